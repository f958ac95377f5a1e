-- late_turn.lua: a request under a lease that goes out late takes a turn of its host (and of
-- its host's politeness group) of its own.
--
-- A lease's turn is when its request was to start, and a host whose concurrency is above
-- one may lease its next turn, timed a delay after it, before that request goes out. Two
-- requests go out late: robots.txt, looked up first (the fleet's copy in Redis, a lock)
-- and made under the lease of the page that needed it, and a page that waited for
-- another consumer's robots.txt lookup. Sent late at the lease's turn, either would
-- follow, or be followed by, another request too closely. So it takes a turn: at once
-- (not before the lease's turn) when no later turn of its host or group was leased nor a
-- later request noted, else a full delay after the latest. The host's last request (and
-- its group's) moves to that turn, so turns leased from now on count from it. The
-- request is made under the lease's slot. A page whose robots.txt this consumer fetched
-- under its lease (that request took the lease's turn) takes its turn the same way, with
-- `after_ms`: a full delay after that request (or after the latest turn, if later), so the
-- page is not handed back (release.lua) to be leased again.
--
-- KEYS[1..4] host state: hosts, due, h:queued, conf (lib/hosts.lua)
-- KEYS[5..6] lease state: leased, leases (lib/leases.lua)
-- KEYS[7..9] group state: g:of, groups, g:parked (lib/groups.lua)
-- KEYS[10] stats  HASH  counters (late_turns, stale)
-- ARGV[1]  worker id
-- ARGV[2]  id of the lease's task
-- ARGV[3]  token
-- ARGV[4]  the lease's turn (Redis ms: Lease.granted_ms)
-- ARGV[5]  after_ms: when a request made under this lease went (Redis ms, on the turns'
--          clock), which this one must follow by a full delay; 0 for none
-- Returns {code, turn_ms, now_ms}: code 0 OK (the request starts at turn_ms, Redis ms;
-- now_ms is this call's TIME), else 3 STALE, 4 EXPIRED, 5 UNKNOWN (the lease is not
-- held: nothing moved, no request may be made)
--- @include "lib/codes"
--- @include "lib/leases"
--- @include "lib/memory"
--- @include "lib/hosts"
--- @include "lib/groups"

local LK, stats = lease_keys(5), KEYS[10]
local worker, id, token, turn = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4])
local after = tonumber(ARGV[5])
if not turn or not after then error('crawlq: late_turn needs the lease turn and after_ms') end
allow_at_maxmemory(stats)
local now = now_ms()
local states, recs = lease_states(LK, {id}, {token}, worker, now)
if states[1] ~= OK then
  bump(stats, {stale = 1})
  return {states[1], 0, now}
end
local host = recs[1].host
local L = ledger(host_keys(1), now)
ledger_groups(L, group_keys(7))
local r = ledger_get(L, host)
local cc = ledger_conf(L)
local at = math.max(now, turn)
-- r.last is the lease's own turn unless a later one was leased (or a late request of the
-- host's was noted): only then does this request wait a delay after it.
if r.last > turn then at = math.max(at, r.last + (host_limits(r, cc, now))) end
if after > 0 then at = math.max(at, math.max(r.last, after) + (host_limits(r, cc, now))) end
local g, gr = group_on(L, host)
if g then
  if gr.last > turn then at = math.max(at, gr.last + (group_limits(gr, cc))) end
  if after > 0 then at = math.max(at, math.max(gr.last, after) + (group_limits(gr, cc))) end
  if at > gr.last then gr.last = at end
  group_touch(L, g)
end
if at > r.last then r.last = at end
ledger_touch(L, host)
ledger_flush(L)
bump(stats, {late_turns = 1})
return {OK, at, now}
