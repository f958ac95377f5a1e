-- robots_claim.lua: one origin's robots.txt, the fleet's copy or the right to fetch it, in
-- one round trip (consumer/robots.py): the copy and how long it lives when there is one;
-- else the fetch lock (SET NX PX) when no other consumer holds it.
--
-- KEYS[1]  robots  STRING  the copy (JSON), robots:<origin>
-- KEYS[2]  lock    STRING  a token, set with SET NX PX (robots:<origin>:lock)
-- ARGV[1]  our token
-- ARGV[2]  the lock's TTL, milliseconds
-- Returns {copy|false, pttl_ms, locked}: the copy and its PTTL (-1: no expiry) with locked
-- 0; or false, -2 and 1 when the lock is ours (fetch, then store and unlock; also when a
-- call sent again finds the lock its first run took), 0 when another holds it (wait for
-- its copy)
local copy = redis.call('GET', KEYS[1])
if copy then return {copy, redis.call('PTTL', KEYS[1]), 0} end
if redis.call('SET', KEYS[2], ARGV[1], 'NX', 'PX', ARGV[2])
    or redis.call('GET', KEYS[2]) == ARGV[1] then
  return {false, -2, 1}
end
return {false, -2, 0}
