"""The host model: what a host is and what Redis keeps about it, below the queue.

- `hostkey`: which host (and partition) a URL belongs to;
- `hostrec`: a host's record as Redis keeps it (its counters, its own settings: delay,
  concurrency, budget, block, robots.txt's Crawl-delay, and its push-back state).

The queue and its scripts are built on these; steering hosts while a crawl runs is the
operator's API above the queue, `common.frontier.hosts`.
"""
