-- checkpoint.lua: save a leased task's checkpoint (resumable paginated work).
--
-- Only the current lease holder, before its deadline, can save one; a reclaimed task
-- is leased again with the last checkpoint saved.
--
-- KEYS[1..2] lease state: leased, leases (lib/leases.lua)
-- KEYS[3]  checkpoints  HASH  id -> checkpoint JSON
-- KEYS[4]  stats        HASH  counters (checkpoints, stale)
-- ARGV[1]  worker id
-- ARGV[2]  id
-- ARGV[3]  token
-- ARGV[4]  checkpoint JSON
-- Returns a code (0 OK, 3 STALE, 4 EXPIRED, 5 UNKNOWN)
--- @include "lib/codes"
--- @include "lib/leases"

local LK, checkpoints, stats = lease_keys(1), KEYS[3], KEYS[4]
local worker, id, token, value = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local state = lease_states(LK, {id}, {token}, worker, now_ms())[1]
if state == OK then
  redis.call('HSET', checkpoints, id, value)
  bump(stats, {checkpoints = 1})
else
  bump(stats, {stale = 1})
end
return state
