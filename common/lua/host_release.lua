-- host_release.lua: give back per-host fetch slots; slow a host down for the whole fleet.
--
-- A cooldown (a 429/503 answer, its Retry-After) pushes the host's next-allowed time
-- out for every consumer. A host with no live slot and nothing to wait for is
-- forgotten, so the hosts hash only holds hosts in use.
--
-- KEYS[1]      hosts  HASH  host -> next allowed request start, ms of Redis TIME
-- KEYS[1+i]    slots  ZSET  of item i's host: slot token -> expiry (ms)
-- ARGV[1..]    per item 3 values: host, slot token, cooldown_ms (0 = none)
-- Returns the number of slots released
local hosts = KEYS[1]
if #ARGV % 3 ~= 0 or #ARGV / 3 ~= #KEYS - 1 then
  error('crawlq: host_release needs one slots key and 3 ARGV values per item')
end
for i = 3, #ARGV, 3 do int_arg(ARGV[i], 'cooldown_ms') end
local now = now_ms()
local released = 0
for i = 1, #KEYS - 1 do
  local base = 1 + 3 * (i - 1)
  local host, token, cooldown = ARGV[base], ARGV[base + 1], tonumber(ARGV[base + 2])
  local slots = KEYS[1 + i]
  released = released + redis.call('ZREM', slots, token)
  local next_allowed = tonumber(redis.call('HGET', hosts, host) or '0')
  if cooldown > 0 and now + cooldown > next_allowed then
    redis.call('HSET', hosts, host, now + cooldown)
  elseif next_allowed <= now and redis.call('EXISTS', slots) == 0 then
    redis.call('HDEL', hosts, host)
  end
end
return released
