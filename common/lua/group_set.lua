-- group_set.lua: change one politeness group's delay or concurrency while the crawl runs
-- (`crawlq hosts group-set`): its own settings override the crawl's group_delay and
-- group_concurrency until cleared.
--
-- A raised concurrency brings the hosts parked on the group back to `due` at once (the
-- ledger's flush, lib/groups.lua). A changed delay takes effect at the group's next turn:
-- a host already in `due` keeps its place there (a longer delay is found by the lease
-- call, which reads the group's record, and moves the host; a shorter one serves the host
-- at its old place: later, never sooner).
--
-- KEYS[1..4] host state: hosts, due, h:queued, conf (lib/hosts.lua)
-- KEYS[5..7] group state: g:of, groups, g:parked (lib/groups.lua)
-- ARGV[1]  group
-- ARGV[2..] pairs: setting, value. Settings: delay (ms), concurrency (0 = no limit);
--           value -1 clears it (back to the crawl's)
-- Returns the group's record after the change: "last,inflight,delay,conc,blocked" ('' for
--   a setting not its own)
--- @include "lib/codes"
--- @include "lib/hosts"
--- @include "lib/groups"

local group = ARGV[1]
if not group or group == '' or string.find(group, '%s') then
  error('crawlq: group_set needs a group')
end
if #ARGV % 2 ~= 1 then error('crawlq: group_set needs (setting, value) pairs') end
local L = ledger(host_keys(1), now_ms())
ledger_groups(L, group_keys(5))
local value = redis.call('HGET', L.G.K.groups, group)
local g = group_decode(value or nil, group)
L.G.rec[group] = g
local fields = {delay = 'delay', concurrency = 'conc'}
for i = 2, #ARGV, 2 do
  local name, v = ARGV[i], int_arg(ARGV[i + 1], ARGV[i])
  if not fields[name] then error('crawlq: unknown group setting ' .. name) end
  if v < -1 then error('crawlq: ' .. name .. ' must be >= 0, or -1 to clear it') end
  g[fields[name]] = v >= 0 and v or nil
end
group_touch(L, group)
ledger_flush(L)
local function s(v) return v and string.format('%d', v) or '' end
return s(g.last) .. ',' .. s(g.inflight) .. ',' .. s(g.delay) .. ',' .. s(g.conc) .. ','
  .. s(g.blocked)
