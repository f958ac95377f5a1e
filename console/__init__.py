"""The operator's console: the ``crawlq`` command (`cli`, one module per command
group), ``crawlq fsck`` (`fsck`), what operators read (`views`: crawl summaries, dead
letters, what was not delivered), the web `dashboard`, the `demo`, ``crawlq run`` (`run`)
and the processes those two start on this machine (`local`). It drives the producer and
the consumer from outside, through Redis and their commands, and builds on `common` like
they do. Its layers (pyproject.toml): cli over dashboard | demo | fsck | run, over local,
over views."""
