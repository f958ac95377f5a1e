-- requeue.lua: put dead tasks back in the ready line, with fresh attempts.
--
-- Bypasses dedup on purpose: a dead URL is still seen, and requeueing it must not
-- depend on the seen set (a failure never poisons dedup).
--
-- KEYS[1]  dead          ZSET
-- KEYS[2]  errors        HASH  id -> "<reason> <message>" (kept as last_error)
-- KEYS[3]  attempts      HASH
-- KEYS[4]  stalls        HASH
-- KEYS[5]  dead_reasons  HASH
-- KEYS[6]  ready         LIST
-- KEYS[7]  prio          ZSET
-- KEYS[8]  prios         HASH
-- KEYS[9]  stats         HASH  counters (requeued)
-- ARGV[1..] ids
-- Returns {code per id} (0 OK, 5 UNKNOWN: not dead)
local dead, errors, attempts, stalls, dead_reasons = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local ready, prio, prios, stats = KEYS[6], KEYS[7], KEYS[8], KEYS[9]
allow_at_maxmemory(stats)
local codes, requeued = {}, 0
for _, id in ipairs(ARGV) do
  if redis.call('ZREM', dead, id) == 1 then
    forget_dead_reason(errors, dead_reasons, id)
    redis.call('HDEL', attempts, id)
    redis.call('HDEL', stalls, id)
    push_ready(ready, prio, prios, id, false)
    requeued = requeued + 1
    codes[#codes + 1] = OK
  else
    codes[#codes + 1] = UNKNOWN
  end
end
bump(stats, {requeued = requeued})
return codes
