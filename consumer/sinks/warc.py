"""WARC sink: WARC/1.1 records in size-rotated ``<crawl>-<worker>-<seq>.warc.gz`` files.

Built on `warcio`, the WARC library of the web-archiving community (Webrecorder; used
by pywb, browsertrix and many archive tools): it writes the record headers, digests,
and one gzip member per record, which is what archive replay and index tools expect.

Each file opens with a ``warcinfo`` record (software, format, crawl, worker); every
later record points to it with ``WARC-Warcinfo-ID``.

Records with an HTTP response (``status`` not None) become ``response`` records:
  - ``WARC-Target-URI`` is ``final_url`` (the URL that produced this response, after
    redirects); when the task URL differs it is kept in ``WARC-Crawlq-Task-URI``.
  - ``WARC-Date`` is ``fetched_at`` (UTC, microseconds, as WARC/1.1 allows).
  - The HTTP block is ``HTTP/<http_version> <status> <reason>`` and the raw response
    headers, then the body. The stored body is already decoded (the client undid
    compression and chunking), so ``Content-Encoding`` and ``Transfer-Encoding`` are
    renamed ``X-Crawlq-Orig-Content-Encoding`` / ``X-Crawlq-Orig-Transfer-Encoding``
    (readers would otherwise try to decode the body again), and ``Content-Length`` is
    set to the stored body's length (the original is kept as
    ``X-Crawlq-Orig-Content-Length`` when it differs).
  - The body is always stored: `store_body` does not apply to WARC, whose point is the
    payload. A response without a body (HEAD, 204) is stored with an empty payload.
A revisit's response that brought nothing new becomes a ``revisit`` record (WARC/1.1
6.7): its HTTP headers, no payload, ``WARC-Refers-To-Target-URI`` (the URL of the visit
it revisits: the same URL) and ``WARC-Refers-To-Date`` (when that visit was fetched, when
known). A ``not_modified`` one (a 304) has the profile
``http://netpreserve.org/warc/1.1/revisit/server-not-modified``; an ``unchanged`` one
(the same body as the previous visit) ``.../identical-payload-digest`` and the
``WARC-Payload-Digest`` of that body (SHA-1, as the original response record has it). A
``changed`` one is a ``response`` record like any page.
Records without an HTTP response (robots_disallowed, DNS or connect errors), and
``filtered`` ones (a response whose body was never read), become ``metadata`` records
(``application/warc-fields``) for the task URL, holding the outcome, task id, attempt,
worker and elapsed time (a filtered one also its status and Content-Type), so the archive
shows what was not fetched and why. `items` returned by a user handler are not written to
WARC files.
"""

from __future__ import annotations

import base64
import hashlib
import io
import socket
from datetime import UTC, datetime
from http import HTTPStatus
from pathlib import Path
from typing import Any, BinaryIO

from warcio.statusandheaders import StatusAndHeaders
from warcio.timeutils import datetime_to_iso_date
from warcio.warcwriter import WARCWriter

from consumer.sinks.base import Record, RotatingFileSink

__all__ = ["REVISIT_PROFILES", "WarcSink", "warc_http_headers"]

SOFTWARE = "crawlq/0.1.0 (warcio)"
_DECODED_HEADERS = frozenset({"content-encoding", "transfer-encoding"})
_ORIG_PREFIX = "X-Crawlq-Orig-"
_PROFILE = "http://netpreserve.org/warc/1.1/revisit/"
#: The outcomes written as revisit records, and their WARC-Profile.
REVISIT_PROFILES = {
    "not_modified": _PROFILE + "server-not-modified",
    "unchanged": _PROFILE + "identical-payload-digest",
}


def _warc_date(unix_seconds: float) -> str:
    moment = datetime.fromtimestamp(unix_seconds, UTC).replace(tzinfo=None)
    return str(datetime_to_iso_date(moment, use_micros=True))


def _clean(value: str) -> str:
    """Header text on one line (a stray CR/LF would break the record framing)."""
    return value.replace("\r", " ").replace("\n", " ")


def warc_http_headers(record: Record) -> StatusAndHeaders:
    """The HTTP status line and headers of a response record, fixed for a decoded body."""
    assert record.status is not None
    try:
        reason = HTTPStatus(record.status).phrase
    except ValueError:
        reason = ""
    body_len = len(record.body) if record.body is not None else 0
    headers: list[tuple[str, str]] = []
    for raw_name, raw_value in record.raw_headers:
        name, value = raw_name.decode("latin-1"), raw_value.decode("latin-1")
        lower = name.lower()
        if lower in _DECODED_HEADERS:
            headers.append((_ORIG_PREFIX + name, _clean(value)))
        elif lower == "content-length":
            if value.strip() != str(body_len):
                headers.append((_ORIG_PREFIX + name, _clean(value)))
        else:
            headers.append((_clean(name), _clean(value)))
    headers.append(("Content-Length", str(body_len)))
    statusline = f"{record.status} {reason}".strip()
    return StatusAndHeaders(statusline, headers, protocol=f"HTTP/{record.http_version}")


