-- reclaim.lua: take back expired leases (their consumer died or stalled).
--
-- An expired task goes back to the head of its host's queue and the host gets its slot
-- back, and the page of its budget the lease held (settle_pages, lib/hosts.lua): whether its
-- request went out is not known, so a consumer that died after a response can let one
-- more page than the budget reach the host. A task reclaimed more than max_stalls
-- times goes to `dead` with reason `stalled`, so a poison task that kills its consumer cannot crash-loop a fleet. The
-- caller names candidate ids (the head of `leases`) and their hosts; each is checked
-- here against Redis TIME, so the script is safe to run from every consumer at once.
--
-- KEYS[1..6] host state: due, h:queued, h:inflight, h:last, hostconf, conf (lib/hosts.lua)
-- KEYS[7]  leases        ZSET  id -> deadline (ms)
-- KEYS[8]  owners        HASH
-- KEYS[9]  stalls        HASH  id -> times reclaimed
-- KEYS[10] tasks         HASH  id -> "<host> <priority> <entry>"
-- KEYS[11] dead          ZSET
-- KEYS[12] errors        HASH
-- KEYS[13] dead_reasons  HASH
-- KEYS[14] stats         HASH  counters (reclaimed, dead, stalled)
-- KEYS[15] pending       STRING
-- KEYS[16] prio_hosts    ZSET
-- KEYS[17] h:errors      ZSET  host -> failed attempts
-- KEYS[18..] per host h (ARGV order): hq:<h> LIST, hp:<h> ZSET
-- ARGV[1]  max_stalls
-- ARGV[2]  H, the number of hosts; ARGV[3..2+H] the hosts
-- ARGV[3+H..] candidate ids
-- Returns {reclaimed, dead}
--- @include "lib/codes"
--- @include "lib/leases"
--- @include "lib/dead"
--- @include "lib/memory"
--- @include "lib/hosts"
--- @include "lib/queues"

local leases, owners, stalls, tasks = KEYS[7], KEYS[8], KEYS[9], KEYS[10]
local dead, errors, dead_reasons, stats = KEYS[11], KEYS[12], KEYS[13], KEYS[14]
local pending, prio_hosts, errors_by_host = KEYS[15], KEYS[16], KEYS[17]
local max_stalls = int_arg(ARGV[1], 'max_stalls')
if max_stalls < 0 then error('crawlq: reclaim needs max_stalls >= 0') end
local hosts, nhosts = argv_hosts(2)
if #KEYS ~= 17 + 2 * nhosts then error('crawlq: reclaim needs 2 keys per host') end
local qkeys = host_queue_keys(18, hosts)
allow_at_maxmemory(stats)
local now = now_ms()
local back, freed, stalled_by_host, died, touched_hosts = {}, {}, {}, 0, {}
local settle = {}
for i = 3 + nhosts, #ARGV do
  local id = ARGV[i]
  local deadline = tonumber(redis.call('ZSCORE', leases, id))
  local host, prio, entry = split_value(redis.call('HGET', tasks, id))
  if deadline and deadline <= now and host and qkeys[host] then
    local slot_taken, reserved = drop_lease(leases, owners, id)
    if slot_taken then freed[host] = (freed[host] or 0) - 1 end
    if reserved then settle[#settle + 1] = {host, true, false} end
    touched_hosts[host] = true
    local stalled = redis.call('HINCRBY', stalls, id, 1)
    if stalled > max_stalls then
      to_dead(dead, errors, dead_reasons, id, 'stalled',
        'lease expired ' .. stalled .. ' times (consumer died or hung)', now)
      stalled_by_host[host] = (stalled_by_host[host] or 0) + 1
      died = died + 1
    else
      redis.call('HDEL', tasks, id)
      back[#back + 1] = {host, prio, entry}
    end
  end
end
add_counts(H.inflight, freed)
add_counts(errors_by_host, stalled_by_host)
settle_pages(settle, now)
local touched = requeue_entries(back, qkeys, prio_hosts, pending, true)
for host in pairs(touched_hosts) do touched[#touched + 1] = host end
refresh_hosts(touched)
bump(stats, {reclaimed = #back, dead = died, stalled = died})
return {#back, died}
