-- lib/codes.lua: the result codes and the small helpers most scripts use (Redis time,
-- integer ARGV, commands over long argument lists, stats counters, binary ids).
-- Includes nothing. Like every module under lib/, it defines no keys of its own: every
-- key a script touches comes in KEYS.
--
-- Result codes (mirrored by common.queue.Code):
--   0 OK       the transition happened
--   1 RETRY    fail: the task waits in `delayed` for another attempt
--   2 DEAD     fail/reclaim: the task moved to `dead`
--   3 STALE    the lease is held under another fencing token (someone else owns it now)
--   4 EXPIRED  the token matches but the lease deadline has passed
--   5 UNKNOWN  the id holds no lease (already acked, reclaimed, never leased)
local OK, RETRY, DEAD, STALE, EXPIRED, UNKNOWN = 0, 1, 2, 3, 4, 5

-- Milliseconds of the Redis server clock: deadlines never come from a worker's clock.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Runs `cmd key args...` in slices of at most `step` values (even, for pairs) and returns
-- the replies joined: unpack() of a long table overflows the Lua C stack (~8000 values),
-- and a script that fails after its first writes is not rolled back.
local function call_sliced(cmd, key, args, step)
  if #args <= step then  -- one slice: its reply as it is
    local reply = redis.call(cmd, key, unpack(args))
    return type(reply) == 'table' and reply or {}
  end
  local out = {}
  for i = 1, #args, step do
    local reply = redis.call(cmd, key, unpack(args, i, math.min(i + step - 1, #args)))
    if type(reply) == 'table' then
      for j = 1, #reply do out[#out + 1] = reply[j] end
    end
  end
  return out
end

-- Adds non-zero deltas to the stats hash in one call.
local function bump(stats, deltas)
  for name, n in pairs(deltas) do
    if n ~= 0 then redis.call('HINCRBY', stats, name, n) end
  end
end

-- Parses an integer ARGV value or stops the script before any write.
local function int_arg(value, name)
  local n = tonumber(value)
  if not n or n ~= math.floor(n) then
    error('crawlq: ARGV ' .. name .. ' must be an integer, got ' .. tostring(value))
  end
  return n
end

-- The 16 bytes of a 32-hex-digit id (a queued entry's, a history record's field), as
-- four 32-bit words: 1.5 us against 6 for a byte at a time (once or twice an ack's item).
-- Digits that are not hex read as 0s.
local function bin_id(hex)
  local f, sub = math.floor, string.sub
  local a, b = tonumber(sub(hex, 1, 8), 16) or 0, tonumber(sub(hex, 9, 16), 16) or 0
  local c, d = tonumber(sub(hex, 17, 24), 16) or 0, tonumber(sub(hex, 25, 32), 16) or 0
  return string.char(f(a / 16777216), f(a / 65536) % 256, f(a / 256) % 256, a % 256,
    f(b / 16777216), f(b / 65536) % 256, f(b / 256) % 256, b % 256,
    f(c / 16777216), f(c / 65536) % 256, f(c / 256) % 256, c % 256,
    f(d / 16777216), f(d / 65536) % 256, f(d / 256) % 256, d % 256)
end
