-- traps.lua: the fleet's part of the crawler-trap rules (common/trapbook.py), for one
-- partition's hosts in one call: count what the rules refused per host and reason, and
-- judge the links with a query by how many distinct queries their host and path have
-- had (the policy's trap_path_variants): a path's query hashes are kept up to the limit,
-- so a query seen before stays admitted (the crawl's dedup has the last word on it), a
-- new one past the limit is refused and counted as trap_variants. A call sent again
-- (the same operation id: lib/once.lua) answers the verdicts of its first run and counts
-- nothing again.
--
-- KEYS[1]  h:traps  ZSET  host -> the sum of its tallies
-- KEYS[2(i-1)+2]  tr:<host i>  HASH  reason -> count
-- KEYS[2(i-1)+3]  tv:<host i>  HASH  8-byte path hash -> 4-byte query hashes
-- KEYS[2+2H]  ops:<worker>  STRING  the worker's last calls (lib/once.lua)
-- ARGV[1]  the most query variants of one path (0 = no limit)
-- ARGV[2]  H, the number of hosts
-- ARGV[3]  the call's operation id (16 hex digits)
-- ARGV[4..3+H] the hosts
-- ARGV[4+H..] records of four values: "c", host index (1..H), reason, n (a tally), or
--   "v", host index, path hash, query hash (a link to judge)
-- Returns one integer per "v" record, in order: 1 admitted, 0 refused
--- @include "lib/codes"
--- @include "lib/once"

local index = KEYS[1]
local limit = int_arg(ARGV[1], 'limit')
local nhosts = int_arg(ARGV[2], 'H')
if #KEYS ~= 2 + 2 * nhosts then error('crawlq: traps needs 2 keys per host, then ops') end
local ops, op = KEYS[#KEYS], ARGV[3]
local replay, calls = once_kept(ops, op)
if replay then return replay end

local function tally(i, reason, n)
  redis.call('HINCRBY', KEYS[2 * i], reason, n)
  redis.call('ZINCRBY', index, n, ARGV[3 + i])
end

-- Whether `query` (4 bytes) is one of `held`'s 4-byte hashes (a match must be aligned).
local function holds(held, query)
  local at = 1
  while true do
    local found = string.find(held, query, at, true)
    if not found then return false end
    if (found - 1) % 4 == 0 then return true end
    at = found + 1
  end
end

local verdicts = {}
for r = 4 + nhosts, #ARGV, 4 do
  local i = int_arg(ARGV[r + 1], 'host index')
  if ARGV[r] == 'c' then
    tally(i, ARGV[r + 2], int_arg(ARGV[r + 3], 'n'))
  else
    local path, query = ARGV[r + 2], ARGV[r + 3]
    local held = redis.call('HGET', KEYS[2 * i + 1], path) or ''
    if holds(held, query) then
      verdicts[#verdicts + 1] = 1
    elseif limit == 0 or #held < 4 * limit then
      redis.call('HSET', KEYS[2 * i + 1], path, held .. query)
      verdicts[#verdicts + 1] = 1
    else
      tally(i, 'trap_variants', 1)
      verdicts[#verdicts + 1] = 0
    end
  end
end
once_keep(ops, op, verdicts, calls)
return verdicts
