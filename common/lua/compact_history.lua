-- compact_history.lua: convert part of one partition's history records from layout 3
-- (text records in one `rv:hist` HASH, 32-hex-digit ids) to layout 4 (binary records in
-- rv:hist:<bucket> HASHes under the id's 16 bytes: lib/revisits.lua record_encode), a
-- chunk of ids per call (common/queue/migrate.py reads them from the old HASH by HSCAN).
--
-- Each id given is converted and its old field deleted: an id whose old field is gone
-- (converted already) is skipped, so a run cut short is redone. A malformed old record
-- is dropped (every script read it as none). The partition's `conf` rv_urls counts the
-- records written.
--
-- KEYS[1]  rv:hist  HASH  layout 3's: id -> "<host> <prio> <interval_s> <fetched_s>
--                         <digest|-> [~<n>,<x>,<t>[,<e>]] <#etag> <#lm> <etag><lm><entry>"
-- KEYS[2]  conf     HASH  rv_urls (the partition's history records)
-- KEYS[3..] per id i (ARGV order): its rv:hist:<bucket> HASH
-- ARGV[1..] ids (32 hex digits)
-- Returns {records converted, malformed ones dropped}
--- @include "lib/revisits"

if #KEYS ~= 2 + #ARGV then error('crawlq: compact_history needs one rv:hist key per id') end
local old, conf = KEYS[1], KEYS[2]

-- A layout-3 record as lib/revisits.lua's record_decode read it (nil if malformed); its
-- `entry` the task's full entry without `v`.
local function text_decode(value)
  local host, prio, iv, at, digest, sums, ne, nl, rest = string.match(value,
    '^(%S+) (%d+) (%d+) (%d+) (%S+) ~([%d.,]+) (%d+) (%d+) (.*)$')
  local n, x, t, e
  if host then
    n, x, t, e = string.match(sums, '^([%d.]+),([%d.]+),([%d.]+),?([%d.]*)$')
    if not n then return nil end
  else
    host, prio, iv, at, digest, ne, nl, rest = string.match(value,
      '^(%S+) (%d+) (%d+) (%d+) (%S+) (%d+) (%d+) (.*)$')
    if not host then return nil end
  end
  ne, nl = tonumber(ne), tonumber(nl)
  local entry = string.sub(rest, ne + nl + 1)
  return {host = host, prio = tonumber(prio), interval = tonumber(iv), fetched = tonumber(at),
          digest = digest == '-' and '' or digest, etag = string.sub(rest, 1, ne),
          lm = string.sub(rest, ne + 1, ne + nl),
          tail = entry == '' and '' or entry_tail(host, entry),
          n = tonumber(n) or 0, x = tonumber(x) or 0, t = tonumber(t) or 0, e = tonumber(e)}
end

local converted, dropped, added = 0, 0, 0
for i, id in ipairs(ARGV) do
  local value = redis.call('HGET', old, id)
  if value then
    local r = string.find(id, HEX_ID) and text_decode(value)
    if r then
      added = added + redis.call('HSET', KEYS[2 + i], record_field(id), record_encode(r))
      converted = converted + 1
    else
      dropped = dropped + 1
    end
    redis.call('HDEL', old, id)
  end
end
if added > 0 then redis.call('HINCRBY', conf, 'rv_urls', added) end
return {converted, dropped}
