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
-- is in no state, and goes to `dead` as `orphaned`, its body kept, for an operator to
-- requeue or purge. Reads each host queue it is given (O(its length)).
--
-- KEYS[1]  leased        HASH  id -> lease record
-- KEYS[2]  leases        ZSET  id -> deadline (ms)
-- KEYS[3]  tasks         HASH  id -> "<host> <priority> <entry>" (waiting or dead)
-- KEYS[4]  delayed       ZSET  only read
-- KEYS[5]  dead          ZSET  id -> died (ms)
-- KEYS[6]  errors        HASH  id -> "<reason> <message>"
-- KEYS[7]  dead_reasons  HASH  reason -> count
-- KEYS[8]  stats         HASH  only opens the script at maxmemory
-- KEYS[9..] per id i (ARGV order): hq:<h> LIST, hp:<h> ZSET of the host its body names
-- ARGV[1..] ids
-- Returns {deadlines_added, deadlines_removed, bodies_dropped, bodies_dead}
--- @include "lib/codes"
--- @include "lib/dead"
--- @include "lib/memory"

if #KEYS ~= 8 + 2 * #ARGV then error('crawlq: fsck_orphans needs 2 host keys per id') end
local leased, leases, tasks, delayed = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local dead, errors, dead_reasons, stats = KEYS[5], KEYS[6], KEYS[7], KEYS[8]
allow_at_maxmemory(stats)
local now = now_ms()

local function queued(id, hq, hp)
  for _, entries in ipairs({redis.call('LRANGE', hq, 0, -1), redis.call('ZRANGE', hp, 0, -1)}) do
    for _, e in ipairs(entries) do
      if string.sub(e, 1, #id) == id then return true end
    end
  end
  return false
end

local added, removed, dropped, died = 0, 0, 0, 0
for i = 1, #ARGV do
  local id = ARGV[i]
  local rec = redis.call('HEXISTS', leased, id) == 1
  local deadline = redis.call('ZSCORE', leases, id)
  if rec and not deadline then
    added = added + redis.call('ZADD', leases, now, id)
  elseif deadline and not rec then
    removed = removed + redis.call('ZREM', leases, id)
  end
  if redis.call('HEXISTS', tasks, id) == 1 and not redis.call('ZSCORE', delayed, id)
      and not redis.call('ZSCORE', dead, id) then
    if rec or queued(id, KEYS[7 + 2 * i], KEYS[8 + 2 * i]) then
      dropped = dropped + redis.call('HDEL', tasks, id)
    else
      to_dead(dead, errors, dead_reasons, id, 'orphaned',
        'its body was in tasks with no state (crawlq fsck --repair)', now)
      died = died + 1
    end
  end
end
return {added, removed, dropped, died}
