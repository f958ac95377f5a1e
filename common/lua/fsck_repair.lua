-- fsck_repair.lua: set the records of some hosts right from what is really there
-- (`crawlq fsck --repair`, console/fsck.py).
--
-- For each host given: a record of the wrong size (unreadable: every script that meets
-- it stops) is rebuilt from the indexes that copy its settings (h:delay, h:blocked,
-- h:budget; its concurrency, pages used and push-back state are lost), its counts taken
-- from what is there and `pending` recounted. Otherwise its queued count becomes the
-- entries its queues hold (LLEN hq + ZCARD hp), `pending` moving by the same difference.
-- Its `prio_hosts` entry follows the head of its priority queue. With inflight = 1 (or
-- a record rebuilt), its inflight becomes its lease records without the fetched mark and
-- its reserved those with the budget mark (lib/leases.lua; O(leases)). The records
-- change through the host ledger, whose flush puts every host given in `due` or takes it
-- out by the due rule (lib/hosts.lua); then its h:queued entry is set to its record's
-- count where it differs. With pending = 1, `pending` becomes the sum of h:queued (O(hosts
-- with work)) and `r:pending` (the render lane's entries: lib/render.lua). A host counted with more entries than its queues hold adds to
-- `repaired_hosts`, the missing entries to `lost_pending` (what lease.lua counts when it
-- finds a host's queue short). Atomic: one call reads and fixes one consistent state of
-- its partition, so it is safe on a running crawl.
--
-- KEYS[1..4] host state: hosts, due, h:queued, conf (lib/hosts.lua)
-- KEYS[5]  pending      STRING pending tasks
-- KEYS[6]  prio_hosts   ZSET  host -> -highest pending priority
-- KEYS[7]  leased       HASH  id -> lease record: only read
-- KEYS[8]  h:delay      ZSET  host -> its delay (ms): only read
-- KEYS[9]  h:blocked    ZSET  host -> blocked until (ms): only read
-- KEYS[10] h:budget     ZSET  host -> its page budget: only read
-- KEYS[11] stats        HASH  counters (repaired_hosts, lost_pending)
-- KEYS[12] r:pending    STRING render entries pending: only read
-- KEYS[13..] per host h (ARGV order): hq:<h> LIST, hp:<h> ZSET
-- ARGV[1]  inflight, 1 to recount the hosts' inflight and reserved from the leases,
--          else 0
-- ARGV[2]  pending, 1 to set pending to the sum of h:queued, else 0
-- ARGV[3]  H, the number of hosts; ARGV[4..3+H] the hosts
-- Returns {recounted, lost, leases_fixed, index_fixed, rebuilt, pending_before,
--          pending_after, due_added, due_removed}:
--   recounted     hosts whose queued count changed
--   lost          entries counted queued that no queue held
--   leases_fixed  hosts whose inflight or reserved count changed
--   index_fixed   hosts whose h:queued entry was set to their record's count
--   rebuilt       records of the wrong size rebuilt
--- @include "lib/codes"
--- @include "lib/leases"
--- @include "lib/memory"
--- @include "lib/hosts"
--- @include "lib/queues"

local pending, prio_hosts, leased = KEYS[5], KEYS[6], KEYS[7]
local delays, blocks, budgets, stats = KEYS[8], KEYS[9], KEYS[10], KEYS[11]
local recount_leases = int_arg(ARGV[1], 'inflight') == 1
local recount_pending = int_arg(ARGV[2], 'pending') == 1
local hosts, nhosts = argv_hosts(3)
if #KEYS ~= 12 + 2 * nhosts then error('crawlq: fsck_repair needs 2 keys per host') end
allow_at_maxmemory(stats)
local L = ledger(host_keys(1), now_ms())

-- A record ledger_load can't decode is written anew, by hand: no script can read it.
local rebuilt, fresh = 0, {}
local values = {}
if nhosts > 0 then values = call_sliced('HMGET', L.K.hosts, hosts, 1000) end
for i, host in ipairs(hosts) do
  if values[i] and #values[i] ~= HOST_BYTES then
    local r = host_decode(nil, host)
    r.delay = tonumber(redis.call('ZSCORE', delays, host))
    r.blocked = tonumber(redis.call('ZSCORE', blocks, host)) or 0
    r.budget = tonumber(redis.call('ZSCORE', budgets, host))
    redis.call('HSET', L.K.hosts, host, host_encode(r))
    rebuilt = rebuilt + 1
    fresh[host] = true
  end
end
if rebuilt > 0 then recount_leases, recount_pending = true, true end
ledger_load(L, hosts)

local pending_before = tonumber(redis.call('GET', pending)) or 0
local recounted, lost, delta = 0, 0, 0
for i, host in ipairs(hosts) do
  local hp = KEYS[12 + 2 * i]
  local held = redis.call('LLEN', KEYS[11 + 2 * i]) + redis.call('ZCARD', hp)
  local r = L.rec[host]
  if fresh[host] then
    r.queued = held
    ledger_touch(L, host)
  elseif r.queued ~= held then
    if r.queued > held then lost = lost + r.queued - held end
    delta = delta + held - r.queued
    r.queued = held
    recounted = recounted + 1
    ledger_touch(L, host)
  end
  refresh_prio(prio_hosts, hp, host)
  ledger_reschedule(L, host)
end

local leases_fixed = 0
if recount_leases and nhosts > 0 then
  local inflight, reserved, seen = {}, {}, {}
  local cursor = '0'
  repeat
    local page = redis.call('HSCAN', leased, cursor, 'COUNT', 1000)
    cursor = page[1]
    local kv = page[2]
    for k = 1, #kv, 2 do
      local rec = not seen[kv[k]] and lease_decode(kv[k + 1])
      seen[kv[k]] = true
      if rec then
        local _, budgeted = owner_marks(rec.owner)
        local h = rec.host
        if not fetched_owner(rec.owner) then inflight[h] = (inflight[h] or 0) + 1 end
        if budgeted then reserved[h] = (reserved[h] or 0) + 1 end
      end
    end
  until cursor == '0'
  for _, host in ipairs(hosts) do
    local r = L.rec[host]
    local n, b = inflight[host] or 0, reserved[host] or 0
    if r.inflight ~= n or r.reserved ~= b then
      r.inflight, r.reserved = n, b
      leases_fixed = leases_fixed + 1
      ledger_touch(L, host)
    end
  end
end

local before, after = {}, {}
if nhosts > 0 then before = call_sliced('ZMSCORE', L.K.due, hosts, 1000) end
ledger_flush(L)
local index_fixed = 0
if nhosts > 0 then
  after = call_sliced('ZMSCORE', L.K.due, hosts, 1000)
  -- The flush writes the index of the counts it changed; an index wrong on its own is
  -- written here.
  local listed = call_sliced('ZMSCORE', L.K.queued, hosts, 1000)
  local qargs = {}
  for i, host in ipairs(hosts) do
    local want, have = L.rec[host].queued, tonumber(listed[i])
    if have ~= want and (have or want ~= 0) then
      qargs[#qargs + 1] = want
      qargs[#qargs + 1] = host
    end
  end
  index_fixed = #qargs / 2
  if #qargs > 0 then call_sliced('ZADD', L.K.queued, qargs, 1000) end
end
local added, removed = 0, 0
for i = 1, nhosts do
  if before[i] and not after[i] then removed = removed + 1 end
  if after[i] and not before[i] then added = added + 1 end
end

local pending_after = pending_before + delta
if recount_pending then
  pending_after = tonumber(redis.call('GET', KEYS[12]) or '0')
  local listed = redis.call('ZRANGEBYSCORE', L.K.queued, '(0', '+inf', 'WITHSCORES')
  for k = 2, #listed, 2 do pending_after = pending_after + tonumber(listed[k]) end
end
if pending_after < 0 then pending_after = 0 end
if pending_after ~= pending_before then redis.call('SET', pending, pending_after) end
bump(stats, {repaired_hosts = recounted, lost_pending = lost})
return {recounted, lost, leases_fixed, index_fixed, rebuilt, pending_before, pending_after,
        added, removed}
