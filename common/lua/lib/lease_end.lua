-- lib/lease_end.lua: the end of a lease on its host's record, the one place it is written
-- (ack, fail, release, reclaim).
-- Includes lib/hosts (the host ledger), lib/groups.
--- @include "lib/hosts"
--- @include "lib/groups"

-- The weight of a response's time in its host's moving average (`lat`).
local LAT_WEIGHT = 0.3

-- Settles one ended lease on its host's record, in ledger `L` (the host loaded). `e`:
--   slot      its host's slot is still taken (not given back when its response came in)
--   reserved  it held a page of its host's budget: given back, and counted used if
--             `responded` (its request got a response, any status)
--   sent      Redis ms its request went out when later than its turn (0: on time): the
--             host's last request moves to then, so its next turn counts from it
--   elapsed   its response's time (ms, -1: none): joins the host's moving average while
--             the crawl's adaptive_delay is on
--   done      it was acked: one more page done
--   group     it held a slot of its host's group (lib/groups.lua; the ledger's groups
--             given): given back with the host's, its `sent` moving the group's last too
local function end_lease(L, host, e)
  local r = L.rec[host]
  if e.slot and r.inflight > 0 then r.inflight = r.inflight - 1 end
  if e.group then group_slot_back(L, host, e.slot, e.sent) end
  if e.reserved then
    if r.reserved > 0 then r.reserved = r.reserved - 1 end
    if e.responded then r.used = r.used + 1 end
  end
  if e.sent and e.sent > r.last then r.last = e.sent end
  if e.elapsed and e.elapsed >= 0 and ledger_conf(L).adapt > 0 then
    r.lat = r.lat and math.floor(r.lat + LAT_WEIGHT * (e.elapsed - r.lat) + 0.5) or e.elapsed
  end
  if e.done then r.done = r.done + 1 end
  ledger_touch(L, host)
end
