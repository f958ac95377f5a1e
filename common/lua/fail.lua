-- fail.lua: record failed attempts: retry later with backoff, or dead-letter.
--
-- attempts < max_attempts and not permanent -> `delayed`, due after
--   backoff = floor(jitter * min(cap_ms, base_ms * 2^(attempts-1)))  (full jitter), or,
--   when the server sent a Retry-After, min(retry_after, max_retry_after_ms) but never
--   less than min(cap_ms, base_ms * 2^(attempts-1)) (a Retry-After of 0 or in the past
--   still waits the normal backoff);
-- otherwise -> `dead` with the reason. Jitter comes in ARGV so tests are deterministic.
-- A push-back (a 429/503, or what else the policy's backoff_on counts) raises its host's
-- backoff for the whole fleet: its level, its block and the pace its next requests keep
-- (push_back, lib/backoff.lua), and blocks its politeness group as long (lib/groups.lua:
-- one host's push-back slows the whole site). Either way its lease ends on its host's record (end_lease,
-- lib/lease_end.lua: the slot back, the request's time; the page of its budget used if its
-- request got a response (a 5xx, 429, a handler's error on a page), given back if not (a
-- timeout, a refused connection, a robots.txt failure)). A task that waits or is dead
-- keeps its body in `tasks` and its attempts in `attempts`.
-- Only the current lease holder, before its deadline, can fail a task.
--
-- KEYS[1..4] host state: hosts, due, h:queued, conf (lib/hosts.lua)
-- KEYS[5..6] lease state: leased, leases (lib/leases.lua)
-- KEYS[7]  attempts      HASH  id -> attempts of a task that is not leased
-- KEYS[8]  delayed       ZSET  id -> due (ms)
-- KEYS[9]  dead          ZSET  id -> died (ms)
-- KEYS[10] errors        HASH  id -> "<reason> <message>"
-- KEYS[11] dead_reasons  HASH  reason -> count
-- KEYS[12] stats         HASH  counters (failed, retried, dead, stale, backoffs)
-- KEYS[13] tasks         HASH  id -> "<host> <priority> <entry>" (waiting or dead)
-- KEYS[14] h:errors      ZSET  host -> failed attempts
-- KEYS[15] h:blocked     ZSET  host -> blocked until (ms)
-- KEYS[16..18] group state: g:of, groups, g:parked (lib/groups.lua)
-- KEYS[19] ops:<worker>  STRING  the worker's last calls (lib/once.lua)
-- ARGV[1]  worker id and operation id, "<worker> <16 hex digits>": a call sent again
--          (the same id) answers the reply its first run kept, counted `replayed`
-- ARGV[2]  base_ms, backoff of the first retry, milliseconds
-- ARGV[3]  cap_ms, the longest backoff, milliseconds
-- ARGV[4]  max_retry_after_ms, the longest Retry-After honoured, milliseconds
-- ARGV[5]  backoff_base_ms, a host's block at its first push-back level, milliseconds
-- ARGV[6]  backoff_cap_ms, the longest block a host's backoff level gives, milliseconds
-- ARGV[7]  backoff_forgive_ms, the half-life of a host's pace, milliseconds (> 0)
-- ARGV[8..] per item 11 values: id, token, max_attempts, reason (no spaces), message,
--           retry_after_ms (-1 = none), permanent (0/1), jitter (0..1), pushback (1 =
--           its host pushed back, 0 = not), sent_ms (Redis ms its request went out when
--           later than its turn, else 0), responded (1 = its request to the host got a
--           response, 0 = none came back)
-- Returns {code, delay_ms, code, delay_ms, ...} per item: 1 RETRY (delay_ms until due),
--         2 DEAD, 3 STALE, 4 EXPIRED, 5 UNKNOWN (delay_ms is -1 but for RETRY)
--- @include "lib/codes"
--- @include "lib/leases"
--- @include "lib/dead"
--- @include "lib/memory"
--- @include "lib/hosts"
--- @include "lib/lease_end"
--- @include "lib/backoff"
--- @include "lib/groups"
--- @include "lib/once"

local LK = lease_keys(5)
local attempts, delayed, dead, errors = KEYS[7], KEYS[8], KEYS[9], KEYS[10]
local dead_reasons, stats, tasks = KEYS[11], KEYS[12], KEYS[13]
local errors_by_host, blocked = KEYS[14], KEYS[15]
local worker, op = once_split(ARGV[1])
local base_ms = int_arg(ARGV[2], 'base_ms')
local cap_ms = int_arg(ARGV[3], 'cap_ms')
local max_retry_after_ms = int_arg(ARGV[4], 'max_retry_after_ms')
local backoff = {base = int_arg(ARGV[5], 'backoff_base_ms'), cap = int_arg(ARGV[6], 'backoff_cap_ms'),
                 max_ra = max_retry_after_ms, fade = int_arg(ARGV[7], 'backoff_forgive_ms')}
if backoff.fade < 1 then error('crawlq: backoff_forgive_ms must be > 0') end
if (#ARGV - 7) % 11 ~= 0 then error('crawlq: fail needs 11 values per item') end
local items = {}
for i = 8, #ARGV, 11 do
  local jitter = tonumber(ARGV[i + 7])
  if not jitter or jitter < 0 or jitter > 1 then error('crawlq: jitter must be in [0, 1]') end
  if string.find(ARGV[i + 3], ' ', 1, true) or ARGV[i + 3] == '' then
    error('crawlq: a fail reason is one word')
  end
  items[#items + 1] = {
    id = ARGV[i], token = ARGV[i + 1], max_attempts = int_arg(ARGV[i + 2], 'max_attempts'),
    reason = ARGV[i + 3], message = ARGV[i + 4],
    retry_after = int_arg(ARGV[i + 5], 'retry_after_ms'),
    permanent = ARGV[i + 6] == '1', jitter = jitter,
    pushback = int_arg(ARGV[i + 8], 'pushback') == 1, sent = int_arg(ARGV[i + 9], 'sent_ms'),
    responded = ARGV[i + 10] == '1',
  }
end

allow_at_maxmemory(stats)
local replay, calls = once_kept(KEYS[19], op)
if replay then
  bump(stats, {replayed = 1})
  return replay
end
local now = now_ms()
local L = ledger(host_keys(1), now)
ledger_groups(L, group_keys(16))
local ids, tokens = {}, {}
for k, it in ipairs(items) do ids[k], tokens[k] = it.id, it.token end
local states, recs = {}, {}
if #ids > 0 then states, recs = lease_states(LK, ids, tokens, worker, now) end
local result, gone, ended, failed_by_host, pushes, seen = {}, {}, {}, {}, {}, {}
local retried, died, stale = 0, 0, 0
for k, it in ipairs(items) do
  local state, rec = states[k], recs[k]
  if state == OK and seen[it.id] then state = UNKNOWN end
  local delay = -1
  if state == OK then
    seen[it.id] = true
    gone[#gone + 1] = it.id
    local host, _, reserved, grouped = rec.host, owner_marks(rec.owner)
    ended[#ended + 1] = {host, {slot = not fetched_owner(rec.owner), reserved = reserved,
                                responded = it.responded, sent = it.sent, group = grouped}}
    failed_by_host[host] = (failed_by_host[host] or 0) + 1
    if it.pushback then
      local push = pushes[host]
      if not push then
        pushes[host] = {ra = it.retry_after, jitter = it.jitter}
      elseif it.retry_after > push.ra then
        push.ra = it.retry_after
      end
    end
    redis.call('HSET', tasks, it.id, host .. ' ' .. rec.prio .. ' ' .. rec.entry)
    redis.call('HSET', attempts, it.id, rec.attempt)
    if it.permanent or rec.attempt >= it.max_attempts then
      to_dead(dead, errors, dead_reasons, it.id, it.reason, it.message, now)
      state = DEAD
      died = died + 1
    else
      local backoff = math.min(cap_ms, base_ms * 2 ^ (rec.attempt - 1))
      if it.retry_after >= 0 then
        delay = math.max(math.min(it.retry_after, max_retry_after_ms), backoff)
      else
        delay = math.floor(it.jitter * backoff)
      end
      redis.call('ZADD', delayed, now + delay, it.id)
      redis.call('HSET', errors, it.id, it.reason .. ' ' .. it.message)
      state = RETRY
      retried = retried + 1
    end
  else
    stale = stale + 1
  end
  result[#result + 1] = state
  result[#result + 1] = delay
end
drop_leases(LK, gone)
local touched = {}
for _, e in ipairs(ended) do touched[#touched + 1] = e[1] end
ledger_load(L, touched)
groups_load_ended(L, ended)
for _, e in ipairs(ended) do end_lease(L, e[1], e[2]) end
local incidents = push_back(L, blocked, pushes, now, backoff)
if next(pushes) then
  local pushed = {}
  for host in pairs(pushes) do pushed[#pushed + 1] = host end
  group_block(L, pushed)
end
for host, n in pairs(failed_by_host) do redis.call('ZINCRBY', errors_by_host, n, host) end
ledger_flush(L)
bump(stats, {failed = retried + died, retried = retried, dead = died, stale = stale,
             backoffs = incidents})
once_keep(KEYS[19], op, result, calls)
return result
