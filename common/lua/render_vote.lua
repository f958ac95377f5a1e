-- render_vote.lua: one probe's verdict on a (host, route) of a crawl whose policy says
-- rendering=auto (docs/rendering.md#render-only-where-needed): whether the page fetched over
-- HTTP gave its route the same items and links as the page rendered.
--
-- A pair's field in the crawl's `render:modes` HASH holds "p<probes>,<same>" while it is
-- probed, then its decision: "h" (HTTP gives the same: its pages are fetched over HTTP)
-- or "r" (they must be rendered); "H" and "R" are an operator's (crawlq render set),
-- which no probe changes. A probe that differs decides "r" at once; `probes` that agree
-- decide "h". A vote on a decided pair changes nothing.
--
-- KEYS[1] render:modes HASH "<host> <route label>" -> mode
-- ARGV[1] the pair's field
-- ARGV[2] same: 1 when the probe's two fetches gave the same, else 0
-- ARGV[3] probes: how many agreeing probes decide "h"
-- Returns {mode}: the pair's mode after the vote
--- @include "lib/codes"

local field = ARGV[1]
local same = int_arg(ARGV[2], 'same')
local probes = int_arg(ARGV[3], 'probes')
local mode = redis.call('HGET', KEYS[1], field)
if mode and string.sub(mode, 1, 1) ~= 'p' then return {mode} end
local seen, agreed = 0, 0
if mode then
  seen, agreed = string.match(mode, '^p(%d+),(%d+)$')
  seen, agreed = tonumber(seen) or 0, tonumber(agreed) or 0
end
seen, agreed = seen + 1, agreed + same
if same == 0 then
  mode = 'r'
elseif agreed >= probes then
  mode = 'h'
else
  mode = 'p' .. seen .. ',' .. agreed
end
redis.call('HSET', KEYS[1], field, mode)
return {mode}
