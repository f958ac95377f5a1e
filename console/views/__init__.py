"""What operators read of a crawl, shared by the ``crawlq`` commands and the dashboard:
its summary and keys (`crawls`), its dead letters (`deadletters`), what it did not
deliver and what to change (`losses`), how its hosts table sorts (`hosts`). Reads
through ``common``; imports nothing else of the console's."""
