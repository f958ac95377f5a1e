-- ack.lua: mark leased tasks done, after their result reached the sink.
--
-- Only the current lease holder, before its deadline, can ack; anything else is
-- refused and counted as `stale`. A done task keeps only its seen mark: its body
-- and bookkeeping are deleted, and its host gets its slot back (unless it got it back
-- when the response was in: lease.lua's fetched list). Reads and deletes are
-- batched (a few commands per call, not per task); an id given twice is acked once,
-- the repeat answers UNKNOWN. With exact dedup its seen mark becomes -(now), the time it
-- ended, which a recrawl window counts from (enqueue.lua). An item sent late (sent_ms)
-- moves its host's last request to then (note_sent, lib/hosts.lua). A lease's page of its
-- host's budget is settled (settle_pages, lib/hosts.lua): used if its request got a response,
-- given back if not (robots_disallowed: no request). With the crawl's adaptive_delay on,
-- each response's time joins its host's moving average (note_elapsed, lib/hosts.lua).
-- With marks 2 (the crawl's revisits on) each done URL also gets its history record and
-- its next visit (schedule_visits, lib/revisits.lua), from what its fetch observed; a
-- partition whose `conf` says revisits are off ignores them.
--
-- KEYS[1..6] host state: due, h:queued, h:inflight, h:last, hostconf, conf (lib/hosts.lua)
-- KEYS[7]  leases       ZSET
-- KEYS[8]  owners       HASH  id -> "[f][b]<token>:<worker>"
-- KEYS[9]  tasks        HASH  id -> "<host> <priority> <entry>"
-- KEYS[10] attempts     HASH
-- KEYS[11] checkpoints  HASH
-- KEYS[12] errors       HASH
-- KEYS[13] stalls       HASH
-- KEYS[14] stats        HASH  counters (done, outcome:<outcome>, stale)
-- KEYS[15] h:done       ZSET  host -> done
-- KEYS[16..] with marks: per item i, its seen bucket HASH; then with marks 2: rv:hist
--          HASH, rv:due ZSET (the last two keys)
-- ARGV[1]  worker id
-- ARGV[2]  marks: 1 = each item also names its seen field (exact dedup), 2 = and what
--          its fetch observed (revisits on), 0 = neither
-- ARGV[3..] per item: id, token, outcome (a short code such as ok, http_4xx), sent_ms
--           (Redis ms its request went out when later than its turn, else 0),
--           responded (1 = its request to the host got a response, 0 = no request
--           went out), elapsed_ms (its response's time, -1 = none)[, seen field,
--           observed ("<max_age_s> <digest|-> <#etag> <#lm> <etag><lm>", marks 2)]
-- Returns {code per item} (0 OK, 3 STALE, 4 EXPIRED, 5 UNKNOWN)
--- @include "lib/codes"
--- @include "lib/leases"
--- @include "lib/memory"
--- @include "lib/hosts"
--- @include "lib/queues"
--- @include "lib/revisits"

local leases, owners, tasks, attempts = KEYS[7], KEYS[8], KEYS[9], KEYS[10]
local checkpoints, errors, stalls, stats = KEYS[11], KEYS[12], KEYS[13], KEYS[14]
local done_by_host = KEYS[15]
local worker = ARGV[1]
local marks = ARGV[2] ~= '0'
local observing = ARGV[2] == '2'
local width = marks and 7 or 6
if observing then width = 8 end
local extra_keys = observing and 2 or 0
if (#ARGV - 2) % width ~= 0
    or (marks and #KEYS ~= 15 + (#ARGV - 2) / width + extra_keys) then
  error('crawlq: ack needs (id, token, outcome, sent_ms, responded, elapsed_ms[, seen '
    .. 'field[, observed]]) per item, and seen keys')
end
allow_at_maxmemory(stats)
local now = now_ms()
local ids, tokens, outcome_of, sent_of, responded_of, elapsed_of = {}, {}, {}, {}, {}, {}
for i = 3, #ARGV, width do
  ids[#ids + 1] = ARGV[i]
  tokens[#tokens + 1] = ARGV[i + 1]
  outcome_of[#outcome_of + 1] = ARGV[i + 2]
  sent_of[#sent_of + 1] = int_arg(ARGV[i + 3], 'sent_ms')
  responded_of[#responded_of + 1] = ARGV[i + 4] == '1'
  elapsed_of[#elapsed_of + 1] = int_arg(ARGV[i + 5], 'elapsed_ms')
end
local states, held = lease_states(leases, owners, ids, tokens, worker, now)
local codes, gone, gone_sent, acked, stale, outcomes = {}, {}, {}, {}, 0, {}
local gone_elapsed = {}  -- per gone id: its response's time (ms, -1: none)
local slot_taken = {}  -- per gone id: its host's slot is still taken (not fetched)
local pages = {}  -- per gone id: {reserved, responded} (settle_pages)
local gone_item = {}  -- per gone id: its item's index
for i, id in ipairs(ids) do
  local state = states[i]
  if state == OK and acked[id] then state = UNKNOWN end
  if state == OK then
    acked[id] = true
    gone[#gone + 1] = id
    gone_item[#gone] = i
    if marks then
      redis.call('HSET', KEYS[15 + i], ARGV[9 + width * (i - 1)], -math.floor(now / 1000))
    end
    gone_sent[#gone] = sent_of[i]
    gone_elapsed[#gone] = elapsed_of[i]
    slot_taken[#gone] = not fetched_owner(held[i])
    local _, reserved = owner_marks(held[i])
    pages[#gone] = {reserved, responded_of[i]}
    local key = 'outcome:' .. outcome_of[i]
    outcomes[key] = (outcomes[key] or 0) + 1
  else
    stale = stale + 1
  end
  codes[i] = state
end
if #gone > 0 then
  local values = call_sliced('HMGET', tasks, gone, 1000)
  local per_host, hosts, sent, freed, settle, elapsed = {}, {}, {}, {}, {}, {}
  local rv = observing and revisit_conf()
  local visits = {}
  for k, v in ipairs(values) do
    local host, prio, entry = split_value(v)
    if rv and host then
      local i = gone_item[k]
      visits[#visits + 1] = {gone[k], host, prio, entry, outcome_of[i],
                                 ARGV[10 + width * (i - 1)]}
    end
    if host then
      per_host[host] = (per_host[host] or 0) + 1
      settle[#settle + 1] = {host, pages[k][1], pages[k][2]}
      if slot_taken[k] then freed[host] = (freed[host] or 0) - 1 end
      hosts[#hosts + 1] = host
      if gone_sent[k] > (sent[host] or 0) then sent[host] = gone_sent[k] end
      if gone_elapsed[k] >= 0 then elapsed[#elapsed + 1] = {host, gone_elapsed[k]} end
    end
  end
  note_sent(sent)
  if #visits > 0 then schedule_visits(KEYS[#KEYS - 1], KEYS[#KEYS], visits, rv, now) end
  if #elapsed > 0 then note_elapsed(elapsed, crawl_conf()) end
  call_sliced('ZREM', leases, gone, 1000)
  for _, h in ipairs({owners, tasks, attempts}) do
    call_sliced('HDEL', h, gone, 1000)
  end
  -- Usually absent (no checkpoints, failures or stalls): an EXISTS is cheaper than
  -- handing every id to HDEL.
  for _, h in ipairs({checkpoints, errors, stalls}) do
    if redis.call('EXISTS', h) == 1 then call_sliced('HDEL', h, gone, 1000) end
  end
  add_counts(H.inflight, freed)
  add_counts(done_by_host, per_host)
  settle_pages(settle, now)
  refresh_hosts(hosts)
end
outcomes.done = #gone
outcomes.stale = stale
bump(stats, outcomes)
return codes
