"""The host model: what a host is and what Redis keeps about it, below the queue.

- `hostkey`: which host (and partition) a URL belongs to;
- `hostrec`: a host's record as Redis keeps it (its counters, its own settings: delay,
  concurrency, budget, block, robots.txt's Crawl-delay, and its push-back state);
- `hostgroup` + `hostip`: the politeness group a host is in (its registrable domain, or
  the address its name resolves to); `group_record`: a group's record as Redis keeps it;
  `enqueue_groups`: naming an enqueue's groups for the crawl's ``politeness_key``.

The queue and its scripts are built on these; steering hosts while a crawl runs is the
operator's API above the queue, `common.frontier.hosts`.
"""
