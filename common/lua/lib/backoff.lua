-- lib/backoff.lua: a host's answer to push-back (a 429 or 503, or another outcome the
-- crawl's policy counts, `backoff_on`), for the whole fleet: its backoff level, its block,
-- and the pace it teaches (lib/hosts.lua: pace_now, host_limits).
-- Includes lib/hosts (the host ledger, pace_now).
--- @include "lib/hosts"

-- A push-back after fewer responses than this since the last one finds the pace far too
-- fast: it doubles it; after more, the pace was nearly right: x1.1 (it was asked to slow
-- down all the same).
local SETTLED = 10
local PACE_DOUBLE, PACE_STEP = 2, 1.1

-- Blocks a host until `until_ms` (ms of Redis TIME; 0 unblocks) in ledger `L` (the host
-- loaded) and in the h:blocked index (`blocked`), the one place a block is written. A
-- push-back only ever lengthens a block; an operator's word (`exact`, host_set) sets it
-- as given, shorter or gone. Returns whether it changed.
local function block_host(L, blocked, host, until_ms, exact)
  local r = L.rec[host]
  if until_ms == r.blocked or (until_ms < r.blocked and not exact) then return false end
  r.blocked = until_ms
  if until_ms > 0 then
    redis.call('ZADD', blocked, until_ms, host)
  else
    redis.call('ZREM', blocked, host)
  end
  ledger_touch(L, host)
  return true
end

-- Records the push-backs of one script call. `pushes`: host -> {ra = Retry-After ms (-1:
-- none), jitter = 0..1}; `p`: {base, cap, max_ra, fade} (ms, the policy's backoff_base,
-- backoff_cap, max_retry_after, backoff_forgive); `L` the script's host ledger, `blocked`
-- the key of h:blocked (block_host).
--
-- A push-back that comes while its host is blocked was sent before the block (no lease is
-- given inside one): it only stretches the block to its own Retry-After. Any other is an
-- incident:
--   level = push-backs in a row: the last level + 1 when the host served nothing since
--           its last block (less one per `fade` ms of quiet after it), else 1;
--   block = max(min(Retry-After, max_ra), min(cap, base * 2^(level-1)) * (0.9 + 0.2 *
--           jitter)), from now: a Retry-After of 0 or a past date waits the backoff;
--   pace  = max(pace now * (PACE_DOUBLE if it served fewer than SETTLED responses since
--           its last incident, else PACE_STEP), the interval it served at since its
--           last block ended: that time over the responses it gave), the delay its next
--           requests keep, fading by half every `fade` ms after the block (pace_now).
-- Returns the number of incidents.
local function push_back(L, blocked, pushes, now, p)
  local hosts = {}
  for host in pairs(pushes) do hosts[#hosts + 1] = host end
  if #hosts == 0 then return 0 end
  ledger_load(L, hosts)
  local incidents = 0
  for _, host in ipairs(hosts) do
    local c, push = L.rec[host], pushes[host]
    local ra = push.ra >= 0 and math.min(push.ra, p.max_ra) or -1
    local until_ms, incident = c.blocked, now >= c.blocked
    if incident then
      incidents = incidents + 1
      local served = c.done
      local level, pace = 0, pace_now(c, now)
      if c.pb_at then
        local since = math.max(0, served - (c.pb_done or served))
        if since == 0 then
          level = math.max(0, c.level - math.floor((now - c.blocked) / math.max(p.fade, 1)))
        end
        pace = pace * (since < SETTLED and PACE_DOUBLE or PACE_STEP)
        local open = now - math.max(c.pb_at, c.blocked)  -- since its block ended
        if since > 0 and open / since > pace then pace = open / since end
      end
      level = level + 1
      local backoff = math.min(p.cap, p.base * 2 ^ (level - 1))
      backoff = math.min(p.cap, math.floor(backoff * (0.9 + 0.2 * push.jitter)))
      until_ms = now + math.max(ra, backoff)
      c.level, c.pace, c.pb_at, c.pb_done = level, math.floor(pace), now, served
      c.fade, c.pushbacks = p.fade, c.pushbacks + 1
    elseif ra >= 0 and now + ra > until_ms then
      until_ms = now + ra
    end
    block_host(L, blocked, host, until_ms)
    if incident then ledger_touch(L, host) end
  end
  return incidents
end
