"""A small test site for the container test, on 127.0.0.1, standard library only.

``/p/<i>.html``    a small HTML page
``/slow/<i>.html`` the same after sleeping ``--delay`` seconds (a crawl that lasts long
                   enough to stop a consumer in the middle of it)
``/robots.txt``    allows everything
``/_hits``         JSON ``{path: requests}`` of every page served so far

Run as ``python3 tests/container/site.py --port-file FILE``: it writes its port to FILE
once it listens, and serves until SIGTERM.
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

PAGE = re.compile(r"^/(p|slow)/(\d+)\.html$")


class Site(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, port: int, delay_s: float) -> None:
        super().__init__(("127.0.0.1", port), Handler)
        self.delay_s = delay_s
        self.hits: Counter[str] = Counter()
        self.lock = threading.Lock()

    def handle_error(self, request: object, client_address: object) -> None:
        """Clients that hang up (a consumer killed mid-request) are expected: stay quiet."""
        return


class Handler(BaseHTTPRequestHandler):
    server: Site
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/robots.txt":
            self._send(200, "text/plain", b"User-agent: *\nAllow: /\n")
            return
        if path == "/_hits":
            with self.server.lock:
                body = json.dumps(dict(self.server.hits)).encode()
            self._send(200, "application/json", body)
            return
        m = PAGE.match(path)
        if m is None:
            self._send(404, "text/plain", b"not found\n")
            return
        with self.server.lock:
            self.server.hits[path] += 1
        if m.group(1) == "slow":
            time.sleep(self.server.delay_s)
        body = (f"<!doctype html><html><head><title>page {m.group(2)}</title></head>"
                f"<body><h1>page {m.group(2)}</h1></body></html>").encode()
        self._send(200, "text/html; charset=utf-8", body)

    def _send(self, status: int, content_type: str, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        return  # quiet: the test prints its own summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--delay", type=float, default=0.5, help="seconds /slow/ pages wait")
    parser.add_argument("--port-file", type=Path, required=True)
    args = parser.parse_args()
    site = Site(args.port, args.delay)
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=site.shutdown).start())
    args.port_file.write_text(f"{site.server_address[1]}\n")
    try:
        site.serve_forever()
    finally:
        site.server_close()


if __name__ == "__main__":
    main()
