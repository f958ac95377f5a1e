-- enqueue.lua: dedup (exact) and enqueue a batch of new tasks into one partition.
--
-- A URL is seen from the moment it is enqueued. It is enqueued again only when the
-- crawl has a recrawl window, its last enqueue is older than that window, and it is
-- not live any more (no body in `tasks`: done or purged, not pending/leased/waiting/dead).
--
-- KEYS[1]      ready   LIST  pending ids, priority 0
-- KEYS[2]      prio    ZSET  pending ids, priority > 0
-- KEYS[3]      tasks   HASH  id -> task JSON
-- KEYS[4]      prios   HASH  id -> priority
-- KEYS[5]      stats   HASH  counters (enqueued, duplicates, recrawled)
-- KEYS[5+i]    seen bucket HASH of item i: field -> last enqueue time (s)
-- ARGV[1]      recrawl_after, seconds; 0 = never enqueue a seen URL again
-- ARGV[2+4(i-1)..] per item i: id, seen field (binary fingerprint tail), priority (>= 0), task JSON
-- Returns {enqueued, duplicates, recrawled}
local ready, prio, tasks, prios, stats = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local recrawl_after = int_arg(ARGV[1], 'recrawl_after')
local n = (#ARGV - 1) / 4
if n ~= #KEYS - 5 or n ~= math.floor(n) then
  error('crawlq: enqueue needs one seen key and 4 ARGV values per item')
end
local priorities = {}
for i = 1, n do priorities[i] = int_arg(ARGV[4 + 4 * (i - 1)], 'priority') end

local now_s = tonumber(redis.call('TIME')[1])
local enqueued, duplicates, recrawled = 0, 0, 0
local tail = {}
for i = 1, n do
  local base = 2 + 4 * (i - 1)
  local id, field, body = ARGV[base], ARGV[base + 1], ARGV[base + 3]
  local bucket = KEYS[5 + i]
  local last = redis.call('HGET', bucket, field)
  local fresh = not last
  if last and recrawl_after > 0 and now_s - tonumber(last) >= recrawl_after
      and redis.call('HEXISTS', tasks, id) == 0 then
    fresh = true
    recrawled = recrawled + 1
  end
  if fresh then
    redis.call('HSET', bucket, field, now_s)
    add_pending(ready, prio, tasks, prios, id, priorities[i], body, tail)
    enqueued = enqueued + 1
  else
    duplicates = duplicates + 1
  end
end
flush_tail(ready, tail)
bump(stats, {enqueued = enqueued, duplicates = duplicates, recrawled = recrawled})
return {enqueued, duplicates, recrawled}
