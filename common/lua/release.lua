-- release.lua: hand leased tasks back without counting an attempt (graceful shutdown,
-- or a robots.txt fetch that used the task's turn).
--
-- The task goes back to the head of its host's queue, so the host's next turn serves it
-- instead of waiting for the lease to expire; the host gets its slot back, and the page
-- of its budget the lease held (settle_pages, lib/hosts.lua): a release is not a page.
--
-- KEYS[1..6] host state: due, h:queued, h:inflight, h:last, hostconf, conf (lib/hosts.lua)
-- KEYS[7]  leases      ZSET
-- KEYS[8]  owners      HASH
-- KEYS[9]  attempts    HASH
-- KEYS[10] tasks       HASH  id -> "<host> <priority> <entry>"
-- KEYS[11] stats       HASH  counters (released, stale)
-- KEYS[12] pending     STRING
-- KEYS[13] prio_hosts  ZSET
-- KEYS[14..] per host h (ARGV order): hq:<h> LIST, hp:<h> ZSET
-- ARGV[1]  worker id
-- ARGV[2]  H, the number of hosts; ARGV[3..2+H] the hosts of the tasks
-- ARGV[3+H] restart: 1 = the hosts' last request was just now (a robots.txt fetch that
--           took the turn ended): their next turn is a full delay from now; 0 = as is
-- ARGV[4+H..] pairs: id, token
-- Returns {code per item} (0 OK, 3 STALE, 4 EXPIRED, 5 UNKNOWN)
--- @include "lib/codes"
--- @include "lib/leases"
--- @include "lib/memory"
--- @include "lib/hosts"
--- @include "lib/queues"

local leases, owners, attempts, tasks = KEYS[7], KEYS[8], KEYS[9], KEYS[10]
local stats, pending, prio_hosts = KEYS[11], KEYS[12], KEYS[13]
local worker = ARGV[1]
local hosts, nhosts = argv_hosts(2)
local restart = ARGV[3 + nhosts] == '1'
local first = 4 + nhosts
if (#ARGV - first + 1) % 2 ~= 0 or #KEYS ~= 13 + 2 * nhosts then
  error('crawlq: release needs 2 keys per host and (id, token) pairs')
end
local qkeys = host_queue_keys(14, hosts)
allow_at_maxmemory(stats)
local now = now_ms()
local codes, back, freed, stale, released_hosts, settle = {}, {}, {}, 0, {}, {}
for i = first, #ARGV, 2 do
  local id, token = ARGV[i], ARGV[i + 1]
  local state = lease_state(leases, owners, id, token, worker, now)
  local host, prio, entry
  if state == OK then
    host, prio, entry = split_value(redis.call('HGET', tasks, id))
    if not (host and qkeys[host]) then state = UNKNOWN end
  end
  if state == OK then
    local slot_taken, reserved = drop_lease(leases, owners, id)
    if slot_taken then freed[host] = (freed[host] or 0) - 1 end
    if reserved then settle[#settle + 1] = {host, true, false} end
    redis.call('HINCRBY', attempts, id, -1)
    redis.call('HDEL', tasks, id)
    back[#back + 1] = {host, prio, entry}
    released_hosts[host] = true
  else
    stale = stale + 1
  end
  codes[#codes + 1] = state
end
add_counts(H.inflight, freed)
settle_pages(settle, now)
if restart and #back > 0 then
  local last = {}
  for host in pairs(released_hosts) do
    last[#last + 1] = now
    last[#last + 1] = host
  end
  redis.call('ZADD', H.last, unpack(last))
end
refresh_hosts(requeue_entries(back, qkeys, prio_hosts, pending, true))
bump(stats, {released = #back, stale = stale})
return codes
