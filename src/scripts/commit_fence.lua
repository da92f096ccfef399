-- Fenced acquire, round 2: only if every lock key still holds our token, raise every
-- fence counter to at least the token t, and clear the "unseeded" flags (the client
-- computed t from a quorum of counters whenever any flag was reported).
-- KEYS[1..n]: the lock keys. KEYS[n+1..2n]: the fence counters. KEYS[2n+1..3n]: the flags.
-- ARGV[1]: our token. ARGV[2]: t (a decimal integer).
-- Returns 1 when committed, 0 when any lock key no longer holds our token.
local n = #KEYS / 3
for i = 1, n do
  if redis.call('GET', KEYS[i]) ~= ARGV[1] then
    return 0
  end
end
local t = tonumber(ARGV[2])
for i = 1, n do
  local c = tonumber(redis.call('GET', KEYS[n + i]) or '0') or 0
  if c < t then
    redis.call('SET', KEYS[n + i], ARGV[2])
  end
  redis.call('DEL', KEYS[2 * n + i])
end
return 1
