"""Spiders: routes by label that turn responses into items and more requests.

`Spider` (routes, item key, start requests), `Response` (a fetch result with parsel
selectors), `Context` (a route's request, follow, emit, checkpoints), `run_route` (the
consumer's call; `returned_by`: the route whose returned value an error is about),
`load_spider` (``--spider``) and `crawl_of` (the crawl a ``--spider`` names). The
public import is ``crawlq``.
"""

from common.spider.context import Context
from common.spider.dispatch import mark_returned, returned_by, run_route
from common.spider.loading import crawl_of, load_spider
from common.spider.response import Response
from common.spider.spider import Route, RouteFn, Spider

__all__ = ["Context", "Response", "Route", "RouteFn", "Spider", "crawl_of", "load_spider",
           "mark_returned", "returned_by", "run_route"]
