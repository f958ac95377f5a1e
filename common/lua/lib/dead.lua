-- lib/dead.lua: the dead-letter set's reasons: moving an id there, and taking its reason
-- off the per-reason counts.
-- Includes nothing.

-- Moves an id to the dead-letter set with a short reason code and a message.
local function to_dead(dead, errors, dead_reasons, id, reason, message, now)
  redis.call('ZADD', dead, now, id)
  redis.call('HSET', errors, id, reason .. ' ' .. message)
  redis.call('HINCRBY', dead_reasons, reason, 1)
end

-- Takes a dead id's reason off the per-reason counts (requeue, purge).
local function forget_dead_reason(errors, dead_reasons, id)
  local err = redis.call('HGET', errors, id) or 'unknown '
  local reason = string.match(err, '^(%S+)') or 'unknown'
  if redis.call('HINCRBY', dead_reasons, reason, -1) <= 0 then
    redis.call('HDEL', dead_reasons, reason)
  end
end
