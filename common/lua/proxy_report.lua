-- proxy_report.lua: fold one consumer's proxy reports (a flush's worth) into the crawl's
-- proxy pool: each proxy's successes, failures, bans and response time, and the
-- quarantine its failures lead to. Fleet-wide: every consumer reads the pool back
-- (common/proxies/health.py reads the records this writes).
--
-- A record: tier, ok, fail, ban (counts), streak (failures in a row), level and until
-- (its quarantine: level quarantines in a row, and when the last one ends, ms of Redis
-- TIME), lat (its response time, a moving average, ms), seen (its last report) and its
-- URL as shown (credentials redacted). Failures in a row reaching max_failures
-- quarantine a proxy until now + min(cap_ms, base_ms * 2^level) and raise its level; a
-- report whose last outcome is a success ends its streak and brings its level back to 0,
-- one whose last outcomes are failures adds them to its streak (the failures of all the
-- fleet's reports add up: a dead proxy is quarantined after max_failures of them).
-- A quarantined proxy is tried again when its quarantine ends; failures reported while
-- it lasts (sent before it was known) are counted, not added to its streak.
-- A call carries an operation id: a call sent again after its reply was lost finds it
-- in KEYS[2] and gets the reply the first one kept, counting nothing twice.
--
-- KEYS[1] px              HASH   proxy id -> "<tier> <ok> <fail> <ban> <streak> <level> <until_ms> <lat_ms> <seen_ms> <shown>"
-- KEYS[2] px:op:<worker>  STRING "<op id> <reply>" of the worker's last call, PX 60 s
-- ARGV[1] op id, unique per call of the worker
-- ARGV[2] base_ms, a proxy's first quarantine, milliseconds (> 0)
-- ARGV[3] cap_ms, its longest quarantine, milliseconds
-- ARGV[4] max_failures, failures in a row that quarantine it (>= 1)
-- ARGV[5..] per item 8 values: proxy id, tier, shown URL, ok n, failed n, tail n (the
--           failures after its last success in this report), banned n, lat_ms (the mean
--           response time of its successes; -1 = none)
-- Returns {until_ms} per item: when the proxy's quarantine ends (ms of Redis TIME; 0 =
--         not quarantined)
--- @include "lib/codes"

local px, op_key = KEYS[1], KEYS[2]
local op = ARGV[1]
local base_ms = int_arg(ARGV[2], 'base_ms')
local cap_ms = int_arg(ARGV[3], 'cap_ms')
local max_failures = int_arg(ARGV[4], 'max_failures')
if base_ms < 1 or max_failures < 1 then
  error('crawlq: proxy_report needs base_ms > 0 and max_failures >= 1')
end
if (#ARGV - 4) % 8 ~= 0 then error('crawlq: proxy_report needs 8 values per item') end
local kept = redis.call('GET', op_key)
if kept then
  local id, reply = string.match(kept, '^(%S+) (.*)$')
  if id == op then return cjson.decode(reply) end
end

local function decode(value)
  local f = {}
  if value then
    for word in string.gmatch(value, '%S+') do f[#f + 1] = word end
  end
  return {ok = tonumber(f[2]) or 0, fail = tonumber(f[3]) or 0, ban = tonumber(f[4]) or 0,
          streak = tonumber(f[5]) or 0, level = tonumber(f[6]) or 0,
          until_ms = tonumber(f[7]) or 0, lat = tonumber(f[8]) or -1}
end

local now = now_ms()
local out = {}
for i = 5, #ARGV, 8 do
  local pid, tier, shown = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  if pid == '' or string.find(pid .. tier .. shown, '%s') or tier == '' or shown == '' then
    error('crawlq: a proxy id, tier and shown URL are words')
  end
  local ok = int_arg(ARGV[i + 3], 'ok n')
  local failed = int_arg(ARGV[i + 4], 'failed n')
  local tail = int_arg(ARGV[i + 5], 'tail n')
  local banned = int_arg(ARGV[i + 6], 'banned n')
  local lat_ms = int_arg(ARGV[i + 7], 'lat_ms')
  local r = decode(redis.call('HGET', px, pid))
  r.ok, r.fail, r.ban = r.ok + ok, r.fail + failed, r.ban + banned
  local quarantined = r.until_ms > now
  if tail == 0 then  -- its last outcome a success: the series ends
    r.streak = 0
    if ok > 0 then r.level = 0 end
  elseif not quarantined then  -- the failures after its last success here add up (another
    r.streak = r.streak + tail  -- consumer's successes may have been before or after them)
  end
  if not quarantined and r.streak >= max_failures then
    r.until_ms = now + math.min(cap_ms, base_ms * 2 ^ r.level)
    r.level = r.level + 1
    r.streak = 0
  end
  if lat_ms >= 0 then
    r.lat = r.lat < 0 and lat_ms or math.floor(0.7 * r.lat + 0.3 * lat_ms + 0.5)
  end
  redis.call('HSET', px, pid, string.format('%s %d %d %d %d %d %d %d %d %s', tier, r.ok,
    r.fail, r.ban, r.streak, r.level, r.until_ms, r.lat, now, shown))
  out[#out + 1] = r.until_ms > now and r.until_ms or 0
end
redis.call('SET', op_key, op .. ' ' .. cjson.encode(out), 'PX', 60000)
return out
