-- fingerprints.lua: add the fingerprints of the pages one consumer's flush fetched to
-- their hosts' newest ones (one partition's hosts in one call) and return, per host, those
-- held before them (common/trapbook.py compares them, and each page with the ones before
-- it in the call). Each host's list stays bounded, the oldest entries dropped first. A page
-- found to be a near duplicate is added too, so a fingerprint that keeps matching (a
-- trap's template) stays among the newest.
--
-- KEYS[i]  nd:<host i>  STRING  entries of 24 bytes, oldest first
-- ARGV[1]  the most bytes kept per host (a whole number of entries)
-- ARGV[1+i]  host i's new entries, in order: 8 bytes of its text's SimHash, 8 of its
--   links', 4 bytes of the URL's fingerprint and 4 of its shape (common/urlshape.py) each
-- Returns one string per host: the entries held before these ('' for none)
--- @include "lib/codes"

local keep = int_arg(ARGV[1], 'keep')
if #ARGV ~= 1 + #KEYS then error('crawlq: fingerprints needs one ARGV of entries per key') end
local out = {}
for i = 1, #KEYS do
  local held = redis.call('GET', KEYS[i]) or ''
  local now = held .. ARGV[1 + i]
  if #now > keep then now = string.sub(now, #now - keep + 1) end
  redis.call('SET', KEYS[i], now)
  out[i] = held
end
return out
