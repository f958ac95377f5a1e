-- requeue.lua: put dead tasks back in their hosts' queues, with fresh attempts.
--
-- Bypasses dedup on purpose: a dead URL is still seen, and requeueing it must not
-- depend on the seen set (a failure never poisons dedup). Their hosts' records count
-- them queued through the host ledger (lib/hosts.lua), which puts the hosts in `due` by
-- the due rule.
--
-- KEYS[1..4] host state: hosts, due, h:queued, conf (lib/hosts.lua)
-- KEYS[5]  dead          ZSET
-- KEYS[6]  errors        HASH  id -> "<reason> <message>" (kept as last_error)
-- KEYS[7]  attempts      HASH  id -> attempts of a task that is not leased
-- KEYS[8]  stalls        HASH
-- KEYS[9]  dead_reasons  HASH
-- KEYS[10] tasks         HASH  id -> "<host> <priority> <entry>" (a dead task's body)
-- KEYS[11] stats         HASH  counters (requeued)
-- KEYS[12] pending       STRING
-- KEYS[13] prio_hosts    ZSET
-- KEYS[14..] per host h (ARGV order): hq:<h> LIST, hp:<h> ZSET
-- ARGV[1]  H, the number of hosts; ARGV[2..1+H] the hosts
-- ARGV[2+H..] ids
-- Returns {code per id} (0 OK, 5 UNKNOWN: not dead here)
--- @include "lib/codes"
--- @include "lib/dead"
--- @include "lib/memory"
--- @include "lib/hosts"
--- @include "lib/queues"

local dead, errors, attempts, stalls, dead_reasons = KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9]
local tasks, stats, pending, prio_hosts = KEYS[10], KEYS[11], KEYS[12], KEYS[13]
local hosts, nhosts = argv_hosts(1)
if #KEYS ~= 13 + 2 * nhosts then error('crawlq: requeue needs 2 keys per host') end
local qkeys = host_queue_keys(14, hosts)
allow_at_maxmemory(stats)
local L = ledger(host_keys(1), now_ms())
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
requeue_entries(L, back, qkeys, prio_hosts, pending, false)
ledger_flush(L)
bump(stats, {requeued = #back})
return codes
