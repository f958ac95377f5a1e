-- enqueue_bloom.lua: dedup (scalable bloom filter) and enqueue a batch into hosts' queues.
--
-- The filter is a list of layers; layer L holds capacity * 2^L URLs at a false-positive
-- rate of error / 2^(L+1), so the total rate stays under `error` however many layers
-- grow. Bit positions use double hashing: (h1 + j * h2) mod m, for j < k.
-- Membership is tested in every layer; new URLs are added to the newest one.
-- A bloom crawl has no recrawl window (the filter keeps no timestamps).
--
-- KEYS[1..4]   host state: hosts, due, h:queued, conf (lib/hosts.lua)
-- KEYS[5]      tasks       HASH  (unused here; same layout as enqueue.lua)
-- KEYS[6]      stats       HASH  counters (enqueued, duplicates, group_unresolved)
-- KEYS[7]      pending     STRING pending tasks
-- KEYS[8]      prio_hosts  ZSET  host -> -highest pending priority
-- KEYS[9]      bloom       HASH  layers -> number of layers; count:<L> -> URLs in layer L
-- KEYS[10..12]  group state: g:of, groups, g:parked (lib/groups.lua)
-- KEYS[13..12+M] bloom:<L> STRING layer bits, for L = 0 .. M-1 (M = the most layers);
--                              sized exactly (m bits) when the layer gets its first URL
-- KEYS[13+M..] per host h (ARGV order): hq:<h> LIST, hp:<h> ZSET
-- ARGV[1]      capacity of layer 0, URLs
-- ARGV[2]      target false-positive rate (e.g. 1e-6)
-- ARGV[3]      M, the number of layer keys
-- ARGV[4]      H, the number of hosts; ARGV[5..4+H] the host keys
-- ARGV[5+H]    groups: the key they are named for, then each host's politeness group,
--              space-separated in host order (enqueue.lua)
-- ARGV[6+H..]  per item 5 values: h1, h2 (32-bit ints), priority (>= 0),
--              host index (1..H), entry (compact, as enqueue.lua's)
-- Returns {enqueued, duplicates, 0, fullest layer past 80% this call or -1}, or {-1, the
-- crawl's politeness_key} when the groups were named for another key (enqueue.lua)
--- @include "lib/codes"
--- @include "lib/hosts"
--- @include "lib/queues"
--- @include "lib/groups"

local stats, pending, prio_hosts, meta = KEYS[6], KEYS[7], KEYS[8], KEYS[9]
local capacity0 = int_arg(ARGV[1], 'capacity')
local err = tonumber(ARGV[2])
if capacity0 < 1 or not err or err <= 0 or err >= 1 then
  error('crawlq: bloom needs capacity >= 1 and 0 < error < 1')
end
local max_layers = int_arg(ARGV[3], 'layers')
local hosts, nhosts = argv_hosts(4)
local first = 6 + nhosts
local n = (#ARGV - first + 1) / 5
if n ~= math.floor(n) or #KEYS ~= 12 + max_layers + 2 * nhosts then
  error('crawlq: enqueue_bloom needs M layer keys, 2 keys per host, 5 ARGV values per item')
end
local function layer_key(layer) return KEYS[13 + layer] end
local groups = ARGV[5 + nhosts]
local L = ledger(host_keys(1), now_ms())
ledger_groups(L, group_keys(10))
local stale = groups_stale(L, groups)
if stale then return {-1, stale} end

-- Layer L is built for a false-positive rate of error * (1 - TIGHTEN) * TIGHTEN^L: the
-- rates of all layers sum to under `error` however many grow, and layer 0, where a crawl
-- sized for its URLs stays, gets 7/8 of it. (At error / 2^(L+1), a 1e-6 layer of 1M URLs
-- took 3.77 MB, which jemalloc rounds up to 4 MiB: 4.19 B/URL; now 3.63 MB, 3.5 MiB.)
local TIGHTEN = 1 / 8
local params = {}  -- layer -> {capacity, m, k}, computed once per call of the script
local function layer_params(layer)
  local got = params[layer]
  if got then return got[1], got[2], got[3] end
  local cap = capacity0 * 2 ^ layer
  local p = err * (1 - TIGHTEN) * TIGHTEN ^ layer
  -- The fewest bits m for which an integer number of hashes k keeps a full layer at or
  -- under p: (1 - e^(-k * cap / m))^k <= p, so m = -k * cap / ln(1 - p^(1/k)), for the
  -- two k next to the optimum log2(1/p).
  local m, k
  local low = math.max(1, math.floor(-math.log(p) / math.log(2)))
  for hashes = low, low + 1 do
    local bits = math.ceil(-hashes * cap / math.log(1 - p ^ (1 / hashes)))
    if not m or bits < m then m, k = bits, hashes end
  end
  params[layer] = {cap, m, k}
  return cap, m, k
end

local layers = tonumber(redis.call('HGET', meta, 'layers') or '1')
local count = tonumber(redis.call('HGET', meta, 'count:' .. (layers - 1)) or '0')
-- Every check before the first write: refuse a batch that could outgrow the layers.
local room, cap = 0, nil
for layer = layers - 1, max_layers - 1 do
  cap = layer_params(layer)
  room = room + cap
end
if room - count < n then
  error('crawlq: bloom filter full (' .. max_layers .. ' layers); use more partitions')
end

-- Whether an item's k bits are all set in a layer. GETBIT one by one, stopping at the
-- first 0: a new URL meets one after about two reads (a layer is at most half ones),
-- which is cheaper than one BITFIELD_RO reading all k.
local function in_layer(layer, h1, h2)
  local _, m, k = layer_params(layer)
  local key = layer_key(layer)
  for j = 0, k - 1 do
    if redis.call('GETBIT', key, (h1 + j * h2) % m) == 0 then return false end
  end
  return true
end

-- Sets an item's k bits in a layer (k SETBITs cost less than one k-op BITFIELD).
local function add_to_layer(layer, h1, h2)
  local _, m, k = layer_params(layer)
  local key = layer_key(layer)
  for j = 0, k - 1 do redis.call('SETBIT', key, (h1 + j * h2) % m, 1) end
end

local enqueued, duplicates, warn = 0, 0, -1
local fresh = {}
for i = 1, n do
  local base = first + 5 * (i - 1)
  local h1, h2 = tonumber(ARGV[base]), tonumber(ARGV[base + 1])
  local priority = int_arg(ARGV[base + 2], 'priority')
  local hi = int_arg(ARGV[base + 3], 'host index')
  if hi < 1 or hi > nhosts then error('crawlq: enqueue host index out of range') end
  local entry = ARGV[base + 4]
  local seen = false
  for layer = 0, layers - 1 do
    if in_layer(layer, h1, h2) then seen = true break end
  end
  if seen then
    duplicates = duplicates + 1
  else
    local current = layers - 1
    cap = layer_params(current)
    if count >= cap then
      redis.call('HSET', meta, 'count:' .. current, count)
      layers = layers + 1
      current = layers - 1
      count = 0
      cap = layer_params(current)
      redis.call('HSET', meta, 'layers', layers)
    end
    if count == 0 then
      -- Size a new layer's bits once, exactly (SETBIT on a missing key allocates just
      -- that); grown by BITFIELD at random offsets, Redis over-allocates them (up to 2x
      -- below 1 MB, +1 MB above).
      local _, m = layer_params(current)
      redis.call('SETBIT', layer_key(current), m - 1, 0)
    end
    add_to_layer(current, h1, h2)
    count = count + 1
    if count == math.floor(cap * 0.8) then warn = current end
    fresh[#fresh + 1] = {hosts[hi], priority, entry}
    enqueued = enqueued + 1
  end
end
local unresolved = groups_assign(L, hosts, groups)
requeue_entries(L, fresh, host_queue_keys(13 + max_layers, hosts), prio_hosts, pending, false)
ledger_flush(L)
if enqueued > 0 then redis.call('HSET', meta, 'count:' .. (layers - 1), count) end
bump(stats, {enqueued = enqueued, duplicates = duplicates, group_unresolved = unresolved})
return {enqueued, duplicates, 0, warn}
