"""The ``crawlq demo``: a sample site to crawl and the orchestration of a local run."""
