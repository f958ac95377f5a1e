-- requeue.lua: put dead tasks back in their hosts' queues, with fresh attempts.
--
-- Bypasses dedup on purpose: a dead URL is still seen, and requeueing it must not
-- depend on the seen set (a failure never poisons dedup).
--
-- KEYS[1..6] host state: due, h:queued, h:inflight, h:last, hostconf, conf (lib/hosts.lua)
-- KEYS[7]  dead          ZSET
-- KEYS[8]  errors        HASH  id -> "<reason> <message>" (kept as last_error)
-- KEYS[9]  attempts      HASH
-- KEYS[10] stalls        HASH
-- KEYS[11] dead_reasons  HASH
-- KEYS[12] tasks         HASH  id -> "<host> <priority> <entry>"
-- KEYS[13] stats         HASH  counters (requeued)
-- KEYS[14] pending       STRING
-- KEYS[15] prio_hosts    ZSET
-- KEYS[16..] per host h (ARGV order): hq:<h> LIST, hp:<h> ZSET
-- ARGV[1]  H, the number of hosts; ARGV[2..1+H] the hosts
-- ARGV[2+H..] ids
-- Returns {code per id} (0 OK, 5 UNKNOWN: not dead here)
--- @include "lib/codes"
--- @include "lib/dead"
--- @include "lib/memory"
--- @include "lib/hosts"
--- @include "lib/queues"

local dead, errors, attempts, stalls, dead_reasons = KEYS[7], KEYS[8], KEYS[9], KEYS[10], KEYS[11]
local tasks, stats, pending, prio_hosts = KEYS[12], KEYS[13], KEYS[14], KEYS[15]
local hosts, nhosts = argv_hosts(1)
if #KEYS ~= 15 + 2 * nhosts then error('crawlq: requeue needs 2 keys per host') end
local qkeys = host_queue_keys(16, hosts)
allow_at_maxmemory(stats)
local codes, back = {}, {}
for i = 2 + nhosts, #ARGV do
  local id = ARGV[i]
  local host, prio, entry = split_value(redis.call('HGET', tasks, id))
  if host and qkeys[host] and redis.call('ZREM', dead, id) == 1 then
    forget_dead_reason(errors, dead_reasons, id)
    redis.call('HDEL', attempts, id)
    redis.call('HDEL', stalls, id)
    redis.call('HDEL', tasks, id)
    back[#back + 1] = {host, prio, entry}
    codes[#codes + 1] = OK
  else
    codes[#codes + 1] = UNKNOWN
  end
end
refresh_hosts(requeue_entries(back, qkeys, prio_hosts, pending, false))
bump(stats, {requeued = #back})
return codes