class WarcSink(RotatingFileSink):
    """Writes WARC/1.1 gzip files; see the module docstring for the record layout."""

    suffix = ".warc.gz"
    # Per file, set when it opens (class defaults until then).
    _writer: Any = None  # warcio.warcwriter.WARCWriter of the current file
    _warcinfo_id = ""

    def _start_file(self, fh: BinaryIO, path: Path) -> None:
        writer = WARCWriter(fh, gzip=True, warc_version="1.1")
        info = {
            "software": SOFTWARE,
            "format": "WARC File Format 1.1",
            "conformsTo": (
                "https://iipc.github.io/warc-specifications/specifications/warc-format/warc-1.1/"
            ),
            "isPartOf": self.crawl,
            "hostname": socket.gethostname(),
            "crawlq-worker": self.worker,
        }
        warcinfo = writer.create_warcinfo_record(path.name, info)
        writer.write_record(warcinfo)
        self._writer = writer
        self._warcinfo_id = str(warcinfo.rec_headers.get_header("WARC-Record-ID"))

    def _end_file(self, fh: BinaryIO) -> None:
        self._writer = None
        self._warcinfo_id = ""

    def _encode_and_write(self, fh: BinaryIO, records: list[Record]) -> None:
        writer = self._writer
        assert writer is not None
        for record in records:
            if record.status is None or record.outcome == "filtered":
                writer.write_record(self._metadata_record(writer, record))
            elif record.outcome in REVISIT_PROFILES:
                writer.write_record(self._revisit_record(writer, record))
            else:
                writer.write_record(self._response_record(writer, record))

    def _common_headers(self, record: Record) -> dict[str, str]:
        headers = {
            "WARC-Date": _warc_date(record.fetched_at),
            "WARC-Warcinfo-ID": self._warcinfo_id,
        }
        return headers

    def _response_record(self, writer: Any, record: Record) -> Any:
        body = record.body or b""
        warc_headers = self._common_headers(record)
        target = record.final_url or record.url
        if target != record.url:
            warc_headers["WARC-Crawlq-Task-URI"] = record.url
        return writer.create_warc_record(
            target,
            "response",
            payload=io.BytesIO(body),
            length=len(body),
            warc_headers_dict=warc_headers,
            http_headers=warc_http_headers(record),
        )

    def _revisit_record(self, writer: Any, record: Record) -> Any:
        warc_headers = self._common_headers(record)
        target = record.final_url or record.url
        if target != record.url:
            warc_headers["WARC-Crawlq-Task-URI"] = record.url
        warc_headers["WARC-Profile"] = REVISIT_PROFILES[record.outcome]
        warc_headers["WARC-Refers-To-Target-URI"] = target
        if record.refers_to_s:
            warc_headers["WARC-Refers-To-Date"] = _warc_date(record.refers_to_s)
        if record.outcome == "unchanged" and record.body is not None:
            sha1 = hashlib.sha1(record.body, usedforsecurity=False).digest()
            warc_headers["WARC-Payload-Digest"] = "sha1:" + base64.b32encode(sha1).decode()
        return writer.create_warc_record(
            target, "revisit", warc_headers_dict=warc_headers,
            http_headers=warc_http_headers(record),
        )

    def _metadata_record(self, writer: Any, record: Record) -> Any:
        fields = {
            "crawlq-outcome": record.outcome,
            "crawlq-task-id": record.task_id,
            "crawlq-attempt": str(record.attempt),
            "crawlq-worker": record.worker,
            "crawlq-elapsed": f"{record.elapsed:.6f}",
            "crawlq-depth": str(record.depth),
        }
        if record.status is not None:
            fields["crawlq-status"] = str(record.status)
            fields["crawlq-content-type"] = record.headers.get("content-type", "")
        block = "".join(f"{k}: {_clean(v)}\r\n" for k, v in fields.items()).encode("utf-8")
        return writer.create_warc_record(
            record.url,
            "metadata",
            payload=io.BytesIO(block),
            length=len(block),
            warc_content_type="application/warc-fields",
            warc_headers_dict=self._common_headers(record),
        )
