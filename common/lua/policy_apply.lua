-- policy_apply.lua: give one partition its crawl's politeness (common/frontier/policy.py): the
-- policy's default delay and concurrency (and its adaptive delay) into `conf`, with the
-- policy version they come
-- from, and every host waiting in `due` moved to its turn under them (refresh_hosts,
-- lib/hosts.lua: max(last request + its delay, blocked until)), so a lower delay moves
-- scheduled turns earlier and a higher one later. A version older than the one `conf`
-- holds is refused, so a slower writer never undoes a newer policy.
--
-- Hosts are refreshed a slice at a time: ZSCAN of `due` from a cursor, the caller calling
-- again with the cursor returned until it is 0 (every host in `due` for the whole scan is
-- seen at least once). The first call (cursor 0) also refreshes the hosts with requests
-- in flight, which a higher concurrency may give a free slot.
--
-- KEYS[1..6] host state: due, h:queued, h:inflight, h:last, hostconf, conf (lib/hosts.lua)
-- ARGV[1] version  ARGV[2] delay_ms  ARGV[3] concurrency (0 = no limit)
-- ARGV[4] cursor (0 to start)  ARGV[5] count: hosts a slice
-- ARGV[6] adapt: the policy's adaptive_delay in thousandths (0 = off)
-- ARGV[7] max_delay_ms: the longest delay adaptive_delay gives
-- ARGV[8] revisit: 0 off, 1 fixed, 2 adaptive (the revisit schedule: ack.lua, revisit.lua)
-- ARGV[9] first interval, s (recrawl_after)  ARGV[10] min interval, s
-- ARGV[11] max interval, s  ARGV[12] grow, thousandths  ARGV[13] shrink, thousandths
-- Returns {applied, cursor}: applied 1, or 0 when `conf` holds a newer version (nothing
--   written); cursor 0 once every host was refreshed
--- @include "lib/codes"
--- @include "lib/hosts"

local version = int_arg(ARGV[1], 'version')
local delay = int_arg(ARGV[2], 'delay_ms')
local conc = int_arg(ARGV[3], 'concurrency')
local cursor = ARGV[4]
local count = int_arg(ARGV[5], 'count')
local adapt = int_arg(ARGV[6], 'adapt')
local max_delay = int_arg(ARGV[7], 'max_delay_ms')
local revisit = {'rv', int_arg(ARGV[8], 'revisit'), 'rv_first', int_arg(ARGV[9], 'first interval'),
                 'rv_min', int_arg(ARGV[10], 'min interval'),
                 'rv_max', int_arg(ARGV[11], 'max interval'),
                 'rv_grow', int_arg(ARGV[12], 'grow'), 'rv_shrink', int_arg(ARGV[13], 'shrink')}
for i = 2, #revisit, 2 do
  if revisit[i] < 0 then error('crawlq: policy_apply needs revisit values >= 0') end
end
local held = tonumber(redis.call('HGET', H.conf, 'policy_version')) or 0
if held > version then return {0, '0'} end
redis.call('HSET', H.conf, 'delay', delay, 'concurrency', conc, 'policy_version', version,
           'adapt', adapt, 'max_delay', max_delay, unpack(revisit))
local hosts = {}
if cursor == '0' then hosts = redis.call('ZRANGEBYSCORE', H.inflight, 1, '+inf') end
local scan = redis.call('ZSCAN', H.due, cursor, 'COUNT', count)
for i = 1, #scan[2], 2 do hosts[#hosts + 1] = scan[2][i] end
refresh_hosts(hosts)
return {1, scan[1]}
