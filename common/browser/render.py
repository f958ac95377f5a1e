"""What a route asks of a render (`Render`) and what a render gives back (`RenderResult`:
a `FetchResult` whose body is the DOM the page's scripts built, with the JSON responses
it fetched). Plain data: nothing here imports Playwright."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from common import codec
from common.http.results import FetchResult

__all__ = ["DEFAULT_RENDER", "Fetched", "Render", "RenderResult"]


@dataclass(frozen=True, slots=True)
class Render:
    """Page actions before the DOM is taken, in this order: the page loads and its
    requests settle (none in flight for `settle_ms`); then `wait_for` (a CSS selector
    that must be in the DOM), `scroll` times to the bottom, and `click` (a "load more"
    button's CSS selector) while one is visible, at most `clicks` times; each action
    waits for the requests it set off to settle. `images`: load images, media and fonts
    too (not by default: nothing a DOM needs). `json`: keep the JSON responses the page
    fetched (``response.fetched``)."""

    wait_for: str | None = None
    scroll: int = 0
    click: str | None = None
    clicks: int = 10
    settle_ms: int = 100
    images: bool = False
    json: bool = True

    def __post_init__(self) -> None:
        for name in ("scroll", "clicks", "settle_ms"):
            value = getattr(self, name)
            if type(value) is not int or value < 0:
                raise ValueError(f"Render {name} must be a whole number >= 0, got {value!r}")
        for name in ("wait_for", "click"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value.strip()):
                raise ValueError(f"Render {name} must be a CSS selector, got {value!r}")


#: What a render does when nothing asks more: load, settle, take the DOM.
DEFAULT_RENDER = Render()


@dataclass(frozen=True, slots=True)
class Fetched:
    """A JSON response the page fetched (an XHR or fetch() call), as it arrived."""

    url: str
    status: int
    body: bytes

    def json(self) -> Any:
        """The body parsed; ValueError when it is not JSON."""
        return codec.loads(self.body)


@dataclass(slots=True)
class RenderResult(FetchResult):
    """A rendered page: `body` is the DOM serialized (UTF-8, ``Content-Type: text/html;
    charset=utf-8``), `final_url` where the page ended; `fetched` the JSON responses its
    scripts fetched (in order, up to the body cap in all); `subrequests` the requests it
    made that were fetched, `refused` those refused (SSRF guard, a type not loaded, over
    the cap) and `dropped_json` the JSON responses over the cap."""

    fetched: tuple[Fetched, ...] = ()
    subrequests: int = 0
    refused: int = 0
    dropped_json: int = 0
    #: monotonic time of the last request to the page's own host (politeness), 0: none
    last_host_request: float = 0.0
