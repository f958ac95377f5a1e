-- fingerprints.lua: add a page's fingerprint to its host's newest ones and return those
-- held before it (common/trapbook.py compares them): one round trip a page, and the
-- host's list stays bounded, the oldest entries dropped first. A page found to be a near
-- duplicate is added too, so a fingerprint that keeps matching (a trap's template) stays
-- among the newest.
--
-- KEYS[1]  fp:<host>  STRING  entries of 12 bytes, oldest first
-- ARGV[1]  the entry: 8 bytes of SimHash, 4 bytes of the URL's fingerprint
-- ARGV[2]  the most bytes kept (a whole number of entries)
-- Returns the entries held before this one ('' for none)
--- @include "lib/codes"

local held = redis.call('GET', KEYS[1]) or ''
local keep = int_arg(ARGV[2], 'keep')
local now = held .. ARGV[1]
if #now > keep then now = string.sub(now, #now - keep + 1) end
redis.call('SET', KEYS[1], now)
return held
