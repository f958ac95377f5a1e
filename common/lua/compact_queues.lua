-- compact_queues.lua: convert part of one host's queues from layout 3 (full entries) to
-- layout 4 (compact: lib/queues.lua entry_compact), a chunk per call so a big queue never
-- blocks Redis for long (common/queue/migrate.py calls it until a host is done, then
-- marks the crawl).
--
-- The LIST is rotated: its first `count` entries are popped and pushed back at its tail
-- compacted, so after calls whose counts sum to its length it holds every entry once,
-- compact, in its order. The ZSET is walked by ZSCAN: each full entry a page returns is
-- replaced by its compact form at the same score. Nobody leases while a crawl converts,
-- and compacting an entry twice leaves it as it is, so a run cut short is redone (only
-- its LIST's head rotated: FIFO order is not a promise).
--
-- KEYS[1]  hq:<host>  LIST  the host's priority-0 entries
-- KEYS[2]  hp:<host>  ZSET  the host's priority entries, score -priority
-- ARGV[1]  the host (its key: the compact form leaves out its scheme and authority)
-- ARGV[2]  count: how many LIST entries to rotate (>= 0)
-- ARGV[3]  the ZSET's ZSCAN cursor ('-' when its walk is done or not wanted)
-- ARGV[4]  the ZSCAN COUNT hint (>= 1)
-- Returns {LIST entries rotated, the next ZSET cursor ('-' when done), ZSET entries
--          compacted}
--- @include "lib/codes"
--- @include "lib/queues"

if #KEYS ~= 2 or #ARGV ~= 4 then
  error('crawlq: compact_queues needs hq, hp and host, count, cursor, scan count')
end
local hq, hp, host = KEYS[1], KEYS[2], ARGV[1]
local count, cursor, scan = int_arg(ARGV[2], 'count'), ARGV[3], int_arg(ARGV[4], 'scan count')
if count < 0 or scan < 1 then error('crawlq: compact_queues needs count >= 0, scan count >= 1') end

local rotated = 0
if count > 0 then
  local popped = redis.call('LPOP', hq, count) or {}
  for i, e in ipairs(popped) do popped[i] = entry_compact(host, e) end
  rotated = #popped
  if rotated > 0 then call_sliced('RPUSH', hq, popped, 1000) end
end

local compacted, next_cursor = 0, '-'
if cursor ~= '-' then
  local page = redis.call('ZSCAN', hp, cursor, 'COUNT', scan)
  for k = 1, #page[2], 2 do
    local e = page[2][k]
    local c = entry_compact(host, e)
    if c ~= e then
      redis.call('ZREM', hp, e)
      redis.call('ZADD', hp, page[2][k + 1], c)
      compacted = compacted + 1
    end
  end
  if page[1] ~= '0' then next_cursor = page[1] end
end
return {rotated, next_cursor, compacted}
