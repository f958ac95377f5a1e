-- fingerprints.lua: add the fingerprints of the pages one consumer's flush fetched to
-- their hosts' newest ones (one partition's hosts in one call) and return, per host, those
-- held before them (common/trapbook.py compares them, and each page with the ones before
-- it in the call). Each host's list stays bounded, the oldest entries dropped first. A page
-- found to be a near duplicate is added too, so a fingerprint that keeps matching (a
-- trap's template) stays among the newest. A call sent again (the same operation id:
-- lib/once.lua) adds nothing, and answers what each host holds without the call's own
-- entries: its pages are judged against their host's others, never against each other
-- out of order.
--
-- KEYS[i]  nd:<host i>  STRING  entries of 24 bytes, oldest first (i = 1..H)
-- KEYS[H+1]  ops:<worker>  STRING  the worker's last calls (lib/once.lua)
-- ARGV[1]  the most bytes kept per host (a whole number of entries)
-- ARGV[1+i]  host i's new entries, in order: 8 bytes of its text's SimHash, 8 of its
--   links', 4 bytes of the URL's fingerprint and 4 of its shape (common/urlshape.py) each
-- ARGV[H+2]  the call's operation id (16 hex digits)
-- Returns one string per host: the entries held before these ('' for none)
--- @include "lib/codes"
--- @include "lib/once"

local keep = int_arg(ARGV[1], 'keep')
if #ARGV ~= 1 + #KEYS then error('crawlq: fingerprints needs one ARGV of entries per key') end
local ops, op = KEYS[#KEYS], ARGV[#ARGV]

-- `held` without the last aligned copy of each of `mine`'s entries (24 bytes each).
local SIZE = 24
local function without(held, mine)
  for at = #mine - SIZE + 1, 1, -SIZE do
    local entry, last, from = string.sub(mine, at, at + SIZE - 1), nil, 1
    while true do
      local found = string.find(held, entry, from, true)
      if not found then break end
      if (found - 1) % SIZE == 0 then last = found end
      from = found + 1
    end
    if last then held = string.sub(held, 1, last - 1) .. string.sub(held, last + SIZE) end
  end
  return held
end

local replay, calls = once_kept(ops, op)
local out = {}
for i = 1, #KEYS - 1 do
  local held = redis.call('GET', KEYS[i]) or ''
  if replay then
    out[i] = without(held, ARGV[1 + i])
  else
    local now = held .. ARGV[1 + i]
    if #now > keep then now = string.sub(now, #now - keep + 1) end
    redis.call('SET', KEYS[i], now)
    out[i] = held
  end
end
if not replay then once_keep(ops, op, true, calls) end
return out
