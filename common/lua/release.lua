-- release.lua: hand leased tasks back without counting an attempt (graceful shutdown, a
-- robots.txt fetch that took the task's turn (late_turn.lua), a page the sink did not
-- take).
--
-- The task goes back to the head of its host's queue, so the host's next turn serves it
-- instead of waiting for the lease to expire; the host gets its slot back, and the page
-- of its budget the lease held (settle_pages, lib/hosts.lua): a release is not a page.
--
-- KEYS[1..4] host state: hosts, due, h:queued, conf (lib/hosts.lua)
-- KEYS[5..6] lease state: leased, leases (lib/leases.lua)
-- KEYS[7]  attempts    HASH  id -> attempts of a task that is not leased
-- KEYS[8]  stats       HASH  counters (released, stale)
-- KEYS[9]  pending     STRING
-- KEYS[10] prio_hosts  ZSET
-- KEYS[11..13] group state: g:of, groups, g:parked (lib/groups.lua)
-- KEYS[14..] per host h (ARGV order): hq:<h> LIST, hp:<h> ZSET
-- ARGV[1]  worker id
-- ARGV[2]  H, the number of hosts; ARGV[3..2+H] the hosts of the tasks
-- ARGV[3+H] restart: 1 = the hosts' last request was just now (a page fetched that the
--           sink did not take): their next turn (and their groups') is a full delay from
--           now, or later if one was leased later; 0 = as is
-- ARGV[4+H..] pairs: id, token
-- Returns {code per item} (0 OK, 3 STALE, 4 EXPIRED, 5 UNKNOWN)
--- @include "lib/codes"
--- @include "lib/leases"
--- @include "lib/memory"
--- @include "lib/hosts"
--- @include "lib/lease_end"
--- @include "lib/queues"
--- @include "lib/groups"

local LK = lease_keys(5)
local attempts, stats, pending, prio_hosts = KEYS[7], KEYS[8], KEYS[9], KEYS[10]
local worker = ARGV[1]
local hosts, nhosts = argv_hosts(2)
local restart = ARGV[3 + nhosts] == '1'
local first = 4 + nhosts
if (#ARGV - first + 1) % 2 ~= 0 or #KEYS ~= 13 + 2 * nhosts then
  error('crawlq: release needs 2 keys per host and (id, token) pairs')
end
local qkeys = host_queue_keys(14, hosts)
allow_at_maxmemory(stats)
local now = now_ms()
local L = ledger(host_keys(1), now)
ledger_groups(L, group_keys(11))
local ids, tokens = {}, {}
for i = first, #ARGV, 2 do
  ids[#ids + 1] = ARGV[i]
  tokens[#tokens + 1] = ARGV[i + 1]
end
local states, recs = {}, {}
if #ids > 0 then states, recs = lease_states(LK, ids, tokens, worker, now) end
local codes, back, gone, ended, seen, stale = {}, {}, {}, {}, {}, 0
for i, id in ipairs(ids) do
  local state, rec = states[i], recs[i]
  if state == OK and (seen[id] or not qkeys[rec.host]) then state = UNKNOWN end
  if state == OK then
    seen[id] = true
    gone[#gone + 1] = id
    local _, reserved, grouped = owner_marks(rec.owner)
    ended[#ended + 1] = {rec.host, {slot = not fetched_owner(rec.owner), reserved = reserved,
                                    group = grouped}}
    if rec.attempt > 1 then redis.call('HSET', attempts, id, rec.attempt - 1) end
    back[#back + 1] = {rec.host, rec.prio, rec.entry}
  else
    stale = stale + 1
  end
  codes[#codes + 1] = state
end
drop_leases(LK, gone)
local touched = {}
for _, e in ipairs(ended) do touched[#touched + 1] = e[1] end
ledger_load(L, touched)
groups_load_ended(L, ended)
for _, e in ipairs(ended) do
  end_lease(L, e[1], e[2])
  if restart then
    local r = L.rec[e[1]]
    if now > r.last then r.last = now end  -- never back past a turn leased ahead
    local g, gr = group_on(L, e[1])
    if g and now > gr.last then
      gr.last = now
      group_touch(L, g)
    end
  end
end
requeue_entries(L, back, qkeys, prio_hosts, pending, true)
ledger_flush(L)
bump(stats, {released = #back, stale = stale})
return codes
