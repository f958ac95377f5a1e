-- ack.lua: mark leased tasks done, after their result reached the sink.
--
-- Only the current lease holder, before its deadline, can ack; anything else is
-- refused and counted as `stale`. A done task keeps only its seen mark: its body
-- and bookkeeping are deleted. Reads and deletes are batched (a few commands per call,
-- not per task); an id given twice is acked once, the repeat answers UNKNOWN.
--
-- KEYS[1]  leases       ZSET
-- KEYS[2]  owners       HASH
-- KEYS[3]  tasks        HASH
-- KEYS[4]  attempts     HASH
-- KEYS[5]  checkpoints  HASH
-- KEYS[6]  errors       HASH
-- KEYS[7]  stalls       HASH
-- KEYS[8]  prios        HASH
-- KEYS[9]  stats        HASH  counters (done, outcome:<outcome>, stale)
-- ARGV[1]  worker id
-- ARGV[2..] triples: id, token, outcome (a short code such as ok, http_404)
-- Returns {code per item} (0 OK, 3 STALE, 4 EXPIRED, 5 UNKNOWN)
local leases, owners, tasks, attempts = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local checkpoints, errors, stalls, prios, stats = KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9]
local worker = ARGV[1]
if (#ARGV - 1) % 3 ~= 0 then error('crawlq: ack needs (id, token, outcome) triples') end
allow_at_maxmemory(stats)
local now = now_ms()
local ids, tokens = {}, {}
for i = 2, #ARGV, 3 do
  ids[#ids + 1] = ARGV[i]
  tokens[#tokens + 1] = ARGV[i + 1]
end
local states = lease_states(leases, owners, ids, tokens, worker, now)
local codes, gone, acked, stale, outcomes = {}, {}, {}, 0, {}
for i, id in ipairs(ids) do
  local state = states[i]
  if state == OK and acked[id] then state = UNKNOWN end
  if state == OK then
    acked[id] = true
    gone[#gone + 1] = id
    local key = 'outcome:' .. ARGV[3 * i + 1]
    outcomes[key] = (outcomes[key] or 0) + 1
  else
    stale = stale + 1
  end
  codes[i] = state
end
if #gone > 0 then
  call_sliced('ZREM', leases, gone, 1000)
  for _, h in ipairs({owners, tasks, attempts}) do
    call_sliced('HDEL', h, gone, 1000)
  end
  -- Usually absent (no checkpoints, failures, stalls or priorities): an EXISTS is
  -- cheaper than handing every id to HDEL.
  for _, h in ipairs({checkpoints, errors, stalls, prios}) do
    if redis.call('EXISTS', h) == 1 then call_sliced('HDEL', h, gone, 1000) end
  end
end
outcomes.done = #gone
outcomes.stale = stale
bump(stats, outcomes)
return codes
