-- host_acquire.lua: take per-host fetch slots for a batch of tasks (fleet-wide politeness).
--
-- A host grants a slot when it has fewer than `concurrency` live slots and its
-- next-allowed time has come; the grant pushes next-allowed to now + delay_ms (the
-- larger of --per-host-delay and the host's robots.txt Crawl-delay). A slot expires
-- after slot_ttl_ms, so a consumer that dies holding one cannot block its host.
-- An item not granted gets the milliseconds to wait; the caller defers its task.
--
-- KEYS[1]      hosts  HASH  host -> next allowed request start, ms of Redis TIME
-- KEYS[1+i]    slots  ZSET  of item i's host: slot token -> expiry (ms)
-- ARGV[1]      concurrency, the most live slots per host
-- ARGV[2]      slot_ttl_ms, how long an unreleased slot lives
-- ARGV[3..]    per item 3 values: host, delay_ms, slot token
-- Returns {wait_ms per item} (0 = granted)
local hosts = KEYS[1]
local concurrency = int_arg(ARGV[1], 'concurrency')
local slot_ttl = int_arg(ARGV[2], 'slot_ttl_ms')
if (#ARGV - 2) % 3 ~= 0 or (#ARGV - 2) / 3 ~= #KEYS - 1 then
  error('crawlq: host_acquire needs one slots key and 3 ARGV values per item')
end
for i = 4, #ARGV, 3 do int_arg(ARGV[i], 'delay_ms') end
local now = now_ms()
local swept, waits, refused = {}, {}, {}
for i = 1, #KEYS - 1 do
  local base = 3 + 3 * (i - 1)
  local host, delay, token = ARGV[base], tonumber(ARGV[base + 1]), ARGV[base + 2]
  local slots = KEYS[1 + i]
  if not swept[slots] then
    redis.call('ZREMRANGEBYSCORE', slots, '-inf', now)
    swept[slots] = true
  end
  local next_allowed = tonumber(redis.call('HGET', hosts, host) or '0')
  -- Refused items of one host are spread out (the k-th waits k spacings longer), so
  -- they come back one by one instead of all at once.
  local k = refused[host] or 0
  local spacing = math.max(delay, 50)
  local wait = 0
  if now < next_allowed then
    wait = next_allowed - now + k * spacing
    refused[host] = k + 1
  elseif redis.call('ZCARD', slots) >= concurrency then
    wait = spacing * (1 + math.floor(k / concurrency))
    refused[host] = k + 1
  else
    redis.call('ZADD', slots, now + slot_ttl, token)
    if delay > 0 then redis.call('HSET', hosts, host, now + delay) end
  end
  waits[i] = wait
end
return waits
