-- lease.lua: lease up to n tasks from hosts whose turn has come (the host-fair frontier).
--
-- The caller names candidate hosts (the head of `due` and of `prio_hosts`: read just
-- before, or as the previous call's reply named them); this script decides, on Redis
-- TIME, which of them may be served now: a host is served when its time in `due` has
-- come and it has fewer requests in flight (leases whose response is not in) than its
-- concurrency. Hosts holding priority work go first, then the longest-waiting. A host
-- with a delay gives one task per call and moves its next turn to now + delay; a host
-- without one gives as many as its free slots. Within a host, priority entries come
-- first, then FIFO. Each task gets a fresh fencing token and a deadline of TIME +
-- lease_ms; its attempt is counted now. A lease of a host with a page budget holds a
-- page of it (its owner marked "b", its host's `reserved` counted: lib/hosts.lua), settled at
-- the lease's end; a host gives at most what its budget has left after its pages used
-- and held, so concurrent leases can't pass it. A host whose budget is spent is not
-- served (lib/hosts.lua's due rule keeps it out of `due`): its tasks stay pending,
-- parked, until its budget is raised. An entry whose id is already
-- live (leased, waiting or dead: a URL queued twice) is dropped, counted `duplicates`.
-- An entry that does not start with a 32-hex-digit id (corrupted state) goes to `dead`
-- as `malformed` under the id sha1(entry)[:32], its bytes kept. A paused crawl leases
-- nothing. A host whose queues hold fewer entries than its record counts (a lost or
-- restored hq/hp key) gets its count set to what they hold, `pending` corrected and
-- `repaired_hosts` (and `lost_pending` by the missing entries) counted, so it leaves
-- `due` when empty instead of staying ready with nothing to pop.
-- Fair share: a call that asked for tasks (n > 0) and got none marks its worker hungry
-- (`hungry`, for HUNGRY_MS); while another worker is hungry, a call takes no more of a
-- host with a concurrency limit than ceil(concurrency / (hungry workers + 1)), counting
-- the slots it holds (ARGV held), and publishes a wake-up so the hungry take the rest.
-- With nobody hungry a worker may take every free slot: no slot idles for fairness.
--
-- KEYS[1..4]  host state: hosts, due, h:queued, conf (lib/hosts.lua)
-- KEYS[5..6]  lease state: leased, leases (lib/leases.lua)
-- KEYS[7]  tasks        HASH  id -> "<host> <priority> <entry>" (waiting or dead: live)
-- KEYS[8]  attempts     HASH  id -> attempts of a task that is not leased
-- KEYS[9]  seq          STRING fencing-token counter
-- KEYS[10] stats        HASH  counters (leased, duplicates, dead, repaired_hosts,
--                       lost_pending)
-- KEYS[11] checkpoints  HASH  id -> checkpoint JSON
-- KEYS[12] errors       HASH  id -> last error
-- KEYS[13] pending      STRING pending tasks
-- KEYS[14] prio_hosts   ZSET  host -> -highest pending priority
-- KEYS[15] delayed      ZSET  id -> due (ms): only read, for the next retry's time
-- KEYS[16] dead         ZSET  id -> died (ms)
-- KEYS[17] dead_reasons HASH  reason -> count
-- KEYS[18] hungry       ZSET  worker -> when its lease call last came back empty (ms)
-- KEYS[19..] per candidate host h (ARGV order): hq:<h> LIST, hp:<h> ZSET
-- ARGV[1]  worker id
-- ARGV[2]  n, the most tasks to lease (0: only give back the slots of `fetched` ones)
-- ARGV[3]  lease_ms, lease length in milliseconds
-- ARGV[4]  k, how many candidates to name for the next call
-- ARGV[5]  the crawl's wake channel (common/wake.py; '' for none): a call with n = 0
--          that gave slots back publishes on it, so the fleet's idle consumers take
--          them while this one's CPU is behind (a failed PUBLISH is ignored: a hint)
-- ARGV[6]  H, the number of candidate hosts; ARGV[7..6+H] the candidate hosts
-- ARGV[7+H] held: how many of each candidate host's slots this worker's leases take now
--          (not counting the pairs below), comma-separated in host order ('': none)
-- ARGV[8+H..] pairs: id, token
--          (this worker's leases whose response is in. Their hosts get their slots
--          back now, before this call's leases; the lease record is marked, so the
--          lease's end does not give the slot back again. A lease that is not this
--          worker's anymore is left alone.)
-- Returns {now_ms, deadline_ms, wait_ms, retry_ms, paused, next, policy_version,
--          id, token, attempt, entry, checkpoint|false, last_error|false, host,
--          delay_ms, concurrency, ...}:
--   wait_ms  -1: no host holds work; 0: hosts are ready (after this call's leases);
--            else ms until the earliest host's turn
--   retry_ms ms until the next retry is due (0: one is due now), -1 if none waits
--   paused   1 if the crawl is paused (nothing leased)
--   policy_version the crawl policy's version this partition's conf holds (-1 in a call
--            on no hosts, which does not read it): a consumer that knows an older one
--            reads the policy again, with no round trip of its own
--   concurrency the lease's host's concurrency, 0 if unlimited: with a limit and no
--            delay, the consumer names the lease in its next call once the response
--            is in
--   delay_ms the lease's host's delay (its policy, or robots.txt's Crawl-delay): with
--            a delay, the request must go out at its turn (the consumer times it)
--   next     the candidates for the next call, read after this one's leases: up to k
--            hosts of `prio_hosts`, then up to k of `due` whose time has come (so a
--            steady crawl leases in one round trip, with no read before)
--- @include "lib/codes"
--- @include "lib/leases"
--- @include "lib/dead"
--- @include "lib/memory"
--- @include "lib/hosts"
--- @include "lib/queues"

-- Phase 1: the call's arguments.
local LK = lease_keys(5)
local tasks, attempts, seq, stats = KEYS[7], KEYS[8], KEYS[9], KEYS[10]
local checkpoints, errors, pending, prio_hosts = KEYS[11], KEYS[12], KEYS[13], KEYS[14]
local delayed, dead, dead_reasons, hungry = KEYS[15], KEYS[16], KEYS[17], KEYS[18]
local worker = ARGV[1]
local n = int_arg(ARGV[2], 'n')
local lease_ms = int_arg(ARGV[3], 'lease_ms')
local next_k = int_arg(ARGV[4], 'k')
if n < 0 or lease_ms < 1 then error('crawlq: lease needs n >= 0 and lease_ms >= 1') end
local hosts, nhosts = argv_hosts(6)
local first = 8 + nhosts
if #KEYS ~= 18 + 2 * nhosts or #ARGV < first - 1 or (#ARGV - first + 1) % 2 ~= 0 then
  error('crawlq: lease needs 2 keys per candidate host, held counts and (id, token) pairs')
end
local held = {}
for v in string.gmatch(ARGV[7 + nhosts], '[^,]+') do held[#held + 1] = tonumber(v) end
-- How long an empty call keeps its worker hungry: longer than a consumer's idle poll
-- (a second at most), so a hungry worker that is still asking stays counted.
local HUNGRY_MS = 2000
local now = now_ms()
local deadline = now + lease_ms
local L = ledger(host_keys(1), now)

-- Phase 2: responses in. Their hosts get their slots back (what the lease's end would
-- do), and their records are marked so the end does not do it again.
local function give_back()
  if #ARGV < first then return end
  local ids, tokens = {}, {}
  for i = first, #ARGV, 2 do
    ids[#ids + 1] = ARGV[i]
    tokens[#tokens + 1] = ARGV[i + 1]
  end
  local states, recs = lease_states(LK, ids, tokens, worker, now)
  local marks, freed, seen = {}, {}, {}
  for i, id in ipairs(ids) do
    local rec = recs[i]
    if states[i] == OK and not fetched_owner(rec.owner) and not seen[id] then
      seen[id] = true
      marks[#marks + 1] = id
      marks[#marks + 1] = lease_value('f' .. rec.owner, rec.attempt, rec.host, rec.prio,
                                      rec.entry)
      freed[#freed + 1] = rec.host
    end
  end
  if #marks == 0 then return end
  call_sliced('HSET', LK.leased, marks, 1000)
  ledger_load(L, freed)
  for _, host in ipairs(freed) do
    local r = L.rec[host]
    if r.inflight > 0 then r.inflight = r.inflight - 1 end
    ledger_touch(L, host)
  end
end
give_back()

local retry_ms = -1
local next_retry = redis.call('ZRANGE', delayed, 0, 0, 'WITHSCORES')
if next_retry[2] then retry_ms = math.max(0, tonumber(next_retry[2]) - now) end

-- The next call's candidates, and how long until a host's turn when none is ready.
local function next_hosts(wait)
  local out = redis.call('ZRANGE', prio_hosts, 0, next_k - 1)
  local ready = redis.call('ZRANGEBYSCORE', L.K.due, '-inf', now, 'LIMIT', 0, next_k)
  if #ready > 0 then
    wait = 0
  else
    local head = redis.call('ZRANGE', L.K.due, 0, 0, 'WITHSCORES')
    if head[2] and (wait < 0 or tonumber(head[2]) - now < wait) then
      wait = math.max(0, tonumber(head[2]) - now)
    end
  end
  for _, h in ipairs(ready) do out[#out + 1] = h end
  return out, wait
end

-- A worker whose call asked for tasks and got none is hungry (read below). A hint: a
-- Redis at maxmemory refuses the mark (the script's first write may not grow memory)
-- and the call goes on without it.
local function hungry_now()
  if redis.pcall('ZADD', hungry, now, worker) == 1 then  -- a new worker: forget old ones
    redis.call('ZREMRANGEBYSCORE', hungry, '-inf', now - HUNGRY_MS)
  end
end

-- Slots given back by a worker whose CPU is behind (n = 0), or left for hungry workers
-- (`capped`): wake the fleet's idle consumers now.
local function wake_fleet(capped)
  if (capped or (n == 0 and #ARGV >= first)) and ARGV[5] ~= '' then
    redis.pcall('PUBLISH', ARGV[5], '1')
  end
end

if #hosts == 0 then  -- a pause shows in the call that names hosts
  ledger_flush(L)
  local nxt, wait = next_hosts(-1)
  if n > 0 and #nxt == 0 then hungry_now() end
  wake_fleet(false)
  return {now, deadline, wait, retry_ms, 0, nxt, -1}
end
local cc = ledger_conf(L)
if cc.paused then
  ledger_flush(L)
  return {now, deadline, -1, retry_ms, 1, {}, cc.version}
end

-- Phase 3: the ready candidates, in serving order: priority work first, then the
-- longest-waiting. Each candidate's turn comes from its record (the due rule), so a
-- `due` score written before the crawl's defaults changed can't serve a host early; a
-- candidate that is not ready gets its place in `due` written again.
ledger_load(L, hosts)
local prio = {}
if redis.call('EXISTS', prio_hosts) == 1 then
  prio = call_sliced('ZMSCORE', prio_hosts, hosts, 1000)
end
local ready, wait, turn, pkey = {}, -1, {}, {}
for i, host in ipairs(hosts) do
  local at = turn_of(L.rec[host], cc, now)
  if at and at <= now and not turn[host] then
    ready[#ready + 1] = i
    turn[host], pkey[i] = at, tonumber(prio[i]) or 0
  else
    if at and (wait < 0 or at - now < wait) then wait = at - now end
    ledger_reschedule(L, host)
  end
end
table.sort(ready, function(a, b)
  if pkey[a] ~= pkey[b] then return pkey[a] < pkey[b] end
  local ta, tb = turn[hosts[a]], turn[hosts[b]]
  if ta ~= tb then return ta < tb end
  return a < b
end)

-- Fair share: while other workers' lease calls came back empty lately, this one takes
-- no more of a host's slots than its share (its concurrency over the hungry workers and
-- this one), counting what it holds; the slots it leaves are for them.
local others, me_hungry = 0, false
for _, w in ipairs(redis.call('ZRANGEBYSCORE', hungry, now - HUNGRY_MS, '+inf')) do
  if w == worker then me_hungry = true else others = others + 1 end
end
local capped = false

-- Phase 4: take entries from the ready hosts' queues: one from a host with a delay (its
-- turn), else up to its free slots, never past its budget or its fair share.
local popped = {}  -- {id, entry, host index, priority}
local delays, concs = {}, {}  -- host index -> delay (ms), concurrency (0: unlimited)
-- A host whose queues came up short (a lost or restored hq/hp key) gets its count set to
-- what `left` priority entries hold, and `pending` corrected.
local function recount(r, got, left)
  local lost = r.queued - got - left
  if lost == 0 then return end
  r.queued = got + left
  redis.call('DECRBY', pending, lost)
  bump(stats, {repaired_hosts = 1, lost_pending = math.max(lost, 0)})
end
for _, i in ipairs(ready) do
  if #popped >= n then
    wait = 0
    break
  end
  local host = hosts[i]
  local hq, hp = KEYS[17 + 2 * i], KEYS[18 + 2 * i]
  local r = L.rec[host]
  local delay, conc = host_limits(r, cc, now)
  delays[i], concs[i] = delay, conc < UNLIMITED and conc or 0
  local take = math.min(n - #popped, conc - r.inflight, budget_left(r))
  if delay > 0 then take = math.min(take, 1) end
  if others > 0 and conc < UNLIMITED then
    local share = math.ceil(conc / (others + 1)) - (held[i] or 0)
    if take > share then
      take = math.max(share, 0)
      capped = true
    end
  end
  local got = 0
  if take > 0 and prio[i] then
    local z = redis.call('ZPOPMIN', hp, take)
    for k = 1, #z, 2 do
      popped[#popped + 1] = {string.sub(z[k], 1, 32), z[k], i, -tonumber(z[k + 1])}
      got = got + 1
    end
    refresh_prio(prio_hosts, hp, host)
  end
  if got < take then
    for _, e in ipairs(redis.call('LPOP', hq, take - got) or {}) do
      popped[#popped + 1] = {string.sub(e, 1, 32), e, i, 0}
      got = got + 1
    end
  end
  if got < take then
    local left = redis.call('ZCARD', hp)
    if left > 0 and not prio[i] then  -- priority work prio_hosts did not name
      redis.call('ZADD', prio_hosts, redis.call('ZRANGE', hp, 0, 0, 'WITHSCORES')[2], host)
    end
    recount(r, got, left)
  end
  r.queued = r.queued - got
  r.inflight = r.inflight + got
  if got > 0 then r.last = now end
  ledger_touch(L, host)
end
if #popped > 0 then redis.call('DECRBY', pending, #popped) end

-- Phase 5: screen. An id that is live already (a URL queued twice) is dropped, and so is
-- a repeat within this call: a task is in exactly one state. An entry without its id
-- goes to `dead` as malformed.
local keep, dropped, malformed = {}, 0, 0
if #popped > 0 then
  local ids = {}
  for k, p in ipairs(popped) do ids[k] = p[1] end
  local live_lease = call_sliced('HMGET', LK.leased, ids, 1000)
  local live_body = call_sliced('HMGET', tasks, ids, 1000)
  local seen_ids = {}
  local HEX_ID = '^' .. string.rep('[0-9a-f]', 32) .. '$'
  for k, p in ipairs(popped) do
    local host = hosts[p[3]]
    local gone = true
    if not string.find(p[1], HEX_ID) then
      local id = string.sub(redis.sha1hex(p[2]), 1, 32)
      redis.call('HSET', tasks, id, host .. ' ' .. p[4] .. ' ' .. p[2])
      to_dead(dead, errors, dead_reasons, id, 'malformed',
        'task entry must start with its 32-hex-digit id', now)
      malformed = malformed + 1
    elseif live_lease[k] or live_body[k] or seen_ids[p[1]] then
      dropped = dropped + 1
    else
      seen_ids[p[1]] = true
      keep[#keep + 1] = p
      gone = false
    end
    if gone then
      local r = L.rec[host]
      r.inflight = r.inflight - 1
    end
  end
end

-- Phase 6: grant. Each kept entry becomes a lease record (its attempt counted now, its
-- owner marked "b" when it holds a page of its host's budget) with its deadline.
local grants = {}  -- {id, token, attempt, entry, checkpoint, last error, host index}
if #keep > 0 then
  local kids = {}
  for k, p in ipairs(keep) do kids[k] = p[1] end
  local cps, errs, counts = {}, {}, {}
  if redis.call('EXISTS', checkpoints) == 1 then cps = call_sliced('HMGET', checkpoints, kids, 1000) end
  if redis.call('EXISTS', errors) == 1 then errs = call_sliced('HMGET', errors, kids, 1000) end
  if redis.call('EXISTS', attempts) == 1 then
    counts = call_sliced('HMGET', attempts, kids, 1000)
    call_sliced('HDEL', attempts, kids, 1000)
  end
  local base = redis.call('INCRBY', seq, #kids) - #kids
  local records, deadlines = {}, {}
  local owner_suffix, deadline_arg = ':' .. worker, tostring(deadline)
  -- Explicit indexes, not #t: the length operator is a search in Lua 5.1.
  for k, p in ipairs(keep) do
    local id, entry, host = p[1], p[2], hosts[p[3]]
    local r = L.rec[host]
    local token = tostring(base + k)
    local attempt = (tonumber(counts[k]) or 0) + 1
    local owner = token .. owner_suffix
    if r.budget then
      owner = 'b' .. owner
      r.reserved = r.reserved + 1
    end
    records[2 * k - 1], records[2 * k] = id, lease_value(owner, attempt, host, p[4], entry)
    deadlines[2 * k - 1], deadlines[2 * k] = deadline_arg, id
    grants[k] = {id, token, attempt, entry, cps[k] or false, errs[k] or false, p[3]}
  end
  call_sliced('HSET', LK.leased, records, 1000)
  call_sliced('ZADD', LK.leases, deadlines, 1000)
end
ledger_flush(L)

-- Phase 7: the reply, with the next call's candidates read after this call's changes.
local nxt
nxt, wait = next_hosts(wait)
local result = {now, deadline, wait, retry_ms, 0, nxt, cc.version}
local r = 7
for _, g in ipairs(grants) do
  local i = g[7]
  result[r + 1], result[r + 2], result[r + 3] = g[1], g[2], g[3]
  result[r + 4], result[r + 5], result[r + 6] = g[4], g[5], g[6]
  result[r + 7], result[r + 8], result[r + 9] = hosts[i], delays[i], concs[i]
  r = r + 9
end
if n > 0 and #keep == 0 then
  hungry_now()
elseif me_hungry and #keep > 0 then
  redis.call('ZREM', hungry, worker)
end
wake_fleet(capped)
bump(stats, {leased = #keep, duplicates = dropped, dead = malformed})
return result
