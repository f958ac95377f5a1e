-- lease.lua: lease up to n pending tasks of one partition to a worker.
--
-- Highest priority first (prio ZSET), then FIFO from the ready LIST. Each task gets a
-- fresh fencing token and a deadline of Redis TIME + lease_ms; its attempt is counted
-- now, so a task that crashes its consumer still uses up attempts. Reads and writes are
-- batched: a few commands per call, not per task. An id whose body is
-- missing (corrupted state) is dropped and counted as `orphans`.
--
-- KEYS[1]  ready        LIST
-- KEYS[2]  prio         ZSET
-- KEYS[3]  tasks        HASH  id -> task JSON
-- KEYS[4]  attempts     HASH  id -> attempts
-- KEYS[5]  leases       ZSET  id -> deadline (ms)
-- KEYS[6]  owners       HASH  id -> "<token>:<worker>"
-- KEYS[7]  seq          STRING fencing-token counter
-- KEYS[8]  stats        HASH  counters (leased, orphans)
-- KEYS[9]  checkpoints  HASH  id -> checkpoint JSON
-- KEYS[10] errors       HASH  id -> last error
-- ARGV[1]  worker id
-- ARGV[2]  n, the most tasks to lease
-- ARGV[3]  lease_ms, lease length in milliseconds
-- Returns {now_ms, deadline_ms, id, token, attempt, body, checkpoint|false, last_error|false, ...}
local ready, prio, tasks, attempts = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local leases, owners, seq, stats = KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local checkpoints, errors = KEYS[9], KEYS[10]
local worker = ARGV[1]
local n = int_arg(ARGV[2], 'n')
local lease_ms = int_arg(ARGV[3], 'lease_ms')
if n < 1 or lease_ms < 1 then error('crawlq: lease needs n >= 1 and lease_ms >= 1') end

local now = now_ms()
local deadline = now + lease_ms
local ids = {}
if redis.call('EXISTS', prio) == 1 then
  local popped = redis.call('ZPOPMIN', prio, n)
  for i = 1, #popped, 2 do ids[#ids + 1] = popped[i] end
end
if #ids < n then
  local popped = redis.call('LPOP', ready, n - #ids)
  if popped then
    for _, id in ipairs(popped) do ids[#ids + 1] = id end
  end
end
local result = {now, deadline}
if #ids == 0 then return result end

local bodies = call_sliced('HMGET', tasks, ids, 1000)
-- Most crawls hold no checkpoints and few errors: skip reading an empty hash.
local cps, errs = {}, {}
if redis.call('EXISTS', checkpoints) == 1 then
  cps = call_sliced('HMGET', checkpoints, ids, 1000)
end
if redis.call('EXISTS', errors) == 1 then
  errs = call_sliced('HMGET', errors, ids, 1000)
end
force_hashtable(owners)
force_hashtable(attempts)
local counts = call_sliced('HMGET', attempts, ids, 1000)
local first = redis.call('INCRBY', seq, #ids) - #ids + 1
-- Explicit indexes, not #t: the length operator is a search in Lua 5.1.
local zargs, hargs, aargs, leased, orphans = {}, {}, {}, 0, 0
local owner_suffix, deadline_arg, r = ':' .. worker, tostring(deadline), 2
for i, id in ipairs(ids) do
  if bodies[i] then
    local token = tostring(first + i - 1)
    local attempt = (tonumber(counts[i]) or 0) + 1
    local k = 2 * leased
    aargs[k + 1], aargs[k + 2] = id, attempt
    zargs[k + 1], zargs[k + 2] = deadline_arg, id
    hargs[k + 1], hargs[k + 2] = id, token .. owner_suffix
    result[r + 1], result[r + 2], result[r + 3] = id, token, attempt
    result[r + 4], result[r + 5], result[r + 6] = bodies[i], cps[i] or false, errs[i] or false
    r = r + 6
    leased = leased + 1
  else
    orphans = orphans + 1
  end
end
if leased > 0 then
  call_sliced('HSET', attempts, aargs, 1000)
  call_sliced('ZADD', leases, zargs, 1000)
  call_sliced('HSET', owners, hargs, 1000)
end
bump(stats, {leased = leased, orphans = orphans})
return result
