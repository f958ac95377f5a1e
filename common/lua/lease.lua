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
-- An entry that is neither compact nor full (lib/queues.lua; corrupted state) goes to `dead`
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
-- A render entry popped (lib/render.lua) is not leased: in a call given the render lane's
-- keys (ARGV render 1) it moves to its host's render queue, for lease_render.lua (a
-- consumer with a browser), and more are popped in its place; in a call without them
-- (render 0: a crawl's calls until they meet one, so a crawl without render requests
-- sends no key more) it goes back where it was and the reply says so (render_met), and
-- the caller's next calls give the keys. Either way the host's turn and slot are not
-- taken for it.
-- Politeness groups (the crawl's politeness_key not host: lib/groups.lua): a grouped host
-- is served only when its group's turn has come too and its group has a free slot; a
-- host with a delay or in a group with one gives one task per call, and its group's next
-- turn moves with it. Its leases hold a slot of the group ("g"), given back like the host's.
--
-- KEYS[1..4]  host state: hosts, due, h:queued, conf (lib/hosts.lua)
-- KEYS[5..6]  lease state: leased, leases (lib/leases.lua)
-- KEYS[7]  tasks        HASH  id -> "<host> <priority> <entry>" (waiting or dead: live)
-- KEYS[8]  attempts     HASH  id -> attempts of a task that is not leased
-- KEYS[9]  seq          STRING fencing-token counter (lib/grant.lua: past it and TIME in us)
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
-- KEYS[19] op:<worker>  STRING "<op id> <reply, cmsgpack>" of this worker's last call that
--                       granted leases, PX OP_KEEP_MS
-- KEYS[20..22] group state: g:of, groups, g:parked (lib/groups.lua)
-- KEYS[23..] with ARGV render 1: KEYS[23] r:due ZSET host -> when its render queue is
--            looked at (lib/render.lua), KEYS[24] r:pending STRING render entries
--            pending, then per candidate host h (ARGV order): hq:<h> LIST, hp:<h> ZSET,
--            rq:<h> LIST; with render 0: per candidate host hq:<h> LIST, hp:<h> ZSET
-- ARGV[1]  worker id
-- ARGV[2]  n, the most tasks to lease (0: only give back the slots of `fetched` ones)
-- ARGV[3]  lease_ms, lease length in milliseconds
-- ARGV[4]  k, how many candidates to name for the next call
-- ARGV[5]  the crawl's wake channel (common/wake.py; '' for none): a call with n = 0
--          that gave slots back publishes on it, so the fleet's idle consumers take
--          them while this one's CPU is behind (a failed PUBLISH is ignored: a hint)
-- ARGV[6]  ahead_ms: a host with a delay whose turn comes within this long is served now,
--          its lease timed to start at its turn (`turn_ms`): one call serves the turns of
--          the next ahead_ms, and the consumer starts each request at its turn (0: only
--          hosts whose turn has come)
-- ARGV[7]  op id: the call's operation id ('' for none). A call whose op id is the one
--          `op` keeps answers with the kept reply and leases nothing (after giving back
--          its pairs' slots): a call sent again after its reply was lost (a timeout, a
--          dropped connection) gets the leases the first one granted, never a second set
-- ARGV[8]  render: 1 when KEYS holds the render lane's keys (above), else 0
-- ARGV[9]  H, the number of candidate hosts; ARGV[10..9+H] the candidate hosts
-- ARGV[10+H] held: how many of each candidate host's slots this worker's leases take now
--          (not counting the pairs below), comma-separated in host order ('': none)
-- ARGV[11+H..] pairs: id, token
--          (this worker's leases whose response is in. Their hosts get their slots
--          back now, before this call's leases; the lease record is marked, so the
--          lease's end does not give the slot back again. A lease that is not this
--          worker's anymore is left alone.)
-- Returns {now_ms, deadline_ms, wait_ms, retry_ms, paused, next, policy_version,
--          render_met, id, token, attempt, entry, checkpoint|false, last_error|false,
--          host, delay_ms, concurrency, turn_ms, ...}:
--   wait_ms  -1: no host holds work; 0: hosts are ready (after this call's leases);
--            else ms until the earliest turn not served comes within ahead_ms
--   retry_ms ms until the next retry is due (0: one is due now), -1 if none waits
--   paused   1 if the crawl is paused (nothing leased)
--   policy_version the crawl policy's version this partition's conf holds (-1 in a call
--            on no hosts, which does not read it): a consumer that knows an older one
--            reads the policy again, with no round trip of its own
--   render_met 1 when a call with render 0 met a render entry (put back): give the
--            render lane's keys from now on; else 0
--   concurrency the lease's host's concurrency, 0 if unlimited: with a limit and no
--            delay, the consumer names the lease in its next call once the response
--            is in
--   delay_ms the lease's host's delay (its policy, or robots.txt's Crawl-delay): with
--            a delay, the request must go out at its turn (the consumer times it)
--   turn_ms  the lease's turn (Redis ms): now, or up to ahead_ms later; its host's last
--            request is counted from it
--   next     the candidates for the next call, read after this one's leases: up to k
--            hosts of `prio_hosts`, then the k of `due` whose turns come first (so a
--            steady crawl leases in one round trip, with no read before)
--- @include "lib/codes"
--- @include "lib/hosts"
--- @include "lib/fairshare"
--- @include "lib/turns"
--- @include "lib/grant"
--- @include "lib/groups"

-- The call's arguments, and its context (lib/turns.lua, lib/grant.lua).
local n = int_arg(ARGV[2], 'n')
local lease_ms = int_arg(ARGV[3], 'lease_ms')
local next_k = int_arg(ARGV[4], 'k')
local ahead = int_arg(ARGV[6], 'ahead_ms')
if n < 0 or lease_ms < 1 or ahead < 0 then
  error('crawlq: lease needs n >= 0, lease_ms >= 1 and ahead_ms >= 0')
end
local render = int_arg(ARGV[8], 'render') == 1
local hosts, nhosts = argv_hosts(9)
local first = 11 + nhosts
if #KEYS ~= (render and 24 + 3 * nhosts or 22 + 2 * nhosts) or #ARGV < first - 1
    or (#ARGV - first + 1) % 2 ~= 0 then
  error('crawlq: lease needs 2 keys per candidate host (3 and 2 more with render), held '
    .. 'counts and (id, token) pairs')
end
local now = now_ms()
local C = {L = ledger(host_keys(1), now), LK = lease_keys(5), worker = ARGV[1], now = now,
           ahead = ahead, n = n, hosts = hosts, held = {}, prio = {},
           qkey = function(i) return KEYS[21 + 2 * i], KEYS[22 + 2 * i] end,
           K = {tasks = KEYS[7], attempts = KEYS[8], seq = KEYS[9], checkpoints = KEYS[11],
                errors = KEYS[12], dead = KEYS[16], dead_reasons = KEYS[17]},
           stats = KEYS[10], pending = KEYS[13], prio_hosts = KEYS[14]}
if render then
  C.qkey = function(i) return KEYS[22 + 3 * i], KEYS[23 + 3 * i] end
  C.rkey = function(i) return KEYS[24 + 3 * i] end
  C.R = {due = KEYS[23], pending = KEYS[24]}
end
local delayed, hungry, op, op_key = KEYS[15], KEYS[18], ARGV[7], KEYS[19]
-- How long a call's reply is kept for a call sent again: longer than a client's retries
-- of it take (socket timeout 10 s, a few tries).
local OP_KEEP_MS = 60000
ledger_groups(C.L, group_keys(20))
for v in string.gmatch(ARGV[10 + nhosts], '[^,]+') do C.held[#C.held + 1] = tonumber(v) end
local ids, tokens = {}, {}
for i = first, #ARGV, 2 do
  ids[#ids + 1] = ARGV[i]
  tokens[#tokens + 1] = ARGV[i + 1]
end

-- The reply's head: the next retry, the next call's candidates (the hosts with priority
-- work, then up to k of `due` whose turns the next call may serve: within ahead_ms of the
-- first turn not served, ready now or not) and how long until that first turn comes
-- within ahead_ms (0: it has). Read after this call's changes.
local function reply_head(wait, paused, version)
  local retry_ms = -1
  local next_retry = redis.call('ZRANGE', delayed, 0, 0, 'WITHSCORES')
  if next_retry[2] then retry_ms = math.max(0, tonumber(next_retry[2]) - now) end
  if paused == 1 then return {now, now + lease_ms, -1, retry_ms, 1, {}, version, 0} end
  local out = redis.call('ZRANGE', C.prio_hosts, 0, next_k - 1)
  local head = redis.call('ZRANGE', C.L.K.due, 0, 0, 'WITHSCORES')
  if head[2] then
    local turn = tonumber(head[2])
    local soon = math.max(0, turn - now - ahead)
    if wait < 0 or soon < wait then wait = soon end
    local until_ms = math.max(now, turn - ahead) + 2 * ahead
    for _, h in ipairs(redis.call('ZRANGEBYSCORE', C.L.K.due, '-inf', until_ms,
                                  'LIMIT', 0, next_k)) do
      out[#out + 1] = h
    end
  end
  return {now, now + lease_ms, wait, retry_ms, 0, out, version, C.met and 1 or 0}
end

-- Slots given back by a worker whose CPU is behind (n = 0), or left for hungry workers
-- (`capped`): wake the fleet's idle consumers now.
local function wake_fleet(capped)
  if (capped or (n == 0 and #ids > 0)) and ARGV[5] ~= '' then
    redis.pcall('PUBLISH', ARGV[5], '1')
  end
end

give_back(C, ids, tokens)
if op ~= '' then
  local last = redis.call('GET', op_key)
  if last and string.sub(last, 1, #op + 1) == op .. ' ' then
    ledger_flush(C.L)
    return cmsgpack.unpack(string.sub(last, #op + 2))
  end
end
if #hosts == 0 then  -- a pause shows in the call that names hosts
  ledger_flush(C.L)
  local result = reply_head(-1, 0, -1)
  -- Hungry unless a host it names is ready now: then the caller's next call leases.
  if n > 0 and result[3] ~= 0 then hungry_mark(hungry, C.worker, now) end
  wake_fleet(false)
  return result
end
C.cc = ledger_conf(C.L)
if C.cc.paused then
  ledger_flush(C.L)
  return reply_head(-1, 1, C.cc.version)
end
ledger_load(C.L, hosts)
if C.L.G.on then groups_load(C.L, hosts) end
if redis.call('EXISTS', C.prio_hosts) == 1 then
  C.prio = call_sliced('ZMSCORE', C.prio_hosts, hosts, 1000)
end
local ready, wait = ready_order(C)
local me_hungry
C.others, me_hungry = hungry_others(hungry, C.worker, now)
local popped, capped, more = take_entries(C, ready)
if more then wait = 0 end
local keep, dropped, malformed = screen(C, popped)
local grants = grant(C, keep, now + lease_ms)
ledger_flush(C.L)

local result, r = reply_head(wait, 0, C.cc.version), 8
for _, g in ipairs(grants) do
  local i = g[7]
  result[r + 1], result[r + 2], result[r + 3] = g[1], g[2], g[3]
  result[r + 4], result[r + 5], result[r + 6] = g[4], g[5], g[6]
  result[r + 7], result[r + 8], result[r + 9] = hosts[i], C.delays[i], C.concs[i]
  result[r + 10] = C.turn[hosts[i]]
  r = r + 10
end
if n > 0 and #keep == 0 then
  hungry_mark(hungry, C.worker, now)
elseif me_hungry and #keep > 0 then
  redis.call('ZREM', hungry, C.worker)
end
wake_fleet(capped)
bump(C.stats, {leased = #keep, duplicates = dropped, dead = malformed})
if op ~= '' and #keep > 0 then
  redis.call('SET', op_key, op .. ' ' .. cmsgpack.pack(result), 'PX', OP_KEEP_MS)
end
return result
