-- promote.lua: move due tasks from `delayed` (retries, deferrals) back to ready.
--
-- KEYS[1]  delayed  ZSET  id -> due (ms)
-- KEYS[2]  ready    LIST
-- KEYS[3]  prio     ZSET
-- KEYS[4]  prios    HASH
-- KEYS[5]  stats    HASH  counters (promoted)
-- ARGV[1]  limit, the most tasks to move in this call
-- Returns {promoted, ms until the next task is due or -1 if none waits}
local delayed, ready, prio, prios, stats = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local limit = int_arg(ARGV[1], 'limit')
if limit < 1 then error('crawlq: promote needs limit >= 1') end
allow_at_maxmemory(stats)
local now = now_ms()
local due = redis.call('ZRANGEBYSCORE', delayed, '-inf', now, 'LIMIT', 0, limit)
for _, id in ipairs(due) do
  redis.call('ZREM', delayed, id)
  push_ready(ready, prio, prios, id, false)
end
bump(stats, {promoted = #due})
local next_due = redis.call('ZRANGE', delayed, 0, 0, 'WITHSCORES')
local wait = -1
if next_due[2] then wait = math.max(0, tonumber(next_due[2]) - now) end
return {#due, wait}
