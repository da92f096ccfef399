-- A waiter's attempt on one lock key with its own queued token: SET NX as usual, and a
-- key that already holds our token (transferred to us by a release whose announcement we
-- did not count) counts as granted, its expiry set to our TTL.
-- KEYS[1]: the lock key. ARGV[1]: our token. ARGV[2]: the TTL in milliseconds.
-- Returns nil when granted, else the holder's token (as SET … NX GET does).
local old = redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2], 'GET')
if old == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return false
end
return old
