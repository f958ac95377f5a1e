-- fsck_repair.lua: recount the frontier state of some hosts from what is really there
-- (`crawlq fsck --repair`, console/fsck.py).
--
-- For each host given: h:queued becomes the entries its queues hold (LLEN hq + ZCARD
-- hp), `pending` moves by the same difference, and its `prio_hosts` entry follows the
-- head of its priority queue. With inflight = 1, h:inflight is recounted for every host
-- of the partition from `leases` and the hosts their bodies in `tasks` name, less the
-- leases whose response is in (their `owners` entry marked fetched, lib/leases.lua) (O(leases)).
-- With pending = 1, `pending` becomes the sum of h:queued once the hosts are recounted
-- (O(hosts with work)). Then every host given or recounted is put in `due` or taken out
-- as every transition does (refresh_hosts, lib/hosts.lua). A host counted with more entries
-- than its queues hold adds to `repaired_hosts`, the missing entries to `lost_pending`
-- (what lease.lua counts when it finds a host's queue short). Atomic: one call reads
-- and fixes one consistent state of its partition, so it is safe on a running crawl.
--
-- KEYS[1..6] host state: due, h:queued, h:inflight, h:last, hostconf, conf (lib/hosts.lua)
-- KEYS[7]  pending      STRING pending tasks
-- KEYS[8]  prio_hosts   ZSET  host -> -highest pending priority
-- KEYS[9]  leases       ZSET  id -> deadline (ms): only read
-- KEYS[10] tasks        HASH  id -> "<host> <priority> <entry>": only read
-- KEYS[11] owners       HASH  id -> "[f]<token>:<worker>": only read
-- KEYS[12] stats        HASH  counters (repaired_hosts, lost_pending)
-- KEYS[13..] per host h (ARGV order): hq:<h> LIST, hp:<h> ZSET
-- ARGV[1]  inflight, 1 to recount h:inflight from the leases, else 0
-- ARGV[2]  pending, 1 to set pending to the sum of h:queued, else 0
-- ARGV[3]  H, the number of hosts; ARGV[4..3+H] the hosts
-- Returns {recounted, lost, inflight_fixed, pending_before, pending_after, due_added,
--          due_removed}:
--   recounted       hosts whose h:queued changed
--   lost            entries counted in h:queued that no queue held
--   inflight_fixed  hosts whose h:inflight changed
--- @include "lib/codes"
--- @include "lib/leases"
--- @include "lib/memory"
--- @include "lib/hosts"
--- @include "lib/queues"

local pending, prio_hosts, leases, tasks = KEYS[7], KEYS[8], KEYS[9], KEYS[10]
local owners, stats = KEYS[11], KEYS[12]
local recount_inflight = int_arg(ARGV[1], 'inflight') == 1
local recount_pending = int_arg(ARGV[2], 'pending') == 1
local hosts, nhosts = argv_hosts(3)
if #KEYS ~= 12 + 2 * nhosts then error('crawlq: fsck_repair needs 2 keys per host') end
allow_at_maxmemory(stats)

local pending_before = tonumber(redis.call('GET', pending)) or 0
local touched, qargs, recounted, lost, delta = {}, {}, 0, 0, 0
local counted = {}
if nhosts > 0 then counted = call_sliced('ZMSCORE', H.queued, hosts, 1000) end
for i, host in ipairs(hosts) do
  local hq, hp = KEYS[11 + 2 * i], KEYS[12 + 2 * i]
  local held = redis.call('LLEN', hq) + redis.call('ZCARD', hp)
  local was = tonumber(counted[i])
  if was ~= held and not (was == nil and held == 0) then
    qargs[#qargs + 1] = held
    qargs[#qargs + 1] = host
    recounted = recounted + 1
    if was and was > held then lost = lost + was - held end
    delta = delta + held - (was or 0)
  end
  refresh_prio(prio_hosts, hp, host)
  touched[#touched + 1] = host
end
if #qargs > 0 then call_sliced('ZADD', H.queued, qargs, 1000) end

local inflight_fixed = 0
if recount_inflight then
  local count, total = {}, redis.call('ZCARD', leases)
  for start = 0, total - 1, 1000 do
    local ids = redis.call('ZRANGE', leases, start, start + 999)
    if #ids == 0 then break end
    local values = redis.call('HMGET', tasks, unpack(ids))
    local held = redis.call('HMGET', owners, unpack(ids))
    for k = 1, #ids do
      local host = split_value(values[k])
      if host and not fetched_owner(held[k]) then count[host] = (count[host] or 0) + 1 end
    end
  end
  local listed = redis.call('ZRANGEBYSCORE', H.inflight, '(0', '+inf', 'WITHSCORES')
  local old = {}
  for k = 1, #listed, 2 do old[listed[k]] = tonumber(listed[k + 1]) end
  local args = {}
  for host, n in pairs(old) do
    if (count[host] or 0) ~= n then
      args[#args + 1] = count[host] or 0
      args[#args + 1] = host
    end
  end
  for host, n in pairs(count) do
    if not old[host] then
      args[#args + 1] = n
      args[#args + 1] = host
    end
  end
  for k = 2, #args, 2 do touched[#touched + 1] = args[k] end
  inflight_fixed = #args / 2
  if #args > 0 then call_sliced('ZADD', H.inflight, args, 1000) end
end

local pending_after = pending_before + delta
if recount_pending then
  pending_after = 0
  local listed = redis.call('ZRANGEBYSCORE', H.queued, '(0', '+inf', 'WITHSCORES')
  for k = 2, #listed, 2 do pending_after = pending_after + tonumber(listed[k]) end
end
if pending_after < 0 then pending_after = 0 end
if pending_after ~= pending_before then redis.call('SET', pending, pending_after) end

touched = unique(touched)
local added, removed = 0, 0
if #touched > 0 then
  local before = call_sliced('ZMSCORE', H.due, touched, 1000)
  refresh_hosts(touched)
  local after = call_sliced('ZMSCORE', H.due, touched, 1000)
  for k = 1, #touched do
    if before[k] and not after[k] then removed = removed + 1 end
    if after[k] and not before[k] then added = added + 1 end
  end
end
bump(stats, {repaired_hosts = recounted, lost_pending = lost})
return {recounted, lost, inflight_fixed, pending_before, pending_after, added, removed}
