-- lib/queues.lua: the hosts' task queues (hq:<h> LIST, hp:<h> ZSET by priority): stored
-- task values, compact entries, putting entries back, and the hosts and queue keys a
-- script is given.
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

-- A queued entry is compact (layout 4, common/task.py compact_entry): the id's 16 bytes,
-- then `/<path>` for https://<host>/<path>, `:/<path>` for http://<host>/<path>, or the
-- whole URL when its authority is not the host's key; then ` <json>` as in a full entry
-- ("<32 hex id><url>[ <json>]"). Its 17th byte is never a hex digit, so a full entry is
-- told apart: compacting one twice, or expanding a full one, leaves it as it is.
local HEX_ID = '^' .. string.rep('[0-9a-f]', 32) .. '$'
-- The hex of a compact entry's id (its first 16 bytes), as four 32-bit words: 0.65 us,
-- against 1.6 us for string.format('%02x' x 16) (the lease's cost per entry). No table
-- built at load: a script's body, includes and all, runs at every call.
local function hex_id(e)
  local a, b, c, d, e5, f, g, h, i, j, k, l, m, n, o, p = string.byte(e, 1, 16)
  return string.format('%08x%08x%08x%08x', ((a * 256 + b) * 256 + c) * 256 + d,
    ((e5 * 256 + f) * 256 + g) * 256 + h, ((i * 256 + j) * 256 + k) * 256 + l,
    ((m * 256 + n) * 256 + o) * 256 + p)
end

local function hex_byte(b)
  return b and ((b >= 48 and b <= 57) or (b >= 97 and b <= 102))
end

-- The compact form of a full entry of `host`'s queue without its id; nil for an entry
-- that is not full (compact already, or without a hex id and then `http`).
local function full_tail(host, e)
  if not hex_byte(string.byte(e, 17)) or string.sub(e, 33, 36) ~= 'http'
      or not string.find(string.sub(e, 1, 32), HEX_ID) then
    return nil
  end
  local n = #host
  if string.sub(e, 33, 41 + n) == 'https://' .. host .. '/' then
    return string.sub(e, 41 + n)
  elseif string.sub(e, 33, 40 + n) == 'http://' .. host .. '/' then
    return ':' .. string.sub(e, 40 + n)
  end
  return string.sub(e, 33)
end

-- The compact form of a full entry of `host`'s queue (an entry compact already, or one
-- without a hex id and then `http`, as it is: the lease screens it).
local function entry_compact(host, e)
  local tail = full_tail(host, e)
  return tail and bin_id(e) .. tail or e
end

-- A queued entry of `host` as its hex id and full entry; the id false for an entry that
-- is neither form (too short, a tail not `/`, `:/` or `http`, a full one's id not hex).
local function entry_expand(host, e)
  local b = string.byte(e, 17)
  if hex_byte(b) then
    local id = string.sub(e, 1, 32)
    return string.find(id, HEX_ID) and id or false, e
  end
  local id = b and hex_id(e)
  if b == 47 then  -- '/'
    return id, id .. 'https://' .. host .. string.sub(e, 17)
  elseif b == 58 and string.byte(e, 18) == 47 then  -- ':/'
    return id, id .. 'http://' .. host .. string.sub(e, 18)
  elseif b and string.sub(e, 17, 20) == 'http' then
    return id, id .. string.sub(e, 17)
  end
  return false, e
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

-- Puts pending entries in their hosts' queues, compact. `items` holds {host, priority,
-- entry} (a full entry, or a compact one: enqueue's);
-- `qkeys[host]` = {hq key, hp key}; front=true puts priority-0 entries at the head (they
-- already waited their turn). Counts them pending, and queued on their hosts' records in
-- ledger `L` (loaded here; flushed by the caller).
local function requeue_entries(L, items, qkeys, prio_hosts, pending, front)
  local lists, deltas, hosts = {}, {}, {}
  for _, it in ipairs(items) do
    local host, prio = it[1], it[2]
    local entry, keys = entry_compact(host, it[3]), qkeys[host]
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

-- Whether an entry of `id` (hex) is pending in a host's queues (`hq` LIST, `hp` ZSET): a
-- scan of both, O(queue), for the repairs of fsck only (an id does not need its host).
local function in_queues(id, hq, hp)
  for _, entries in ipairs({redis.call('LRANGE', hq, 0, -1), redis.call('ZRANGE', hp, 0, -1)}) do
    for _, e in ipairs(entries) do
      if entry_expand('', e) == id then return true end
    end
  end
  return false
end
