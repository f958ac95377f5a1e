-- fsck_revisits.lua: set the revisit schedule of some ids right (`crawlq fsck --repair`,
-- console/fsck_revisits.py).
--
-- The rule (docs/frontier.md, Revisits): an id in `rv:due` has a history record and is in
-- no other state; a history record is in `rv:due` unless its URL is being revisited
-- (pending in its host's queue, leased, waiting or dead: that visit's ack writes its next
-- one) or it is a recrawl window's (interval 0: validators alone, never scheduled). For
-- each id given, checked here again so a call is atomic and safe on a running
-- crawl: one scheduled with no history, or while its URL is active, leaves `rv:due`; a
-- history neither scheduled nor active is scheduled at its last visit + its interval
-- (due at once if that has passed). Reads each host queue it is given (O(its length)).
--
-- KEYS[1]  rv:due   ZSET  id -> next visit (ms)
-- KEYS[2]  leased   HASH  id -> lease record: only read
-- KEYS[3]  delayed  ZSET  only read
-- KEYS[4]  dead     ZSET  only read
-- KEYS[5..] per id i (ARGV order): its rv:hist:<bucket> HASH (id's 16 bytes -> history
--          record, lib/revisits.lua), hq:<h> LIST, hp:<h> ZSET of its host (its record's)
-- ARGV[1..] ids
-- Returns {removed from rv:due, added to rv:due}
--- @include "lib/queues"
--- @include "lib/revisits"

if #KEYS ~= 4 + 3 * #ARGV then error('crawlq: fsck_revisits needs 3 keys per id') end
local due, leased, delayed, dead = KEYS[1], KEYS[2], KEYS[3], KEYS[4]

local removed, added = 0, 0
for i = 1, #ARGV do
  local id = ARGV[i]
  local at = 2 + 3 * i  -- its keys: KEYS[at..at + 2]
  local record = record_decode(redis.call('HGET', KEYS[at], record_field(id)))
  local active = redis.call('HEXISTS', leased, id) == 1 or redis.call('ZSCORE', delayed, id)
    or redis.call('ZSCORE', dead, id) or in_queues(id, KEYS[at + 1], KEYS[at + 2])
  local scheduled = redis.call('ZSCORE', due, id)
  if scheduled and (not record or active) then
    removed = removed + redis.call('ZREM', due, id)
  elseif record and not scheduled and not active and record.interval > 0 then
    added = added + redis.call('ZADD', due, (record.fetched + record.interval) * 1000, id)
  end
end
return {removed, added}
