-- lib/fairshare.lua: the fair share of a host's slots between consumers: a worker whose
-- lease call asked for tasks and got none is hungry; while another is, a call takes no
-- more of a host with a concurrency limit than its share.
-- Includes nothing.

-- How long an empty call keeps its worker hungry: longer than a consumer's idle poll
-- (a second at most), so a hungry worker that is still asking stays counted.
local HUNGRY_MS = 2000

-- Marks `worker` hungry at `now`. A hint: a Redis at maxmemory refuses the mark (the
-- script's first write may not grow memory) and the call goes on without it.
local function hungry_mark(hungry, worker, now)
  if redis.pcall('ZADD', hungry, now, worker) == 1 then  -- a new worker: forget old ones
    redis.call('ZREMRANGEBYSCORE', hungry, '-inf', now - HUNGRY_MS)
  end
end

-- How many other workers are hungry now, and whether `worker` is.
local function hungry_others(hungry, worker, now)
  local others, me = 0, false
  for _, w in ipairs(redis.call('ZRANGEBYSCORE', hungry, now - HUNGRY_MS, '+inf')) do
    if w == worker then me = true else others = others + 1 end
  end
  return others, me
end

-- The most a call may take of a host with concurrency `conc` (< UNLIMITED) while
-- `others` workers are hungry, this worker holding `held` of its slots: its share,
-- ceil(conc / (others + 1)), less what it holds. Returns the take, and whether the share
-- cut it (the slots left are for the hungry: the caller wakes them).
local function fair_take(take, conc, others, held)
  if others == 0 then return take, false end
  local share = math.ceil(conc / (others + 1)) - (held or 0)
  if take <= share then return take, false end
  return math.max(share, 0), true
end
