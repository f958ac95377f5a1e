-- is_empty.lua: whether no task is left to work on: nothing leased or waiting, nothing
-- pending but the parked tasks of hosts whose page budget is spent, and no revisit due,
-- read in one atomic step.
--
-- With nothing leased, a host with pending work is in `due` unless its budget is spent
-- (the due rule: lib/hosts.lua's turn_of), so pending tasks with an empty `due` are all
-- parked: they wait for a budget to be raised, which no consumer can do; but render
-- tasks in the render lane (`r:pending`, lib/render.lua) are work, whatever `due` says. A revisit due
-- (its score in `rv:due` at or before Redis TIME) is work while the crawl's revisits are
-- on (the reaper brings it back: revisit.lua); one scheduled later, or any while
-- revisits are off (the schedule waits), is not work for this pass. Reads only, so it
-- also answers on a full Redis (at maxmemory, where a MULTI is refused). On one Redis
-- the caller passes every partition's keys; on a cluster, one partition's (each call
-- stays in one slot).
--
-- KEYS[7(i-1)+1]  pending  STRING pending tasks of partition i
-- KEYS[7(i-1)+2]  leases   ZSET   its leased tasks
-- KEYS[7(i-1)+3]  delayed  ZSET   its retries waiting
-- KEYS[7(i-1)+4]  due      ZSET   its hosts with pending work, a free slot and budget
-- KEYS[7(i-1)+5]  conf     HASH   its politeness and revisit settings (rv: 0 = off)
-- KEYS[7(i-1)+6]  rv:due   ZSET   its revisit schedule: id -> next visit, ms
-- KEYS[7(i-1)+7]  r:pending STRING its render tasks pending
-- Returns 1 if every partition given is empty, else 0
--- @include "lib/codes"

if #KEYS % 7 ~= 0 then
  error('crawlq: is_empty needs (pending, leases, delayed, due, conf, rv:due, r:pending) '
    .. 'septuples')
end
local now = now_ms()
for i = 1, #KEYS, 7 do
  if tonumber(redis.call('GET', KEYS[i + 6]) or '0') > 0 then return 0 end
  if redis.call('ZCARD', KEYS[i + 1]) > 0 or redis.call('ZCARD', KEYS[i + 2]) > 0 then
    return 0
  end
  if tonumber(redis.call('GET', KEYS[i]) or '0') > 0 and redis.call('ZCARD', KEYS[i + 3]) > 0 then
    return 0
  end
  if (tonumber(redis.call('HGET', KEYS[i + 4], 'rv')) or 0) > 0
      and redis.call('ZCOUNT', KEYS[i + 5], '-inf', now) > 0 then
    return 0
  end
end
return 1
