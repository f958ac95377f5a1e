-- proxy_bans.lua: record what the hosts of one partition did to the crawl's proxies (a
-- consumer's flush's worth): bans per host, each host's proxy tier, and hosts that no
-- proxy can reach for a while.
--
-- A ban: the proxy is not used for that host until now + ban_ms (other hosts keep it).
-- It counts at the host's tier when it was made there or higher: the host's tier moves
-- up one (escalates) once tier_bans proxies of its tier were banned there in a row, or at
-- once when the consumer found none of that tier left for the host (exhausted); a ban at
-- a cheaper tier than the host's (a pick made before the host escalated) does not count.
-- A host steps one tier down per quiet_ms without a ban at its tier (reckoned when it is
-- read: common/proxies/health.py's effective_tier mirrors tier_now).
-- A gone: no proxy of the consumer may reach the host now (each banned by it or
-- quarantined); the host is blocked for the whole fleet until the first of them comes
-- back (now + wait_ms; a block only ever lengthens, lib/backoff.lua's block_host), so no
-- consumer leases its tasks meanwhile.
-- Expired bans are dropped. A call carries an operation id: a call sent again after its
-- reply was lost finds it in KEYS[8] and gets the reply the first one kept.
--
-- KEYS[1..4] host state: hosts, due, h:queued, conf (lib/hosts.lua)
-- KEYS[5] h:blocked       ZSET   host -> blocked until (ms)
-- KEYS[6] px:ban          ZSET   "<proxy id> <host>" -> banned until (ms)
-- KEYS[7] px:tier         HASH   host -> "<tier> <since_ms> <bans>"
-- KEYS[8] px:op:<worker>  STRING "<op id> <reply>" of the worker's last call, PX 60 s
-- ARGV[1] op id, unique per call of the worker
-- ARGV[2] ban_ms, how long a ban keeps a proxy from its host, milliseconds
-- ARGV[3] quiet_ms, how long without a ban takes a host a tier down, milliseconds
-- ARGV[4] tier_bans, bans at a host's tier that escalate it (>= 1)
-- ARGV[5] tiers, the tier names cheapest first, comma-separated
-- ARGV[6..] per item 6 values: event (ban or gone), host, proxy id (gone: -), tier (the
--           banned proxy's; gone: -), wait_ms (gone: how long no proxy may reach the
--           host; ban: 0), exhausted (1 = no proxy of that tier is left for the host)
-- Returns {tier} per item: the host's tier after it
--- @include "lib/codes"
--- @include "lib/hosts"
--- @include "lib/backoff"

local blocked, bans_key, tiers_key, op_key = KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local op = ARGV[1]
local ban_ms = int_arg(ARGV[2], 'ban_ms')
local quiet_ms = int_arg(ARGV[3], 'quiet_ms')
local tier_bans = int_arg(ARGV[4], 'tier_bans')
if tier_bans < 1 or ban_ms < 0 or quiet_ms < 0 then
  error('crawlq: proxy_bans needs ban_ms, quiet_ms >= 0 and tier_bans >= 1')
end
if (#ARGV - 5) % 6 ~= 0 then error('crawlq: proxy_bans needs 6 values per item') end
local kept = redis.call('GET', op_key)
if kept then
  local id, reply = string.match(kept, '^(%S+) (.*)$')
  if id == op then return cjson.decode(reply) end
end
local tiers, index = {}, {}
for name in string.gmatch(ARGV[5], '[^,]+') do
  tiers[#tiers + 1] = name
  index[name] = #tiers
end
if #tiers == 0 then error('crawlq: proxy_bans needs the tiers') end

local now = now_ms()
-- A host's tier record as of now: its tier's index, since when, its bans there; a
-- quiet_ms without a ban takes it one tier down (its bans forgotten).
local function tier_now(host)
  local value = redis.call('HGET', tiers_key, host)
  local name, since, n = 'x', now, 0
  if value then name, since, n = string.match(value, '^(%S+) (%S+) (%S+)$') end
  local at = index[name] or 1
  since, n = tonumber(since) or now, tonumber(n) or 0
  if at > 1 and quiet_ms > 0 then
    local steps = math.floor((now - since) / quiet_ms)
    if steps > 0 then
      local down = math.min(steps, at - 1)
      at, since, n = at - down, since + down * quiet_ms, 0
    end
  end
  return at, since, n
end

local L = nil
redis.call('ZREMRANGEBYSCORE', bans_key, '-inf', now)
local out = {}
for i = 6, #ARGV, 6 do
  local event, host, pid, tier = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3]
  local wait = int_arg(ARGV[i + 4], 'wait_ms')
  local exhausted = ARGV[i + 5] == '1'
  if host == '' or string.find(host .. pid .. tier, '%s') then
    error('crawlq: a host, proxy id and tier are words')
  end
  local at, since, n = tier_now(host)
  if event == 'ban' then
    redis.call('ZADD', bans_key, now + ban_ms, pid .. ' ' .. host)
    local made = index[tier] or 0
    if made >= at then
      if made > at then at, n = made, 0 end
      n, since = n + 1, now
      if (exhausted or n >= tier_bans) and at < #tiers then
        at, n = at + 1, 0
      end
    end
  elseif event == 'gone' then
    if wait < 0 then error('crawlq: wait_ms must be >= 0') end
    if not L then L = ledger(host_keys(1), now) end
    ledger_get(L, host)
    block_host(L, blocked, host, now + wait, false)
  else
    error('crawlq: a proxy_bans event is ban or gone, not ' .. event)
  end
  if at == 1 and n == 0 then
    redis.call('HDEL', tiers_key, host)
  else
    redis.call('HSET', tiers_key, host, string.format('%s %d %d', tiers[at], since, n))
  end
  out[#out + 1] = tiers[at]
end
if L then ledger_flush(L) end
redis.call('SET', op_key, op .. ' ' .. cjson.encode(out), 'PX', 60000)
return out
