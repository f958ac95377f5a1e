-- lease.lua: lease up to n tasks from hosts whose turn has come (the host-fair frontier).
--
-- The caller names candidate hosts (the head of `due` and of `prio_hosts`: read just
-- before, or as the previous call's reply named them); this script decides, on Redis
-- TIME, which of them may be served now: a host is served when its time in `due` has
-- come and it has fewer leases than its concurrency. Hosts holding priority work go first, then the longest-waiting. A host
-- with a delay gives one task per call and moves its next turn to now + delay; a host
-- without one gives as many as its free slots. Within a host, priority entries come
-- first, then FIFO. Each task gets a fresh fencing token and a deadline of TIME +
-- lease_ms; its attempt is counted now. A host past its page budget has its pending
-- entries ended as done, outcome `host_budget`, instead. An entry whose id is already
-- live (leased, waiting or dead: a URL queued twice) is dropped, counted `duplicates`.
-- An entry that does not start with a 32-hex-digit id (corrupted state) goes to `dead`
-- as `malformed` under the id sha1(entry)[:32], its bytes kept. A paused crawl leases
-- nothing.
--
-- KEYS[1..6]  host state: due, h:queued, h:inflight, h:last, hostconf, conf (lib.lua)
-- KEYS[7]  tasks        HASH  id -> "<host> <priority> <entry>"
-- KEYS[8]  attempts     HASH  id -> attempts
-- KEYS[9]  leases       ZSET  id -> deadline (ms)
-- KEYS[10] owners       HASH  id -> "<token>:<worker>"
-- KEYS[11] seq          STRING fencing-token counter
-- KEYS[12] stats        HASH  counters (leased, duplicates, done, outcome:host_budget)
-- KEYS[13] checkpoints  HASH  id -> checkpoint JSON
-- KEYS[14] errors       HASH  id -> last error
-- KEYS[15] pending      STRING pending tasks
-- KEYS[16] prio_hosts   ZSET  host -> -highest pending priority
-- KEYS[17] delayed      ZSET  id -> due (ms): only read, for the next retry's time
-- KEYS[18] h:done       ZSET  host -> done
-- KEYS[19] dead         ZSET  id -> died (ms)
-- KEYS[20] dead_reasons HASH  reason -> count
-- KEYS[21..] per candidate host h (ARGV order): hq:<h> LIST, hp:<h> ZSET
-- ARGV[1]  worker id
-- ARGV[2]  n, the most tasks to lease
-- ARGV[3]  lease_ms, lease length in milliseconds
-- ARGV[4]  k, how many candidates to name for the next call
-- ARGV[5..] candidate hosts
-- Returns {now_ms, deadline_ms, wait_ms, retry_ms, paused, next,
--          id, token, attempt, entry, checkpoint|false, last_error|false, host, ...}:
--   wait_ms  -1: no host holds work; 0: hosts are ready (after this call's leases);
--            else ms until the earliest host's turn
--   retry_ms ms until the next retry is due (0: one is due now), -1 if none waits
--   paused   1 if the crawl is paused (nothing leased)
--   next     the candidates for the next call, read after this one's leases: up to k
--            hosts of `prio_hosts`, then up to k of `due` whose time has come (so a
--            steady crawl leases in one round trip, with no read before)
local tasks, attempts, leases, owners = KEYS[7], KEYS[8], KEYS[9], KEYS[10]
local seq, stats, checkpoints, errors = KEYS[11], KEYS[12], KEYS[13], KEYS[14]
local pending, prio_hosts, delayed, done_by_host = KEYS[15], KEYS[16], KEYS[17], KEYS[18]
local dead, dead_reasons = KEYS[19], KEYS[20]
local worker = ARGV[1]
local n = int_arg(ARGV[2], 'n')
local lease_ms = int_arg(ARGV[3], 'lease_ms')
local next_k = int_arg(ARGV[4], 'k')
if n < 1 or lease_ms < 1 then error('crawlq: lease needs n >= 1 and lease_ms >= 1') end
local hosts = {}
for i = 5, #ARGV do hosts[#hosts + 1] = ARGV[i] end
if #KEYS ~= 20 + 2 * #hosts then error('crawlq: lease needs 2 keys per candidate host') end

local now = now_ms()
local deadline = now + lease_ms
local retry_ms = -1
local next_retry = redis.call('ZRANGE', delayed, 0, 0, 'WITHSCORES')
if next_retry[2] then retry_ms = math.max(0, tonumber(next_retry[2]) - now) end
-- The next call's candidates, and how long until a host's turn when none is ready.
local function next_hosts(wait)
  local out = {}
  if redis.call('EXISTS', prio_hosts) == 1 then
    out = redis.call('ZRANGE', prio_hosts, 0, next_k - 1)
  end
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

local cc = crawl_conf()
if cc.paused then return {now, deadline, -1, retry_ms, 1, {}} end
if #hosts == 0 then
  local nxt, wait = next_hosts(-1)
  return {now, deadline, wait, retry_ms, 0, nxt}
end

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
for i = 1, #hosts do
  local at = tonumber(due[i])
  if at then
    local c = conf_decode(confs[i])
    local delay = host_limits(c, cc)
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
table.sort(ready, function(a, b)
  local pa, pb = tonumber(prio[a]) or 0, tonumber(prio[b]) or 0
  if pa ~= pb then return pa < pb end
  local da, db = tonumber(due[a]), tonumber(due[b])
  if da ~= db then return da < db end
  return a < b
end)

local popped = {}  -- {id, entry, host index, priority}
local dq, dinf, ddone, last_args, conf_args = {}, {}, {}, {}, {}
local budget_ended, budget_ids = 0, {}
for r, i in ipairs(ready) do
  if #popped >= n then
    wait = 0
    break
  end
  local host = hosts[i]
  local hq, hp = KEYS[19 + 2 * i], KEYS[20 + 2 * i]
  local c = conf_decode(confs[i])
  local delay, conc = host_limits(c, cc)
  local free = conc - (tonumber(inflight[i]) or 0)
  if c.budget and c.used >= c.budget then
    -- Past its budget: end what it holds (a bounded number per call) without fetching.
    local ended = redis.call('LPOP', hq, 1000) or {}
    if #ended < 1000 then
      local z = redis.call('ZPOPMIN', hp, 1000 - #ended)
      for k = 1, #z, 2 do ended[#ended + 1] = z[k] end
    end
    for _, e in ipairs(ended) do budget_ids[#budget_ids + 1] = string.sub(e, 1, 32) end
    budget_ended = budget_ended + #ended
    dq[host] = (dq[host] or 0) - #ended
    ddone[host] = (ddone[host] or 0) + #ended
    refresh[#refresh + 1] = host
  elseif free > 0 then
    local take = n - #popped
    if delay > 0 then take = 1 end
    if take > free then take = free end
    if c.budget and take > c.budget - c.used then take = c.budget - c.used end
    local got = 0
    if prio[i] then
      local z = redis.call('ZPOPMIN', hp, take)
      for k = 1, #z, 2 do
        popped[#popped + 1] = {string.sub(z[k], 1, 32), z[k], i, -tonumber(z[k + 1])}
        got = got + 1
      end
      local top = redis.call('ZRANGE', hp, 0, 0, 'WITHSCORES')
      if top[2] then
        redis.call('ZADD', prio_hosts, top[2], host)
      else
        redis.call('ZREM', prio_hosts, host)
      end
    end
    if got < take then
      for _, e in ipairs(redis.call('LPOP', hq, take - got) or {}) do
        popped[#popped + 1] = {string.sub(e, 1, 32), e, i, 0}
        got = got + 1
      end
    end
    dq[host] = (dq[host] or 0) - got
    dinf[host] = (dinf[host] or 0) + got
    if got > 0 then
      last_args[#last_args + 1] = now
      last_args[#last_args + 1] = host
      if c.budget then
        c.used = c.used + got
        conf_args[#conf_args + 1] = host
        conf_args[#conf_args + 1] = conf_encode(c)
      end
    end
    refresh[#refresh + 1] = host
  else
    refresh[#refresh + 1] = host  -- full: out of `due` until a lease ends
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

if #last_args > 0 then call_sliced('ZADD', H.last, last_args, 1000) end
if #conf_args > 0 then call_sliced('HSET', H.hostconf, conf_args, 1000) end
add_counts(H.queued, dq)
add_counts(H.inflight, dinf)
if budget_ended > 0 then
  add_counts(done_by_host, ddone)
  for _, h in ipairs({attempts, errors, checkpoints}) do
    if redis.call('EXISTS', h) == 1 then call_sliced('HDEL', h, budget_ids, 1000) end
  end
end
refresh_hosts(refresh)
local taken = #popped + budget_ended
if taken > 0 then redis.call('DECRBY', pending, taken) end

local nxt
nxt, wait = next_hosts(wait)
local result = {now, deadline, wait, retry_ms, 0, nxt}
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
  local owner_suffix, deadline_arg, r = ':' .. worker, tostring(deadline), 6
  for k, p in ipairs(keep) do
    local id, entry, host = p[1], p[2], hosts[p[3]]
    local token = tostring(first + k - 1)
    local attempt = (tonumber(counts[k]) or 0) + 1
    local j = 2 * (k - 1)
    aargs[j + 1], aargs[j + 2] = id, attempt
    zargs[j + 1], zargs[j + 2] = deadline_arg, id
    hargs[j + 1], hargs[j + 2] = id, token .. owner_suffix
    targs[j + 1], targs[j + 2] = id, host .. ' ' .. p[4] .. ' ' .. entry
    result[r + 1], result[r + 2], result[r + 3] = id, token, attempt
    result[r + 4], result[r + 5], result[r + 6] = entry, cps[k] or false, errs[k] or false
    result[r + 7] = host
    r = r + 7
  end
  call_sliced('HSET', tasks, targs, 1000)
  call_sliced('HSET', attempts, aargs, 1000)
  call_sliced('ZADD', leases, zargs, 1000)
  call_sliced('HSET', owners, hargs, 1000)
end
local counters = {leased = #keep, duplicates = dropped, dead = malformed}
if budget_ended > 0 then
  counters.done = budget_ended
  counters['outcome:host_budget'] = budget_ended
end
bump(stats, counters)
return result
