-- promote.lua: put retries whose time has come back in their hosts' queues.
--
-- The caller names candidate ids (the head of `delayed`) and their hosts; each is
-- checked here against Redis TIME. A retry joins the tail of its host's queue, so it
-- takes its host's turn like any other task.
--
-- KEYS[1..4] host state: hosts, due, h:queued, conf (lib/hosts.lua)
-- KEYS[5]  delayed     ZSET  id -> due (ms)
-- KEYS[6]  tasks       HASH  id -> "<host> <priority> <entry>"
-- KEYS[7]  stats       HASH  counters (promoted)
-- KEYS[8]  pending     STRING
-- KEYS[9]  prio_hosts  ZSET
-- KEYS[10..] per host h (ARGV order): hq:<h> LIST, hp:<h> ZSET
-- ARGV[1]  H, the number of hosts; ARGV[2..1+H] the hosts
-- ARGV[2+H..] candidate ids
-- Returns {promoted, ms until the next retry is due or -1 if none waits}
--- @include "lib/codes"
--- @include "lib/memory"
--- @include "lib/hosts"
--- @include "lib/queues"

local delayed, tasks, stats, pending, prio_hosts = KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9]
local hosts, nhosts = argv_hosts(1)
if #KEYS ~= 9 + 2 * nhosts then error('crawlq: promote needs 2 keys per host') end
local qkeys = host_queue_keys(10, hosts)
allow_at_maxmemory(stats)
local now = now_ms()
local back = {}
for i = 2 + nhosts, #ARGV do
  local id = ARGV[i]
  local at = tonumber(redis.call('ZSCORE', delayed, id))
  local host, prio, entry = split_value(redis.call('HGET', tasks, id))
  if at and at <= now and host and qkeys[host] then
    redis.call('ZREM', delayed, id)
    redis.call('HDEL', tasks, id)
    back[#back + 1] = {host, prio, entry}
  end
end
local L = ledger(host_keys(1), now)
requeue_entries(L, back, qkeys, prio_hosts, pending, false)
ledger_flush(L)
bump(stats, {promoted = #back})
local next_due = redis.call('ZRANGE', delayed, 0, 0, 'WITHSCORES')
local wait = -1
if next_due[2] then wait = math.max(0, tonumber(next_due[2]) - now) end
return {#back, wait}
