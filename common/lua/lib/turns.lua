-- lib/turns.lua: the frontier's side of a lease call (lease.lua): slots given back by
-- responses in, the candidates whose turn has come in serving order, and taking their
-- entries. `C` is the call's context: L (host ledger), LK (lease keys), worker, now,
-- ahead, n, cc (crawl defaults), hosts (candidates), prio (their -priority or false),
-- held (slots this worker holds, per candidate), qkey(i) (candidate i's hq, hp keys),
-- prio_hosts, pending, stats. A host of a politeness group (lib/groups.lua, the ledger's
-- groups on) is served only when its group's turn has come too, and its group's slots
-- count with its own; C.grouped[i] says candidate i's leases took a slot of its group.
-- C.rkey(i) is candidate i's render queue and C.R the render lane's keys (lib/render.lua):
-- a render entry popped is moved there, not leased; a call without them (C.rkey nil)
-- puts it back where it was, with the entries popped after it, and says so (C.met).
-- Includes lib/leases, lib/hosts, lib/queues (refresh_prio), lib/fairshare, lib/groups,
-- lib/render.
--- @include "lib/leases"
--- @include "lib/hosts"
--- @include "lib/queues"
--- @include "lib/fairshare"
--- @include "lib/groups"
--- @include "lib/render"

-- The most render entries one call moves from a host's queue to its render queue (on its
-- way to `take` entries it may lease): a queue of render entries moves over a few calls.
local MOVE_MAX = 64

-- A host's turn `at` with its group's: the later of the two, or nil while its group's
-- slots are all taken; and its group's delay (0: ungrouped).
local function with_group(C, host, at)
  local g, gr = group_on(C.L, host)
  if not g then return at, 0 end
  local gat = group_turn(gr, C.cc)
  return gat and math.max(at, gat) or nil, (group_limits(gr, C.cc))
end

