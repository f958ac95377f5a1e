-- is_empty.lua: whether nothing is pending, leased or waiting, read in one atomic step.
--
-- Reads only, so it also answers on a full Redis (at maxmemory, where a MULTI is
-- refused). On one Redis the caller passes every partition's keys; on a cluster, one
-- partition's (each call stays in one slot).
--
-- KEYS[3(i-1)+1]  pending  STRING pending tasks of partition i
-- KEYS[3(i-1)+2]  leases   ZSET   its leased tasks
-- KEYS[3(i-1)+3]  delayed  ZSET   its retries waiting
-- Returns 1 if every partition given is empty, else 0
if #KEYS % 3 ~= 0 then error('crawlq: is_empty needs (pending, leases, delayed) triples') end
for i = 1, #KEYS, 3 do
  if tonumber(redis.call('GET', KEYS[i]) or '0') > 0
      or redis.call('ZCARD', KEYS[i + 1]) > 0 or redis.call('ZCARD', KEYS[i + 2]) > 0 then
    return 0
  end
end
return 1
