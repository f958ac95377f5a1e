"""The exception hierarchy of crawlq: one root, a few named kinds.

Expected outcomes of queue operations (a stale fencing token, an unknown id) are
result codes, not exceptions; these types are for what a caller must handle.
"""

from __future__ import annotations


class CrawlqError(Exception):
    """Root of every error crawlq raises on purpose."""


class ConfigError(CrawlqError, ValueError):
    """A flag, environment variable or crawl setting is invalid or conflicts."""


class CrawlConflictError(ConfigError):
    """A crawl exists with settings (partitions, dedup) other than the ones asked for."""


class RedisUnavailableError(CrawlqError, ConnectionError):
    """Redis could not be reached, refused the login, or refused a write (out of memory)."""


class MalformedTaskError(CrawlqError, ValueError):
    """A task body could not be decoded or does not match the task schema."""


class BadRequestError(CrawlqError, ValueError):
    """An operator's request names something malformed or out of range (a task id, a
    dead-letter reason, a page); the message says what was wrong."""


class InvalidRequestError(CrawlqError, ValueError):
    """A Request (common/tasks/request.py) is malformed: a bad method, data that isn't a JSON
    object, a body over the cap, a label that isn't a route name, a bad header; the
    message names the field and what to do. Raised where it enters a crawl (a route's
    follow, a spider's start, the producer's reader), or at the enqueue of a NewTask
    built by hand."""


class UnknownLabelError(CrawlqError, LookupError):
    """A request's label names no route of the spider (common/spider): refused when the
    request is made or enqueued; a leased task with one ends dead (``unknown_label``)."""


class SourceError(CrawlqError, OSError):
    """An input source (file, stdin, sitemap) could not be read."""


class FetchError(CrawlqError):
    """A fetch failed; `reason` is a short stable code, `retryable` says what to do next."""

    def __init__(
        self,
        reason: str,
        message: str,
        *,
        retryable: bool,
        retry_after: float | None = None,
        status: int | None = None,
        proxy_failed: bool = False,
    ) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason = reason
        self.message = message
        self.retryable = retryable
        self.retry_after = retry_after
        self.status = status
        #: the proxy it went through failed (no connection through it, refused, dropped):
        #: the host never answered, so another proxy may be tried at once
        self.proxy_failed = proxy_failed


class RedisServerError(CrawlqError, RuntimeError):
    """The embedded redis-server could not be found or started."""


class LuaIncludeError(CrawlqError, ValueError):
    """A Lua script's ``--- @include`` names no module under common/lua, is malformed, or
    the includes form a cycle."""
