-- lib/hosts.lua: the frontier's host state: each host's record in `hosts` (its counters,
-- settings and push-back state), the crawl's politeness defaults in `conf`, the one due
-- rule, and the host ledger through which every script reads and writes host records.
-- Includes lib/codes (call_sliced).
--- @include "lib/codes"

local UNLIMITED = 1000000000

-- The host-state keys of a script, from KEYS[first ..]: hosts, due, h:queued, conf
-- (common/keys.py's PartitionKeys.host_state, in that order).
local function host_keys(first)
  return {hosts = KEYS[first], due = KEYS[first + 1], queued = KEYS[first + 2],
          conf = KEYS[first + 3]}
end

-- A host's record: 18 little-endian doubles (common/hostmodel/hostrec.py mirrors it).
-- queued: pending tasks; inflight: leases whose response is not in; last: its last
-- request's start (ms); done: tasks acked; then its settings (delay and concurrency
-- when not the crawl's, page budget, used: pages fetched while it had a budget, blocked
-- until (ms), robots.txt Crawl-delay (ms), reserved: leases holding a page of its
-- budget; -1 = unset) and its push-back state (lib/backoff.lua): level, pace (ms), pb_at
-- and pb_done (when its last push-back came, and its done count then), fade (the pace's
-- half-life, ms), pushbacks, lat (its response time, ms, a moving average kept while the
-- crawl's adaptive_delay is on).
local HOST_FORMAT = '<dddddddddddddddddd'
local HOST_BYTES = 144

local function host_decode(value, host)
  if not value then
    return {queued = 0, inflight = 0, last = 0, done = 0, used = 0, blocked = 0,
            reserved = 0, level = 0, pace = 0, pushbacks = 0}
  end
  if #value ~= HOST_BYTES then
    error('crawlq: the record of host ' .. host .. ' is ' .. #value .. ' bytes, not '
      .. HOST_BYTES .. ': run crawlq fsck --repair')
  end
  local q, f, l, d, dl, c, b, u, bl, rb, rs, lv, pc, pa, pd, fd, n, lat =
    struct.unpack(HOST_FORMAT, value)
  return {queued = q, inflight = f, last = l, done = d,
          delay = dl >= 0 and dl or nil, conc = c >= 0 and c or nil,
          budget = b >= 0 and b or nil, used = u, blocked = bl,
          robots = rb >= 0 and rb or nil, reserved = rs, level = lv, pace = pc,
          pb_at = pa >= 0 and pa or nil, pb_done = pd >= 0 and pd or nil,
          fade = fd >= 0 and fd or nil, pushbacks = n, lat = lat >= 0 and lat or nil}
end

local function host_encode(r)
  return struct.pack(HOST_FORMAT, r.queued, r.inflight, r.last, r.done, r.delay or -1,
    r.conc or -1, r.budget or -1, r.used, r.blocked, r.robots or -1, r.reserved, r.level,
    r.pace, r.pb_at or -1, r.pb_done or -1, r.fade or -1, r.pushbacks, r.lat or -1)
end

-- The crawl's politeness defaults, the policy version they came from (policy_apply.lua)
-- and the pause flag; `adapt` (the policy's adaptive_delay, in thousandths: 0 = off) and
-- `max_delay` (ms) turn a host's response times into a delay (host_limits); `gkey` (the
-- politeness_key when not host, '' for host), `gdelay` (ms) and `gconc` are the politeness
-- groups' (lib/groups.lua).
local function crawl_conf(conf)
  local c = redis.call('HMGET', conf, 'paused', 'delay', 'concurrency', 'policy_version',
                       'adapt', 'max_delay', 'gkey', 'gdelay', 'gconc')
  return {paused = c[1] == '1', delay = tonumber(c[2]) or 0, conc = tonumber(c[3]) or 0,
          version = tonumber(c[4]) or 0, adapt = tonumber(c[5]) or 0,
          max_delay = tonumber(c[6]) or 0, gkey = c[7] or '', gdelay = tonumber(c[8]) or 0,
          gconc = tonumber(c[9]) or 0}
end

-- The delay (ms) a host's push-back taught the fleet, at `now`: its pace, halved for
-- every `fade` ms since its last block ended, to the nearest ms (0 once under one).
local function pace_now(r, now)
  if r.pace <= 0 then return 0 end
  local quiet = now - r.blocked
  if quiet <= 0 then return r.pace end
  local p = r.pace * 2 ^ (-quiet / math.max(r.fade or 1, 1))
  if p < 1 then return 0 end
  return math.floor(p + 0.5)
end

-- How many more pages a host may be leased under its budget (UNLIMITED without one):
-- pages fetched and leases holding a page together never pass the budget.
local function budget_left(r)
  if not r.budget then return UNLIMITED end
  return math.max(0, r.budget - r.used - r.reserved)
end

-- A host's delay (ms) and concurrency under the crawl defaults `cc` at `now` (ms of
-- Redis TIME): its own setting or the default, and never faster than its robots.txt
-- Crawl-delay, the pace its push-back taught (pace_now) or, with the crawl's
-- adaptive_delay on, its response time x that factor, at most max_delay.
local function host_limits(r, cc, now)
  local delay = r.delay or cc.delay
  if r.robots and r.robots > delay then delay = r.robots end
  if cc.adapt > 0 and r.lat then
    local adaptive = math.min(cc.max_delay, math.floor(r.lat * cc.adapt / 1000 + 0.5))
    if adaptive > delay then delay = adaptive end
  end
  if r.pace > 0 then
    local pace = pace_now(r, now)
    if pace > delay then delay = pace end
  end
  local conc = r.conc or cc.conc
  if conc <= 0 then conc = UNLIMITED end
  return delay, conc
