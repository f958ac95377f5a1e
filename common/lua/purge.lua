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
-- KEYS[9]  rv:hist       HASH  id -> history record (the revisit schedule)
-- KEYS[10] rv:due        ZSET  id -> next visit
-- KEYS[11..] with marks: per id i, its seen bucket HASH
-- ARGV[1]  marks: 1 = each id is followed by its seen field (exact dedup), 0 = not
-- ARGV[2..] ids (with marks: id, seen field pairs)
-- Returns {code per id} (0 OK, 5 UNKNOWN: not dead)
--- @include "lib/codes"
--- @include "lib/dead"
--- @include "lib/memory"

local dead, errors, dead_reasons, tasks = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local attempts, stalls, checkpoints, stats = KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local hist, rv_due = KEYS[9], KEYS[10]
local marks = ARGV[1] == '1'
local width = marks and 2 or 1
if (#ARGV - 1) % width ~= 0 or #KEYS ~= 10 + (marks and (#ARGV - 1) / 2 or 0) then
  error('crawlq: purge needs ids (with marks: id, seen field pairs), rv:hist, rv:due '
    .. 'and seen keys')
end
allow_at_maxmemory(stats)
local now_s = tonumber(redis.call('TIME')[1])
local codes, purged = {}, 0
for i = 2, #ARGV, width do
  local id = ARGV[i]
  if redis.call('ZREM', dead, id) == 1 then
    if marks then redis.call('HSET', KEYS[10 + i / 2], ARGV[i + 1], -now_s) end
    forget_dead_reason(errors, dead_reasons, id)
    for _, h in ipairs({errors, tasks, attempts, stalls, checkpoints, hist}) do
      redis.call('HDEL', h, id)
    end
    redis.call('ZREM', rv_due, id)
    purged = purged + 1
    codes[#codes + 1] = OK
  else
    codes[#codes + 1] = UNKNOWN
  end
end
bump(stats, {purged = purged})
return codes
