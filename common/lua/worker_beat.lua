-- worker_beat.lua: one consumer's heartbeat in the worker registry (common/workers.py).
--
-- Every time here is Redis TIME in ms, so ages compare with the reader's Redis TIME and
-- a consumer whose own clock is off still shows its true heartbeat age.
--
-- KEYS[1]  worker:<id>  HASH  id, host, pid, state, started_ms, heartbeat_ms,
--                             interval_ms, in_flight, done, failed, pages_per_s
-- KEYS[2]  workers      ZSET  id -> last heartbeat, ms of Redis TIME
-- ARGV[1] id  ARGV[2] host  ARGV[3] pid  ARGV[4] state  ARGV[5] in_flight  ARGV[6] done
-- ARGV[7] failed  ARGV[8] ttl_ms (the hash expires unless refreshed)  ARGV[9] interval_ms
-- Returns the heartbeat time, ms of Redis TIME.
--- @include "lib/codes"

local worker, workers = KEYS[1], KEYS[2]
local ttl = tonumber(ARGV[8])
local now = now_ms()
local prev = redis.call('HMGET', worker, 'heartbeat_ms', 'done', 'started_ms')
local done = tonumber(ARGV[6])
-- Pages per second since the previous beat (0 after a restart or a gap past the TTL).
local rate = 0
local prev_beat, prev_done = tonumber(prev[1]), tonumber(prev[2])
if prev_beat and prev_done and now > prev_beat and done >= prev_done then
  rate = (done - prev_done) * 1000 / (now - prev_beat)
end
redis.call('HSET', worker, 'id', ARGV[1], 'host', ARGV[2], 'pid', ARGV[3],
           'state', ARGV[4], 'in_flight', ARGV[5], 'done', ARGV[6], 'failed', ARGV[7],
           'started_ms', prev[3] or now, 'heartbeat_ms', now, 'interval_ms', ARGV[9],
           'pages_per_s', string.format('%.2f', rate))
redis.call('PEXPIRE', worker, ttl)
redis.call('ZADD', workers, now, ARGV[1])
-- Members older than a TTL have no hash any more: dead consumers, forgotten here so
-- readers never write.
redis.call('ZREMRANGEBYSCORE', workers, '-inf', '(' .. (now - ttl))
return now
