"""The operator's console: the ``crawlq`` command (`cli`, `cli_hosts`, `cli_crawl`,
`fsck`), what operators read (`crawls`, `deadletters`), the web `dashboard` and the
`demo`. It drives the producer and the consumer from outside, through Redis and their
commands, and builds on `common` like they do."""
