-- renew.lua: extend the leases a worker still holds (its heartbeat).
--
-- Only leases held under the given fencing token and not yet expired are extended;
-- the rest are reported lost, and the worker must drop their results.
--
-- KEYS[1..2] lease state: leased, leases (lib/leases.lua)
-- KEYS[3]  stats   HASH  counters (renewed, lost)
-- ARGV[1]  worker id
-- ARGV[2]  lease_ms, new lease length from now, milliseconds
-- ARGV[3..] pairs: id, token
-- Returns {deadline_ms, lost id, lost code, lost id, lost code, ...}
--- @include "lib/codes"
--- @include "lib/leases"
--- @include "lib/memory"

local LK = lease_keys(1)
local stats = KEYS[3]
local worker = ARGV[1]
local lease_ms = int_arg(ARGV[2], 'lease_ms')
if lease_ms < 1 or (#ARGV - 2) % 2 ~= 0 then
  error('crawlq: renew needs lease_ms >= 1 and (id, token) pairs')
end
allow_at_maxmemory(stats)
local now = now_ms()
local deadline = now + lease_ms
local ids, tokens = {}, {}
for i = 3, #ARGV, 2 do
  ids[#ids + 1] = ARGV[i]
  tokens[#tokens + 1] = ARGV[i + 1]
end
local result, renewed = {deadline}, {}
if #ids > 0 then
  local states = lease_states(LK, ids, tokens, worker, now)
  for i, id in ipairs(ids) do
    if states[i] == OK then
      renewed[#renewed + 1] = deadline
      renewed[#renewed + 1] = id
    else
      result[#result + 1] = id
      result[#result + 1] = states[i]
    end
  end
  if #renewed > 0 then call_sliced('ZADD', LK.leases, renewed, 1000) end
end
bump(stats, {renewed = #renewed / 2, lost = (#result - 1) / 2})
return result
