-- renew.lua: extend the leases a worker still holds (its heartbeat).
--
-- Only leases held under the given fencing token and not yet expired are extended;
-- the rest are reported lost, and the worker must drop their results.
--
-- KEYS[1]  leases  ZSET  id -> deadline (ms)
-- KEYS[2]  owners  HASH  id -> "<token>:<worker>"
-- KEYS[3]  stats   HASH  counters (renewed, lost)
-- ARGV[1]  worker id
-- ARGV[2]  lease_ms, new lease length from now, milliseconds
-- ARGV[3..] pairs: id, token
-- Returns {deadline_ms, lost id, lost code, lost id, lost code, ...}
--- @include "lib/codes"
--- @include "lib/leases"
--- @include "lib/memory"

local leases, owners, stats = KEYS[1], KEYS[2], KEYS[3]
local worker = ARGV[1]
local lease_ms = int_arg(ARGV[2], 'lease_ms')
if lease_ms < 1 or (#ARGV - 2) % 2 ~= 0 then
  error('crawlq: renew needs lease_ms >= 1 and (id, token) pairs')
end
allow_at_maxmemory(stats)
local now = now_ms()
local deadline = now + lease_ms
local result = {deadline}
local renewed = 0
for i = 3, #ARGV, 2 do
  local id, token = ARGV[i], ARGV[i + 1]
  local state = lease_state(leases, owners, id, token, worker, now)
  if state == OK then
    redis.call('ZADD', leases, 'XX', deadline, id)
    renewed = renewed + 1
  else
    result[#result + 1] = id
    result[#result + 1] = state
  end
end
bump(stats, {renewed = renewed, lost = (#result - 1) / 2})
return result
