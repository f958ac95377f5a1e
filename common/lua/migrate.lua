-- migrate.lua: convert one partition of a live crawl from layout 2 to layout 3, in one
-- atomic step (common/queue/migrate.py runs it on every partition, then marks the crawl).
--
-- Layout 2 kept a host's state in five places: the ZSETs h:queued, h:inflight, h:last and
-- h:done (host -> number) and the HASH hostconf (host -> "delay,conc,budget,used,blocked,
-- robots,reserved[,level,pace,pb_at,pb_done,fade,pushbacks,lat]", '' = unset; 6, 7 or
-- 14 fields); and a lease in three: owners (id -> "[f][b]<token>:<worker>"), tasks
-- (id -> "<host> <priority> <entry>") and attempts (id -> attempts). Layout 3 keeps one
-- record per host (`hosts`, lib/hosts.lua's host_encode) and one per lease (`leased`,
-- lib/leases.lua's lease_value). Here every host named by h:queued, h:inflight, h:last,
-- h:done or hostconf gets its record, and every id of owners its lease record (its
-- attempt 1 when attempts holds none); those ids' tasks and attempts fields are deleted
-- (a waiting or dead task keeps its body and attempts); then h:inflight, h:last, h:done,
-- hostconf and owners are deleted. h:queued stays (the records' index), and so do `due`
-- (the due rule is the same), the leases' deadlines, the host queues and every other key.
--
-- Idempotent: a host that has a record already and an id that has a lease record already
-- are left as they are (layout 3 wrote them), so on a converted partition, where the old
-- keys are gone and h:queued names only hosts with records, nothing changes. An id of
-- owners whose body is missing or malformed can't become a lease record: its fields are
-- left as they are (and its lease to expire unreclaimed: crawlq fsck reports it).
--
-- KEYS[1..4] host state: hosts, due, h:queued, conf (lib/hosts.lua)
-- KEYS[5]  leased      HASH  id -> "<owner> <attempt> <host> <priority> <entry>"
-- KEYS[6]  tasks       HASH  id -> "<host> <priority> <entry>"
-- KEYS[7]  attempts    HASH  id -> attempts so far
-- KEYS[8]  h:inflight  ZSET  layout 2: host -> leases whose response is not in
-- KEYS[9]  h:last      ZSET  layout 2: host -> last request start (ms)
-- KEYS[10] h:done      ZSET  layout 2: host -> tasks done
-- KEYS[11] hostconf    HASH  layout 2: host -> its settings and push-back state (CSV)
-- KEYS[12] owners      HASH  layout 2: id -> "[f][b]<token>:<worker>"
-- ARGV none
-- Returns {hosts converted, hosts kept (a record already), leases converted, leases
--          kept (a record already), leases left without a body}
--- @include "lib/codes"
--- @include "lib/memory"
--- @include "lib/hosts"
--- @include "lib/leases"
--- @include "lib/queues"

local HK = host_keys(1)
local leased, tasks, attempts = KEYS[5], KEYS[6], KEYS[7]
local old_inflight, old_last, old_done = KEYS[8], KEYS[9], KEYS[10]
local hostconf, owners = KEYS[11], KEYS[12]
if #KEYS ~= 12 or #ARGV ~= 0 then
  error('crawlq: migrate needs 12 keys (host state, leased, tasks, attempts, h:inflight, '
    .. 'h:last, h:done, hostconf, owners) and no ARGV')
end

-- Phase 1: every host the old keys name, and what each key holds of it (no table per
-- host: a partition may hold hundreds of thousands).
local order, named = {}, {}
local function read_counts(zset)
  local flat, counts = redis.call('ZRANGE', zset, 0, -1, 'WITHSCORES'), {}
  for i = 1, #flat, 2 do
    local host = flat[i]
    counts[host] = tonumber(flat[i + 1]) or 0
    if not named[host] then
      named[host] = true
      order[#order + 1] = host
    end
  end
  return counts
end
local queued, inflight = read_counts(HK.queued), read_counts(old_inflight)
local last, done = read_counts(old_last), read_counts(old_done)
local confs = {}
local flat = redis.call('HGETALL', hostconf)
for i = 1, #flat, 2 do
  local host = flat[i]
  confs[host] = flat[i + 1]
  if not named[host] then
    named[host] = true
    order[#order + 1] = host
  end
end
flat = nil

-- A host's record from the old keys; hostconf as the old conf_decode read it: '' (or a
-- field not there) is unset.
local CONF = {'delay', 'conc', 'budget', 'used', 'blocked', 'robots', 'reserved', 'level',
              'pace', 'pb_at', 'pb_done', 'fade', 'pushbacks', 'lat'}
local function record(host)
  local r = host_decode(nil, host)
  r.queued, r.inflight = queued[host] or 0, inflight[host] or 0
  r.last, r.done = last[host] or 0, done[host] or 0
  local conf = confs[host]
  if conf then
    local k = 1
    for v in string.gmatch(conf .. ',', '([^,]*),') do
      local name = CONF[k]
      if not name then break end
      local n = tonumber(v)
      if n then r[name] = n end
      k = k + 1
    end
  end
  return r
end

-- Phase 2: the records, but for hosts that have one already; 1000 hosts a step.
local hosts_done, hosts_kept = 0, 0
for first = 1, #order, 1000 do
  local slice = {unpack(order, first, math.min(first + 999, #order))}
  local have = redis.call('HMGET', HK.hosts, unpack(slice))
  local args = {}
  for i, host in ipairs(slice) do
    if have[i] then
      hosts_kept = hosts_kept + 1
    else
      args[#args + 1] = host
      args[#args + 1] = host_encode(record(host))
      hosts_done = hosts_done + 1
    end
  end
  if #args > 0 then redis.call('HSET', HK.hosts, unpack(args)) end
end

-- Phase 3: a lease record of each owned id, from its owner, body and attempts.
local ids, owner_of = {}, {}
flat = redis.call('HGETALL', owners)
for i = 1, #flat, 2 do
  if flat[i] ~= HASHTABLE_FIELD and flat[i] ~= LEGACY_HASHTABLE_FIELD then
    ids[#ids + 1] = flat[i]
    owner_of[#ids] = flat[i + 1]
  end
end
local leases_done, leases_kept, no_body = 0, 0, 0
if #ids > 0 then
  local have = call_sliced('HMGET', leased, ids, 1000)
  local bodies = call_sliced('HMGET', tasks, ids, 1000)
  local counts = call_sliced('HMGET', attempts, ids, 1000)
  local records, moved = {}, {}
  for i, id in ipairs(ids) do
    local host, prio, entry = split_value(bodies[i])
    if have[i] then
      leases_kept = leases_kept + 1
    elseif not host then
      no_body = no_body + 1
    else
      local attempt = math.floor(tonumber(counts[i]) or 1)
      records[#records + 1] = id
      records[#records + 1] = lease_value(owner_of[i], attempt, host, prio, entry)
      moved[#moved + 1] = id
      leases_done = leases_done + 1
    end
  end
  if #records > 0 then
    force_hashtable(leased)
    call_sliced('HSET', leased, records, 1000)
    call_sliced('HDEL', tasks, moved, 1000)
    call_sliced('HDEL', attempts, moved, 1000)
  end
end

-- Phase 4: the old keys go (UNLINK: a big key is freed in the background, not here), and
-- so does the hashtable field of `attempts`: lease reads it only while it exists.
redis.call('UNLINK', old_inflight, old_last, old_done, hostconf, owners)
redis.call('HDEL', attempts, HASHTABLE_FIELD, LEGACY_HASHTABLE_FIELD)
return {hosts_done, hosts_kept, leases_done, leases_kept, no_body}
