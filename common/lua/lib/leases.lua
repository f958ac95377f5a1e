-- lib/leases.lua: a lease's `owners` entry and its marks, whether a worker still holds a
-- lease (one or many), and ending one.
-- Includes lib/codes (result codes, call_sliced).
--- @include "lib/codes"

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
