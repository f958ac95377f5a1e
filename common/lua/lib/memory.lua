-- lib/memory.lua: how scripts deal with Redis memory: hashes kept as hashtables, and
-- scripts that may run at maxmemory.
-- Includes nothing.

-- Makes Redis store `hash` as a hashtable for good (a field longer than
-- hash-max-listpack-value does it, so longer than any sane setting: the deployments
-- raise it to 192 for the history records), before it holds a few hundred task fields
-- that a listpack would scan on every access. Never a task id; see common/keys.py.
local HASHTABLE_FIELD = string.rep('~', 1024)
-- The field of layouts before 4 (too short once hash-max-listpack-value is raised).
local LEGACY_HASHTABLE_FIELD = string.rep('~', 128)
local function force_hashtable(hash)
  redis.call('HSETNX', hash, HASHTABLE_FIELD, '1')
end

-- Lets a script that does not grow memory run at maxmemory. Redis refuses a
-- memory-growing command (ZADD, HSET, HINCRBY ...) when it is the script's first write
-- and the server is over maxmemory; once a script has written, it may finish. HDEL is
-- a write that never grows memory, so this no-op HDEL opens the script. Used by every
-- transition that frees or only moves memory (ack, renew, fail, ...), so a full Redis
-- can still be drained; never by enqueue, which must be refused whole.
local function allow_at_maxmemory(hash)
  redis.call('HDEL', hash, '')
end
