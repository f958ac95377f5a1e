-- purge.lua: delete dead tasks for good (their URLs stay seen).
--
-- KEYS[1]  dead          ZSET
-- KEYS[2]  errors        HASH
-- KEYS[3]  dead_reasons  HASH
-- KEYS[4]  tasks         HASH
-- KEYS[5]  attempts      HASH
-- KEYS[6]  stalls        HASH
-- KEYS[7]  checkpoints   HASH
-- KEYS[8]  stats         HASH  counters (purged)
-- ARGV[1..] ids
-- Returns {code per id} (0 OK, 5 UNKNOWN: not dead)
local dead, errors, dead_reasons, tasks = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local attempts, stalls, checkpoints, stats = KEYS[5], KEYS[6], KEYS[7], KEYS[8]
allow_at_maxmemory(stats)
local codes, purged = {}, 0
for _, id in ipairs(ARGV) do
  if redis.call('ZREM', dead, id) == 1 then
    forget_dead_reason(errors, dead_reasons, id)
    for _, h in ipairs({errors, tasks, attempts, stalls, checkpoints}) do
      redis.call('HDEL', h, id)
    end
    purged = purged + 1
    codes[#codes + 1] = OK
  else
    codes[#codes + 1] = UNKNOWN
  end
end
bump(stats, {purged = purged})
return codes
