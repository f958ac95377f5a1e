-- reclaim.lua: take back expired leases (their consumer died or stalled).
--
-- An expired task goes back to the head of the ready line. A task reclaimed more than
-- max_stalls times goes to `dead` with reason `stalled`, so a poison task that kills
-- its consumer cannot crash-loop a fleet. Safe to run from every consumer at once.
--
-- KEYS[1]  leases        ZSET  id -> deadline (ms)
-- KEYS[2]  owners        HASH
-- KEYS[3]  stalls        HASH  id -> times reclaimed
-- KEYS[4]  ready         LIST
-- KEYS[5]  prio          ZSET
-- KEYS[6]  prios         HASH
-- KEYS[7]  dead          ZSET
-- KEYS[8]  errors        HASH
-- KEYS[9]  dead_reasons  HASH
-- KEYS[10] stats         HASH  counters (reclaimed, dead, stalled)
-- ARGV[1]  limit, the most leases to reclaim in this call
-- ARGV[2]  max_stalls
-- Returns {reclaimed, dead, more (1 if the limit was reached)}
local leases, owners, stalls, ready, prio = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local prios, dead, errors, dead_reasons, stats = KEYS[6], KEYS[7], KEYS[8], KEYS[9], KEYS[10]
local limit = int_arg(ARGV[1], 'limit')
local max_stalls = int_arg(ARGV[2], 'max_stalls')
if limit < 1 or max_stalls < 0 then error('crawlq: reclaim needs limit >= 1, max_stalls >= 0') end
allow_at_maxmemory(stats)
local now = now_ms()
local expired = redis.call('ZRANGEBYSCORE', leases, '-inf', now, 'LIMIT', 0, limit)
local reclaimed, died = 0, 0
for _, id in ipairs(expired) do
  drop_lease(leases, owners, id)
  local stalled = redis.call('HINCRBY', stalls, id, 1)
  if stalled > max_stalls then
    to_dead(dead, errors, dead_reasons, id, 'stalled',
      'lease expired ' .. stalled .. ' times (consumer died or hung)', now)
    died = died + 1
  else
    push_ready(ready, prio, prios, id, true)
    reclaimed = reclaimed + 1
  end
end
bump(stats, {reclaimed = reclaimed, dead = died, stalled = died})
return {reclaimed, died, #expired == limit and 1 or 0}
