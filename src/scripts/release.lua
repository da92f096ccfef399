-- Compare-and-delete: delete each key only if it still holds our token.
-- KEYS: the lock keys. ARGV[1]: our token. ARGV[2..]: channels to announce the release on.
-- Returns the number of keys deleted. Never deletes another owner's key.
local deleted = 0
for i = 1, #KEYS do
  if redis.call('GET', KEYS[i]) == ARGV[1] then
    redis.call('DEL', KEYS[i])
    deleted = deleted + 1
  end
end
if deleted > 0 then
  for i = 2, #ARGV do
    redis.call('PUBLISH', ARGV[i], string.sub(ARGV[1], 1, 8))
  end
end
return deleted
