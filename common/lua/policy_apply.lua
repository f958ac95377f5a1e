-- policy_apply.lua: give one partition its crawl's politeness (common/frontier/policy.py): the
-- policy's default delay and concurrency (and its adaptive delay) into `conf`, with the
-- policy version they come
-- from, and every host's place in `due` written again under them (the due rule,
-- lib/hosts.lua: max(last request + its delay, blocked until)), so a lower delay moves
-- scheduled turns earlier and a higher one later, and a higher concurrency gives a host
-- whose slots were all taken its turn. A version older than the one `conf`
-- holds is refused, so a slower writer never undoes a newer policy.
--
-- Hosts are refreshed a slice at a time: HSCAN of `hosts` from a cursor, the caller calling
-- again with the cursor returned until it is 0 (every host for the whole scan is seen at
-- least once).
--
-- KEYS[1..4] host state: hosts, due, h:queued, conf (lib/hosts.lua)
-- KEYS[5..7] group state: g:of, groups, g:parked (lib/groups.lua)
-- ARGV[1] version  ARGV[2] delay_ms  ARGV[3] concurrency (0 = no limit)
-- ARGV[4] cursor (0 to start)  ARGV[5] count: hosts a slice
-- ARGV[6] adapt: the policy's adaptive_delay in thousandths (0 = off)
-- ARGV[7] max_delay_ms: the longest delay adaptive_delay gives
-- ARGV[8] revisit: 0 off, 1 fixed, 2 adaptive (the revisit schedule: ack.lua, revisit.lua)
-- ARGV[9] first interval, s (recrawl_after)  ARGV[10] min interval, s
-- ARGV[11] max interval, s  ARGV[12] grow, thousandths  ARGV[13] shrink, thousandths
-- ARGV[14] gkey: the politeness_key when not host ('' = host: no politeness groups;
--          the first slice then brings every parked host back, lib/groups.lua)
-- ARGV[15] gdelay_ms: the groups' delay  ARGV[16] gconc: their concurrency (0 = no limit)
-- ARGV[17] conditional: 1 = recrawls ask with their URL's validators, kept for them (a
--          recrawl window's too: ack.lua, enqueue.lua), 0 = off
-- Returns {applied, cursor}: applied 1, or 0 when `conf` holds a newer version (nothing
--   written); cursor 0 once every host was refreshed
--- @include "lib/codes"
--- @include "lib/hosts"
--- @include "lib/groups"

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
local gkey = ARGV[14]
local gdelay = int_arg(ARGV[15], 'gdelay_ms')
local gconc = int_arg(ARGV[16], 'gconc')
local conditional = int_arg(ARGV[17], 'conditional')
local K = host_keys(1)
local held = tonumber(redis.call('HGET', K.conf, 'policy_version')) or 0
if held > version then return {0, '0'} end
redis.call('HSET', K.conf, 'delay', delay, 'concurrency', conc, 'policy_version', version,
           'adapt', adapt, 'max_delay', max_delay, 'gkey', gkey, 'gdelay', gdelay,
           'gconc', gconc, 'rv_cond', conditional, unpack(revisit))
local GK = group_keys(5)
if gkey == '' and cursor == '0' then redis.call('DEL', GK.parked) end
local L = ledger(K, now_ms())
ledger_groups(L, GK)
local scan = redis.call('HSCAN', K.hosts, cursor, 'COUNT', count)
local hosts = {}
for i = 1, #scan[2], 2 do hosts[#hosts + 1] = scan[2][i] end
ledger_load(L, hosts)
for _, host in ipairs(hosts) do ledger_reschedule(L, host) end
ledger_flush(L)
return {1, scan[1]}
