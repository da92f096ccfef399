-- Take every key or none (multi-resource locks; one resource uses SET NX PX).
-- KEYS: the lock keys. ARGV[1]: our token. ARGV[2]: the TTL in milliseconds.
-- ARGV[3..] (optional): our reservations, the tokens under which this waiter already
-- holds some of the keys (taken one resource at a time, in order): a key holding one of
-- them counts as free, and is set to our token like the others.
-- Returns 1 when every key was set to our token, 0 when any key already exists (and is
-- not one of our reservations).
local function reserved(key)
  if #ARGV < 3 or redis.call('TYPE', key)['ok'] ~= 'string' then
    return false
  end
  local v = redis.call('GET', key)
  for j = 3, #ARGV do
    if v == ARGV[j] then
      return true
    end
  end
  return false
end
for i = 1, #KEYS do
  if redis.call('EXISTS', KEYS[i]) == 1 and not reserved(KEYS[i]) then
    return 0
  end
end
for i = 1, #KEYS do
  redis.call('SET', KEYS[i], ARGV[1], 'PX', ARGV[2])
end
return 1
