-- reclaim.lua: take back expired leases (their consumer died or stalled).
--
-- An expired task goes back to the head of its host's queue, with its attempts, and its
-- lease ends on its host's record (end_lease, lib/lease_end.lua: the slot back, the page
-- of its budget given back): whether its request went out is not known, so a consumer
-- that died after a response can let one more page than the budget reach the host. A task reclaimed more than max_stalls
-- times goes to `dead` with reason `stalled`, so a poison task that kills its consumer cannot crash-loop a fleet. The
-- caller names candidate ids (the head of `leases`) and their hosts; each is checked
-- here against Redis TIME, so the script is safe to run from every consumer at once.
--
-- KEYS[1..4] host state: hosts, due, h:queued, conf (lib/hosts.lua)
-- KEYS[5..6] lease state: leased, leases (lib/leases.lua)
-- KEYS[7]  stalls        HASH  id -> times reclaimed
-- KEYS[8]  tasks         HASH  id -> "<host> <priority> <entry>" (a dead task's body)
-- KEYS[9]  dead          ZSET
-- KEYS[10] errors        HASH
-- KEYS[11] dead_reasons  HASH
-- KEYS[12] stats         HASH  counters (reclaimed, dead, stalled)
-- KEYS[13] pending       STRING
-- KEYS[14] prio_hosts    ZSET
-- KEYS[15] h:errors      ZSET  host -> failed attempts
-- KEYS[16] attempts      HASH  id -> attempts of a task that is not leased
-- KEYS[17..19] group state: g:of, groups, g:parked (lib/groups.lua)
-- KEYS[20..] per host h (ARGV order): hq:<h> LIST, hp:<h> ZSET
-- ARGV[1]  max_stalls
-- ARGV[2]  H, the number of hosts; ARGV[3..2+H] the hosts
-- ARGV[3+H..] candidate ids
-- Returns {reclaimed, dead}
--- @include "lib/codes"
--- @include "lib/leases"
--- @include "lib/dead"
--- @include "lib/memory"
--- @include "lib/hosts"
--- @include "lib/lease_end"
--- @include "lib/queues"
--- @include "lib/groups"

local LK = lease_keys(5)
local stalls, tasks, dead, errors = KEYS[7], KEYS[8], KEYS[9], KEYS[10]
local dead_reasons, stats, pending, prio_hosts = KEYS[11], KEYS[12], KEYS[13], KEYS[14]
local errors_by_host, attempts = KEYS[15], KEYS[16]
local max_stalls = int_arg(ARGV[1], 'max_stalls')
if max_stalls < 0 then error('crawlq: reclaim needs max_stalls >= 0') end
local hosts, nhosts = argv_hosts(2)
if #KEYS ~= 19 + 2 * nhosts then error('crawlq: reclaim needs 2 keys per host') end
local qkeys = host_queue_keys(20, hosts)
allow_at_maxmemory(stats)
local now = now_ms()
local L = ledger(host_keys(1), now)
ledger_groups(L, group_keys(17))
local ids = {}
for i = 3 + nhosts, #ARGV do ids[#ids + 1] = ARGV[i] end
local values, deadlines = {}, {}
if #ids > 0 then
  values = call_sliced('HMGET', LK.leased, ids, 1000)
  deadlines = call_sliced('ZMSCORE', LK.leases, ids, 1000)
end
local back, gone, ended, stalled_by_host, seen, died = {}, {}, {}, {}, {}, 0
for i, id in ipairs(ids) do
  local rec, deadline = lease_decode(values[i]), tonumber(deadlines[i])
  if rec and deadline and deadline <= now and qkeys[rec.host] and not seen[id] then
    seen[id] = true
    gone[#gone + 1] = id
    local _, reserved, grouped = owner_marks(rec.owner)
    ended[#ended + 1] = {rec.host, {slot = not fetched_owner(rec.owner), reserved = reserved,
                                    group = grouped}}
    redis.call('HSET', attempts, id, rec.attempt)
    local stalled = redis.call('HINCRBY', stalls, id, 1)
    if stalled > max_stalls then
      redis.call('HSET', tasks, id, rec.host .. ' ' .. rec.prio .. ' ' .. rec.entry)
      to_dead(dead, errors, dead_reasons, id, 'stalled',
        'lease expired ' .. stalled .. ' times (consumer died or hung)', now)
      stalled_by_host[rec.host] = (stalled_by_host[rec.host] or 0) + 1
      died = died + 1
    else
      back[#back + 1] = {rec.host, rec.prio, rec.entry}
    end
  end
end
drop_leases(LK, gone)
local touched = {}
for _, e in ipairs(ended) do touched[#touched + 1] = e[1] end
ledger_load(L, touched)
groups_load_ended(L, ended)
for _, e in ipairs(ended) do end_lease(L, e[1], e[2]) end
for host, n in pairs(stalled_by_host) do redis.call('ZINCRBY', errors_by_host, n, host) end
requeue_entries(L, back, qkeys, prio_hosts, pending, true)
ledger_flush(L)
bump(stats, {reclaimed = #back, dead = died, stalled = died})
return {#back, died}
