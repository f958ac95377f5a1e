-- lib/backoff.lua: a host's answer to push-back (a 429 or 503, or another outcome the
-- crawl's policy counts, `backoff_on`), for the whole fleet: its backoff level, its block,
-- and the pace it teaches (lib/hosts.lua: pace_now, host_limits).
-- Includes lib/hosts (conf_decode, conf_encode, pace_now; lib/codes' call_sliced).
--- @include "lib/hosts"

-- Responses a host must have served since its last push-back to forgive one level.
local FORGIVE_SUCCESSES = 10
-- The least a push-back raises a host's pace by (x1.1): it was asked to slow down.
local PACE_STEP = 1.1

-- Records the push-backs of one script call. `pushes`: host -> {ra = Retry-After ms (-1:
-- none), jitter = 0..1}; `p`: {base, cap, max_ra, fade} (ms, the policy's backoff_base,
-- backoff_cap, max_retry_after, backoff_forgive); `hostconf`, `blocked` and `done` are
-- the keys of hostconf, h:blocked and h:done (host -> responses acked).
--
-- A push-back that comes while its host is blocked was sent before the block (no lease is
-- given inside one): it only stretches the block to its own Retry-After. Any other is an
-- incident:
--   level = what is left of the last level (one forgiven per FORGIVE_SUCCESSES responses
--           served since the last incident, and one per `fade` ms of quiet after its
--           block) + 1;
--   block = max(min(Retry-After, max_ra), min(cap, base * 2^(level-1)) * (0.9 + 0.2 *
--           jitter)), from now: a Retry-After of 0 or a past date waits the backoff;
--   pace  = max(pace now * PACE_STEP, the interval the host served at since its last
--           incident: its time over the responses it gave), the delay its next
--           requests keep, fading by half every `fade` ms after the block (pace_now).
-- Returns the number of incidents. Two commands to read, two to write, for any hosts.
local function push_back(hostconf, blocked, done, pushes, now, p)
  local hosts = {}
  for host in pairs(pushes) do hosts[#hosts + 1] = host end
  if #hosts == 0 then return 0 end
  local confs = call_sliced('HMGET', hostconf, hosts, 1000)
  local dones = call_sliced('ZMSCORE', done, hosts, 1000)
  local conf_args, block_args, incidents = {}, {}, 0
  for i, host in ipairs(hosts) do
    local c, push = conf_decode(confs[i]), pushes[host]
    local ra = push.ra >= 0 and math.min(push.ra, p.max_ra) or -1
    local until_ms = c.blocked
    if now >= c.blocked then
      incidents = incidents + 1
      local served = tonumber(dones[i]) or 0
      local level, pace = c.level, pace_now(c, now)
      if c.pb_at then
        local since = math.max(0, served - (c.pb_done or served))
        level = level - math.floor(since / FORGIVE_SUCCESSES)
          - math.floor((now - c.blocked) / math.max(p.fade, 1))
        pace = pace * PACE_STEP
        if since > 0 and (now - c.pb_at) / since > pace then pace = (now - c.pb_at) / since end
      end
      level = math.max(level, 0) + 1
      local backoff = math.min(p.cap, p.base * 2 ^ (level - 1))
      backoff = math.min(p.cap, math.floor(backoff * (0.9 + 0.2 * push.jitter)))
      until_ms = now + math.max(ra, backoff)
      c.level, c.pace, c.pb_at, c.pb_done = level, math.floor(pace), now, served
      c.fade, c.pushbacks = p.fade, c.pushbacks + 1
    elseif ra >= 0 and now + ra > until_ms then
      until_ms = now + ra
    end
    if until_ms > c.blocked then
      c.blocked = until_ms
      block_args[#block_args + 1] = until_ms
      block_args[#block_args + 1] = host
    end
    if c.pb_at == now or #block_args > 0 and block_args[#block_args] == host then
      conf_args[#conf_args + 1] = host
      conf_args[#conf_args + 1] = conf_encode(c)
    end
  end
  if #conf_args > 0 then call_sliced('HSET', hostconf, conf_args, 1000) end
  if #block_args > 0 then call_sliced('ZADD', blocked, block_args, 1000) end
  return incidents
end
