"""crawlq producer: canonicalize, dedup and enqueue URLs."""
