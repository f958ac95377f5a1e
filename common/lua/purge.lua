-- purge.lua: delete dead tasks for good (their URLs stay seen: with exact dedup the mark
-- becomes -(now), so a recrawl window counts from the purge). A purged URL's revisit
-- history and next visit go too (lib/revisits.lua): kept, the history would make it a
-- duplicate for good and the schedule would bring it back by itself.
--
-- KEYS[1]  dead          ZSET
-- KEYS[2]  errors        HASH
-- KEYS[3]  dead_reasons  HASH
-- KEYS[4]  tasks         HASH  id -> "<host> <priority> <entry>" (a dead task's body)
-- KEYS[5]  attempts      HASH  id -> attempts of a task that is not leased
-- KEYS[6]  stalls        HASH
-- KEYS[7]  checkpoints   HASH
-- KEYS[8]  stats         HASH  counters (purged)
-- KEYS[9]  rv:due        ZSET  id -> next visit
-- KEYS[10] conf          HASH  rv_urls: the partition's history records
-- KEYS[11..] with marks: per id i, its seen bucket HASH and its rv:hist:<bucket> HASH
--          (id's 16 bytes -> history record: the revisit schedule)
-- ARGV[1]  marks: 1 = each id is followed by its seen field (exact dedup), 0 = not
--          (a crawl without marks keeps no history)
-- ARGV[2..] ids (with marks: id, seen field pairs)
-- Returns {code per id} (0 OK, 5 UNKNOWN: not dead)
--- @include "lib/codes"
--- @include "lib/dead"
--- @include "lib/memory"

local dead, errors, dead_reasons, tasks = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local attempts, stalls, checkpoints, stats = KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local rv_due, conf = KEYS[9], KEYS[10]
local marks = ARGV[1] == '1'
local width = marks and 2 or 1
if (#ARGV - 1) % width ~= 0 or #KEYS ~= 10 + (marks and #ARGV - 1 or 0) then
  error('crawlq: purge needs ids (with marks: id, seen field pairs), rv:due, conf and '
    .. 'per id its seen and rv:hist keys')
end
allow_at_maxmemory(stats)
local now_s = tonumber(redis.call('TIME')[1])
local codes, purged, forgotten = {}, 0, 0
for i = 2, #ARGV, width do
  local id = ARGV[i]
  if redis.call('ZREM', dead, id) == 1 then
    if marks then
      redis.call('HSET', KEYS[9 + i], ARGV[i + 1], -now_s)
      forgotten = forgotten + redis.call('HDEL', KEYS[10 + i], bin_id(id))
    end
    forget_dead_reason(errors, dead_reasons, id)
    for _, h in ipairs({errors, tasks, attempts, stalls, checkpoints}) do
      redis.call('HDEL', h, id)
    end
    redis.call('ZREM', rv_due, id)
    purged = purged + 1
    codes[#codes + 1] = OK
  else
    codes[#codes + 1] = UNKNOWN
  end
end
if forgotten > 0 then redis.call('HINCRBY', conf, 'rv_urls', -forgotten) end
bump(stats, {purged = purged})
return codes
