"""The frontier's operator API: steering hosts while a crawl runs.

- `hosts`: `Frontier` (list hosts, set one, pause, resume), a layer above the queue.

What a host is (its key, its settings as Redis keeps them) is the host model below the
queue, `common.hostmodel`; the crawl's policy is `common.policy`. The lease itself is
``common/lua/lease.lua`` (its reply's layout is read in `common.queue`), the host state
its scripts share ``common/lua/lib/hosts.lua``.
"""
