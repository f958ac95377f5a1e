-- lib/revisits.lua: the revisit schedule (issue 26): each done URL's history record in
-- `rv:hist` and its next visit in `rv:due` (common/keys.py), the interval each visit
-- learns, and the entry a due URL goes back to its host's queue with; with revisits off,
-- a recrawl window's records alone (keep_visits: validators for its conditional recrawls,
-- and the entry a recrawl of the known URLs brings it back with past its window).
-- Includes lib/codes (call_sliced, bin_id) and lib/queues (entry_compact, entry_expand).
--- @include "lib/codes"
--- @include "lib/queues"

-- Validators longer than this are not kept (common/revisit.py).
local MAX_VALIDATOR = 256
-- Lateness buckets (s, upper bounds) of promoted revisits: stats field rv_late:<bound>;
-- a revisit later than the last is counted in rv_late:inf.
local LATE_BOUNDS = {1, 10, 60, 600, 3600, 21600, 86400}
-- learned: each visit's observation weighs this much of the one before (a memory of
-- about 1 / (1 - DECAY) = 10 visits, so a page that starts changing is noticed).
local DECAY = 0.9
-- learned: the price at which a page changing once per first interval is revisited
-- every first interval (1 - 2/e: Cho and Garcia-Molina's optimum at r = 1).
local PRICE_AT_FIRST = 1 - 2 / math.exp(1)

-- The crawl's revisit settings from its `conf` key (policy_apply.lua), or nil when revisits are off:
-- mode 1 fixed, 2 adaptive, 3 learned; intervals in s; grow and shrink in thousandths.
-- `price` (learned: s, ack keeps it in `conf`, see learn_price) and the partition's
-- `demand` (fetches/s its schedule asks for) come along.
local function revisit_conf(conf)
  local c = redis.call('HMGET', conf, 'rv', 'rv_first', 'rv_min', 'rv_max', 'rv_grow',
                       'rv_shrink', 'rv_price', 'rv_demand')
  local mode = tonumber(c[1]) or 0
  if mode == 0 then return nil end
  local r = {mode = mode, first = tonumber(c[2]) or 0, min = tonumber(c[3]) or 60,
             max = tonumber(c[4]) or 7776000, grow = tonumber(c[5]) or 0,
             shrink = tonumber(c[6]) or 0, demand = tonumber(c[8]) or 0, conf = conf}
  local first = r.first > 0 and r.first or r.min
  r.price = tonumber(c[7]) or PRICE_AT_FIRST * first
  return r
end

-- Whether a crawl whose revisits are off keeps its done URLs' validators for their
-- recrawls: a recrawl window (rv_first, recrawl_after > 0) and the policy's
-- `conditional` (rv_cond; absent, as an earlier crawlq's conf has it: its default, on).
local function keeps_validators(conf)
  local c = redis.call('HMGET', conf, 'rv', 'rv_first', 'rv_cond')
  return (tonumber(c[1]) or 0) == 0 and (tonumber(c[2]) or 0) > 0 and c[3] ~= '0'
end

-- A history record (layout 4; common/history_record.py reads it too) is binary:
--   flags (1 byte: 1 the estimator's sums n, x, t; 2 and e; 4 the digest as its 8 bytes
--   (16 hex digits), else as text; 8 Last-Modified as u32 seconds (an IMF-fixdate that
--   prints back the same), else as text; any other bit: malformed)
--   prio, interval_s (varints), fetched_s (u32)
--   [n, x, t[, e]] (varints of thousandths)
--   digest (8 bytes | varint length + text), Last-Modified (u32 | varint length + text)
--   ETag, host (each varint length + bytes; the host '' in a record without entry)
--   the rest: the URL's compact entry without its 16-byte id and `v` (lib/queues.lua
--   entry_compact), `tail` here: what brings the URL back (a revisit, or a recrawl of
--   the known URLs past their window); '' in a record an older crawlq wrote for a
--   recrawl window (it kept neither entry nor host).
-- Unsigned LEB128 varints and little-endian u32s. It lives in the partition's
-- rv:hist:<bucket> HASH under the id's 16 bytes (bucket as the seen mark's).
-- The `~` sums (learned revisits; n = x = t = 0 when absent) are the change-rate
-- estimator's: visits observed n, changes among them x, seconds they covered t, and of
-- those the seconds the page is known to have stayed as it was, e (from Last-Modified;
-- absent when the URL's Last-Modified did not date its changes), each decayed.
local REC_FLAGS = {sums = 1, e = 2, digest = 4, lm = 8, all = 15}
local HEX16 = '^' .. string.rep('[0-9a-f]', 16) .. '$'

local function rec_varint(v)
  if v < 128 then return string.char(v) end  -- most are (1 and 2 bytes without a table)
  if v < 16384 then return string.char(v % 128 + 128, math.floor(v / 128)) end
  local t = {}
  while v >= 128 do
    t[#t + 1] = v % 128 + 128
    v = math.floor(v / 128)
  end
  t[#t + 1] = v
  return string.char(unpack(t))
end

local function rec_u32(v)
  return string.char(v % 256, math.floor(v / 256) % 256, math.floor(v / 65536) % 256,
                     math.floor(v / 16777216) % 256)
end

-- A record being read: its bytes and position; each reader returns nil past its end.
local function rd_varint(rd)
  local v, mul = 0, 1
  while true do
    local b = string.byte(rd.s, rd.i)
    if not b or mul > 2 ^ 49 then return nil end
    rd.i = rd.i + 1
    if b < 128 then return v + b * mul end
    v, mul = v + (b - 128) * mul, mul * 128
  end
end

local function rd_u32(rd)
  local a, b, c, d = string.byte(rd.s, rd.i, rd.i + 3)
  if not d then return nil end
  rd.i = rd.i + 4
  return ((d * 256 + c) * 256 + b) * 256 + a
end

local function rd_bytes(rd, n)
  if not n or rd.i + n - 1 > #rd.s then return nil end
  rd.i = rd.i + n
  return string.sub(rd.s, rd.i - n, rd.i - 1)
end

local function rec_text(s) return rec_varint(#s) .. s end

local MONTHS = {Jan = 1, Feb = 2, Mar = 3, Apr = 4, May = 5, Jun = 6, Jul = 7, Aug = 8,
                Sep = 9, Oct = 10, Nov = 11, Dec = 12}
local MONTH_NAMES = {'Jan', 'Feb', 'Mar', 'Apr', 'May', 'Jun', 'Jul', 'Aug', 'Sep', 'Oct',
                     'Nov', 'Dec'}
local WEEKDAYS = {'Thu', 'Fri', 'Sat', 'Sun', 'Mon', 'Tue', 'Wed'}  -- from 1970-01-01's

-- An HTTP date (RFC 9110's IMF-fixdate, "Sun, 06 Nov 1994 08:49:37 GMT", what servers
-- send) as Unix seconds; nil for anything else (the obsolete forms included).
local function http_seconds(s)
  local d, mon, y, hh, mm, ss = string.match(s or '',
    '^%a%a%a, (%d%d) (%a%a%a) (%d%d%d%d) (%d%d):(%d%d):(%d%d) GMT$')
  local m = MONTHS[mon]
  if not m then return nil end
  y = tonumber(y) - (m <= 2 and 1 or 0)  -- days from the civil date (H. Hinnant's algorithm)
  local era = math.floor(y / 400)
  local yoe = y - era * 400
  local doy = math.floor((153 * (m + (m > 2 and -3 or 9)) + 2) / 5) + tonumber(d) - 1
  local doe = yoe * 365 + math.floor(yoe / 4) - math.floor(yoe / 100) + doy
  local days = era * 146097 + doe - 719468
  return days * 86400 + tonumber(hh) * 3600 + tonumber(mm) * 60 + tonumber(ss)
end

-- Unix seconds `s` (>= 0) as an IMF-fixdate (the civil date from days, same algorithm).
local function http_date(s)
  local days = math.floor(s / 86400)
  local sod = s - days * 86400
  local z = days + 719468
  local era = math.floor(z / 146097)
  local doe = z - era * 146097
  local yoe = math.floor((doe - math.floor(doe / 1460) + math.floor(doe / 36524)
    - math.floor(doe / 146096)) / 365)
  local doy = doe - (365 * yoe + math.floor(yoe / 4) - math.floor(yoe / 100))
  local mp = math.floor((5 * doy + 2) / 153)
  local m = mp < 10 and mp + 3 or mp - 9
  local y = yoe + era * 400 + (m <= 2 and 1 or 0)
  return string.format('%s, %02d %s %04d %02d:%02d:%02d GMT', WEEKDAYS[days % 7 + 1],
    doy - math.floor((153 * mp + 2) / 5) + 1, MONTH_NAMES[m], y, math.floor(sod / 3600),
    math.floor(sod / 60) % 60, sod % 60)
end

-- A history record as a table (nil if malformed): host, prio, interval, fetched, digest,
-- etag, lm, tail, n, x, t, e.
local function record_decode(value)
  if not value or value == '' then return nil end
  local rd = {s = value, i = 2}
  local flags = string.byte(value, 1)
  if flags > REC_FLAGS.all then return nil end
  local r = {prio = rd_varint(rd), interval = rd_varint(rd), fetched = rd_u32(rd),
             n = 0, x = 0, t = 0}
  if flags % 2 == 1 then
    r.n, r.x, r.t = rd_varint(rd), rd_varint(rd), rd_varint(rd)
    if not r.t then return nil end
    r.n, r.x, r.t = r.n / 1000, r.x / 1000, r.t / 1000
    if math.floor(flags / 2) % 2 == 1 then
      r.e = rd_varint(rd)
      if not r.e then return nil end
      r.e = r.e / 1000
    end
  end
  if math.floor(flags / 4) % 2 == 1 then
    local d = rd_bytes(rd, 8)
    r.digest = d and string.format(string.rep('%02x', 8), string.byte(d, 1, 8))
  else
    r.digest = rd_bytes(rd, rd_varint(rd))
  end
  if math.floor(flags / 8) % 2 == 1 then
    local at = rd_u32(rd)
    r.lm = at and http_date(at)
  else
    r.lm = rd_bytes(rd, rd_varint(rd))
  end
  r.etag = rd_bytes(rd, rd_varint(rd))
  r.host = rd_bytes(rd, rd_varint(rd))
  if not (r.prio and r.interval and r.fetched and r.digest and r.lm and r.etag and r.host) then
    return nil
  end
  r.tail = string.sub(value, rd.i)
  return r
end

local function rec_sum(v) return rec_varint(math.floor(v * 1000 + 0.5)) end

local function record_encode(r)
  local flags, sums = 0, ''
  if r.n and r.n > 0 then
    flags = REC_FLAGS.sums
    sums = rec_sum(r.n) .. rec_sum(r.x) .. rec_sum(r.t)
    if r.e then
      flags = flags + REC_FLAGS.e
      sums = sums .. rec_sum(r.e)
    end
  end
  local digest = rec_text(r.digest)
  if string.find(r.digest, HEX16) then
    flags = flags + REC_FLAGS.digest
    digest = string.sub(bin_id(r.digest .. '0000000000000000'), 1, 8)
  end
  local lm = rec_text(r.lm)
  local at = http_seconds(r.lm)
  if at and at >= 0 and at < 4294967296 and http_date(at) == r.lm then
    flags = flags + REC_FLAGS.lm
    lm = rec_u32(at)
  end
  return string.char(flags) .. rec_varint(r.prio) .. rec_varint(r.interval)
    .. rec_u32(r.fetched) .. sums .. digest .. lm .. rec_text(r.etag)
    .. rec_text(r.tail ~= '' and r.host or '') .. r.tail
end

-- A history record's field: the id's 16 bytes (in its rv:hist:<bucket>).
local function record_field(id) return bin_id(id) end

-- A record's tail without the `v` a recrawl's entry carries (revisit_entry put it last:
-- its JSON's only top-level array, so a tail ending in "]}" holds it; "v":[ is never
-- inside a JSON string, whose quotes are escaped): the record keeps the request alone.
local function without_visit(tail)
  if string.sub(tail, -2) ~= ']}' then return tail end
  local at, from = nil, 1
  while true do
    local i = string.find(tail, '"v":[', from, true)
    if not i then break end
    at, from = i, i + 1
  end
  if not at then return tail end
  if string.sub(tail, at - 1, at - 1) == ',' then return string.sub(tail, 1, at - 2) .. '}' end
  if string.sub(tail, at - 2, at - 1) == ' {' then return string.sub(tail, 1, at - 3) end
  return tail
end

-- The record's tail of a task's entry (full, "<32 hex id><url>[ <json>]", as leases hold
-- it; or compact): its compact form without the id and without `v`.
local function entry_tail(host, entry)
  return without_visit(full_tail(host, entry) or string.sub(entry, 17))
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

-- Clocks of a server and of Redis may differ by this much (s): a Last-Modified this much
-- before the previous visit, or after this one, still dates a change between the two.
local CLOCK_SKEW = 60

-- learned: the estimator's sums after a visit `elapsed` s after the last one that found
-- the page as it was (`outcome` not_modified / unchanged) or changed (its response's
-- Last-Modified `lm`, at `now_s`); any other outcome (a first visit, an error) observes
-- nothing. e adds the seconds the page is known to have stayed as it was: all of an
-- unchanged visit's, and of a changed one's those since its Last-Modified; a change that
-- Last-Modified does not date (none, another form, or before the previous visit) drops
-- e: the URL's rate comes from whether its visits found it changed alone.
local function observe_change(prev, outcome, elapsed, lm, now_s)
  if not prev then return 0, 0, 0, 0 end
  local n, x, t, e = prev.n, prev.x, prev.t, prev.e
  if n == 0 then e = 0 end  -- the estimator starts
  local changed = outcome == 'changed'
  if elapsed > 0 and (changed or outcome == 'not_modified' or outcome == 'unchanged') then
    local stayed = elapsed
    if changed then
      local at = http_seconds(lm)
      if at and at >= now_s - elapsed - CLOCK_SKEW and at <= now_s + CLOCK_SKEW then
        stayed = math.max(0, math.min(elapsed, now_s - at))
      else
        stayed = nil
      end
    end
    n, x, t = n * DECAY + 1, x * DECAY + (changed and 1 or 0), t * DECAY + elapsed
    e = e and stayed and e * DECAY + stayed
  end
  return n, x, t, e
end

-- learned: a page's change rate (per s) from x changes seen in n visits covering t s.
-- With e, the seconds it is known to have stayed as it was: a Poisson process's rate is
-- its changes over its time at risk, x / e (each change's Last-Modified ends a stretch
-- of no change; Cho and Garcia-Molina, "Estimating frequency of change", 2003, show what
-- last-modified dates add), here (x + 0.5) / (e + 0.5 min(t / n, first)), a prior of
-- half a change over half a visit (one no longer than the first interval, so a visit
-- after max_interval does not hide what the short ones found), so a page never seen
-- changing gets a rate that falls as its unchanged visits add up, not 0. Without e,
-- their estimator for an incomplete history (a visit sees whether the page changed, not
-- how often), -log((n - x + 0.5) / (n + 0.5)) / (t / n), with n + 1 below instead of
-- n + 0.5, the same prior; it cannot tell a page that changed at every visit from one
-- that changes a hundred times as often.
local function change_rate(n, x, t, e, first)
  if e then return (x + 0.5) / (e + 0.5 * math.min(t / n, first)) end
  return -math.log((n - x + 0.5) / (n + 1)) / (t / n)
end

-- learned: the interval that is Cho and Garcia-Molina's optimum for a page changing
-- `rate` times a s at `price` (the freshness one more fetch a s must buy): r = rate x
-- interval solves 1 - e^-r (1 + r) = price x rate. A page with price x rate >= 1 changes
-- too fast for any affordable visit to keep it fresh: nil (revisited at max_interval).
local function optimal_interval(rate, price)
  local c = price * rate
  if c >= 1 then return nil end
  local lo, hi = 0, 50
  for _ = 1, 48 do
    local mid = (lo + hi) / 2
    if 1 - math.exp(-mid) * (1 + mid) < c then lo = mid else hi = mid end
  end
  return (lo + hi) / 2 / rate
end

-- The interval (s) until a URL's next visit. Fixed: the first interval, always (min and
-- max bound what adaptive learns, not what an operator fixed). Adaptive (Nutch's
-- AdaptiveFetchSchedule): the last interval x (1 + grow) when the visit found the page
-- as it was (a 304 or the same digest), x (1 - shrink) when it changed, as it was
-- otherwise. Learned: the optimal interval (optimal_interval) at the crawl's price for
-- the rate the URL's estimator (`est` = {n, x, t, e}) gives; the first interval until it
-- has observed a visit. A declared freshness lifetime (max-age / Expires) longer than
-- that raises it (a visit before then gets the same copy). Clamped to [min, max].
local function next_interval(c, prev, outcome, max_age, est)
  local iv = c.first > 0 and c.first or c.min  -- recrawl_after 0: min_interval
  if c.mode == 1 then return math.max(iv, 1) end
  if c.mode == 3 then
    if est.n > 0 then
      iv = optimal_interval(change_rate(est.n, est.x, est.t, est.e, iv), c.price) or c.max
    end
  elseif prev and prev.interval > 0 then  -- 0: a recrawl window's record, no interval
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

-- learned: the budget. The crawl spends what a fixed schedule at the first interval
-- would (its URLs / first fetches a s); `demand`, what the partition's intervals ask
-- (sum of 1 / interval, kept in `conf` by each ack), moves the price: up when it asks
-- more, down when less, by the batch's share of the partition's URLs, so a whole round
-- of visits corrects it once. The partition's URLs: its history records (`conf`
-- rv_urls, kept by ack and purge: the records are spread over many small hashes).
local function learn_price(c, visited, demand_change)
  local urls = tonumber(redis.call('HGET', c.conf, 'rv_urls')) or 0
  local demand = math.max(c.demand + demand_change, 0)
  local target = urls / (c.first > 0 and c.first or c.min)
  local price = c.price
  if demand > 0 and target > 0 then
    local step = math.log(demand / target) * math.min(1, visited / urls)
    price = price * math.exp(math.max(-0.5, math.min(0.5, step)))
  end
  redis.call('HSET', c.conf, 'rv_price', price, 'rv_demand', demand)
end

local function kept(value, old, keep_old)
  if value == '' and keep_old then return old end
  if #value > MAX_VALIDATOR then return '' end
  return value
end

-- The history record of visit `v` ({id, host, prio, entry, outcome, observed, key}), its
-- fetch observed as `o`, after record `p` (nil: none), at `now_s`, keeping `tail`: a 304
-- keeps the stored validators and digest its response did not carry.
local function visit_record(p, v, o, now_s, interval, tail, est)
  local keep = p and v[5] == 'not_modified'
  return {host = v[2], prio = v[3], interval = interval, fetched = now_s,
          digest = kept(o.digest, p and p.digest, keep),
          etag = kept(o.etag, p and p.etag, keep), lm = kept(o.lm, p and p.lm, keep),
          tail = tail, n = est.n, x = est.x, t = est.t, e = est.e}
end

-- The records before the visits (decoded; nil: none or malformed); each visit's record
-- field joins it (v[8]).
local function previous_records(visits)
  local prev = {}
  for i, v in ipairs(visits) do
    v[8] = record_field(v[1])
    prev[i] = record_decode(redis.call('HGET', v[7], v[8]))
  end
  return prev
end

-- Writes each visit's record; the partition's count of records (`conf` rv_urls) follows.
local function write_records(conf, visits, records)
  local added = 0
  for i, v in ipairs(visits) do
    added = added + redis.call('HSET', v[7], v[8], record_encode(records[i]))
  end
  if added > 0 then redis.call('HINCRBY', conf, 'rv_urls', added) end
end

-- Writes the history record and the next visit of each done URL. `visits` holds
-- {id, host, prio, entry, outcome, observed, its rv:hist:<bucket> key}; `now` ms of
-- Redis TIME. A 304 keeps the stored validators and digest its response did not carry.
local function schedule_visits(due, visits, c, now)
  local prev = previous_records(visits)
  local records, scores = {}, {}
  local now_s = math.floor(now / 1000)
  local demand_change = 0
  for i, v in ipairs(visits) do
    local p = prev[i]
    local o = observed_decode(v[6])
    local est = {n = 0, x = 0, t = 0}
    if c.mode == 3 then
      -- what the visit covered: since the last one, at least the interval it was due
      -- after (a revisit comes no earlier; one moved up by hand covers that interval)
      est.n, est.x, est.t, est.e = observe_change(
        p, v[5], p and math.max(now_s - p.fetched, p.interval) or 0, o.lm, now_s)
    end
    local iv = next_interval(c, p, v[5], o.max_age, est)
    demand_change = demand_change + 1 / iv - (p and p.interval > 0 and 1 / p.interval or 0)
    -- a record of an older crawlq's recrawl window has no entry: this visit's
    local tail = p and p.tail ~= '' and p.tail or entry_tail(v[2], v[4])
    records[i] = visit_record(p, v, o, now_s, iv, tail, est)
    scores[#scores + 1] = now + iv * 1000
    scores[#scores + 1] = v[1]
  end
  write_records(c.conf, visits, records)
  call_sliced('ZADD', due, scores, 1000)
  if c.mode == 3 then learn_price(c, #visits, demand_change) end
end

-- Writes the history record of each done URL of a crawl that keeps validators with its
-- revisits off (keeps_validators): what its fetch observed, for its recrawl to ask with
-- (enqueue.lua), its host and entry, for the URL to be brought back past its window
-- without a link to it (the producer's recrawl of the known URLs, common/queue/known.py),
-- and no next visit. A new record has interval 0 (never scheduled); one the schedule wrote before revisits were turned off keeps its
-- interval, entry and estimator (the schedule waits, as it was). A recrawl that found its
-- page gone (outcome `gone`: a 404 or 410 to a URL with a record) deletes the record (and
-- any next visit in `due`, rv:due), and a first visit answered 4xx (`http_4xx`: a dead
-- link) writes none: nothing brings such a URL back but a seed or a link past its window.
-- Same `visits` as schedule_visits.
local function keep_visits(conf, due, visits, now)
  local prev = previous_records(visits)
  local kept, records, gone = {}, {}, {}
  local now_s = math.floor(now / 1000)
  for i, v in ipairs(visits) do
    local p = prev[i]
    if v[5] == 'gone' then
      gone[#gone + 1] = v
    elseif p or v[5] ~= 'http_4xx' then  -- a first visit's 4xx: no page to know
      kept[#kept + 1] = v
      records[#kept] = visit_record(p, v, observed_decode(v[6]), now_s,
                                    p and p.interval or 0,
                                    p and p.tail ~= '' and p.tail or entry_tail(v[2], v[4]),
                                    p or {n = 0, x = 0, t = 0})
    end
  end
  write_records(conf, kept, records)
  local dropped = 0
  for _, v in ipairs(gone) do
    dropped = dropped + redis.call('HDEL', v[7], v[8])
    redis.call('ZREM', due, v[1])
  end
  if dropped > 0 then redis.call('HINCRBY', conf, 'rv_urls', -dropped) end
end

-- A JSON string (validators are header values: printable, but may hold '"' or '\').
local function json_string(s)
  return '"' .. string.gsub(s, '[%c"\\]', function(ch)
    return string.format('\\u%04x', string.byte(ch))
  end) .. '"'
end

-- The entry a due URL goes back to its host's queue with: its full entry `full` (or a
-- compact entry's tail, without its binary id: "<url>[ <json>]") with `v`, the previous
-- visit of record `r` (common/revisit.py), appended as the last field.
local function revisit_entry(r, full)
  local v = '"v":[' .. json_string(r.etag) .. ',' .. json_string(r.lm) .. ','
    .. json_string(r.digest) .. ',' .. r.fetched .. ',' .. r.interval .. ']'
  local head, json = string.match(full, '^(%S+) {(.*)}$')
  if head then return head .. ' {' .. json .. ',' .. v .. '}' end
  return full .. ' {' .. v .. '}'
end

-- Counts a revisit `late_ms` after its due time in its lateness bucket.
local function late_bucket(late_ms)
  for _, bound in ipairs(LATE_BOUNDS) do
    if late_ms <= bound * 1000 then return 'rv_late:' .. bound end
  end
  return 'rv_late:inf'
end
