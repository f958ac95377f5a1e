-- lib/leases.lua: lease records, the one record of a leased task in `leased`, with its
-- deadline in `leases`: writing, reading, judging and ending them.
-- Includes lib/codes (result codes, call_sliced).
--- @include "lib/codes"

-- The lease keys of a script, from KEYS[first ..]: leased, leases (common/keys.py's
-- PartitionKeys.lease_state, in that order).
local function lease_keys(first)
  return {leased = KEYS[first], leases = KEYS[first + 1]}
end

-- A lease record "<owner> <attempt> <host> <priority> <entry>". The owner is
-- "[f][b][g]<token>:<worker>": b when the lease holds a page of its host's budget
-- (reserved at lease, settled at its end: lib/lease_end.lua), g when it holds a slot of its
-- host's politeness group (lib/groups.lua), and f once its response is in (lease.lua's
-- responses in): its host's (and group's) slot was given back then, so the lease's end
-- must not give it back again.
local function lease_value(owner, attempt, host, prio, entry)
  return owner .. ' ' .. attempt .. ' ' .. host .. ' ' .. prio .. ' ' .. entry
end

-- A lease record as a table {owner, attempt, host, prio, entry} (nil if malformed).
local function lease_decode(value)
  if not value then return nil end
  local owner, attempt, host, prio, entry = string.match(value,
    '^(%S+) (%d+) (%S+) (%d+) (.*)$')
  if not owner then return nil end
  return {owner = owner, attempt = tonumber(attempt), host = host, prio = tonumber(prio),
          entry = entry}
end

local function fetched_owner(owner)
  return string.byte(owner, 1) == 102  -- 'f'
end

-- The owner with its marks taken off, whether it holds a page of its host's budget and
-- whether it holds a slot of its host's group.
local function owner_marks(owner)
  if fetched_owner(owner) then owner = string.sub(owner, 2) end
  local budget = string.byte(owner, 1) == 98  -- 'b'
  if budget then owner = string.sub(owner, 2) end
  local grouped = string.byte(owner, 1) == 103  -- 'g'
  if grouped then owner = string.sub(owner, 2) end
  return owner, budget, grouped
end

-- The result code of a lease from its record and its deadline (either nil or false when
-- absent): whether `worker` still holds it under `token`.
local function judge_lease(rec, deadline, token, worker, now)
  if not rec then return UNKNOWN end
  if owner_marks(rec.owner) ~= token .. ':' .. worker then return STALE end
  deadline = deadline and tonumber(deadline)
  if (not deadline) or deadline <= now then return EXPIRED end
  return OK
end

-- Judges many (id, token) pairs of `worker` in two commands (HMGET leased, ZMSCORE
-- leases). Returns the result codes and the lease records read (tables; nil: none).
local function lease_states(LK, ids, tokens, worker, now)
  local values = call_sliced('HMGET', LK.leased, ids, 1000)
  local deadlines = call_sliced('ZMSCORE', LK.leases, ids, 1000)
  local states, recs = {}, {}
  for i = 1, #ids do
    local rec = lease_decode(values[i])
    recs[i] = rec
    states[i] = judge_lease(rec, deadlines[i], tokens[i], worker, now)
  end
  return states, recs
end

-- Deletes the records and deadlines of ended leases (two commands).
local function drop_leases(LK, ids)
  if #ids == 0 then return end
  call_sliced('HDEL', LK.leased, ids, 1000)
  call_sliced('ZREM', LK.leases, ids, 1000)
end
