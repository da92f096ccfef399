-- A multi-resource waiter's attempt on its lock keys with its own queued token: every key
-- or none, as acquire.lua, except that a key already holding our token (transferred to us
-- by a release whose announcement we did not count) counts as free; every key then gets
-- our token with our TTL.
-- KEYS: the lock keys. ARGV[1]: our token. ARGV[2]: the TTL in milliseconds.
-- Returns 1 when every key now holds our token, 0 when any key holds another.
for i = 1, #KEYS do
  local held = redis.call('GET', KEYS[i])
  if held and held ~= ARGV[1] then
    return 0
  end
end
for i = 1, #KEYS do
  redis.call('SET', KEYS[i], ARGV[1], 'PX', ARGV[2])
end
return 1
