-- lib/hosts.lua: the frontier's host state: the crawl's and each host's politeness
-- settings, page budgets, per-host counters and the `due` schedule.
-- Includes lib/codes (call_sliced).
--- @include "lib/codes"

-- The frontier's host state. Every script that changes a host takes these six keys first:
-- KEYS[1] due  KEYS[2] h:queued  KEYS[3] h:inflight  KEYS[4] h:last  KEYS[5] hostconf
-- KEYS[6] conf (see common/keys.py). A host is in `due` exactly when it has pending work
-- and a free slot; its score there is when its next request may start.
local H = {due = KEYS[1], queued = KEYS[2], inflight = KEYS[3], last = KEYS[4],
           hostconf = KEYS[5], conf = KEYS[6]}
local UNLIMITED = 1000000000

-- The crawl's politeness defaults, the policy version they came from (policy_apply.lua)
-- and the pause flag; `adapt` (the policy's adaptive_delay, in thousandths: 0 = off) and
-- `max_delay` (ms) turn a host's response times into a delay (host_limits).
local function crawl_conf()
  local c = redis.call('HMGET', H.conf, 'paused', 'delay', 'concurrency', 'policy_version',
                       'adapt', 'max_delay')
  return {paused = c[1] == '1', delay = tonumber(c[2]) or 0, conc = tonumber(c[3]) or 0,
          version = tonumber(c[4]) or 0, adapt = tonumber(c[5]) or 0,
          max_delay = tonumber(c[6]) or 0}
end

-- A host's settings from its hostconf value
-- "delay,conc,budget,used,blocked,robots,reserved[,level,pace,pb_at,pb_done,fade,pushbacks,lat]"
-- (ms, counts; '' = unset; a value written before `reserved` existed has six fields, one
-- of a host that never pushed back has seven).
-- `used`: pages of the host fetched (a response came back) while it had a budget;
-- `reserved`: its leases holding a page of the budget, not settled yet. The rest is its
-- push-back state (lib/backoff.lua): `level` its backoff level, `pace` the delay it taught
-- the fleet (ms, fading: pace_now), `pb_at` / `pb_done` when its last push-back came and
-- its h:done count then, `fade` the pace's half-life (ms), `pushbacks` how many it gave;
-- `lat` its response time (ms, a moving average: note_elapsed), kept only while the
-- crawl's adaptive_delay is on.
local function conf_decode(value)
  local f = {}
  if value then
    local i = 1
    for v in string.gmatch(value .. ',', '([^,]*),') do
      f[i] = tonumber(v)
      i = i + 1
    end
  end
  return {delay = f[1], conc = f[2], budget = f[3], used = f[4] or 0, blocked = f[5] or 0,
          robots = f[6], reserved = f[7] or 0, level = f[8] or 0, pace = f[9] or 0,
          pb_at = f[10], pb_done = f[11], fade = f[12], pushbacks = f[13] or 0, lat = f[14]}
end

local function conf_encode(c)
  local function s(v) return v and string.format('%d', v) or '' end
  local v = s(c.delay) .. ',' .. s(c.conc) .. ',' .. s(c.budget) .. ',' .. s(c.used) .. ','
    .. s(c.blocked) .. ',' .. s(c.robots) .. ',' .. s(c.reserved)
  if c.pb_at or c.lat then
    v = v .. ',' .. s(c.level) .. ',' .. s(c.pace) .. ',' .. s(c.pb_at) .. ','
      .. s(c.pb_done) .. ',' .. s(c.fade) .. ',' .. s(c.pushbacks) .. ',' .. s(c.lat)
  end
  return v
end

-- The delay (ms) a host's push-back taught the fleet, at `now`: its pace, halved for
-- every `fade` ms since its last block ended, to the nearest ms (0 once under one).
local function pace_now(c, now)
  if c.pace <= 0 then return 0 end
  local quiet = now - c.blocked
  if quiet <= 0 then return c.pace end
  local p = c.pace * 2 ^ (-quiet / math.max(c.fade or 1, 1))
  if p < 1 then return 0 end
  return math.floor(p + 0.5)
end

-- How many more pages a host may be leased under its budget (UNLIMITED without one):
-- pages fetched and leases holding a page together never pass the budget.
local function budget_left(c)
  if not c.budget then return UNLIMITED end
  return math.max(0, c.budget - c.used - c.reserved)
end

-- Whether a conf holds nothing worth keeping (then its hostconf field is deleted).
local function conf_empty(c, now)
  return not (c.delay or c.conc or c.budget or c.robots or c.pb_at or c.lat)
    and c.blocked <= now
end

-- A host's delay (ms) and concurrency under the crawl defaults `cc` at `now` (ms of Redis
-- TIME, or nil when the caller has not read it: then it is read here, once per script,
-- and only for a host that pushed back): its own setting or the default, and never
-- faster than its robots.txt Crawl-delay, the pace its push-back taught (pace_now) or,
-- with the crawl's adaptive_delay on, its response time x that factor, at most max_delay.
local clock
local function host_limits(c, cc, now)
  local delay = c.delay or cc.delay
  if c.robots and c.robots > delay then delay = c.robots end
  if cc.adapt > 0 and c.lat then
    local adaptive = math.min(cc.max_delay, math.floor(c.lat * cc.adapt / 1000 + 0.5))
    if adaptive > delay then delay = adaptive end
  end
  if c.pace > 0 then
    if not now then
      clock = clock or now_ms()
      now = clock
    end
    local pace = pace_now(c, now)
    if pace > delay then delay = pace end
  end
  local conc = c.conc or cc.conc
  if conc <= 0 then conc = UNLIMITED end
  return delay, conc
end

