"""The dashboard's API as the tests call it in process (``make_client`` in conftest.py):
the token its clients present, the header that carries it, and its JSON errors."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from aiohttp import ClientResponse

#: The dashboard token the dashboard tests' clients present (make_client's default).
DASHBOARD_TOKEN = "t0ken-for-the-tests-0123456789"

AUTH = {"Authorization": f"Bearer {DASHBOARD_TOKEN}"}

#: The type of conftest's ``make_client`` fixture.
ClientFactory = Callable[..., Any]


async def error_of(resp: ClientResponse, status: int) -> str:
    assert resp.status == status, await resp.text()
    assert resp.content_type == "application/json"
    doc = await resp.json()
    assert set(doc) == {"error"} and "Traceback" not in doc["error"]
    return str(doc["error"])
