-- session_update.lua: what one consumer's requests did with one session since its last
-- call (a flush's worth): the cookies they were given, how many went out with it, whether
-- one was answered with a block, the proxy it now goes through. Any consumer may continue
-- a session: it reads the record this writes (common/sessions.py).
--
-- Cookies are changed field by field (a value '' removes one), so two consumers that
-- each were given a cookie keep both. The version goes up with every change of the
-- cookies, the state, the proxy or the headers: a request a session's flush enqueued
-- carries the version it needs, and a consumer holding an older one reads it again.
-- A pool session (host not '') is retired on a block or once max_uses requests went out
-- with it: its cookies are dropped and it leaves its host's pool; a named one only counts
-- its blocks (it is its spider's own: a login). A retired session takes nothing more.
-- A call carries an operation id, kept in the record: a call sent again after its reply
-- was lost gets the same reply and counts nothing twice.
--
-- KEYS[1] se          ZSET  session name -> its last change (ms of Redis TIME)
-- KEYS[2] se:<name>   HASH  the session: ~v ~uses ~bans ~state ~proxy ~host ~h ~made ~op, cookies
-- KEYS[3] sp:<host>   ZSET  the live sessions of its host's pool -> when made (ms)
-- ARGV[1] op id, unique per call of the worker
-- ARGV[2] session name, its member in KEYS[1] and KEYS[3]
-- ARGV[3] pool host, its pool's (empty for a named session)
-- ARGV[4] uses n, requests that went out with it since the last call
-- ARGV[5] banned n, those answered with a block
-- ARGV[6] max_uses, requests a pool session serves before it is retired (0 = no limit)
-- ARGV[7] proxy id it goes through now (empty: unchanged)
-- ARGV[8] headers json it sends with every request (empty: unchanged; set once)
-- ARGV[9..] pairs: cookie field, cookie value (empty: the cookie is removed)
-- Returns {version, state}: its version after the call and live or retired
--- @include "lib/codes"

local index, rec, pool = KEYS[1], KEYS[2], KEYS[3]
local op, member, host = ARGV[1], ARGV[2], ARGV[3]
local uses = int_arg(ARGV[4], 'uses n')
local banned = int_arg(ARGV[5], 'banned n')
local max_uses = int_arg(ARGV[6], 'max_uses')
local proxy, headers = ARGV[7], ARGV[8]
local first = 9
if member == '' then error('crawlq: session_update needs a session name') end
if (#ARGV - first + 1) % 2 ~= 0 then error('crawlq: session_update needs (field, value) pairs') end
local f = redis.call('HMGET', rec, '~op', '~v', '~state', '~made', '~proxy', '~h')
local version, state = tonumber(f[2]) or 0, f[3] or 'live'
if f[1] == op then return {version, state} end
local now = now_ms()
local changed = false
if not f[4] then
  redis.call('HSET', rec, '~made', now, '~host', host, '~state', 'live')
  changed = true
end
local total = redis.call('HINCRBY', rec, '~uses', uses)
if banned > 0 then redis.call('HINCRBY', rec, '~bans', banned) end
if state ~= 'retired' then
  if host ~= '' and (banned > 0 or (max_uses > 0 and total >= max_uses)) then
    state = 'retired'
    local drop = {}
    for _, field in ipairs(redis.call('HKEYS', rec)) do
      if string.sub(field, 1, 2) == 'c:' then drop[#drop + 1] = field end
    end
    if #drop > 0 then call_sliced('HDEL', rec, drop, 1000) end
    redis.call('HSET', rec, '~state', 'retired')
    changed = true
  else
    local sets, dels = {}, {}
    for i = first, #ARGV, 2 do
      if string.sub(ARGV[i], 1, 2) ~= 'c:' then error('crawlq: a cookie field starts with c:') end
      if ARGV[i + 1] == '' then
        dels[#dels + 1] = ARGV[i]
      else
        sets[#sets + 1] = ARGV[i]
        sets[#sets + 1] = ARGV[i + 1]
      end
    end
    if #sets > 0 then call_sliced('HSET', rec, sets, 1000) end
    if #dels > 0 then call_sliced('HDEL', rec, dels, 1000) end
    changed = changed or #sets > 0 or #dels > 0
    if proxy ~= '' and proxy ~= f[5] then
      redis.call('HSET', rec, '~proxy', proxy)
      changed = true
    end
    if headers ~= '' and not f[6] then
      redis.call('HSET', rec, '~h', headers)
      changed = true
    end
  end
end
if changed then version = redis.call('HINCRBY', rec, '~v', 1) end
redis.call('HSET', rec, '~op', op)
if host ~= '' then
  if state == 'retired' then
    redis.call('ZREM', pool, member)
  elseif not f[4] then
    redis.call('ZADD', pool, now, member)
  end
end
redis.call('ZADD', index, now, member)
return {version, state}
