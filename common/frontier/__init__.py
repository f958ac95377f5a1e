"""The frontier: which host's turn it is, and the rules that decide it.

- `hostkey`: which host (and partition) a URL belongs to;
- `hostconf`: a host's own settings as Redis keeps them (delay, concurrency, budget,
  block, robots.txt's Crawl-delay);
- `policy`: the crawl's policy, one versioned object every process follows;
- `hosts`: steering it while a crawl runs (list hosts, set one, pause, resume).

The lease itself is ``common/lua/lease.lua`` (its reply's layout is read in
`common.queue`), the host state its scripts share ``common/lua/lib/hosts.lua``.
"""
