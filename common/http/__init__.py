"""The safe HTTP client both services use: the fetcher (timeouts, body cap, redirects,
redaction) and the SSRF guard under it. The producer fetches sitemaps with it, the
consumer pages and robots.txt.

- `fetcher`: `Fetcher`, one pooled aiohttp session, following redirects by hand;
- `results`: what a fetch is given and gives back (`FetchSettings`, `FetchResult`) and
  what a status means (`classify_status`);
- `hops`: a fetch's hops: the start URL, a redirect's target, what a hop carries over;
- `ssrf`: the guard every hop goes through; `cookies`: a session's cookie jar.
"""

from common.http.cookies import CookieJar, redact_set_cookie
from common.http.fetcher import Fetcher
from common.http.results import FetchResult, FetchSettings, classify_status, http_date

__all__ = ["CookieJar", "FetchResult", "FetchSettings", "Fetcher", "classify_status",
           "http_date", "redact_set_cookie"]
