-- lib/grant.lua: the lease side of a lease call (lease.lua): screening the entries taken
-- from the hosts' queues, and granting the rest as lease records. `C` is the call's
-- context (lib/turns.lua) with K: the keys tasks, attempts, seq, checkpoints, errors,
-- dead, dead_reasons, and C.grouped (lib/turns.lua).
-- Includes lib/leases, lib/dead, lib/memory, lib/hosts, lib/groups.
--- @include "lib/leases"
--- @include "lib/dead"
--- @include "lib/memory"
--- @include "lib/hosts"
--- @include "lib/groups"

-- An entry whose id is live already (a URL queued twice: leased, waiting or dead) is
-- dropped, and so is a repeat within this call: a task is in exactly one state. An entry
-- without its id (lib/queues.lua entry_expand: neither a full nor a compact entry) goes
-- to `dead` as malformed, its bytes kept under sha1(entry)[:32].
-- Either way its host's slot (and its group's) is not taken. Returns the entries kept, and how many were
-- dropped and malformed.
local function screen(C, popped)
  local keep, dropped, malformed = {}, 0, 0
  if #popped == 0 then return keep, 0, 0 end
  local K, ids = C.K, {}
  for k, p in ipairs(popped) do ids[k] = p[1] or '' end  -- '': a malformed one's
  local live_lease = call_sliced('HMGET', C.LK.leased, ids, 1000)
  local live_body = call_sliced('HMGET', K.tasks, ids, 1000)
  local seen = {}
  for k, p in ipairs(popped) do
    local host, stays = C.hosts[p[3]], false
    if not p[1] then
      local id = string.sub(redis.sha1hex(p[2]), 1, 32)
      redis.call('HSET', K.tasks, id, host .. ' ' .. p[4] .. ' ' .. p[2])
      to_dead(K.dead, K.errors, K.dead_reasons, id, 'malformed',
        'task entry must start with its id, then its URL', C.now)
      malformed = malformed + 1
    elseif live_lease[k] or live_body[k] or seen[p[1]] then
      dropped = dropped + 1
    else
      seen[p[1]] = true
      keep[#keep + 1] = p
      stays = true
    end
    if not stays then
      local r = C.L.rec[host]
      r.inflight = r.inflight - 1
      if C.grouped[p[3]] then group_slot_back(C.L, host, true) end
    end
  end
  return keep, dropped, malformed
end

-- Grants the kept entries: each becomes a lease record of C.worker under a fresh fencing
-- token (greater than every token granted before, on this primary or a lost one), its
-- attempt counted now (the ones before taken out of `attempts`), its owner marked "b"
-- when its host has a page budget (a page of it reserved) and "g" when it took a slot of
-- its host's group, with its deadline
-- in `leases`. Returns per lease {id, token, attempt, entry, checkpoint|false,
-- last error|false, candidate index}.
local function grant(C, keep, deadline)
  local grants = {}
  if #keep == 0 then return grants end
  local K, kids = C.K, {}
  for k, p in ipairs(keep) do kids[k] = p[1] end
  local cps, errs, counts = {}, {}, {}
  if redis.call('EXISTS', K.checkpoints) == 1 then cps = call_sliced('HMGET', K.checkpoints, kids, 1000) end
  if redis.call('EXISTS', K.errors) == 1 then errs = call_sliced('HMGET', K.errors, kids, 1000) end
  if redis.call('EXISTS', K.attempts) == 1 then
    counts = call_sliced('HMGET', K.attempts, kids, 1000)
    call_sliced('HDEL', K.attempts, kids, 1000)
  end
  -- Tokens only grow, also across a failover that lost the last writes (the promoted
  -- replica's `seq` may be behind what the old primary granted): a call's tokens come
  -- after both `seq` and Redis TIME in microseconds (ms * 1000), so a primary promoted
  -- after the old one's last grant starts past every token that one gave, as long as
  -- the clocks differ by less than the failover takes (docs/failover.md). A token is
  -- an integer below 2^53 (exact in a Lua number) and 2^63 (a bigint) until year 2255.
  local base = math.max(tonumber(redis.call('GET', K.seq)) or 0, C.now * 1000)
  redis.call('SET', K.seq, string.format('%.0f', base + #kids))
  local records, deadlines = {}, {}
  local owner_suffix, deadline_arg = ':' .. C.worker, tostring(deadline)
  -- Explicit indexes, not #t: the length operator is a search in Lua 5.1.
  for k, p in ipairs(keep) do
    local id, host = p[1], C.hosts[p[3]]
    local r = C.L.rec[host]
    local token = string.format('%.0f', base + k)
    local attempt = (tonumber(counts[k]) or 0) + 1
    local owner = token .. owner_suffix
    if C.grouped[p[3]] then owner = 'g' .. owner end
    if r.budget then
      owner = 'b' .. owner
      r.reserved = r.reserved + 1
    end
    records[2 * k - 1], records[2 * k] = id, lease_value(owner, attempt, host, p[4], p[2])
    deadlines[2 * k - 1], deadlines[2 * k] = deadline_arg, id
    grants[k] = {id, token, attempt, p[2], cps[k] or false, errs[k] or false, p[3]}
  end
  force_hashtable(C.LK.leased)
  call_sliced('HSET', C.LK.leased, records, 1000)
  call_sliced('ZADD', C.LK.leases, deadlines, 1000)
  return grants
end
