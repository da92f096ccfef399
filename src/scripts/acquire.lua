-- Take every key or none (multi-resource locks; one resource uses SET NX PX).
-- KEYS: the lock keys. ARGV[1]: our token. ARGV[2]: the TTL in milliseconds.
-- Returns 1 when every key was set to our token, 0 when any key already exists, and -1
-- when every key already holds our token: this very request sent again (a Redis Cluster
-- client resends a command whose reply a dropped connection lost), which the client
-- counts as a failure to clean up, never as a grant.
local ours = 0
for i = 1, #KEYS do
  local held = redis.call('GET', KEYS[i])
  if held then
    if held ~= ARGV[1] then
      return 0
    end
    ours = ours + 1
  end
end
if ours == #KEYS then
  return -1
elseif ours > 0 then
  return 0
end
for i = 1, #KEYS do
  redis.call('SET', KEYS[i], ARGV[1], 'PX', ARGV[2])
end
return 1
