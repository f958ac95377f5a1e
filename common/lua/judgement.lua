-- judgement.lua: what the fleet learns of its hosts' pages, for one partition's hosts in
-- one call (common/trapbook.py): store the soft-404 signatures of probes a consumer made,
-- the session tokens it learned, claim the probes it wants to make (at most `max` per
-- host, each directory once: the claim is the claimer's, so the same call sent again
-- finds it won), and read back each asked host's whole state.
--
-- KEYS[i]  jd:<host i>  HASH  s:<dir> -> signature, p:<dir> -> claimer, n -> probes
--          claimed, t:<rule> -> the session value its links are deduplicated under
-- ARGV[1]  the most probes claimed per host
-- ARGV[2]  the claimer (worker id and a nonce: "<worker> <nonce>")
-- ARGV[3..] records of three values: "r", host index, "" (read the host's state);
--   "s", host index, "<dir> <signature>" (store a signature); "t", host index,
--   "<rule> <value>" (a learned token, kept if none is); "c", host index, dir (claim the
--   probe of dir)
-- Returns {states, claims}: states, one per host, its fields and values flat ({} when
-- not read); claims, one per "c" record in order, 1 won (this claimer's), 0 not
--- @include "lib/codes"

local max = int_arg(ARGV[1], 'max')
local me = ARGV[2]
if (#ARGV - 2) % 3 ~= 0 then error('crawlq: judgement needs records of three values') end
local read, claims = {}, {}
for r = 3, #ARGV, 3 do
  local kind, key, value = ARGV[r], KEYS[int_arg(ARGV[r + 1], 'host index')], ARGV[r + 2]
  if not key then error('crawlq: judgement: host index past KEYS') end
  if kind == 'r' then
    read[int_arg(ARGV[r + 1], 'host index')] = true
  elseif kind == 's' then
    local dir, sig = string.match(value, '^(%S+) (.*)$')
    if not dir then error('crawlq: judgement: a signature needs "<dir> <signature>"') end
    redis.call('HSET', key, 's:' .. dir, sig)
  elseif kind == 't' then
    local rule, own = string.match(value, '^(%S+) (.*)$')
    if not rule then error('crawlq: judgement: a token rule needs "<rule> <value>"') end
    redis.call('HSETNX', key, 't:' .. rule, own)  -- the first learner's value is the fleet's
  elseif kind == 'c' then
    local field = 'p:' .. value
    local held = redis.call('HGET', key, field)
    if held == me then
      claims[#claims + 1] = 1
    elseif held or tonumber(redis.call('HGET', key, 'n') or '0') >= max then
      claims[#claims + 1] = 0
    else
      redis.call('HSET', key, field, me)
      redis.call('HINCRBY', key, 'n', 1)
      claims[#claims + 1] = 1
    end
  else
    error('crawlq: judgement: unknown record ' .. tostring(kind))
  end
end
local states = {}
for i = 1, #KEYS do
  states[i] = read[i] and redis.call('HGETALL', KEYS[i]) or {}
end
return {states, claims}
