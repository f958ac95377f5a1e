-- lib/groups.lua: politeness groups. With the crawl's politeness_key at `domain` (conf
-- `gkey`), the hosts of one registrable domain share a second limit beside their own (at
-- `ip`, the hosts whose names resolve to one address): the group's delay and
-- concurrency, fleet-wide (a request waits for its host's turn and its
-- group's, in the same lease call). `g:of` names each host's group (written at enqueue),
-- `groups` holds each group's record, and `g:parked` the hosts kept out of `due` while
-- their group's slots are all taken, each "<group> <host>" (score 0, read by lex range):
-- a slot of the group given back brings them back (the host ledger's flush), so a host
-- whose group is full never spins the lease script.
--
-- A host ledger (lib/hosts.lua) gets groups with `ledger_groups`: its flush then writes a
-- grouped host's place in `due` at max(its own turn, its group's) or parks it, and writes
-- the groups' records. A lease that took a slot of its host's group is marked "g" on its
-- owner (lib/leases.lua), and its end gives that slot back whatever the key is by then.
-- Includes lib/codes (call_sliced), lib/hosts (UNLIMITED, ledger).
--- @include "lib/codes"
--- @include "lib/hosts"

-- A group's record: 5 little-endian doubles (common/hostmodel/grouprec.py mirrors it):
-- last (its last request's start, ms), inflight (leases holding a slot of it), its own
-- delay and concurrency (-1: the crawl's group_delay and group_concurrency) and blocked
-- (until, ms: the longest block a push-back gave one of its hosts).
local GROUP_FORMAT = '<ddddd'
local GROUP_BYTES = 40
-- Parked hosts one flush brings back per group whose slot came free (the rest follow
-- as more slots do).
local UNPARK = 100

-- The group-state keys of a script, from KEYS[first ..]: g:of, groups, g:parked
-- (common/keys.py's PartitionKeys.group_state, in that order).
local function group_keys(first)
  return {of = KEYS[first], groups = KEYS[first + 1], parked = KEYS[first + 2]}
end

local function group_decode(value, name)
  if not value then return {last = 0, inflight = 0, blocked = 0} end
  if #value ~= GROUP_BYTES then
    error('crawlq: the record of group ' .. name .. ' is ' .. #value .. ' bytes, not '
      .. GROUP_BYTES .. ': run crawlq fsck --repair')
  end
  local l, f, dl, c, bl = struct.unpack(GROUP_FORMAT, value)
  return {last = l, inflight = f, delay = dl >= 0 and dl or nil, conc = c >= 0 and c or nil,
          blocked = bl}
end

local function group_encode(g)
  return struct.pack(GROUP_FORMAT, g.last, g.inflight, g.delay or -1, g.conc or -1, g.blocked)
end

-- A group's delay (ms) and concurrency (UNLIMITED for none) under the crawl defaults.
local function group_limits(g, cc)
  local conc = g.conc or cc.gconc
  if conc <= 0 then conc = UNLIMITED end
  return g.delay or cc.gdelay, conc
end

-- A group's turn: max(its last request + its delay, blocked until); nil while its slots
-- are all taken.
local function group_turn(g, cc)
  local delay, conc = group_limits(g, cc)
  if g.inflight >= conc then return nil end
  return math.max(g.last + delay, g.blocked)
end

-- Reads the groups of `hosts` not read yet (one HMGET of g:of, one of groups).
local function groups_load(L, hosts)
  local G, want, seen = L.G, {}, {}
  for _, h in ipairs(hosts) do
    if G.of[h] == nil and not seen[h] then
      seen[h] = true
      want[#want + 1] = h
    end
  end
  if #want == 0 then return end
  local names, gwant = call_sliced('HMGET', G.K.of, want, 1000), {}
  for i, h in ipairs(want) do
    local g = names[i] or false
    G.of[h] = g
    if g and not G.rec[g] and not seen[g .. ' '] then
      seen[g .. ' '] = true
      gwant[#gwant + 1] = g
    end
  end
  if #gwant == 0 then return end
  local values = call_sliced('HMGET', G.K.groups, gwant, 1000)
  for i, g in ipairs(gwant) do G.rec[g] = group_decode(values[i], g) end
end

-- A host's group and the group's record (read if not yet), or nil: ungrouped, or a
-- ledger without groups.
local function group_of(L, host)
  local G = L.G
  if not G then return nil end
  if G.of[host] == nil then groups_load(L, {host}) end
  local g = G.of[host]
  if not g then return nil end
  return g, G.rec[g]
end

-- The group whose limits a host's requests keep now (the crawl's key is `domain`).
local function group_on(L, host)
  if not (L.G and L.G.on) then return nil end
  return group_of(L, host)
end

local function group_touch(L, g)
  local G = L.G
  if not G.write[g] then
    G.write[g] = true
    G.order[#G.order + 1] = g
  end
end

-- Gives back the slot of host's group a lease held (with `slot`: not given back yet), and
-- `sent` (when its request went out, late, as end_lease takes it) moves the group's last
-- request too, so its next turn counts from it.
local function group_slot_back(L, host, slot, sent)
  local g, r = group_of(L, host)
  if not g then return end
  if slot and r.inflight > 0 then r.inflight = r.inflight - 1 end
  if sent and sent > r.last then r.last = sent end
  group_touch(L, g)
end

-- Reads at once the groups of the hosts of `ended` leases ({host, e} as end_lease takes
-- them) that hold a slot of their group (e.group), before their ends give the slots back.
local function groups_load_ended(L, ended)
  local hosts = {}
  for _, e in ipairs(ended) do
    if e[2].group then hosts[#hosts + 1] = e[1] end
  end
  if #hosts > 0 then groups_load(L, hosts) end
end

-- Push-back from a host slows its group: the group is blocked as long as the host.
local function group_block(L, hosts)
  for _, host in ipairs(hosts) do
    local g, r = group_on(L, host)
    local until_ms = L.rec[host].blocked
    if g and until_ms > r.blocked then
      r.blocked = until_ms
      group_touch(L, g)
    end
  end
end

-- The flush's first step: the hosts parked on a group that has a free slot again come
-- back (read and rescheduled), and the groups of the hosts to schedule are read.
local function groups_prepare(L)
  local G = L.G
  if not G.on then return end
  local cc = ledger_conf(L)
  -- Most flushes find nobody parked: one EXISTS instead of a range read per group.
  if #G.order > 0 and redis.call('EXISTS', G.K.parked) == 0 then
    groups_load(L, L.order)
    return
  end
  for _, g in ipairs(G.order) do
    if group_turn(G.rec[g], cc) then
      local parked = redis.call('ZRANGEBYLEX', G.K.parked, '[' .. g .. ' ', '(' .. g .. '!',
                                'LIMIT', 0, UNPARK)
      if #parked > 0 then
        local hosts = {}
        for k, m in ipairs(parked) do hosts[k] = string.sub(m, #g + 2) end
        call_sliced('ZREM', G.K.parked, parked, 1000)
        ledger_load(L, hosts)
        for _, h in ipairs(hosts) do ledger_reschedule(L, h) end
      end
    end
  end
  groups_load(L, L.order)
end

-- A due host's place in `due` with its group: max(`at`, its group's turn), or nil (parked
-- until its group has a free slot).
local function groups_adjust(L, host, at)
  local g, r = group_on(L, host)
  if not g then return at end
  local gat = group_turn(r, ledger_conf(L))
  if gat then return math.max(at, gat) end
  L.G.parks[#L.G.parks + 1] = 0
  L.G.parks[#L.G.parks + 1] = g .. ' ' .. host
  return nil
end

-- The flush's last step: the changed group records and the hosts parked.
local function groups_flush(L)
  local G, args = L.G, {}
  for _, g in ipairs(G.order) do
    args[#args + 1] = g
    args[#args + 1] = group_encode(G.rec[g])
  end
  if #args > 0 then call_sliced('HSET', G.K.groups, args, 1000) end
  if #G.parks > 0 then call_sliced('ZADD', G.K.parked, G.parks, 1000) end
  G.order, G.write, G.parks = {}, {}, {}
end

-- The crawl's politeness_key ('host' for none) when an enqueue's groups, `text`, were
-- named for another (its first word: `ip`, or `domain` under any other key, which host
-- ignores): the enqueue changes nothing and is named again for it. Checked before the
-- script's first write.
local function groups_stale(L, text)
  local key = ledger_conf(L).gkey
  if string.match(text, '^%S*') ~= (key == 'ip' and 'ip' or 'domain') then
    return key == '' and 'host' or key
  end
  return nil
end

-- Names the groups of `hosts` in g:of from `text` (groups_stale's key, then their groups
-- in host order, "-" for none, "?" for a name that failed to resolve just now) while the
-- crawl's key is not host (L.G on): an enqueue's. Under `ip` a host keeps the first group
-- it was named: another process may resolve its name to another address (a
-- changed or balanced DNS answer), and the end of a lease gives its slot back to the
-- group g:of names then. Returns how many names failed to resolve.
local function groups_assign(L, hosts, text)
  if not L.G.on then return 0 end
  local named, groups, i, unresolved = {}, {}, -1, 0
  for g in string.gmatch(text, '%S+') do
    i = i + 1
    if g == '?' then
      unresolved = unresolved + 1
    elseif i > 0 and g ~= '-' and hosts[i] then
      named[#named + 1] = hosts[i]
      groups[#groups + 1] = g
    end
  end
  if i ~= #hosts then error('crawlq: enqueue needs one group per host') end
  if #named == 0 then return unresolved end
  local had = {}
  if ledger_conf(L).gkey == 'ip' then had = call_sliced('HMGET', L.G.K.of, named, 1000) end
  local args = {}
  for k, host in ipairs(named) do
    if not had[k] then
      args[#args + 1] = host
      args[#args + 1] = groups[k]
    end
  end
  if #args > 0 then call_sliced('HSET', L.G.K.of, args, 1000) end
  return unresolved
end

-- Gives ledger `L` the groups of keys `GK` (group_keys): on (group limits kept) when the
-- crawl's politeness_key is not host; off, only a lease's group slot given back.
local function ledger_groups(L, GK)
  L.G = {K = GK, on = ledger_conf(L).gkey ~= '', of = {}, rec = {}, write = {}, order = {},
         parks = {}, prepare = groups_prepare, adjust = groups_adjust, flush = groups_flush}
end
