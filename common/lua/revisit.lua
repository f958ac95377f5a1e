-- revisit.lua: put URLs whose next visit has come back in their hosts' queues (the revisit
-- schedule, lib/revisits.lua), each with its previous visit (`v`: its own validators
-- and digest) in its entry.
--
-- The caller names candidate ids (the head of `rv:due`) and their hosts (from their
-- history records); each is checked here against Redis TIME. A revisit joins the tail of
-- its host's queue, so it keeps every politeness rule a new URL does (delay,
-- concurrency, budget, blocks, robots.txt at its lease). Its history record stays: the
-- ack of the visit writes the next one. Nothing moves while the crawl's revisits are off
-- (the schedule waits). Each revisit's lateness (now - due) is counted in its bucket
-- (stats rv_late:<bound s>).
--
-- KEYS[1..4] host state: hosts, due, h:queued, conf (lib/hosts.lua)
-- KEYS[5]  rv:due      ZSET  id -> next visit (ms)
-- KEYS[6]  stats       HASH  counters (revisits, rv_late:<bound>)
-- KEYS[7]  pending     STRING
-- KEYS[8]  prio_hosts  ZSET
-- KEYS[9..] per host h (ARGV order): hq:<h> LIST, hp:<h> ZSET; then per candidate i:
--          its rv:hist:<bucket> HASH (id's 16 bytes -> history record)
-- ARGV[1]  H, the number of hosts; ARGV[2..1+H] the hosts
-- ARGV[2+H..] candidate ids
-- Returns {revisits queued, ms until the next one is due or -1 if none waits}
--- @include "lib/codes"
--- @include "lib/hosts"
--- @include "lib/queues"
--- @include "lib/revisits"

local due, stats, pending, prio_hosts = KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local hosts, nhosts = argv_hosts(1)
local first = 2 + nhosts  -- the first candidate's ARGV
if #KEYS ~= 8 + 2 * nhosts + #ARGV - first + 1 then
  error('crawlq: revisit needs 2 keys per host and one rv:hist key per candidate')
end
if not revisit_conf(KEYS[4]) then return {0, -1} end
local qkeys = host_queue_keys(9, hosts)
local now = now_ms()
local back, counts = {}, {}
for i = 2 + nhosts, #ARGV do
  local id = ARGV[i]
  local at = tonumber(redis.call('ZSCORE', due, id))
  local field = record_field(id)
  local r = record_decode(redis.call('HGET', KEYS[8 + 2 * nhosts + i - first + 1], field))
  -- its compact entry straight from the record: the id's 16 bytes (its field) and its
  -- tail with `v` (not expanded to be compacted again by requeue_entries; the tail
  -- alone, as binary id bytes may be whitespace); none for a recrawl window's record
  if at and at <= now and r and qkeys[r.host] and r.tail ~= '' then
    redis.call('ZREM', due, id)
    back[#back + 1] = {r.host, r.prio, field .. revisit_entry(r, r.tail)}
    local bucket = late_bucket(now - at)
    counts[bucket] = (counts[bucket] or 0) + 1
  end
end
local L = ledger(host_keys(1), now)
requeue_entries(L, back, qkeys, prio_hosts, pending, false)
ledger_flush(L)
counts.revisits = #back
bump(stats, counts)
local next_due = redis.call('ZRANGE', due, 0, 0, 'WITHSCORES')
local wait = -1
if next_due[2] then wait = math.max(0, tonumber(next_due[2]) - now) end
return {#back, wait}
