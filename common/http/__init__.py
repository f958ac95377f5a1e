"""The safe HTTP client both services use: the fetcher (timeouts, body cap, redirects,
redaction) and the SSRF guard under it. The producer fetches sitemaps with it, the
consumer pages and robots.txt."""
