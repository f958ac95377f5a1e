"""Ports on 127.0.0.1 for the tests that need one nothing answers on."""

from __future__ import annotations

import socket


def closed_port() -> int:
    """A port on 127.0.0.1 nothing listens on (bound, then closed): a connection to it is
    refused."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port
