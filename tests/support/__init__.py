"""Helpers the test files share (spec files import them from here, not from each other;
tests/test_test_layout.py holds them to it), as ``from support.<module> import <name>``:

- ``routes``: a local aiohttp site of a test's own routes (``serve``, ``Site``) and
  handlers for it (``page``, ``hanging``);
- ``consume``: a consumer run in-process (``enqueue``, ``consumer_args``, ``consume``,
  ``records``, ``NullSink``);
- ``frontier``: tasks, a queue with the crawl's politeness set, a lease that waits for a
  host's turn;
- ``handover``: a parent's children handed from one consumer process to another
  (``hand_over_children``) and a wait for a condition (``until``);
- ``clock``: Redis' clock (``redis_ms``) and waits on it (``expire``, ``window_passed``);
- ``ports``: a port nothing listens on;
- ``sentinel``: a Redis Sentinel group of real processes (a primary, two replicas, three
  sentinels) and the failover drill's steps on it;
- ``dashboard``: the in-process dashboard's token, auth header and JSON errors;
- ``browser``: headless Chromium and the dashboard as a child process;
- ``docs``: the README and docs/ pages the tests hold to the code;
- ``benches``: a module of bench/ loaded from its file (``load_bench``).
- ``tiers``: the pytest plugin that sorts the tests into ``unit`` (no process started)
  and ``integration``, and fails a unit test that starts one.

Helpers with a life of their own stay beside the tests: ``sites.py`` (also run as
``python -m tests.sites``), ``consumer_handlers.py`` (loaded by name with ``--handler``),
``procs.py``, ``redis_binaries.py``, ``shared_data.py``, ``import_graph.py`` (also run as
``python tests/import_graph.py``).
"""
