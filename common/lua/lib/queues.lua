-- lib/queues.lua: the hosts' task queues (hq:<h> LIST, hp:<h> ZSET by priority): stored
-- task values, putting entries back, and the hosts and queue keys a script is given.
-- Includes lib/codes (call_sliced, int_arg) and lib/hosts (the host ledger).
--- @include "lib/codes"
--- @include "lib/hosts"

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

-- Puts pending entries in their hosts' queues. `items` holds {host, priority, entry};
-- `qkeys[host]` = {hq key, hp key}; front=true puts priority-0 entries at the head (they
-- already waited their turn). Counts them pending, and queued on their hosts' records in
-- ledger `L` (loaded here; flushed by the caller).
local function requeue_entries(L, items, qkeys, prio_hosts, pending, front)
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
  ledger_load(L, hosts)
  for host, n in pairs(deltas) do
    local r = L.rec[host]
    r.queued = r.queued + n
    ledger_touch(L, host)
  end
  if #items > 0 then redis.call('INCRBY', pending, #items) end
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

-- Whether an entry of `id` is pending in a host's queues (`hq` LIST, `hp` ZSET): a scan of
-- both, O(queue), for the repairs of fsck only.
local function in_queues(id, hq, hp)
  for _, entries in ipairs({redis.call('LRANGE', hq, 0, -1), redis.call('ZRANGE', hp, 0, -1)}) do
    for _, e in ipairs(entries) do
      if string.sub(e, 1, #id) == id then return true end
    end
  end
  return false
end
