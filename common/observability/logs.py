"""Logging set-up: text or one-JSON-object-per-line output, with secrets redacted.

Call `setup_logging()` once in `main()`. Everything else logs through the standard
library with a stable snake_case event name as the message and details as extras::

    log = logging.getLogger("consumer")
    log.info("task_leased", extra={"n": 5, "partition": 3})

Text output (``fmt="text"``)::

    2026-11-30T04:00:00.123Z INFO  consumer  task_leased n=5 partition=3

JSON output (``fmt="json"``), one object per line, serialised with ujson::

    {"ts":"2026-11-30T04:00:00.123Z","level":"INFO","logger":"consumer",
     "event":"task_leased","n":5,"partition":3}

Redaction: a `RedactFilter` is attached to every handler on the root logger. It rewrites
the message, string extras and the formatted exception in place, so every handler sees
the redacted record: URL passwords (``scheme://user:pass@`` -> ``scheme://user:***@``),
``password=...`` / ``token=...`` style pairs, and ``Bearer``/``Basic`` credentials.
String extras whose *key* names a secret (``password``, ``api_key``, ``auth_token``...)
are replaced by ``***`` whole. `redact()` is exported for callers that build strings
elsewhere (for example a settings ``__repr__``).
"""

from __future__ import annotations

import logging
import math
import re
import sys
import time
import traceback
from typing import Any, Final, TextIO

import ujson

from common.errors import ConfigError

__all__ = ["JsonFormatter", "RedactFilter", "TextFormatter", "redact", "setup_logging"]

REDACTED: Final = "***"

# scheme://user:password@host -> scheme://user:***@host. The password runs to the last
# "@" before a "/" or whitespace, so unencoded "@" in a password is still hidden.
_URL_USERINFO_RE: Final = re.compile(
    r"(?P<prefix>\b[a-zA-Z][a-zA-Z0-9+.\-]*://[^:/@\s]*):(?P<secret>[^/\s]*)@"
)
# password=..., token: ..., "api_key": "..." (in text, query strings and JSON).
_SECRET_NAME: Final = r"[\w\-]*(?:password|passwd|pwd|secret|token|api[_\-]?key)"
_KEY_VALUE_RE: Final = re.compile(
    rf"(?i)(?P<prefix>\b{_SECRET_NAME}[\"']?\s*[=:]\s*[\"']?)(?P<secret>[^\s&,;\"'}}\]]+)"
)
_AUTH_SCHEME_RE: Final = re.compile(r"(?i)(?P<prefix>\b(?:bearer|basic)\s+)[A-Za-z0-9._~+/=\-]+")
_SECRET_KEY_RE: Final = re.compile(rf"(?i)^{_SECRET_NAME}$")

# Attributes every LogRecord has; anything else on a record came from `extra=`.
_RECORD_ATTRS: Final = frozenset(
    vars(logging.LogRecord("", 0, "", 0, "", None, None)).keys()
    | {"message", "asctime", "taskName"}
)
_CORE_KEYS: Final = frozenset({"ts", "level", "logger", "event", "exc"})
_HANDLER_MARK: Final = "_crawlq_handler"


def redact(text: str) -> str:
    """Return `text` with URL passwords, key=value secrets and auth credentials masked."""
    if not text:
        return text
    text = _URL_USERINFO_RE.sub(rf"\g<prefix>:{REDACTED}@", text)
    text = _KEY_VALUE_RE.sub(rf"\g<prefix>{REDACTED}", text)
    return _AUTH_SCHEME_RE.sub(rf"\g<prefix>{REDACTED}", text)


def _extras(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in vars(record).items() if k not in _RECORD_ATTRS}


def _redact_value(value: Any) -> Any:
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, list | tuple):
        return [_redact_value(v) for v in value]
    if isinstance(value, dict):
        return {
            k: REDACTED if isinstance(v, str) and _SECRET_KEY_RE.match(str(k)) else _redact_value(v)
            for k, v in value.items()
        }
    return value


