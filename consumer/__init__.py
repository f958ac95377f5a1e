"""crawlq consumer: leases tasks from Redis, fetches them politely, writes results to a sink."""
