-- release.lua: hand leased tasks back without counting an attempt (graceful shutdown).
--
-- The task goes back to the head of the ready line, so the next consumer starts it
-- at once instead of waiting for the lease to expire.
--
-- KEYS[1]  leases    ZSET
-- KEYS[2]  owners    HASH
-- KEYS[3]  attempts  HASH
-- KEYS[4]  ready     LIST
-- KEYS[5]  prio      ZSET
-- KEYS[6]  prios     HASH
-- KEYS[7]  stats     HASH  counters (released, stale)
-- ARGV[1]  worker id
-- ARGV[2..] pairs: id, token
-- Returns {code per item} (0 OK, 3 STALE, 4 EXPIRED, 5 UNKNOWN)
local leases, owners, attempts, ready = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local prio, prios, stats = KEYS[5], KEYS[6], KEYS[7]
local worker = ARGV[1]
if (#ARGV - 1) % 2 ~= 0 then error('crawlq: release needs (id, token) pairs') end
allow_at_maxmemory(stats)
local now = now_ms()
local codes, released, stale = {}, 0, 0
for i = 2, #ARGV, 2 do
  local id, token = ARGV[i], ARGV[i + 1]
  local state = lease_state(leases, owners, id, token, worker, now)
  if state == OK then
    drop_lease(leases, owners, id)
    redis.call('HINCRBY', attempts, id, -1)
    push_ready(ready, prio, prios, id, true)
    released = released + 1
  else
    stale = stale + 1
  end
  codes[#codes + 1] = state
end
bump(stats, {released = released, stale = stale})
return codes