end

-- The due rule, the one place it is written: a host is due when it has pending work, a
-- free slot and budget left, and its turn is max(its last request + its delay, blocked
-- until). Returns its turn (ms), or nil when it is not due.
local function turn_of(r, cc, now)
  if r.queued <= 0 or budget_left(r) <= 0 then return nil end
  local delay, conc = host_limits(r, cc, now)
  if r.inflight >= conc then return nil end
  local at = r.last + delay
  if r.blocked > at then at = r.blocked end
  return at
end

-- The host ledger: a script's view of host records. `ledger_load` reads the records of
-- the named hosts not read yet (one HMGET); a script changes them in place and marks
-- them (`ledger_touch`); `ledger_flush` writes back the marked records (one HSET), the
-- queued index of those whose count changed (one ZADD) and their places in `due` by the
-- due rule (one ZADD, one ZREM). `ledger_reschedule` marks a host whose record did not
-- change but whose place in `due` may have (a crawl default changed meanwhile). A ledger
-- with groups (`L.G`, lib/groups.lua's ledger_groups) also brings back, places and writes
-- by its hosts' groups.
local function ledger(K, now)
  return {K = K, now = now, rec = {}, queued0 = {}, marked = {}, order = {}, write = {}}
end

-- The crawl defaults, read once per ledger.
local function ledger_conf(L)
  if not L.cc then L.cc = crawl_conf(L.K.conf) end
  return L.cc
end

local function ledger_load(L, hosts)
  local want, seen = {}, {}
  for _, host in ipairs(hosts) do
    if not L.rec[host] and not seen[host] then
      seen[host] = true
      want[#want + 1] = host
    end
  end
  if #want == 0 then return end
  local values = call_sliced('HMGET', L.K.hosts, want, 1000)
  for i, host in ipairs(want) do
    local r = host_decode(values[i], host)
    L.rec[host] = r
    L.queued0[host] = r.queued
  end
end

-- A loaded host's record (loading it alone if it was not: prefer ledger_load in bulk).
local function ledger_get(L, host)
  if not L.rec[host] then ledger_load(L, {host}) end
  return L.rec[host]
end

local function mark(L, host)
  if not L.marked[host] then
    L.marked[host] = true
    L.order[#L.order + 1] = host
  end
end

local function ledger_touch(L, host)
  mark(L, host)
  L.write[host] = true
end

local function ledger_reschedule(L, host)
  mark(L, host)
end

local function ledger_flush(L)
  if L.G then L.G.prepare(L) end
  if #L.order == 0 then
    if L.G then L.G.flush(L) end
    return
  end
  local cc = ledger_conf(L)
  local hargs, qargs, add, rem = {}, {}, {}, {}
  for _, host in ipairs(L.order) do
    local r = L.rec[host]
    if L.write[host] then
      hargs[#hargs + 1] = host
      hargs[#hargs + 1] = host_encode(r)
      if r.queued ~= L.queued0[host] then
        qargs[#qargs + 1] = r.queued
        qargs[#qargs + 1] = host
        L.queued0[host] = r.queued
      end
    end
    local at = turn_of(r, cc, L.now)
    if at and L.G then at = L.G.adjust(L, host, at) end
    if at then
      add[#add + 1] = at
      add[#add + 1] = host
    else
      rem[#rem + 1] = host
    end
  end
  if #hargs > 0 then call_sliced('HSET', L.K.hosts, hargs, 1000) end
  if #qargs > 0 then call_sliced('ZADD', L.K.queued, qargs, 1000) end
  if #add > 0 then call_sliced('ZADD', L.K.due, add, 1000) end
  if #rem > 0 then call_sliced('ZREM', L.K.due, rem, 1000) end
  L.order, L.marked, L.write = {}, {}, {}
  if L.G then L.G.flush(L) end
end
