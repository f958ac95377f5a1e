-- lib/revisits.lua: the revisit schedule (issue 26): each done URL's history record in
-- `rv:hist` and its next visit in `rv:due` (common/keys.py), the interval each visit
-- learns, and the entry a due URL goes back to its host's queue with.
-- Includes lib/codes (call_sliced).
--- @include "lib/codes"

-- Validators longer than this are not kept (common/revisit.py).
local MAX_VALIDATOR = 256
-- Lateness buckets (s, upper bounds) of promoted revisits: stats field rv_late:<bound>;
-- a revisit later than the last is counted in rv_late:inf.
local LATE_BOUNDS = {1, 10, 60, 600, 3600, 21600, 86400}

-- The crawl's revisit settings from its `conf` key (policy_apply.lua), or nil when revisits are off:
-- mode 1 fixed, 2 adaptive; intervals in s; grow and shrink in thousandths.
local function revisit_conf(conf)
  local c = redis.call('HMGET', conf, 'rv', 'rv_first', 'rv_min', 'rv_max', 'rv_grow',
                       'rv_shrink')
  local mode = tonumber(c[1]) or 0
  if mode == 0 then return nil end
  return {mode = mode, first = tonumber(c[2]) or 0, min = tonumber(c[3]) or 60,
          max = tonumber(c[4]) or 7776000, grow = tonumber(c[5]) or 0,
          shrink = tonumber(c[6]) or 0}
end

-- A history record "<host> <prio> <interval_s> <fetched_s> <digest|-> <#etag> <#lm>
-- <etag><lm><entry>" as a table (nil if malformed). `entry` is the task's entry without
-- its `v` field.
local function record_decode(value)
  if not value then return nil end
  local host, prio, iv, at, digest, ne, nl, rest = string.match(value,
    '^(%S+) (%d+) (%d+) (%d+) (%S+) (%d+) (%d+) (.*)$')
  if not host then return nil end
  ne, nl = tonumber(ne), tonumber(nl)
  return {host = host, prio = tonumber(prio), interval = tonumber(iv), fetched = tonumber(at),
          digest = digest == '-' and '' or digest, etag = string.sub(rest, 1, ne),
          lm = string.sub(rest, ne + 1, ne + nl), entry = string.sub(rest, ne + nl + 1)}
end

local function record_encode(r)
  return r.host .. ' ' .. r.prio .. ' ' .. r.interval .. ' ' .. r.fetched .. ' '
    .. (r.digest == '' and '-' or r.digest) .. ' ' .. #r.etag .. ' ' .. #r.lm .. ' '
    .. r.etag .. r.lm .. r.entry
end

-- What one fetch observed (ack's per-item ARGV, common/schedule.py):
-- "<max_age_s> <digest|-> <#etag> <#lm> <etag><lm>".
local function observed_decode(value)
  local age, digest, ne, nl, rest = string.match(value or '', '^(-?%d+) (%S+) (%d+) (%d+) (.*)$')
  if not age then error('crawlq: ack observed must be "<max_age> <digest> <#etag> <#lm> ..."') end
  ne, nl = tonumber(ne), tonumber(nl)
  return {max_age = tonumber(age), digest = digest == '-' and '' or digest,
          etag = string.sub(rest, 1, ne), lm = string.sub(rest, ne + 1, ne + nl)}
end

-- The interval (s) until a URL's next visit. Fixed: the first interval, always (min and
-- max bound what adaptive learns, not what an operator fixed). Adaptive (Nutch's
-- AdaptiveFetchSchedule): the last interval x (1 + grow) when the visit found the page
-- as it was (a 304 or the same digest), x (1 - shrink) when it changed, as it was
-- otherwise; a declared freshness lifetime (max-age / Expires) longer than that raises
-- it (a visit before then gets the same copy). Clamped to [min, max].
local function next_interval(c, prev, outcome, max_age)
  local iv = c.first > 0 and c.first or c.min  -- recrawl_after 0: min_interval
  if c.mode ~= 2 then return math.max(iv, 1) end
  if prev then
    iv = prev.interval
    if outcome == 'not_modified' or outcome == 'unchanged' then
      iv = iv * (1000 + c.grow) / 1000
    elseif outcome == 'changed' then
      iv = iv * (1000 - c.shrink) / 1000
    end
  end
  if max_age > iv then iv = max_age end
  iv = math.floor(iv + 0.5)
  return math.max(c.min, math.min(c.max, iv), 1)
end

local function kept(value, old, keep_old)
  if value == '' and keep_old then return old end
  if #value > MAX_VALIDATOR then return '' end
  return value
end

-- Writes the history record and the next visit of each done URL. `visits` holds
-- {id, host, prio, entry, outcome, observed}; `now` ms of Redis TIME. A 304 keeps the
-- stored validators and digest its response did not carry.
local function schedule_visits(hist, due, visits, c, now)
  local ids = {}
  for i, v in ipairs(visits) do ids[i] = v[1] end
  local prev = call_sliced('HMGET', hist, ids, 1000)
  local fields, scores = {}, {}
  local now_s = math.floor(now / 1000)
  for i, v in ipairs(visits) do
    local p = record_decode(prev[i])
    local o = observed_decode(v[6])
    local iv = next_interval(c, p, v[5], o.max_age)
    local keep = p and v[5] == 'not_modified'
    local r = {host = v[2], prio = v[3], interval = iv, fetched = now_s,
               digest = kept(o.digest, p and p.digest, keep),
               etag = kept(o.etag, p and p.etag, keep), lm = kept(o.lm, p and p.lm, keep),
               entry = p and p.entry or v[4]}
    fields[#fields + 1] = v[1]
    fields[#fields + 1] = record_encode(r)
    scores[#scores + 1] = now + iv * 1000
    scores[#scores + 1] = v[1]
  end
  call_sliced('HSET', hist, fields, 1000)
  call_sliced('ZADD', due, scores, 1000)
end

-- A JSON string (validators are header values: printable, but may hold '"' or '\').
local function json_string(s)
  return '"' .. string.gsub(s, '[%c"\\]', function(ch)
    return string.format('\\u%04x', string.byte(ch))
  end) .. '"'
end

-- The entry a due URL goes back to its host's queue with: its own entry with `v`, the
-- previous visit (common/revisit.py), appended as the last field.
local function revisit_entry(r)
  local v = '"v":[' .. json_string(r.etag) .. ',' .. json_string(r.lm) .. ','
    .. json_string(r.digest) .. ',' .. r.fetched .. ',' .. r.interval .. ']'
  local head, json = string.match(r.entry, '^(%S+) {(.*)}$')
  if head then return head .. ' {' .. json .. ',' .. v .. '}' end
  return r.entry .. ' {' .. v .. '}'
end

-- Counts a revisit `late_ms` after its due time in its lateness bucket.
local function late_bucket(late_ms)
  for _, bound in ipairs(LATE_BOUNDS) do
    if late_ms <= bound * 1000 then return 'rv_late:' .. bound end
  end
  return 'rv_late:inf'
end
