-- fsck_orphans.lua: set right the ids whose lease or body fsck found without its other
-- half (`crawlq fsck --repair`, console/fsck.py), each checked again here, so a call is
-- atomic and safe on a running crawl.
--
-- A lease record (`leased`) with no deadline in `leases` gets one that has passed: the
-- reaper's reclaim then takes it back like any expired lease (its task back in its
-- queue, its lease ended on its host's record: lib/lease_end.lua). A deadline with no
-- lease record is dropped: reclaim can't take back a lease no record names, and such
-- ids at the head of `leases` would stall it. A body in `tasks` of an id neither waiting
-- (`delayed`) nor dead is a stale copy when the id is leased or pending in its host's
-- queues (lease would drop that entry as a duplicate): it is deleted; otherwise its task
-- is in no state, and goes back to the tail of its host's queue, counted queued on its
-- host's record through the host ledger (lib/hosts.lua), its attempts kept. Reads each
-- host queue it is given (O(its length)).
--
-- KEYS[1..4] host state: hosts, due, h:queued, conf (lib/hosts.lua)
-- KEYS[5..6] lease state: leased, leases (lib/leases.lua)
-- KEYS[7]  tasks       HASH  id -> "<host> <priority> <entry>" (waiting or dead)
-- KEYS[8]  delayed     ZSET  only read
-- KEYS[9]  dead        ZSET  only read
-- KEYS[10] stats       HASH  only opens the script at maxmemory
-- KEYS[11] pending     STRING
-- KEYS[12] prio_hosts  ZSET
-- KEYS[13..] per id i (ARGV order): hq:<h> LIST, hp:<h> ZSET of its host
-- ARGV[1..] pairs: id, host (the host its body names, '' if it has none: a body that
--           names another host by now is left alone)
-- Returns {deadlines_added, deadlines_removed, bodies_dropped, bodies_queued}
--- @include "lib/codes"
--- @include "lib/leases"
--- @include "lib/memory"
--- @include "lib/hosts"
--- @include "lib/queues"

if #ARGV % 2 ~= 0 or #KEYS ~= 12 + #ARGV then
  error('crawlq: fsck_orphans needs (id, host) pairs and 2 host keys per id')
end
local LK = lease_keys(5)
local tasks, delayed, dead, stats = KEYS[7], KEYS[8], KEYS[9], KEYS[10]
local pending, prio_hosts = KEYS[11], KEYS[12]
allow_at_maxmemory(stats)
local now = now_ms()
local L = ledger(host_keys(1), now)

local added, removed, dropped = 0, 0, 0
local back, qkeys = {}, {}
for i = 1, #ARGV, 2 do
  local id, given = ARGV[i], ARGV[i + 1]
  local hq, hp = KEYS[12 + i], KEYS[13 + i]
  local value = redis.call('HGET', LK.leased, id)
  local deadline = redis.call('ZSCORE', LK.leases, id)
  if lease_decode(value) and not deadline then
    added = added + redis.call('ZADD', LK.leases, now, id)
  elseif deadline and not value then
    removed = removed + redis.call('ZREM', LK.leases, id)
  end
  local host, prio, entry = split_value(redis.call('HGET', tasks, id))
  if host and not redis.call('ZSCORE', delayed, id) and not redis.call('ZSCORE', dead, id) then
    if value or in_queues(id, hq, hp) then
      dropped = dropped + redis.call('HDEL', tasks, id)
    elseif host == given then
      redis.call('HDEL', tasks, id)
      qkeys[host] = {hq, hp}
      back[#back + 1] = {host, prio, entry}
    end
  end
end
requeue_entries(L, back, qkeys, prio_hosts, pending, false)
ledger_flush(L)
return {added, removed, dropped, #back}