-- Responses in: the hosts of these leases of C.worker get their slots back now (what
-- the lease's end would do), and the lease records are marked "f" so the end does not.
local function give_back(C, ids, tokens)
  if #ids == 0 then return end
  local states, recs = lease_states(C.LK, ids, tokens, C.worker, C.now)
  local marks, freed, seen, grouped = {}, {}, {}, {}
  for i, id in ipairs(ids) do
    local rec = recs[i]
    if states[i] == OK and not fetched_owner(rec.owner) and not seen[id] then
      seen[id] = true
      marks[#marks + 1] = id
      marks[#marks + 1] = lease_value('f' .. rec.owner, rec.attempt, rec.host, rec.prio,
                                      rec.entry)
      freed[#freed + 1] = rec.host
      local _, _, g = owner_marks(rec.owner)
      if g then grouped[#grouped + 1] = rec.host end
    end
  end
  if #marks == 0 then return end
  if #grouped > 0 then groups_load(C.L, grouped) end
  for _, host in ipairs(grouped) do group_slot_back(C.L, host, true) end
  call_sliced('HSET', C.LK.leased, marks, 1000)
  ledger_load(C.L, freed)
  for _, host in ipairs(freed) do
    local r = C.L.rec[host]
    if r.inflight > 0 then r.inflight = r.inflight - 1 end
    ledger_touch(C.L, host)
  end
end

-- The ready candidates (indexes into C.hosts) in serving order: priority work first,
-- then the longest-waiting, then by name; C.turn[host] is each one's turn. Each turn comes from the
-- record (the due rule), so a `due` score written before the crawl's defaults changed
-- can't serve a host early; a candidate that is not ready whose place in `due` is not
-- its turn (such a score, or another consumer's lease since the candidates were named
-- left it right) gets it written again. A host with a delay is served up to C.ahead ms before its turn (the
-- consumer times its request); one without (a block's end is its turn) only once it has
-- come. Returns the order and the ms until a candidate not served comes within reach
-- (-1: none).
local function ready_order(C)
  local L, cc, now = C.L, C.cc, C.now
  local ready, wait, pkey, since, unready, turns = {}, -1, {}, {}, {}, {}
  C.turn = {}
  for i, host in ipairs(C.hosts) do
    local r = L.rec[host]
    local at, gdelay = turn_of(r, cc, now), 0
    if at then at, gdelay = with_group(C, host, at) end
    local lead = (at and at > now and (host_limits(r, cc, now) > 0 or gdelay > 0))
      and C.ahead or 0
    if at and at <= now + lead and not C.turn[host] then
      ready[#ready + 1] = i
      C.turn[host], pkey[i], since[i] = math.max(at, now), tonumber(C.prio[i]) or 0, at
    elseif not C.turn[host] then
      if at and (wait < 0 or at - now - lead < wait) then wait = math.max(0, at - now - lead) end
      unready[#unready + 1], turns[#unready + 1] = host, at or false
    end
  end
  if #unready > 0 then
    local scores = call_sliced('ZMSCORE', L.K.due, unready, 1000)
    for k, host in ipairs(unready) do
      if (tonumber(scores[k]) or false) ~= turns[k] then ledger_reschedule(L, host) end
    end
  end
  table.sort(ready, function(a, b)
    if pkey[a] ~= pkey[b] then return pkey[a] < pkey[b] end
    if since[a] ~= since[b] then return since[a] < since[b] end
    return C.hosts[a] < C.hosts[b]
  end)
  return ready, wait
end

-- A host whose queues came up short (a lost or restored hq/hp key) gets its count set to
-- what `left` priority entries hold, and `pending` corrected.
local function recount(C, r, got, left)
  local lost = r.queued - got - left
  if lost == 0 then return end
  r.queued = got + left
  redis.call('DECRBY', C.pending, lost)
  bump(C.stats, {repaired_hosts = 1, lost_pending = math.max(lost, 0)})
end

-- Takes up to C.n entries from the ready hosts' queues, in order: one from a host with a
-- delay (its turn), else up to its free slots, never past its budget or its fair share
-- (C.others hungry workers). Counts them out of `pending`, out of their hosts' queued
-- and into their inflight, their last request at their turn. Returns the entries
-- ({id, entry, candidate index, priority}: expanded, lib/queues.lua entry_expand; the id
-- false for a malformed one), C.delays / C.concs per candidate, whether a
-- fair share cut a take, and whether ready hosts were left unserved (n reached).
local function take_entries(C, ready)
  local L, popped, capped, more = C.L, {}, false, false
  C.delays, C.concs, C.grouped = {}, {}, {}
  for _, i in ipairs(ready) do
    if #popped >= C.n then
      more = true
      break
    end
    local host = C.hosts[i]
    local hq, hp = C.qkey(i)
    local r = L.rec[host]
    local delay, conc = host_limits(r, C.cc, C.now)
    local take = math.min(C.n - #popped, conc - r.inflight, budget_left(r))
    -- Its group's turn may have moved since ready_order: another of its hosts served.
    local g, gr = group_on(L, host)
    local gdelay, gconc = 0, UNLIMITED
    if g then
      gdelay, gconc = group_limits(gr, C.cc)
      local gat = group_turn(gr, C.cc)
      local lead = (delay > 0 or gdelay > 0) and C.ahead or 0
      if gat and gat <= C.now + lead then
        C.turn[host] = math.max(C.turn[host], gat)
        take = math.min(take, gconc - gr.inflight)
      else
        take = 0
      end
    end
    C.delays[i] = math.max(delay, gdelay)
    C.concs[i] = conc < UNLIMITED and conc or (gconc < UNLIMITED and gconc or 0)
    if delay > 0 or gdelay > 0 then take = math.min(take, 1) end
    if conc < UNLIMITED then
      local cut
      take, cut = fair_take(take, conc, C.others, C.held[i])
      capped = capped or cut
    end
    local got, moved, short, stop = 0, {}, false, false
    if take > 0 and C.prio[i] then
      local z = redis.call('ZPOPMIN', hp, take)
      for k = 1, #z, 2 do
        if is_render(z[k]) and not C.rkey then
          local back = {}
          for j = k, #z, 2 do back[#back + 1], back[#back + 2] = z[j + 1], z[j] end
          redis.call('ZADD', hp, unpack(back))
          C.met, stop = true, true
          break
        elseif is_render(z[k]) then
          moved[#moved + 1] = z[k]
        else
          local id, entry = entry_expand(host, z[k])
          popped[#popped + 1] = {id, entry, i, -tonumber(z[k + 1])}
          got = got + 1
        end
      end
      refresh_prio(C.prio_hosts, hp, host)
    end
    -- Render entries met on the way are moved, and more popped in their place.
    while got < take and not short and not stop and #moved < MOVE_MAX do
      local want = take - got
      local list = redis.call('LPOP', hq, want) or {}
      short = #list < want
      for k, e in ipairs(list) do
        if is_render(e) and not C.rkey then
          local back = {}
          for j = #list, k, -1 do back[#back + 1] = list[j] end
          redis.call('LPUSH', hq, unpack(back))
          C.met, stop, short = true, true, false
          break
        elseif is_render(e) then
          moved[#moved + 1] = e
        else
          local id, entry = entry_expand(host, e)
          popped[#popped + 1] = {id, entry, i, 0}
          got = got + 1
        end
      end
    end
    if short then
      local left = redis.call('ZCARD', hp)
      if left > 0 and not C.prio[i] then  -- priority work prio_hosts did not name
        redis.call('ZADD', C.prio_hosts, redis.call('ZRANGE', hp, 0, 0, 'WITHSCORES')[2], host)
      end
      recount(C, r, got + #moved, left)
    end
    if #moved > 0 then render_push(C.R, host, C.rkey(i), moved, C.now) end
    r.queued = r.queued - got - #moved
    r.inflight = r.inflight + got
    if got > 0 then r.last = C.turn[host] end
    if g and got > 0 then
      gr.inflight = gr.inflight + got
      if C.turn[host] > gr.last then gr.last = C.turn[host] end
      C.grouped[i] = true
      group_touch(L, g)
    end
    ledger_touch(L, host)
  end
  if #popped > 0 then redis.call('DECRBY', C.pending, #popped) end
  return popped, capped, more
end
