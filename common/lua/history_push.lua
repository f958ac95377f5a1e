-- history_push.lua: one snapshot of a crawl's summed counters (common/history.py).
--
-- The snapshot's time is Redis TIME, so every consumer of the fleet stamps it on one
-- clock, and a snapshot less than `min_gap_ms` after the newest is skipped, so the list
-- covers the same span however many consumers write it.
--
-- KEYS[1]  history  LIST  newest first, JSON {"t": unix s, "<counter>": n, ...}
-- ARGV[1] counters: a JSON object of numbers, without "t"
-- ARGV[2] min_gap_ms   ARGV[3] length kept (LTRIM)
-- Returns 1 if pushed, 0 if skipped.
--- @include "lib/codes"

local history = KEYS[1]
local now_s = now_ms() / 1000
local head = redis.call('LINDEX', history, 0)
if head then
  local ok, snap = pcall(cjson.decode, head)
  if ok and type(snap) == 'table' and tonumber(snap.t)
      and (now_s - tonumber(snap.t)) * 1000 < tonumber(ARGV[2]) then
    return 0
  end
end
local stamp = string.format('{"t":%.3f', now_s)
local body = ARGV[1]:match('^%s*{%s*(.-)%s*}%s*$') or ''
redis.call('LPUSH', history, body == '' and (stamp .. '}') or (stamp .. ',' .. body .. '}'))
redis.call('LTRIM', history, 0, tonumber(ARGV[3]) - 1)
return 1
