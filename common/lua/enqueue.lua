-- enqueue.lua: dedup (exact) and enqueue a batch of new tasks into their hosts' queues.
--
-- A URL is seen from the moment it is enqueued. Its seen mark holds the enqueue time
-- (s of Redis TIME) while the task lives, and -(the time it ended) once it is done or
-- purged (ack.lua, purge.lua). It is enqueued again only when the crawl has a recrawl
-- window and it ended longer ago than that: a live task (pending, leased, waiting,
-- dead) is never queued twice. With the crawl's revisits on (`conf`), a done URL with a
-- schedule's history record (interval > 0) is a duplicate too: its revisit schedule
-- brings it back (revisit.lua); one done before revisits were turned on has none (or a
-- recrawl window's, interval 0), and comes back by the window once, to be scheduled when
-- that visit is done. A URL the window brings back with a history record goes with `v`,
-- its previous visit (lib/revisits.lua revisit_entry), so its fetch asks with that
-- URL's own validators, unless the policy's `conditional` is off (`conf` rv_cond 0).
--
-- KEYS[1..4]   host state: hosts, due, h:queued, conf (lib/hosts.lua)
-- KEYS[5]      tasks       HASH  (unused here; same layout as enqueue_bloom.lua)
-- KEYS[6]      stats       HASH  counters (enqueued, duplicates, recrawled,
--                                   group_unresolved)
-- KEYS[7]      pending     STRING pending tasks
-- KEYS[8]      prio_hosts  ZSET  host -> -highest pending priority
-- KEYS[9..11]  group state: g:of, groups, g:parked (lib/groups.lua)
-- KEYS[12..]   per host h (ARGV order): hq:<h> LIST, hp:<h> ZSET
-- KEYS[12+2H..] per item i: its seen bucket HASH (field -> enqueue time, or -end time);
--              then with recrawl_after > 0, per item i: its rv:hist:<bucket> HASH (the
--              URL's history record, lib/revisits.lua)
-- ARGV[1]      recrawl_after, seconds; 0 = never enqueue a seen URL again
-- ARGV[2]      H, the number of hosts; ARGV[3..2+H] the host keys
-- ARGV[3+H]    groups: the politeness_key they are named for (ip, or domain), then each
--              host's politeness group (its registrable domain or its name's address,
--              "-" for none, "?" for a name that failed to resolve), space-separated in
--              host order: recorded while the crawl's politeness_key is not host
--              (lib/groups.lua)
-- ARGV[4+H..]  per item 4 values: seen field (binary fingerprint tail), priority
--              (>= 0), host index (1..H), entry (compact, common/task.py: stored as sent;
--              it holds the id, read from it only for a recrawl)
-- Returns {enqueued, duplicates, recrawled}, or {-1, the crawl's politeness_key} when the
-- groups were named for another key (nothing changed: name them again)
--- @include "lib/codes"
--- @include "lib/hosts"
--- @include "lib/queues"
--- @include "lib/groups"
--- @include "lib/revisits"

local stats, pending, prio_hosts = KEYS[6], KEYS[7], KEYS[8]
local recrawl_after = int_arg(ARGV[1], 'recrawl_after')
local hosts, nhosts = argv_hosts(2)
local first = 4 + nhosts
local n = (#ARGV - first + 1) / 4
if n ~= math.floor(n)
    or #KEYS ~= 11 + 2 * nhosts + n * (recrawl_after > 0 and 2 or 1) then
  error('crawlq: enqueue needs 2 keys per host, one seen key and 4 ARGV values per item, '
    .. 'and with recrawl_after one rv:hist key per item')
end
local groups = ARGV[3 + nhosts]
local L = ledger(host_keys(1), now_ms())
ledger_groups(L, group_keys(9))
local stale = groups_stale(L, groups)
if stale then return {-1, stale} end
local rv  -- the crawl's revisits on, and conditional recrawls: read at the first URL they matter for
local items = {}
for i = 1, n do
  local base = first + 4 * (i - 1)
  local hi = int_arg(ARGV[base + 2], 'host index')
  if hi < 1 or hi > nhosts then error('crawlq: enqueue host index out of range') end
  items[i] = {field = ARGV[base], priority = int_arg(ARGV[base + 1], 'priority'),
              host = hosts[hi], entry = ARGV[base + 3], bucket = KEYS[11 + 2 * nhosts + i],
              hist = KEYS[11 + 2 * nhosts + n + i]}
end

local now_s = tonumber(redis.call('TIME')[1])
local enqueued, duplicates, recrawled = 0, 0, 0
local fresh = {}
for _, it in ipairs(items) do
  local new
  if recrawl_after == 0 then
    new = redis.call('HSETNX', it.bucket, it.field, now_s) == 1
  else
    local mark = tonumber(redis.call('HGET', it.bucket, it.field))
    new = not mark
    if mark and mark < 0 and now_s + mark >= recrawl_after then
      if rv == nil then
        local c = redis.call('HMGET', KEYS[4], 'rv', 'rv_cond')
        rv = {on = (tonumber(c[1]) or 0) > 0, conditional = c[2] ~= '0'}
      end
      -- The id and the full entry, from the compact one sent (only here: a recrawl).
      local id, full = entry_expand(it.host, it.entry)
      local r = id and record_decode(redis.call('HGET', it.hist, record_field(id)))
      new = not (rv.on and r and r.interval > 0)
      if new then
        recrawled = recrawled + 1
        if r and rv.conditional then  -- `v` joins the full entry (compacted again)
          it.entry = revisit_entry(r, full)
        end
      end
    end
    if new then redis.call('HSET', it.bucket, it.field, now_s) end
  end
  if new then
    fresh[#fresh + 1] = {it.host, it.priority, it.entry}
    enqueued = enqueued + 1
  else
    duplicates = duplicates + 1
  end
end
local unresolved = groups_assign(L, hosts, groups)
requeue_entries(L, fresh, host_queue_keys(12, hosts), prio_hosts, pending, false)
ledger_flush(L)
bump(stats, {enqueued = enqueued, duplicates = duplicates, recrawled = recrawled,
             group_unresolved = unresolved})
return {enqueued, duplicates, recrawled}
