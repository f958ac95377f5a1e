-- lib.lua: helpers prepended to every other script by common/scripts.py.
-- Defines no keys of its own; every key a script touches still comes in KEYS.
--
-- Result codes (mirrored by common.queue.Code):
--   0 OK       the transition happened
--   1 RETRY    fail: the task waits in `delayed` for another attempt
--   2 DEAD     fail/reclaim: the task moved to `dead`
--   3 STALE    the lease is held under another fencing token (someone else owns it now)
--   4 EXPIRED  the token matches but the lease deadline has passed
--   5 UNKNOWN  the id holds no lease (already acked, reclaimed, never leased)
local OK, RETRY, DEAD, STALE, EXPIRED, UNKNOWN = 0, 1, 2, 3, 4, 5

-- Milliseconds of the Redis server clock: deadlines never come from a worker's clock.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- The result code of a lease from its `owners` entry and its deadline in `leases`
-- (either false when absent): whether `worker` still holds it under `token`.
local function judge_lease(owner, deadline, token, worker, now)
  if not owner then return UNKNOWN end
  if owner ~= token .. ':' .. worker then return STALE end
  deadline = deadline and tonumber(deadline)
  if (not deadline) or deadline <= now then return EXPIRED end
  return OK
end

-- Whether `worker` still holds the lease on `id` under `token`, as a result code.
local function lease_state(leases, owners, id, token, worker, now)
  local owner = redis.call('HGET', owners, id)
  if not owner then return UNKNOWN end
  return judge_lease(owner, redis.call('ZSCORE', leases, id), token, worker, now)
end

-- Ends a lease (the caller already checked it).
local function drop_lease(leases, owners, id)
  redis.call('ZREM', leases, id)
  redis.call('HDEL', owners, id)
end

-- Puts a pending id back in line: priority tasks into `prio`, the rest into `ready`
-- at the head (front=true: it already waited its turn) or the tail.
local function push_ready(ready, prio, prios, id, front)
  local p = redis.call('HGET', prios, id)
  if p then
    redis.call('ZADD', prio, -tonumber(p), id)
  elseif front then
    redis.call('LPUSH', ready, id)
  else
    redis.call('RPUSH', ready, id)
  end
end

-- Runs `cmd key args...` in slices of at most `step` values (even, for pairs) and returns
-- the replies joined: unpack() of a long table overflows the Lua C stack (~8000 values),
-- and a script that fails after its first writes is not rolled back.
local function call_sliced(cmd, key, args, step)
  local out = {}
  for i = 1, #args, step do
    local reply = redis.call(cmd, key, unpack(args, i, math.min(i + step - 1, #args)))
    if type(reply) == 'table' then
      for j = 1, #reply do out[#out + 1] = reply[j] end
    end
  end
  return out
end

-- lease_state of many (id, token) pairs in two commands (HMGET owners, ZMSCORE leases),
-- sliced like call_sliced.
local function lease_states(leases, owners, ids, tokens, worker, now)
  local held = call_sliced('HMGET', owners, ids, 1000)
  local deadlines = call_sliced('ZMSCORE', leases, ids, 1000)
  local states = {}
  for i = 1, #ids do
    states[i] = judge_lease(held[i], deadlines[i], tokens[i], worker, now)
  end
  return states
end

-- Moves an id to the dead-letter set with a short reason code and a message.
local function to_dead(dead, errors, dead_reasons, id, reason, message, now)
  redis.call('ZADD', dead, now, id)
  redis.call('HSET', errors, id, reason .. ' ' .. message)
  redis.call('HINCRBY', dead_reasons, reason, 1)
end

-- Adds non-zero deltas to the stats hash in one call.
local function bump(stats, deltas)
  for name, n in pairs(deltas) do
    if n ~= 0 then redis.call('HINCRBY', stats, name, n) end
  end
end

-- Makes Redis store `hash` as a hashtable for good (a field longer than
-- hash-max-listpack-value does it), before it holds a few hundred task fields that a
-- listpack would scan on every access. Never a task id; see common/keys.py.
local HASHTABLE_FIELD = string.rep('~', 128)
local function force_hashtable(hash)
  redis.call('HSETNX', hash, HASHTABLE_FIELD, '1')
end

-- Parses an integer ARGV value or stops the script before any write.
local function int_arg(value, name)
  local n = tonumber(value)
  if not n or n ~= math.floor(n) then
    error('crawlq: ARGV ' .. name .. ' must be an integer, got ' .. tostring(value))
  end
  return n
end

-- Takes a dead id's reason off the per-reason counts (requeue, purge).
local function forget_dead_reason(errors, dead_reasons, id)
  local err = redis.call('HGET', errors, id) or 'unknown '
  local reason = string.match(err, '^(%S+)') or 'unknown'
  if redis.call('HINCRBY', dead_reasons, reason, -1) <= 0 then
    redis.call('HDEL', dead_reasons, reason)
  end
end

-- Stores a new task and queues it: priority > 0 into `prio` at once, the rest appended
-- to `tail`, which the caller pushes to `ready` with flush_tail (one RPUSH per 1000).
local function add_pending(ready, prio, tasks, prios, id, priority, body, tail)
  redis.call('HSET', tasks, id, body)
  if priority > 0 then
    redis.call('HSET', prios, id, priority)
    redis.call('ZADD', prio, -priority, id)
  else
    tail[#tail + 1] = id
    if #tail == 1000 then
      redis.call('RPUSH', ready, unpack(tail))
      for j = #tail, 1, -1 do tail[j] = nil end
    end
  end
end

local function flush_tail(ready, tail)
  if #tail > 0 then redis.call('RPUSH', ready, unpack(tail)) end
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
