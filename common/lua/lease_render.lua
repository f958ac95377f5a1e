-- lease_render.lua: lease up to n render tasks (lib/render.lua) to a consumer with a
-- browser, from hosts whose turn has come.
--
-- The caller names candidate hosts (the head of `r:due`, as the previous call's reply
-- named them; a call on no hosts only names them). A candidate is served when it has
-- render entries, its budget has pages left, it has a free slot and its turn has come
-- (its last request plus its delay, or the end of a block), and its group's too: the
-- host record's rule (lib/hosts.lua), which lease.lua serves the same host by, so the
-- two kinds of request share one politeness. A host with a delay (or in a group with
-- one) gives one task per call, else as many as its free slots; each lease takes the
-- host's turn and a slot (and a page of its budget, a slot of its group), as lease.lua's
-- do, and ends through the same ack, fail, release and reclaim. A candidate not served
-- gets its place in `r:due` set to its turn, or, when it waits for a slot or a page of
-- its budget (neither has a time), POLL_MS on; a host whose render queue is empty
-- leaves `r:due`. An entry whose id is live already is dropped (`duplicates`), one that
-- is neither form goes to `dead` as `malformed` (lib/grant.lua). A paused crawl leases
-- nothing.
--
-- KEYS[1..4]  host state: hosts, due, h:queued, conf (lib/hosts.lua)
-- KEYS[5..6]  lease state: leased, leases (lib/leases.lua)
-- KEYS[7]  tasks        HASH  id -> "<host> <priority> <entry>" (waiting or dead: live)
-- KEYS[8]  attempts     HASH  id -> attempts of a task that is not leased
-- KEYS[9]  seq          STRING fencing-token counter (lib/grant.lua)
-- KEYS[10] stats        HASH  counters (leased, duplicates, dead)
-- KEYS[11] checkpoints  HASH  id -> checkpoint JSON
-- KEYS[12] errors       HASH  id -> last error
-- KEYS[13] pending      STRING pending tasks
-- KEYS[14] dead         ZSET  id -> died (ms)
-- KEYS[15] dead_reasons HASH  reason -> count
-- KEYS[16] rop:<worker> STRING "<op id> <reply, cmsgpack>" of this worker's last call
--                       that granted leases, PX OP_KEEP_MS
-- KEYS[17..19] group state: g:of, groups, g:parked (lib/groups.lua)
-- KEYS[20] r:due      ZSET  host -> when its render queue is looked at (ms)
-- KEYS[21] r:pending  STRING render entries pending
-- KEYS[22..] per candidate host h (ARGV order): rq:<h> LIST
-- ARGV[1]  worker id
-- ARGV[2]  n, the most tasks to lease
-- ARGV[3]  lease_ms, lease length in milliseconds
-- ARGV[4]  k, how many candidates to name for the next call
-- ARGV[5]  op id: the call's operation id ('' for none); a call whose op id is the one
--          `op` keeps answers with the kept reply and leases nothing (a call sent again
--          after its reply was lost gets the leases the first one granted)
-- ARGV[6]  H, the number of candidate hosts; ARGV[7..6+H] the candidate hosts
-- Returns {now_ms, deadline_ms, wait_ms, retry_ms, paused, next, policy_version,
--          render_met, id, token, attempt, entry, checkpoint|false, last_error|false,
--          host, delay_ms, concurrency, turn_ms, ...} (lease.lua's layout):
--   wait_ms  -1: no host holds render work; 0: a host may be ready now; else ms until
--            the earliest place in `r:due`
--   retry_ms always -1 (lease.lua promotes retries)
--   paused   1 if the crawl is paused (nothing leased)
--   policy_version the partition's conf's (-1 in a call on no hosts)
--   render_met always 0 (lease.lua's)
--   next     the candidates for the next call: up to k hosts of `r:due` whose place has
--            come, earliest first
--- @include "lib/codes"
--- @include "lib/hosts"
--- @include "lib/turns"
--- @include "lib/grant"
--- @include "lib/groups"
--- @include "lib/render"

local n = int_arg(ARGV[2], 'n')
local lease_ms = int_arg(ARGV[3], 'lease_ms')
local next_k = int_arg(ARGV[4], 'k')
if n < 0 or lease_ms < 1 then error('crawlq: lease_render needs n >= 0 and lease_ms >= 1') end
local op, op_key = ARGV[5], KEYS[16]
local hosts, nhosts = argv_hosts(6)
if #KEYS ~= 21 + nhosts then
  error('crawlq: lease_render needs one render queue key per candidate host')
end
local now = now_ms()
local R = {due = KEYS[20], pending = KEYS[21]}
local C = {L = ledger(host_keys(1), now), LK = lease_keys(5), worker = ARGV[1], now = now,
           hosts = hosts, grouped = {}, turn = {}, delays = {}, concs = {},
           K = {tasks = KEYS[7], attempts = KEYS[8], seq = KEYS[9], checkpoints = KEYS[11],
                errors = KEYS[12], dead = KEYS[14], dead_reasons = KEYS[15]}}
-- A host waiting for a slot or a page of its budget is looked at again this often.
local POLL_MS = 200
local OP_KEEP_MS = 60000

local function reply_head(version, paused)
  if paused then return {now, now + lease_ms, -1, -1, 1, {}, version, 0} end
  local wait = -1
  local head = redis.call('ZRANGE', R.due, 0, 0, 'WITHSCORES')
  if head[2] then wait = math.max(0, tonumber(head[2]) - now) end
  local out = redis.call('ZRANGEBYSCORE', R.due, '-inf', now, 'LIMIT', 0, next_k)
  return {now, now + lease_ms, wait, -1, 0, out, version, 0}
end

if op ~= '' then
  local last = redis.call('GET', op_key)
  if last and string.sub(last, 1, #op + 1) == op .. ' ' then
    return cmsgpack.unpack(string.sub(last, #op + 2))
  end
end
if nhosts == 0 or n == 0 then return reply_head(-1, false) end
C.cc = ledger_conf(C.L)
if C.cc.paused then return reply_head(C.cc.version, true) end
ledger_load(C.L, hosts)
ledger_groups(C.L, group_keys(17))
if C.L.G.on then groups_load(C.L, hosts) end

-- Each candidate's turn by the host record's rule (work aside), or nil with its wait.
local ready, places = {}, {}
for i, host in ipairs(hosts) do
  local r = C.L.rec[host]
  local delay, conc = host_limits(r, C.cc, now)
  local at, gdelay = nil, 0
  if budget_left(r) > 0 and r.inflight < conc then
    at = math.max(r.last + delay, r.blocked)
    at, gdelay = with_group(C, host, at)
  end
  C.delays[i] = math.max(delay, gdelay)
  C.concs[i] = conc < UNLIMITED and conc or 0
  if at and at <= now and not C.turn[host] then
    ready[#ready + 1] = i
    C.turn[host] = at
  else
    places[i] = at or now + POLL_MS
  end
end
table.sort(ready, function(a, b)
  local ta, tb = C.turn[hosts[a]], C.turn[hosts[b]]
  if ta ~= tb then return ta < tb end
  return hosts[a] < hosts[b]
end)

-- Takes the ready hosts' entries: one from a host with a delay, else up to its free
-- slots, never past its budget or its group's slots.
local popped = {}
for _, i in ipairs(ready) do
  if #popped >= n then
    places[i] = now
  else
    local host = hosts[i]
    local r = C.L.rec[host]
    local delay, conc = host_limits(r, C.cc, now)
    local take = math.min(n - #popped, conc - r.inflight, budget_left(r))
    local g, gr = group_on(C.L, host)
    if g then
      local gdelay, gconc = group_limits(gr, C.cc)
      take = math.min(take, gconc - gr.inflight)
      if gdelay > 0 then take = math.min(take, 1) end
    end
    if delay > 0 then take = math.min(take, 1) end
    local got = 0
    if take > 0 then
      for _, e in ipairs(redis.call('LPOP', KEYS[21 + i], take) or {}) do
        local id, entry = entry_expand(host, e)
        popped[#popped + 1] = {id, entry, i, 0}
        got = got + 1
      end
    end
    if got > 0 then
      local turn = math.max(C.turn[host], now)
      C.turn[host] = turn
      r.inflight = r.inflight + got
      r.last = turn
      if g then
        gr.inflight = gr.inflight + got
        if turn > gr.last then gr.last = turn end
        C.grouped[i] = true
        group_touch(C.L, g)
      end
      ledger_touch(C.L, host)
    end
    places[i] = delay > 0 and r.last + delay or now
    if r.inflight >= conc then places[i] = now + POLL_MS end
  end
end

-- Each candidate's place in r:due: its next look, or none once its render queue is empty.
local add, rem = {}, {}
for i, host in ipairs(hosts) do
  if redis.call('LLEN', KEYS[21 + i]) == 0 then
    rem[#rem + 1] = host
  else
    add[#add + 1] = places[i] or now
    add[#add + 1] = host
  end
end
if #add > 0 then redis.call('ZADD', R.due, unpack(add)) end
if #rem > 0 then redis.call('ZREM', R.due, unpack(rem)) end
if #popped > 0 then
  redis.call('DECRBY', KEYS[13], #popped)
  redis.call('DECRBY', R.pending, #popped)
end

local keep, dropped, malformed = screen(C, popped)
local grants = grant(C, keep, now + lease_ms)
ledger_flush(C.L)
local result, at = reply_head(C.cc.version, false), 8
for _, gnt in ipairs(grants) do
  local i = gnt[7]
  result[at + 1], result[at + 2], result[at + 3] = gnt[1], gnt[2], gnt[3]
  result[at + 4], result[at + 5], result[at + 6] = gnt[4], gnt[5], gnt[6]
  result[at + 7], result[at + 8], result[at + 9] = hosts[i], C.delays[i], C.concs[i]
  result[at + 10] = C.turn[hosts[i]]
  at = at + 10
end
bump(KEYS[10], {leased = #keep, duplicates = dropped, dead = malformed})
if op ~= '' and #keep > 0 then
  redis.call('SET', op_key, op .. ' ' .. cmsgpack.pack(result), 'PX', OP_KEEP_MS)
end
return result
