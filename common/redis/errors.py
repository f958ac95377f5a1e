"""What to tell a person when Redis refuses or can't be reached: one message per cause."""

from __future__ import annotations

import re

from redis.exceptions import (
    AuthenticationError,
    BusyLoadingError,
    NoPermissionError,
    OutOfMemoryError,
    ReadOnlyError,
    RedisError,
    ResponseError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from common.urls.redact import redact_url

#: What a Redis call raises when Redis refuses or can't be reached: loops that must
#: outlive an outage catch these.
REDIS_ERRORS = (RedisError, OSError)

_REFUSALS = ("OOM", "NOPERM", "NOAUTH", "WRONGPASS", "READONLY", "LOADING", "MISCONF",
             "NOREPLICAS", "MASTERDOWN")
_SCRIPT_ERROR = re.compile(r"-([A-Z]{3,}) ")


#: How redis-py's pipeline rewrites the message of a command's error.
_PIPELINE_ERROR = re.compile(r"^Command # \d+ \(.*?\) of pipeline caused error: ", re.S)


def _script_error_code(text: str) -> str:
    """A refusal inside a Lua script or a pipeline, rewritten to start with its code.

    Redis < 7 wraps a script's: ``Error running script (call to f_...): @user_script:..:
    -OOM command not allowed ...``; an ACL refusal there says "can't run this command".
    redis-py's pipeline puts ``Command # 1 (EVALSHA ...) of pipeline caused error: ``
    before the server's message (a refusal of a server's state, READONLY or NOREPLICAS,
    refuses every write of the pipeline alike).
    """
    text = _PIPELINE_ERROR.sub("", text, count=1)
    if "Error running script" not in text and "user_script" not in text:
        return text
    if "can't run this command" in text or "no permissions" in text:
        return f"NOPERM {text}"
    m = _SCRIPT_ERROR.search(text)
    return f"{m.group(1)} {text}" if m else text


def error_code(text: str) -> str:
    """The error code a Redis error message starts with (``READONLY``), also when a Lua
    script's call raised it; '' for none."""
    head = _script_error_code(text).split(" ", 1)[0]
    return head if head.isupper() else ""


def redis_error_message(exc: RedisError, url: str) -> str | None:
    """A plain message for a Redis failure that is the environment's fault, else None.

    Covers unreachable, login refused, ACL refused, out of memory, read-only replica,
    still loading; None for anything else (a bug: let it raise).
    """
    where = f"Redis at {redact_url(url)}"
    raw = str(exc)
    text = _script_error_code(raw)  # what is matched; raw is what is shown
    if isinstance(exc, AuthenticationError) or text.startswith(("NOAUTH", "WRONGPASS")):
        return (f"{where} refused the login ({raw}); check the user and password in "
                "--redis-url / REDIS_URL")
    if isinstance(exc, NoPermissionError) or text.startswith("NOPERM"):
        return (f"{where} refused a command for this ACL user ({raw}); grant the user "
                "the commands and the crawlq:* keys it needs")
    if isinstance(exc, OutOfMemoryError) or "OOM" in text.split(" ", 1)[0]:
        return (f"{where} is out of memory and refused a write ({raw}); free memory "
                "(crawlq reset an old crawl) or raise maxmemory")
    if isinstance(exc, ReadOnlyError) or text.startswith("READONLY"):
        return f"{where} is a read-only replica ({raw}); point --redis-url at the primary"
    if isinstance(exc, BusyLoadingError) or text.startswith("LOADING"):
        return f"{where} is still loading its data ({raw}); retry in a moment"
    if isinstance(exc, RedisConnectionError | RedisTimeoutError):
        return (f"cannot reach {where}: {raw or type(exc).__name__}; check --redis-url / "
                "REDIS_URL and that Redis is running")
    if isinstance(exc, ResponseError) and text.startswith(_REFUSALS):
        return f"{where} refused the command: {raw}"
    return None
