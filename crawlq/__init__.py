"""crawlq's public import for spider authors: ``from crawlq import Spider, Request, Item``
(and ``Blocked``: what a blocked answer to a route's requests looks like).

A thin re-export of what lives in ``common`` (the base layer every crawlq process
imports), so a spider file loads the same in the producer, the consumer and
``crawlq run``, and nothing in crawlq itself imports this package.
"""

from common.browser.render import Render
from common.proxies.bans import Blocked
from common.spider import Context, Response, Spider
from common.tasks.items import Item
from common.tasks.request import Request

__all__ = ["Blocked", "Context", "Item", "Render", "Request", "Response", "Spider"]
