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
-- (push_back, lib/backoff.lua). Either way the host gets its slot back, and an
-- item sent late (sent_ms) moves its host's last request to then (note_sent, lib/hosts.lua).
-- A lease's page of its host's budget is settled (settle_pages, lib/hosts.lua): used if its
-- request got a response (a 5xx, 429, a handler's error on a page), given back if not
-- (a timeout, a refused connection, a robots.txt failure).
-- Only the current lease holder, before its deadline, can fail a task.
--
-- KEYS[1..6] host state: due, h:queued, h:inflight, h:last, hostconf, conf (lib/hosts.lua)
-- KEYS[7]  leases        ZSET
-- KEYS[8]  owners        HASH  id -> "[f][b]<token>:<worker>"
-- KEYS[9]  attempts      HASH
-- KEYS[10] delayed       ZSET  id -> due (ms)
-- KEYS[11] dead          ZSET  id -> died (ms)
-- KEYS[12] errors        HASH  id -> "<reason> <message>"
-- KEYS[13] dead_reasons  HASH  reason -> count
-- KEYS[14] stats         HASH  counters (failed, retried, dead, stale, backoffs)
-- KEYS[15] tasks         HASH  id -> "<host> <priority> <entry>" (kept: still live)
-- KEYS[16] h:errors      ZSET  host -> failed attempts
-- KEYS[17] h:blocked     ZSET  host -> blocked until (ms)
-- KEYS[18] h:done        ZSET  host -> done
-- ARGV[1]  worker id
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
--- @include "lib/backoff"
--- @include "lib/queues"

local leases, owners, attempts, delayed = KEYS[7], KEYS[8], KEYS[9], KEYS[10]
local dead, errors, dead_reasons, stats = KEYS[11], KEYS[12], KEYS[13], KEYS[14]
local tasks, errors_by_host, blocked, done_by_host = KEYS[15], KEYS[16], KEYS[17], KEYS[18]
local worker = ARGV[1]
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
local now = now_ms()
local result = {}
local retried, died, stale = 0, 0, 0
local freed, failed_by_host, hosts, pushes, sent, settle = {}, {}, {}, {}, {}, {}
for _, it in ipairs(items) do
  local state = lease_state(leases, owners, it.id, it.token, worker, now)
  local delay = -1
  if state == OK then
    local slot_taken, reserved = drop_lease(leases, owners, it.id)
    local host = split_value(redis.call('HGET', tasks, it.id))
    if host then
      if slot_taken then freed[host] = (freed[host] or 0) - 1 end
      settle[#settle + 1] = {host, reserved, it.responded}
      failed_by_host[host] = (failed_by_host[host] or 0) + 1
      hosts[#hosts + 1] = host
      if it.sent > (sent[host] or 0) then sent[host] = it.sent end
      if it.pushback then
        local push = pushes[host]
        if not push then
          pushes[host] = {ra = it.retry_after, jitter = it.jitter}
        elseif it.retry_after > push.ra then
          push.ra = it.retry_after
        end
      end
    end
    local attempt = tonumber(redis.call('HGET', attempts, it.id) or '1')
    if it.permanent or attempt >= it.max_attempts then
      to_dead(dead, errors, dead_reasons, it.id, it.reason, it.message, now)
      state = DEAD
      died = died + 1
    else
      local backoff = math.min(cap_ms, base_ms * 2 ^ (attempt - 1))
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
local incidents = push_back(H.hostconf, blocked, done_by_host, pushes, now, backoff)
add_counts(H.inflight, freed)
add_counts(errors_by_host, failed_by_host)
note_sent(sent)
settle_pages(settle, now)
refresh_hosts(hosts)
bump(stats, {failed = retried + died, retried = retried, dead = died, stale = stale,
             backoffs = incidents})
return result
