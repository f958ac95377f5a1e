-- fsck_groups.lua: set the slot counts of some politeness groups right from the lease
-- records (`crawlq fsck --repair`, console/fsck_groups.py).
--
-- A group's inflight becomes the number of lease records marked "g" (a slot of its
-- host's group) without the fetched mark whose host is in the group (g:of). O(leases).
-- The records change through the host ledger with groups (lib/groups.lua), whose flush
-- brings back the hosts parked on a group that has a free slot again. Atomic: one call
-- reads and fixes one consistent state of its partition, so it is safe on a running crawl.
--
-- KEYS[1..4] host state: hosts, due, h:queued, conf (lib/hosts.lua)
-- KEYS[5..7] group state: g:of, groups, g:parked (lib/groups.lua)
-- KEYS[8]  leased       HASH  id -> lease record: only read
-- ARGV[1..] the groups
-- Returns the number of groups whose count changed
--- @include "lib/codes"
--- @include "lib/leases"
--- @include "lib/hosts"
--- @include "lib/groups"

local leased = KEYS[8]
local L = ledger(host_keys(1), now_ms())
ledger_groups(L, group_keys(5))
local want, groups = {}, {}
for i = 1, #ARGV do
  groups[i] = ARGV[i]
  want[ARGV[i]] = 0
end
local hosts, held, cursor = {}, {}, '0'
repeat
  local page = redis.call('HSCAN', leased, cursor, 'COUNT', 1000)
  cursor = page[1]
  local kv = page[2]
  for k = 1, #kv, 2 do
    local rec = lease_decode(kv[k + 1])
    if rec and not fetched_owner(rec.owner) then
      local _, _, grouped = owner_marks(rec.owner)
      if grouped and not held[kv[k]] then
        held[kv[k]] = true
        hosts[#hosts + 1] = rec.host
      end
    end
  end
until cursor == '0'
if #hosts > 0 then groups_load(L, hosts) end
for _, host in ipairs(hosts) do
  local g = L.G.of[host]
  if g and want[g] then want[g] = want[g] + 1 end
end
local fixed = 0
for _, g in ipairs(groups) do
  local value = redis.call('HGET', L.G.K.groups, g)
  local r = L.G.rec[g] or group_decode(value, g)
  L.G.rec[g] = r
  if r.inflight ~= want[g] then
    r.inflight = want[g]
    group_touch(L, g)
    fixed = fixed + 1
  end
end
ledger_flush(L)
return fixed
