-- Compare-and-extend: push the expiry of every key out to at least the new TTL, only if
-- every key still holds our token.
-- KEYS: the lock keys. ARGV[1]: our token. ARGV[2]: the new TTL in milliseconds.
-- Returns 1 when every key holds our token (each expiry is then at least now + TTL), 0 when
-- any key is missing or holds another token (then nothing is changed: an extension never
-- deletes and never re-creates a key).
-- `PEXPIRE ... GT` only ever moves an expiry later: an extension with a shorter TTL, or one
-- that lands late (a slow node, a request finished in the background after its caller gave
-- up), can never shorten the time for which a node holds our token. That makes the guard's
-- deadline safe on every path: whatever an extension does on a minority of nodes, the
-- quorum that backed the old deadline still holds the key at least that long.
for i = 1, #KEYS do
  if redis.call('GET', KEYS[i]) ~= ARGV[1] then
    return 0
  end
end
for i = 1, #KEYS do
  redis.call('PEXPIRE', KEYS[i], ARGV[2], 'GT')
end
return 1
