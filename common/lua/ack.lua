-- ack.lua: mark leased tasks done, after their result reached the sink.
--
-- Only the current lease holder, before its deadline, can ack; anything else is
-- refused and counted as `stale`. A done task keeps only its seen mark: its body
-- and bookkeeping are deleted, and its lease ends on its host's record (end_lease,
-- lib/lease_end.lua: the slot back unless it came back with the response, the budget
-- page settled, the request's time, the response's time). Reads and deletes are
-- batched (a few commands per call, not per task); an id given twice is acked once,
-- the repeat answers UNKNOWN. With exact dedup its seen mark becomes -(now), the time it
-- ended, which a recrawl window counts from (enqueue.lua). A lease's page of its host's
-- budget is used if its request got a response, given back if not (robots_disallowed: no
-- request).
-- With marks 2 (the crawl's revisits on, or a recrawl window with `conditional` on) each
-- done URL also gets its history record and its next visit (schedule_visits,
-- lib/revisits.lua), from what its fetch observed (a soft-404 probe, outcome probe, gets
-- none: it is no page of the crawl's); a partition whose `conf` says
-- revisits are off but keeps validators (keeps_validators) writes the record alone
-- (keep_visits: with the URL's host and entry; an outcome `gone` deletes it instead),
-- one that does neither ignores them.
--
-- KEYS[1..4] host state: hosts, due, h:queued, conf (lib/hosts.lua)
-- KEYS[5..6] lease state: leased, leases (lib/leases.lua)
-- KEYS[7]  checkpoints  HASH
-- KEYS[8]  errors       HASH
-- KEYS[9]  stalls       HASH
-- KEYS[10] stats        HASH  counters (done, outcome:<outcome>, stale)
-- KEYS[11..13] group state: g:of, groups, g:parked (lib/groups.lua)
-- KEYS[14..] with marks: per item i, its seen bucket HASH; then with marks 2: per item
--          i, its rv:hist:<bucket> HASH (id's 16 bytes -> history record), and rv:due
--          ZSET; then, the last key, ops:<worker> STRING (lib/once.lua)
-- ARGV[1]  worker id and operation id, "<worker> <16 hex digits>": a call sent again
--          (the same id) answers the codes its first run kept, counted `replayed`
-- ARGV[2]  marks: 1 = each item also names its seen field (exact dedup), 2 = and what
--          its fetch observed (revisits on or validators kept), 0 = neither
-- ARGV[3..] per item: id, token, outcome (a short code such as ok, http_4xx), sent_ms
--           (Redis ms its request went out when later than its turn, else 0),
--           responded (1 = its request to the host got a response, 0 = no request
--           went out), elapsed_ms (its response's time, -1 = none)[, seen field,
--           observed ("<max_age_s> <digest|-> <#etag> <#lm> <etag><lm>", marks 2)]
-- Returns {code per item} (0 OK, 3 STALE, 4 EXPIRED, 5 UNKNOWN)
--- @include "lib/codes"
--- @include "lib/leases"
--- @include "lib/memory"
--- @include "lib/hosts"
--- @include "lib/lease_end"
--- @include "lib/groups"
--- @include "lib/revisits"
--- @include "lib/once"

local LK = lease_keys(5)
local checkpoints, errors, stalls, stats = KEYS[7], KEYS[8], KEYS[9], KEYS[10]
local worker, op = once_split(ARGV[1])
local marks = ARGV[2] ~= '0'
local observing = ARGV[2] == '2'
local width = marks and 7 or 6
if observing then width = 8 end
local n = (#ARGV - 2) / width
if n ~= math.floor(n) or #KEYS ~= 14 + (marks and n * (observing and 2 or 1)
                                       + (observing and 1 or 0) or 0) then
  error('crawlq: ack needs (id, token, outcome, sent_ms, responded, elapsed_ms[, seen '
    .. 'field[, observed]]) per item, and seen keys (and rv:hist keys, rv:due), then ops')
end
allow_at_maxmemory(stats)
local replay, calls = once_kept(KEYS[#KEYS], op)
if replay then
  bump(stats, {replayed = 1})
  return replay
end
local now = now_ms()
local L = ledger(host_keys(1), now)
ledger_groups(L, group_keys(11))
local ids, tokens = {}, {}
for i = 3, #ARGV, width do
  ids[#ids + 1] = ARGV[i]
  tokens[#tokens + 1] = ARGV[i + 1]
end
local states, recs = lease_states(LK, ids, tokens, worker, now)
local codes, gone, ended, hosts, acked, outcomes, visits = {}, {}, {}, {}, {}, {}, {}
local stale = 0
local rv = observing and revisit_conf(L.K.conf)
local keeps = observing and not rv and keeps_validators(L.K.conf)
for i, id in ipairs(ids) do
  local state = states[i]
  if state == OK and acked[id] then state = UNKNOWN end
  codes[i] = state
  if state == OK then
    acked[id] = true
    local rec, base = recs[i], 3 + width * (i - 1)
    gone[#gone + 1] = id
    if marks then
      redis.call('HSET', KEYS[13 + i], ARGV[base + 6], -math.floor(now / 1000))
    end
    local _, reserved, grouped = owner_marks(rec.owner)
    ended[#ended + 1] = {rec.host, {slot = not fetched_owner(rec.owner), reserved = reserved,
      group = grouped,
      responded = ARGV[base + 4] == '1', sent = int_arg(ARGV[base + 3], 'sent_ms'),
      elapsed = int_arg(ARGV[base + 5], 'elapsed_ms'), done = true}}
    hosts[#hosts + 1] = rec.host
    if (rv or keeps) and ARGV[base + 2] ~= 'probe' then  -- a soft-404 probe is no page
      visits[#visits + 1] = {id, rec.host, rec.prio, rec.entry, ARGV[base + 2], ARGV[base + 7],
                             KEYS[13 + n + i]}
    end
    local key = 'outcome:' .. ARGV[base + 2]
    outcomes[key] = (outcomes[key] or 0) + 1
  else
    stale = stale + 1
  end
end
if #gone > 0 then
  if #visits > 0 and rv then schedule_visits(KEYS[#KEYS - 1], visits, rv, now)
  elseif #visits > 0 then keep_visits(L.K.conf, KEYS[#KEYS - 1], visits, now) end
  drop_leases(LK, gone)
  -- Usually absent (no checkpoints, failures or stalls): an EXISTS is cheaper than
  -- handing every id to HDEL.
  for _, h in ipairs({checkpoints, errors, stalls}) do
    if redis.call('EXISTS', h) == 1 then call_sliced('HDEL', h, gone, 1000) end
  end
  ledger_load(L, hosts)
  groups_load_ended(L, ended)
  for _, e in ipairs(ended) do end_lease(L, e[1], e[2]) end
  ledger_flush(L)
end
outcomes.done = #gone
outcomes.stale = stale
bump(stats, outcomes)
once_keep(KEYS[#KEYS], op, codes, calls)
return codes
