-- host_set.lua: change one host's settings while the crawl runs (`crawlq hosts set`,
-- `crawlq hosts block`, a robots.txt Crawl-delay), and move its turn to match.
--
-- Its next turn is recomputed at once: last request + its new delay, or the block's end,
-- so a change takes effect on the fleet's next lease. A budget raised past the pages
-- used puts a host whose budget was spent back in `due`: its parked tasks are served.
-- Pages used are kept across budget changes (lowering a budget below them parks the host).
--
-- KEYS[1..4] host state: hosts, due, h:queued, conf (lib/hosts.lua)
-- KEYS[5]  h:delay    ZSET  host -> its delay when not the default (ms)
-- KEYS[6]  h:blocked  ZSET  host -> blocked until (ms)
-- KEYS[7]  h:budget   ZSET  host -> its page budget (hosts with one)
-- ARGV[1]  host
-- ARGV[2..] pairs: setting, value. Settings: delay (ms), concurrency, budget (pages),
--           robots_delay (ms) -- value -1 clears it (back to the default); block (ms from
--           now; 0 unblocks)
-- Returns the host's settings after the change: "delay,conc,budget,used,blocked,robots,reserved"
--- @include "lib/codes"
--- @include "lib/hosts"
--- @include "lib/backoff"

local delays, blocked, budgets = KEYS[5], KEYS[6], KEYS[7]
local host = ARGV[1]
if not host or host == '' or string.find(host, '%s') then error('crawlq: host_set needs a host') end
if #ARGV % 2 ~= 1 then error('crawlq: host_set needs (setting, value) pairs') end
local now = now_ms()
local L = ledger(host_keys(1), now)
local c = ledger_get(L, host)
local fields = {delay = 'delay', concurrency = 'conc', budget = 'budget', robots_delay = 'robots'}
for i = 2, #ARGV, 2 do
  local name, value = ARGV[i], int_arg(ARGV[i + 1], ARGV[i])
  if name == 'block' then
    if value < 0 then error('crawlq: block must be >= 0 ms') end
    block_host(L, blocked, host, value > 0 and now + value or 0, true)
  elseif fields[name] then
    if value < -1 then error('crawlq: ' .. name .. ' must be >= 0, or -1 to clear it') end
    c[fields[name]] = value >= 0 and value or nil
  else
    error('crawlq: unknown host setting ' .. name)
  end
end
ledger_touch(L, host)
local own = c.delay
if c.robots and (not own or c.robots > own) then own = c.robots end
if own then redis.call('ZADD', delays, own, host) else redis.call('ZREM', delays, host) end
if c.blocked <= now then redis.call('ZREM', blocked, host) end
if c.budget then redis.call('ZADD', budgets, c.budget, host) else redis.call('ZREM', budgets, host) end
ledger_flush(L)
local function s(v) return v and string.format('%d', v) or '' end
return s(c.delay) .. ',' .. s(c.conc) .. ',' .. s(c.budget) .. ',' .. s(c.used) .. ','
  .. s(c.blocked) .. ',' .. s(c.robots) .. ',' .. s(c.reserved)
