"""crawlq common core: config, key schema, Lua scripts and their API, task model, URLs."""
