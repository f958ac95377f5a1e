-- refresh_lock.lua: extend a lock only while it still holds our token.
--
-- KEYS[1]  lock  STRING  a token, set with SET NX PX (lock:producer, robots:<origin>:lock)
-- ARGV[1]  our token
-- ARGV[2]  the new TTL, milliseconds
-- Returns 1 if extended, 0 if the lock is not ours any more
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
