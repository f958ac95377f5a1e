-- fail.lua: record failed attempts: retry later with backoff, or dead-letter.
--
-- attempts < max_attempts and not permanent -> `delayed`, due after
--   retry_after (when given, capped at max_retry_after_ms), else
--   floor(jitter * min(cap_ms, base_ms * 2^(attempts-1)))   (exponential, full jitter);
-- otherwise -> `dead` with the reason. Jitter comes in ARGV so tests are deterministic.
-- Only the current lease holder, before its deadline, can fail a task.
--
-- KEYS[1]  leases        ZSET
-- KEYS[2]  owners        HASH
-- KEYS[3]  attempts      HASH
-- KEYS[4]  delayed       ZSET  id -> due (ms)
-- KEYS[5]  dead          ZSET  id -> died (ms)
-- KEYS[6]  errors        HASH  id -> "<reason> <message>"
-- KEYS[7]  dead_reasons  HASH  reason -> count
-- KEYS[8]  stats         HASH  counters (failed, retried, dead, stale)
-- ARGV[1]  worker id
-- ARGV[2]  base_ms, backoff of the first retry, milliseconds
-- ARGV[3]  cap_ms, the longest backoff, milliseconds
-- ARGV[4]  max_retry_after_ms, the longest Retry-After honoured, milliseconds
-- ARGV[5..] per item 8 values: id, token, max_attempts, reason (no spaces), message,
--           retry_after_ms (-1 = none), permanent (0/1), jitter (0..1)
-- Returns {code, delay_ms, code, delay_ms, ...} per item: 1 RETRY (delay_ms until due),
--         2 DEAD, 3 STALE, 4 EXPIRED, 5 UNKNOWN (delay_ms is -1 but for RETRY)
local leases, owners, attempts, delayed = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local dead, errors, dead_reasons, stats = KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local worker = ARGV[1]
local base_ms = int_arg(ARGV[2], 'base_ms')
local cap_ms = int_arg(ARGV[3], 'cap_ms')
local max_retry_after_ms = int_arg(ARGV[4], 'max_retry_after_ms')
if (#ARGV - 4) % 8 ~= 0 then error('crawlq: fail needs 8 values per item') end
local items = {}
for i = 5, #ARGV, 8 do
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
  }
end

allow_at_maxmemory(stats)
local now = now_ms()
local result = {}
local retried, died, stale = 0, 0, 0
for _, it in ipairs(items) do
  local state = lease_state(leases, owners, it.id, it.token, worker, now)
  local delay = -1
  if state == OK then
    drop_lease(leases, owners, it.id)
    local attempt = tonumber(redis.call('HGET', attempts, it.id) or '1')
    if it.permanent or attempt >= it.max_attempts then
      to_dead(dead, errors, dead_reasons, it.id, it.reason, it.message, now)
      state = DEAD
      died = died + 1
    else
      if it.retry_after >= 0 then
        delay = math.min(it.retry_after, max_retry_after_ms)
      else
        delay = math.floor(it.jitter * math.min(cap_ms, base_ms * 2 ^ (attempt - 1)))
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
bump(stats, {failed = retried + died, retried = retried, dead = died, stale = stale})
return result
