-- release_lock.lua: delete a lock only while it still holds our token (compare-and-delete).
--
-- KEYS[1]  lock  STRING  a token, set with SET NX PX (lock:producer, robots:<origin>:lock)
-- ARGV[1]  our token
-- Returns 1 if deleted, 0 if the lock is not ours (expired, or taken over)
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
