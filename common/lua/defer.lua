-- defer.lua: put leased tasks back to wait, without counting an attempt.
--
-- For politeness: a task whose host is over its budget waits in `delayed` until the
-- host has room, and holds no lease or fetch slot meanwhile.
--
-- KEYS[1]  leases    ZSET
-- KEYS[2]  owners    HASH
-- KEYS[3]  attempts  HASH
-- KEYS[4]  delayed   ZSET  id -> due (ms)
-- KEYS[5]  stats     HASH  counters (deferred, stale)
-- ARGV[1]  worker id
-- ARGV[2..] triples: id, token, delay_ms
-- Returns {code per item} (0 OK, 3 STALE, 4 EXPIRED, 5 UNKNOWN)
local leases, owners, attempts, delayed, stats = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local worker = ARGV[1]
if (#ARGV - 1) % 3 ~= 0 then error('crawlq: defer needs (id, token, delay_ms) triples') end
for i = 4, #ARGV, 3 do
  if int_arg(ARGV[i], 'delay_ms') < 0 then error('crawlq: delay_ms must be >= 0') end
end
allow_at_maxmemory(stats)
local now = now_ms()
local codes, deferred, stale = {}, 0, 0
for i = 2, #ARGV, 3 do
  local id, token, delay = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2])
  local state = lease_state(leases, owners, id, token, worker, now)
  if state == OK then
    drop_lease(leases, owners, id)
    redis.call('HINCRBY', attempts, id, -1)
    redis.call('ZADD', delayed, now + delay, id)
    deferred = deferred + 1
  else
    stale = stale + 1
  end
  codes[#codes + 1] = state
end
bump(stats, {deferred = deferred, stale = stale})
return codes
