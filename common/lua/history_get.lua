-- history_get.lua: read the history records of some done URLs in one call (the revisit
-- promoter reads their hosts to name their queues to revisit.lua: common/queue/revisits.py).
-- Reads only. One call instead of a pipeline of HGETs: a client pays for each command it
-- packs and parses (~25 us a record in redis-py's pipeline, measured by queue_bench).
--
-- KEYS[1(i-1)+1]  rv:hist:<b>  HASH  id i's bucket (id's 16 bytes -> history record)
-- ARGV[1..] per id i: its field (the id's 16 bytes)
-- Returns {its record or nil} per item

if #KEYS ~= #ARGV then error('crawlq: history_get needs one rv:hist key per field') end
local out = {}
for i = 1, #ARGV do out[i] = redis.call('HGET', KEYS[i], ARGV[i]) end
return out