class RedactFilter(logging.Filter):
    """Mask secrets in the message, string extras and exception text of every record.

    The record is rewritten in place (``msg`` becomes the formatted message, ``args``
    None), so handlers after this one, and the formatters, only see redacted text.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "_crawlq_redacted", False):
            return True
        try:
            message = record.getMessage()
        except Exception:  # a bad format string: let the handler report it as usual
            return True
        record.msg = redact(message)
        record.args = None
        for key, value in _extras(record).items():
            if isinstance(value, str) and _SECRET_KEY_RE.match(key):
                setattr(record, key, REDACTED)
            elif isinstance(value, str | list | tuple | dict):
                setattr(record, key, _redact_value(value))
        if record.exc_info and not record.exc_text:
            record.exc_text = "".join(traceback.format_exception(*record.exc_info)).rstrip()
        if record.exc_text:
            record.exc_text = redact(record.exc_text)
        if record.stack_info:
            record.stack_info = redact(record.stack_info)
        setattr(record, "_crawlq_redacted", True)  # noqa: B010
        return True


def _iso_utc(created: float) -> str:
    seconds = int(created)
    millis = int((created - seconds) * 1000)
    return f"{time.strftime('%Y-%m-%dT%H:%M:%S', time.gmtime(seconds))}.{millis:03d}Z"


def _json_safe(value: Any, depth: int = 0) -> Any:
    """Return a value ujson encodes as valid JSON: non-finite floats and objects become str."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if depth < 8 and isinstance(value, list | tuple | set | frozenset):
        return [_json_safe(v, depth + 1) for v in value]
    if depth < 8 and isinstance(value, dict):
        return {str(k): _json_safe(v, depth + 1) for k, v in value.items()}
    return redact(str(value))


def _exc_text(formatter: logging.Formatter, record: logging.LogRecord) -> str | None:
    if record.exc_info and not record.exc_text:
        record.exc_text = redact(formatter.formatException(record.exc_info))
    text = record.exc_text
    if record.stack_info:
        text = f"{text}\n{record.stack_info}" if text else record.stack_info
    return text or None


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, event, extras, and exc if any."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "ts": _iso_utc(record.created),
            "level": record.levelname,
            "logger": record.name,
            "event": record.getMessage(),
        }
        for key, value in _extras(record).items():
            if key.startswith("_crawlq"):
                continue
            doc[f"extra_{key}" if key in _CORE_KEYS else key] = _json_safe(value)
        exc = _exc_text(self, record)
        if exc:
            doc["exc"] = exc
        return str(ujson.dumps(doc, ensure_ascii=False, escape_forward_slashes=False))


def _text_value(value: Any) -> str:
    if isinstance(value, str):
        if value and not any(c.isspace() or c in '"=' for c in value):
            return value
        return str(ujson.dumps(value, ensure_ascii=False, escape_forward_slashes=False))
    safe = _json_safe(value)
    if isinstance(safe, str):
        return _text_value(safe)
    return str(ujson.dumps(safe, ensure_ascii=False, escape_forward_slashes=False))


class TextFormatter(logging.Formatter):
    """``<ts> <LEVEL> <logger>  <event> k=v ...``, then the traceback on following lines."""

    def format(self, record: logging.LogRecord) -> str:
        parts = [
            f"{_iso_utc(record.created)} {record.levelname:<5} {record.name}  {record.getMessage()}"
        ]
        parts.extend(
            f"{key}={_text_value(value)}"
            for key, value in _extras(record).items()
            if not key.startswith("_crawlq")
        )
        line = " ".join(parts)
        exc = _exc_text(self, record)
        return f"{line}\n{exc}" if exc else line


def setup_logging(level: str = "INFO", fmt: str = "text", *, stream: TextIO | None = None) -> None:
    """Configure the root logger: one handler on `stream` (stderr), redaction everywhere.

    Calling it again replaces the handler it installed before (it never stacks
    handlers). Handlers installed by others on the root logger are kept, and also get
    the redaction filter. Raises ConfigError for an unknown level or format.
    """
    levelno = logging.getLevelNamesMapping().get(level.strip().upper())
    if levelno is None:
        raise ConfigError(f"unknown log level {level!r}; use DEBUG, INFO, WARNING or ERROR")
    formatter: logging.Formatter
    if fmt == "json":
        formatter = JsonFormatter()
    elif fmt == "text":
        formatter = TextFormatter()
    else:
        raise ConfigError(f"unknown log format {fmt!r}; use 'text' or 'json'")

    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, _HANDLER_MARK, False)]:
        root.removeHandler(old)
        old.close()
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    setattr(handler, _HANDLER_MARK, True)
    handler.setFormatter(formatter)
    root.addHandler(handler)
    root.setLevel(levelno)
    for each in root.handlers:
        if not any(isinstance(f, RedactFilter) for f in each.filters):
            each.addFilter(RedactFilter())