-- The unique values of a list, in first-seen order.
local function unique(list)
  local out, seen = {}, {}
  for _, v in ipairs(list) do
    if not seen[v] then
      seen[v] = true
      out[#out + 1] = v
    end
  end
  return out
end

-- Adds deltas to per-host counters in a ZSET (host -> count) with two commands.
local function add_counts(zset, deltas)
  local hosts = {}
  for host in pairs(deltas) do hosts[#hosts + 1] = host end
  if #hosts == 0 then return end
  local old = call_sliced('ZMSCORE', zset, hosts, 1000)
  local args = {}
  for i, host in ipairs(hosts) do
    local v = (tonumber(old[i]) or 0) + deltas[host]
    if v < 0 then v = 0 end
    args[2 * i - 1], args[2 * i] = v, host
  end
  call_sliced('ZADD', zset, args, 1000)
end

-- Puts each host in `due` (at max(last request + delay, blocked until)) or takes it out,
-- from its pending count, leases, settings and the crawl defaults. A host whose page
-- budget is spent (or held by its leases: budget_left) stays out: its pending tasks are
-- parked until its budget is raised or a lease gives its page back. Six commands for any
-- number of hosts.
local function refresh_hosts(hosts)
  hosts = unique(hosts)
  if #hosts == 0 then return end
  local cc = crawl_conf()
  local queued = call_sliced('ZMSCORE', H.queued, hosts, 1000)
  local inflight = call_sliced('ZMSCORE', H.inflight, hosts, 1000)
  local last = call_sliced('ZMSCORE', H.last, hosts, 1000)
  local confs = call_sliced('HMGET', H.hostconf, hosts, 1000)
  local add, rem = {}, {}
  for i, host in ipairs(hosts) do
    local c = conf_decode(confs[i])
    local delay, conc = host_limits(c, cc)
    if (tonumber(queued[i]) or 0) > 0 and (tonumber(inflight[i]) or 0) < conc
        and budget_left(c) > 0 then
      local at = (tonumber(last[i]) or 0) + delay
      if c.blocked > at then at = c.blocked end
      add[#add + 1] = at
      add[#add + 1] = host
    else
      rem[#rem + 1] = host
    end
  end
  if #add > 0 then call_sliced('ZADD', H.due, add, 1000) end
  if #rem > 0 then call_sliced('ZREM', H.due, rem, 1000) end
end

-- Settles the budget pages of ended leases. `items` holds {host, reserved, responded}:
-- a lease that held a page (reserved: its host had a budget when it was leased) gives it
-- back, and counts it used if its request got a response (any status). Leases of hosts
-- without a budget cost nothing here (a budget counts the pages leased after it is
-- set). One HMGET for the hosts (`now`: ms of Redis TIME); a host with no setting left
-- keeps no hostconf entry.
local function settle_pages(items, now)
  local per_host, hosts = {}, {}
  for _, it in ipairs(items) do
    if it[2] then
      local d = per_host[it[1]]
      if not d then
        d = {back = 0, held = 0}
        per_host[it[1]] = d
        hosts[#hosts + 1] = it[1]
      end
      d.back = d.back + 1
      if it[3] then d.held = d.held + 1 end
    end
  end
  if #hosts == 0 then return end
  local confs = call_sliced('HMGET', H.hostconf, hosts, 1000)
  local args = {}
  for i, host in ipairs(hosts) do
    local c, d = conf_decode(confs[i]), per_host[host]
    local used = d.held
    if d.back > 0 or used > 0 then
      c.reserved = math.max(0, c.reserved - d.back)
      c.used = c.used + used
      if confs[i] and not conf_empty(c, now) then
        args[#args + 1] = host
        args[#args + 1] = conf_encode(c)
      end
    end
  end
  if #args > 0 then call_sliced('HSET', H.hostconf, args, 1000) end
end

-- A request that went out later than its turn moves its host's last request to when it
-- went (`sent`: host -> Redis ms, the latest per host), so the host's next turn counts its
-- delay from the request itself. GT: an earlier time never moves it back.
local function note_sent(sent)
  local args = {'GT'}
  for host, at in pairs(sent) do
    args[#args + 1] = at
    args[#args + 1] = host
    if #args > 1000 then
      redis.call('ZADD', H.last, unpack(args))
      args = {'GT'}
    end
  end
  if #args > 1 then redis.call('ZADD', H.last, unpack(args)) end
end

-- The weight of a response's time in its host's moving average (`lat`).
local LAT_WEIGHT = 0.3

-- With the crawl's adaptive_delay on (`cc.adapt` > 0), folds the response times of acked
-- requests (`elapsed`: a list of {host, ms}) into their hosts' moving averages; with it
-- off, nothing is read. One HMGET and one HSET for the hosts.
local function note_elapsed(elapsed, cc)
  if cc.adapt <= 0 or #elapsed == 0 then return end
  local hosts, samples = {}, {}
  for _, e in ipairs(elapsed) do
    if not samples[e[1]] then
      samples[e[1]] = {}
      hosts[#hosts + 1] = e[1]
    end
    local list = samples[e[1]]
    list[#list + 1] = e[2]
  end
  local confs = call_sliced('HMGET', H.hostconf, hosts, 1000)
  local args = {}
  for i, host in ipairs(hosts) do
    local c = conf_decode(confs[i])
    local lat = c.lat
    for _, ms in ipairs(samples[host]) do
      lat = lat and lat + LAT_WEIGHT * (ms - lat) or ms
    end
    c.lat = math.floor(lat + 0.5)
    args[#args + 1] = host
    args[#args + 1] = conf_encode(c)
  end
  call_sliced('HSET', H.hostconf, args, 1000)
end
