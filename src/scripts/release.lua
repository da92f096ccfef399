-- Compare-and-delete: delete each key only if it still holds our token.
-- KEYS: the lock keys. ARGV[1]: our token. ARGV[2..]: channels to announce the release on.
-- Returns {deleted, listeners}: the number of keys deleted, and the largest number of
-- subscribers one announcement reached (waiters, as far as this node knows). Never
-- deletes another owner's key. The announcement carries the token's first 8 characters,
-- so a waiter hearing the same release from several nodes wakes once.
local deleted = 0
for i = 1, #KEYS do
  if redis.call('GET', KEYS[i]) == ARGV[1] then
    redis.call('DEL', KEYS[i])
    deleted = deleted + 1
  end
end
local listeners = 0
if deleted > 0 then
  for i = 2, #ARGV do
    local n = redis.call('PUBLISH', ARGV[i], string.sub(ARGV[1], 1, 8))
    if n > listeners then
      listeners = n
    end
  end
end
return {deleted, listeners}
