-- ack.lua: mark leased tasks done, after their result reached the sink.
--
-- Only the current lease holder, before its deadline, can ack; anything else is
-- refused and counted as `stale`. A done task keeps only its seen mark: its body
-- and bookkeeping are deleted.
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
local codes, done, stale, outcomes = {}, 0, 0, {}
for i = 2, #ARGV, 3 do
  local id, token, outcome = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local state = lease_state(leases, owners, id, token, worker, now)
  if state == OK then
    drop_lease(leases, owners, id)
    for _, h in ipairs({tasks, attempts, checkpoints, errors, stalls, prios}) do
      redis.call('HDEL', h, id)
    end
    done = done + 1
    outcomes['outcome:' .. outcome] = (outcomes['outcome:' .. outcome] or 0) + 1
  else
    stale = stale + 1
  end
  codes[#codes + 1] = state
end
outcomes.done = done
outcomes.stale = stale
bump(stats, outcomes)
return codes
