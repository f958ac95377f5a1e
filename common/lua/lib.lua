-- lib.lua: helpers prepended to every other script by common/scripts.py.
-- Defines no keys of its own; every key a script touches still comes in KEYS.
--
-- Result codes (mirrored by common.queue.Code):
--   0 OK       the transition happened
--   1 RETRY    fail: the task waits in `delayed` for another attempt
--   2 DEAD     fail/reclaim: the task moved to `dead`
--   3 STALE    the lease is held under another fencing token (someone else owns it now)
--   4 EXPIRED  the token matches but the lease deadline has passed
--   5 UNKNOWN  the id holds no lease (already acked, reclaimed, never leased)
local OK, RETRY, DEAD, STALE, EXPIRED, UNKNOWN = 0, 1, 2, 3, 4, 5

-- Milliseconds of the Redis server clock: deadlines never come from a worker's clock.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- An `owners` entry is "<token>:<worker>", or "f<token>:<worker>" once the lease's
-- response is in (lease.lua's fetched list): its host's slot was given back then, so
-- the lease's end must not give it back again. A lease of a host with a page budget
-- holds a page of it (reserved at lease, settled at its end: settle_pages) and is
-- "b<token>:<worker>" ("fb..." once its response is in).
local function fetched_owner(owner)
  return owner and string.byte(owner, 1) == 102  -- 'f'
end

-- The owner with its marks taken off, and whether it holds a page of its host's budget.
local function owner_marks(owner)
  if fetched_owner(owner) then owner = string.sub(owner, 2) end
  if string.byte(owner, 1) == 98 then return string.sub(owner, 2), true end  -- 'b'
  return owner, false
end

-- The result code of a lease from its `owners` entry and its deadline in `leases`
-- (either false when absent): whether `worker` still holds it under `token`.
local function judge_lease(owner, deadline, token, worker, now)
  if not owner then return UNKNOWN end
  if owner_marks(owner) ~= token .. ':' .. worker then return STALE end
  deadline = deadline and tonumber(deadline)
  if (not deadline) or deadline <= now then return EXPIRED end
  return OK
end

-- Whether `worker` still holds the lease on `id` under `token`, as a result code.
local function lease_state(leases, owners, id, token, worker, now)
  local owner = redis.call('HGET', owners, id)
  if not owner then return UNKNOWN end
  return judge_lease(owner, redis.call('ZSCORE', leases, id), token, worker, now)
end

-- Ends a lease (the caller already checked it); true when its host's slot is still
-- taken (not given back at its fetch), so the caller gives it back; and whether it
-- held a page of its host's budget (owner_marks), for settle_pages.
local function drop_lease(leases, owners, id)
  local owner = redis.call('HGET', owners, id)
  redis.call('ZREM', leases, id)
  redis.call('HDEL', owners, id)
  local _, reserved = owner_marks(owner)
  return not fetched_owner(owner), reserved
end

-- Runs `cmd key args...` in slices of at most `step` values (even, for pairs) and returns
-- the replies joined: unpack() of a long table overflows the Lua C stack (~8000 values),
-- and a script that fails after its first writes is not rolled back.
local function call_sliced(cmd, key, args, step)
  local out = {}
  for i = 1, #args, step do
    local reply = redis.call(cmd, key, unpack(args, i, math.min(i + step - 1, #args)))
    if type(reply) == 'table' then
      for j = 1, #reply do out[#out + 1] = reply[j] end
    end
  end
  return out
end

-- lease_state of many (id, token) pairs in two commands (HMGET owners, ZMSCORE leases),
-- sliced like call_sliced; and the `owners` entries read.
local function lease_states(leases, owners, ids, tokens, worker, now)
  local held = call_sliced('HMGET', owners, ids, 1000)
  local deadlines = call_sliced('ZMSCORE', leases, ids, 1000)
  local states = {}
  for i = 1, #ids do
    states[i] = judge_lease(held[i], deadlines[i], tokens[i], worker, now)
  end
  return states, held
end

-- Moves an id to the dead-letter set with a short reason code and a message.
local function to_dead(dead, errors, dead_reasons, id, reason, message, now)
  redis.call('ZADD', dead, now, id)
  redis.call('HSET', errors, id, reason .. ' ' .. message)
  redis.call('HINCRBY', dead_reasons, reason, 1)
end

-- Adds non-zero deltas to the stats hash in one call.
local function bump(stats, deltas)
  for name, n in pairs(deltas) do
    if n ~= 0 then redis.call('HINCRBY', stats, name, n) end
  end
end

-- Makes Redis store `hash` as a hashtable for good (a field longer than
-- hash-max-listpack-value does it), before it holds a few hundred task fields that a
-- listpack would scan on every access. Never a task id; see common/keys.py.
local HASHTABLE_FIELD = string.rep('~', 128)
local function force_hashtable(hash)
  redis.call('HSETNX', hash, HASHTABLE_FIELD, '1')
end

-- Parses an integer ARGV value or stops the script before any write.
local function int_arg(value, name)
  local n = tonumber(value)
  if not n or n ~= math.floor(n) then
    error('crawlq: ARGV ' .. name .. ' must be an integer, got ' .. tostring(value))
  end
  return n
end

-- Takes a dead id's reason off the per-reason counts (requeue, purge).
local function forget_dead_reason(errors, dead_reasons, id)
  local err = redis.call('HGET', errors, id) or 'unknown '
  local reason = string.match(err, '^(%S+)') or 'unknown'
  if redis.call('HINCRBY', dead_reasons, reason, -1) <= 0 then
    redis.call('HDEL', dead_reasons, reason)
  end
end

-- Lets a script that does not grow memory run at maxmemory. Redis refuses a
-- memory-growing command (ZADD, HSET, HINCRBY ...) when it is the script's first write
-- and the server is over maxmemory; once a script has written, it may finish. HDEL is
-- a write that never grows memory, so this no-op HDEL opens the script. Used by every
-- transition that frees or only moves memory (ack, renew, fail, ...), so a full Redis
-- can still be drained; never by enqueue, which must be refused whole.
local function allow_at_maxmemory(hash)
  redis.call('HDEL', hash, '')
end

-- ---------------------------------------------------------------------------------------
-- The frontier's host state. Every script that changes a host takes these six keys first:
-- KEYS[1] due  KEYS[2] h:queued  KEYS[3] h:inflight  KEYS[4] h:last  KEYS[5] hostconf
-- KEYS[6] conf (see common/keys.py). A host is in `due` exactly when it has pending work
-- and a free slot; its score there is when its next request may start.
local H = {due = KEYS[1], queued = KEYS[2], inflight = KEYS[3], last = KEYS[4],
           hostconf = KEYS[5], conf = KEYS[6]}
local UNLIMITED = 1000000000

-- The crawl's politeness defaults, the policy version they came from (policy_apply.lua)
-- and the pause flag.
local function crawl_conf()
  local c = redis.call('HMGET', H.conf, 'paused', 'delay', 'concurrency', 'policy_version')
  return {paused = c[1] == '1', delay = tonumber(c[2]) or 0, conc = tonumber(c[3]) or 0,
          version = tonumber(c[4]) or 0}
end

-- A host's settings from its hostconf value "delay,conc,budget,used,blocked,robots,reserved"
-- (ms, counts; '' = unset; a value written before `reserved` existed has six fields).
-- `used`: pages of the host fetched (a response came back) while it had a budget;
-- `reserved`: its leases holding a page of the budget, not settled yet.
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
          robots = f[6], reserved = f[7] or 0}
end

local function conf_encode(c)
  local function s(v) return v and string.format('%d', v) or '' end
  return s(c.delay) .. ',' .. s(c.conc) .. ',' .. s(c.budget) .. ',' .. s(c.used) .. ','
    .. s(c.blocked) .. ',' .. s(c.robots) .. ',' .. s(c.reserved)
end

-- How many more pages a host may be leased under its budget (UNLIMITED without one):
-- pages fetched and leases holding a page together never pass the budget.
local function budget_left(c)
  if not c.budget then return UNLIMITED end
  return math.max(0, c.budget - c.used - c.reserved)
end

-- Whether a conf holds nothing worth keeping (then its hostconf field is deleted).
local function conf_empty(c, now)
  return not (c.delay or c.conc or c.budget or c.robots) and c.blocked <= now
end

-- A host's delay (ms) and concurrency under the crawl defaults `cc`: its own setting or
-- the default, and never faster than its robots.txt Crawl-delay.
local function host_limits(c, cc)
  local delay = c.delay or cc.delay
  if c.robots and c.robots > delay then delay = c.robots end
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

-- A stored task value "<host> <priority> <entry>" as its three parts (nil if malformed).
local function split_value(value)
  if not value then return nil end
  local host, prio, entry = string.match(value, '^(%S+) (%d+) (.*)$')
  if not host then return nil end
  return host, tonumber(prio), entry
end

-- `prio_hosts` names `host` by the highest priority left in its ZSET `hp`, or not at all.
local function refresh_prio(prio_hosts, hp, host)
  local top = redis.call('ZRANGE', hp, 0, 0, 'WITHSCORES')
  if top[2] then
    redis.call('ZADD', prio_hosts, top[2], host)
  else
    redis.call('ZREM', prio_hosts, host)
  end
end

-- Puts pending entries back in their hosts' queues. `items` holds {host, priority,
-- entry}; `qkeys[host]` = {hq key, hp key}; front=true puts priority-0 entries at the
-- head (they already waited their turn). Counts them pending; returns the hosts touched.
local function requeue_entries(items, qkeys, prio_hosts, pending, front)
  local lists, deltas, hosts = {}, {}, {}
  for _, it in ipairs(items) do
    local host, prio, entry = it[1], it[2], it[3]
    local keys = qkeys[host]
    if prio > 0 then
      redis.call('ZADD', keys[2], -prio, entry)
      redis.call('ZADD', prio_hosts, 'LT', -prio, host)
    else
      local l = lists[host]
      if not l then
        l = {}
        lists[host] = l
      end
      l[#l + 1] = entry
    end
    deltas[host] = (deltas[host] or 0) + 1
    hosts[#hosts + 1] = host
  end
  for host, l in pairs(lists) do
    if front then
      -- LPUSH reverses its arguments: push the last first so the first ends at the head.
      local rev = {}
      for i = #l, 1, -1 do rev[#rev + 1] = l[i] end
      call_sliced('LPUSH', qkeys[host][1], rev, 1000)
    else
      call_sliced('RPUSH', qkeys[host][1], l, 1000)
    end
  end
  add_counts(H.queued, deltas)
  if #items > 0 then redis.call('INCRBY', pending, #items) end
  return hosts
end

-- The queue keys of the hosts a script was given: KEYS[first + 2(i-1)] and the next are
-- hq and hp of ARGV host i (hosts named in ARGV[argv_first ..], nhosts of them).
local function host_queue_keys(first, hosts)
  local qkeys = {}
  for i, host in ipairs(hosts) do
    qkeys[host] = {KEYS[first + 2 * (i - 1)], KEYS[first + 2 * (i - 1) + 1]}
  end
  return qkeys
end

-- The hosts a script is given: ARGV[at] holds their number H, ARGV[at+1 .. at+H] the
-- hosts. Returns the hosts and H.
local function argv_hosts(at)
  local nhosts = int_arg(ARGV[at], 'hosts')
  local hosts = {}
  for i = 1, nhosts do hosts[i] = ARGV[at + i] end
  return hosts, nhosts
end
