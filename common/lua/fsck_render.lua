-- fsck_render.lua: set a partition's render lane right (`crawlq fsck --repair`,
-- console/fsck_render.py; lib/render.lua): each host given is in `r:due` exactly when its
-- render queue holds entries (added at now), and with `total` given, `r:pending` becomes
-- that total plus the entries of the hosts given (the caller's count of every other
-- host's: its hosts come in pages, the last page carries the sum of the others).
--
-- KEYS[1] r:due      ZSET  host -> when lease_render.lua looks at its render queue (ms)
-- KEYS[2] r:pending  STRING render entries pending
-- KEYS[3..] per host h (ARGV order): rq:<h> LIST
-- ARGV[1]  total: the render entries of the hosts not given, -1 to leave r:pending
-- ARGV[2]  H, the number of hosts; ARGV[3..2+H] the hosts
-- Returns {due_added, due_removed, pending_before, pending_after}
--- @include "lib/codes"
--- @include "lib/queues"

local total = int_arg(ARGV[1], 'total')
local hosts, nhosts = argv_hosts(2)
if #KEYS ~= 2 + nhosts then error('crawlq: fsck_render needs one render queue per host') end
local now = now_ms()
local added, removed, held = 0, 0, 0
for i, host in ipairs(hosts) do
  local n = redis.call('LLEN', KEYS[2 + i])
  held = held + n
  local placed = redis.call('ZSCORE', KEYS[1], host)
  if n > 0 and not placed then
    redis.call('ZADD', KEYS[1], now, host)
    added = added + 1
  elseif n == 0 and placed then
    redis.call('ZREM', KEYS[1], host)
    removed = removed + 1
  end
end
local before = tonumber(redis.call('GET', KEYS[2]) or '0')
local after = before
if total >= 0 then
  after = total + held
  redis.call('SET', KEYS[2], after)
end
return {added, removed, before, after}
