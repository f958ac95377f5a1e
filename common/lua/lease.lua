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
-- served (lib/hosts.lua's refresh_hosts keeps it out of `due`): its tasks stay pending,
-- parked, until its budget is raised. An entry whose id is already
-- live (leased, waiting or dead: a URL queued twice) is dropped, counted `duplicates`.
-- An entry that does not start with a 32-hex-digit id (corrupted state) goes to `dead`
-- as `malformed` under the id sha1(entry)[:32], its bytes kept. A paused crawl leases
-- nothing. A host whose queues hold fewer entries than h:queued counts (a lost or
-- restored hq/hp key) gets its count set to what they hold, `pending` corrected and
-- `repaired_hosts` (and `lost_pending` by the missing entries) counted, so it leaves
-- `due` when empty instead of staying ready with nothing to pop.
-- Fair share: a call that asked for tasks (n > 0) and got none marks its worker hungry
-- (`hungry`, for HUNGRY_MS); while another worker is hungry, a call takes no more of a
-- host with a concurrency limit than ceil(concurrency / (hungry workers + 1)), counting
-- the slots it holds (ARGV held), and publishes a wake-up so the hungry take the rest.
-- With nobody hungry a worker may take every free slot: no slot idles for fairness.
--
-- KEYS[1..6]  host state: due, h:queued, h:inflight, h:last, hostconf, conf (lib/hosts.lua)
-- KEYS[7]  tasks        HASH  id -> "<host> <priority> <entry>"
-- KEYS[8]  attempts     HASH  id -> attempts
-- KEYS[9]  leases       ZSET  id -> deadline (ms)
-- KEYS[10] owners       HASH  id -> "<token>:<worker>"
-- KEYS[11] seq          STRING fencing-token counter
-- KEYS[12] stats        HASH  counters (leased, duplicates, dead, repaired_hosts,
--                       lost_pending)
-- KEYS[13] checkpoints  HASH  id -> checkpoint JSON
-- KEYS[14] errors       HASH  id -> last error
-- KEYS[15] pending      STRING pending tasks
-- KEYS[16] prio_hosts   ZSET  host -> -highest pending priority
-- KEYS[17] delayed      ZSET  id -> due (ms): only read, for the next retry's time
-- KEYS[18] dead         ZSET  id -> died (ms)
-- KEYS[19] dead_reasons HASH  reason -> count
-- KEYS[20] hungry       ZSET  worker -> when its lease call last came back empty (ms)
-- KEYS[21..] per candidate host h (ARGV order): hq:<h> LIST, hp:<h> ZSET
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
--          back now, before this call's leases; the owners entry is marked, so the
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

local tasks, attempts, leases, owners = KEYS[7], KEYS[8], KEYS[9], KEYS[10]
local seq, stats, checkpoints, errors = KEYS[11], KEYS[12], KEYS[13], KEYS[14]
local pending, prio_hosts, delayed = KEYS[15], KEYS[16], KEYS[17]
local dead, dead_reasons = KEYS[18], KEYS[19]
local worker = ARGV[1]
local n = int_arg(ARGV[2], 'n')
local lease_ms = int_arg(ARGV[3], 'lease_ms')
local next_k = int_arg(ARGV[4], 'k')
if n < 0 or lease_ms < 1 then error('crawlq: lease needs n >= 0 and lease_ms >= 1') end
local hosts, nhosts = argv_hosts(6)
local first = 8 + nhosts
if #KEYS ~= 20 + 2 * nhosts or #ARGV < first - 1 or (#ARGV - first + 1) % 2 ~= 0 then
  error('crawlq: lease needs 2 keys per candidate host, held counts and (id, token) pairs')
end
local hungry = KEYS[20]
local held = {}
for v in string.gmatch(ARGV[7 + nhosts], '[^,]+') do held[#held + 1] = tonumber(v) end
-- How long an empty call keeps its worker hungry: longer than a consumer's idle poll
-- (a second at most), so a hungry worker that is still asking stays counted.
local HUNGRY_MS = 2000

local now = now_ms()
-- Responses in: give their hosts' slots back (what ack.lua would do at the lease's end).
if #ARGV >= first then
  local ids, tokens = {}, {}
  for i = first, #ARGV, 2 do
    ids[#ids + 1] = ARGV[i]
    tokens[#tokens + 1] = ARGV[i + 1]
  end
  local states, held = lease_states(leases, owners, ids, tokens, worker, now)
  local marks, owner_of, marked = {}, {}, {}
  for i, id in ipairs(ids) do
    if states[i] == OK and not fetched_owner(held[i]) and not marked[id] then
      marked[id] = true
      marks[#marks + 1] = id
      owner_of[#marks] = held[i]
    end
  end
  if #marks > 0 then
    local values = call_sliced('HMGET', tasks, marks, 1000)
    local freed, touched, hargs = {}, {}, {}
    for k, id in ipairs(marks) do
      local host = split_value(values[k])
      if host then
        freed[host] = (freed[host] or 0) - 1
        touched[#touched + 1] = host
        hargs[#hargs + 1] = id
        hargs[#hargs + 1] = 'f' .. owner_of[k]
      end
    end
    if #hargs > 0 then call_sliced('HSET', owners, hargs, 1000) end
    add_counts(H.inflight, freed)
    refresh_hosts(touched)
  end
end
local deadline = now + lease_ms
local retry_ms = -1
local next_retry = redis.call('ZRANGE', delayed, 0, 0, 'WITHSCORES')
if next_retry[2] then retry_ms = math.max(0, tonumber(next_retry[2]) - now) end
-- The next call's candidates, and how long until a host's turn when none is ready.
local function next_hosts(wait)
  local out = redis.call('ZRANGE', prio_hosts, 0, next_k - 1)
  local ready = redis.call('ZRANGEBYSCORE', H.due, '-inf', now, 'LIMIT', 0, next_k)
  if #ready > 0 then
    wait = 0
  else
    local first = redis.call('ZRANGE', H.due, 0, 0, 'WITHSCORES')
    if first[2] and (wait < 0 or tonumber(first[2]) - now < wait) then
      wait = math.max(0, tonumber(first[2]) - now)
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
  local nxt, wait = next_hosts(-1)
  if n > 0 and #nxt == 0 then hungry_now() end
  wake_fleet(false)
  return {now, deadline, wait, retry_ms, 0, nxt, -1}
end
local cc = crawl_conf()
if cc.paused then return {now, deadline, -1, retry_ms, 1, {}, cc.version} end

-- Fair share: while other workers' lease calls came back empty lately, this one takes
-- no more of a host's slots than its share (its concurrency over the hungry workers and
-- this one), counting what it holds; the slots it leaves are for them.
local others, me_hungry = 0, false
for _, w in ipairs(redis.call('ZRANGEBYSCORE', hungry, now - HUNGRY_MS, '+inf')) do
  if w == worker then me_hungry = true else others = others + 1 end
end
local capped = false

local due = call_sliced('ZMSCORE', H.due, hosts, 1000)
local inflight = call_sliced('ZMSCORE', H.inflight, hosts, 1000)
local queued = call_sliced('ZMSCORE', H.queued, hosts, 1000)
local confs = call_sliced('HMGET', H.hostconf, hosts, 1000)
local last = call_sliced('ZMSCORE', H.last, hosts, 1000)
local prio = {}
if redis.call('EXISTS', prio_hosts) == 1 then
  prio = call_sliced('ZMSCORE', prio_hosts, hosts, 1000)
end

-- Ready candidates, priority work first, then the longest-waiting. A host's time is
-- checked again from its last request and settings (a `due` score written before the
-- crawl's defaults changed may be early).
local ready, wait, refresh = {}, -1, {}
-- Each due candidate's settings, decoded once (most hosts have none: one shared table,
-- never written: only a host with a budget has its conf changed below).
local cf, NO_CONF = {}, conf_decode(nil)
for i = 1, #hosts do
  local at = tonumber(due[i])
  if at then
    local c = confs[i] and conf_decode(confs[i]) or NO_CONF
    cf[i] = c
    local delay = host_limits(c, cc, now)
    local earliest = math.max((tonumber(last[i]) or 0) + delay, c.blocked)
    if earliest > at then
      at = earliest
      refresh[#refresh + 1] = hosts[i]
    end
    if at <= now then
      ready[#ready + 1] = i
    elseif wait < 0 or at - now < wait then
      wait = at - now
    end
  end
end
local pkey, dkey = {}, {}
for _, i in ipairs(ready) do
  pkey[i], dkey[i] = tonumber(prio[i]) or 0, tonumber(due[i])
end
table.sort(ready, function(a, b)
  if pkey[a] ~= pkey[b] then return pkey[a] < pkey[b] end
  if dkey[a] ~= dkey[b] then return dkey[a] < dkey[b] end
  return a < b
end)

local popped = {}  -- {id, entry, host index, priority}
local delays, concs = {}, {}  -- host index -> delay (ms), concurrency (0: unlimited)
local budgeted = {}  -- host index -> its conf, when it has a page budget
local dq, dinf, last_args, stamped = {}, {}, {}, {}
-- Called when a host's pops came up short (its queues are empty, but for `left`
-- priority entries `prio_hosts` did not name): h:queued becomes what is left.
local function recount(i, host, got, left)
  local lost = (tonumber(queued[i]) or 0) + (dq[host] or 0) - got - left
  if lost == 0 then return end
  dq[host] = (dq[host] or 0) - lost
  redis.call('DECRBY', pending, lost)
  bump(stats, {repaired_hosts = 1, lost_pending = math.max(lost, 0)})
end
for r, i in ipairs(ready) do
  if #popped >= n then
    wait = 0
    break
  end
  local host = hosts[i]
  local hq, hp = KEYS[19 + 2 * i], KEYS[20 + 2 * i]
  local c = cf[i]
  local delay, conc = host_limits(c, cc, now)
  delays[i] = delay
  concs[i] = conc < UNLIMITED and conc or 0
  local free = conc - (tonumber(inflight[i]) or 0)
  local left = budget_left(c)
  if c.budget then budgeted[i] = c end
  if free > 0 and left > 0 then
    local take = n - #popped
    if delay > 0 then take = 1 end
    if take > free then take = free end
    if take > left then take = left end
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
      recount(i, host, got, left)
    end
    dq[host] = (dq[host] or 0) - got
    dinf[host] = (dinf[host] or 0) + got
    if got > 0 then
      last_args[#last_args + 1] = now
      last_args[#last_args + 1] = host
      stamped[host] = true
    end
    refresh[#refresh + 1] = host
  else
    refresh[#refresh + 1] = host  -- full or budget spent: out of `due` until that changes
  end
end

-- An id that is live already (a URL queued twice) is dropped, and so is a repeat within
-- this call: a task is in exactly one state.
local ids = {}
for k, p in ipairs(popped) do ids[k] = p[1] end
local live_owner, live_body = {}, {}
if #ids > 0 then
  live_owner = call_sliced('HMGET', owners, ids, 1000)
  live_body = call_sliced('HMGET', tasks, ids, 1000)
end
local keep, seen_ids, dropped, malformed = {}, {}, 0, 0
local HEX_ID = '^' .. string.rep('[0-9a-f]', 32) .. '$'
for k, p in ipairs(popped) do
  local host = hosts[p[3]]
  if not string.find(p[1], HEX_ID) then
    local id = string.sub(redis.sha1hex(p[2]), 1, 32)
    redis.call('HSET', tasks, id, host .. ' ' .. p[4] .. ' ' .. p[2])
    to_dead(dead, errors, dead_reasons, id, 'malformed',
      'task entry must start with its 32-hex-digit id', now)
    malformed = malformed + 1
    dinf[host] = dinf[host] - 1
  elseif live_owner[k] or live_body[k] or seen_ids[p[1]] then
    dropped = dropped + 1
    dinf[host] = dinf[host] - 1
  else
    seen_ids[p[1]] = true
    keep[#keep + 1] = p
  end
end

-- Each lease kept from a host with a budget holds a page of it until its end.
local conf_args, reserved_by = {}, {}
for _, p in ipairs(keep) do
  local c = budgeted[p[3]]
  if c then
    if not reserved_by[p[3]] then
      reserved_by[p[3]] = true
      conf_args[#conf_args + 1] = hosts[p[3]]
      conf_args[#conf_args + 1] = c
    end
    c.reserved = c.reserved + 1
  end
end
for k = 2, #conf_args, 2 do conf_args[k] = conf_encode(conf_args[k]) end

if #last_args > 0 then call_sliced('ZADD', H.last, last_args, 1000) end
if #conf_args > 0 then call_sliced('HSET', H.hostconf, conf_args, 1000) end
-- The touched hosts' new counts and places in `due`, from the state read above and this
-- call's changes: what lib/hosts.lua's add_counts and refresh_hosts would read again.
do
  local index, seen, qargs, iargs, add, rem = {}, {}, {}, {}, {}, {}
  for i = #hosts, 1, -1 do index[hosts[i]] = i end
  for _, host in ipairs(refresh) do
    if not seen[host] then
      seen[host] = true
      local i, q_by, f_by = index[host], dq[host] or 0, dinf[host] or 0
      local q = math.max(0, (tonumber(queued[i]) or 0) + q_by)
      local f = math.max(0, (tonumber(inflight[i]) or 0) + f_by)
      if q_by ~= 0 then qargs[#qargs + 1], qargs[#qargs + 2] = q, host end
      if f_by ~= 0 then iargs[#iargs + 1], iargs[#iargs + 2] = f, host end
      local c = cf[i]  -- every host refreshed here was due: decoded above
      local delay, conc = host_limits(c, cc, now)
      if q > 0 and f < conc and budget_left(c) > 0 then
        local at = (stamped[host] and now or tonumber(last[i]) or 0) + delay
        if c.blocked > at then at = c.blocked end
        add[#add + 1], add[#add + 2] = at, host
      else
        rem[#rem + 1] = host
      end
    end
  end
  if #qargs > 0 then call_sliced('ZADD', H.queued, qargs, 1000) end
  if #iargs > 0 then call_sliced('ZADD', H.inflight, iargs, 1000) end
  if #add > 0 then call_sliced('ZADD', H.due, add, 1000) end
  if #rem > 0 then call_sliced('ZREM', H.due, rem, 1000) end
end
if #popped > 0 then redis.call('DECRBY', pending, #popped) end

local nxt
nxt, wait = next_hosts(wait)
local result = {now, deadline, wait, retry_ms, 0, nxt, cc.version}
if #keep > 0 then
  local kids = {}
  for k, p in ipairs(keep) do kids[k] = p[1] end
  local cps, errs = {}, {}
  if redis.call('EXISTS', checkpoints) == 1 then cps = call_sliced('HMGET', checkpoints, kids, 1000) end
  if redis.call('EXISTS', errors) == 1 then errs = call_sliced('HMGET', errors, kids, 1000) end
  force_hashtable(owners)
  force_hashtable(attempts)
  local counts = call_sliced('HMGET', attempts, kids, 1000)
  local first = redis.call('INCRBY', seq, #kids) - #kids + 1
  -- Explicit indexes, not #t: the length operator is a search in Lua 5.1.
  local zargs, hargs, aargs, targs = {}, {}, {}, {}
  local owner_suffix, deadline_arg, r = ':' .. worker, tostring(deadline), 7
  for k, p in ipairs(keep) do
    local id, entry, host = p[1], p[2], hosts[p[3]]
    local token = tostring(first + k - 1)
    local attempt = (tonumber(counts[k]) or 0) + 1
    local j = 2 * (k - 1)
    aargs[j + 1], aargs[j + 2] = id, attempt
    zargs[j + 1], zargs[j + 2] = deadline_arg, id
    hargs[j + 1], hargs[j + 2] = id, (budgeted[p[3]] and 'b' or '') .. token .. owner_suffix
    targs[j + 1], targs[j + 2] = id, host .. ' ' .. p[4] .. ' ' .. entry
    result[r + 1], result[r + 2], result[r + 3] = id, token, attempt
    result[r + 4], result[r + 5], result[r + 6] = entry, cps[k] or false, errs[k] or false
    result[r + 7], result[r + 8], result[r + 9] = host, delays[p[3]], concs[p[3]]
    r = r + 9
  end
  call_sliced('HSET', tasks, targs, 1000)
  call_sliced('HSET', attempts, aargs, 1000)
  call_sliced('ZADD', leases, zargs, 1000)
  call_sliced('HSET', owners, hargs, 1000)
end
if n > 0 and #keep == 0 then
  hungry_now()
elseif me_hungry and #keep > 0 then
  redis.call('ZREM', hungry, worker)
end
wake_fleet(capped)
bump(stats, {leased = #keep, duplicates = dropped, dead = malformed})
return result
