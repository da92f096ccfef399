-- Take every key or none (multi-resource locks; one resource uses SET NX PX).
-- KEYS: the lock keys. ARGV[1]: our token. ARGV[2]: the TTL in milliseconds.
-- Returns 1 when every key was set to our token, 0 when any key already exists.
for i = 1, #KEYS do
  if redis.call('EXISTS', KEYS[i]) == 1 then
    return 0
  end
end
for i = 1, #KEYS do
  redis.call('SET', KEYS[i], ARGV[1], 'PX', ARGV[2])
end
return 1
