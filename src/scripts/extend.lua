-- Compare-and-extend: set a new TTL on every key, only if every key still holds our token.
-- KEYS: the lock keys. ARGV[1]: our token. ARGV[2]: the new TTL in milliseconds.
-- Returns 1 when extended, 0 when any key is missing or holds another token (then
-- nothing is changed: an extension never deletes and never re-creates a key).
for i = 1, #KEYS do
  if redis.call('GET', KEYS[i]) ~= ARGV[1] then
    return 0
  end
end
for i = 1, #KEYS do
  redis.call('PEXPIRE', KEYS[i], ARGV[2], 'GT')
end
return 1
