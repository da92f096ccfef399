-- Fenced acquire, round 2: only if every lock key still holds our token, raise every
-- fence counter of the lock to at least the token t. Raising only, so running it twice,
-- or late, does no harm.
-- KEYS[1..n]: the lock keys. KEYS[n+1..2n]: the fence counters, in the same order.
-- ARGV[1]: our token. ARGV[2]: t (a decimal integer below 2^53).
-- Returns 1 when committed, 0 when any lock key no longer holds our token; an error (and
-- no write) when a counter is not an integer.
local n = #KEYS / 2
local t = tonumber(ARGV[2])
local counters = {}
for i = 1, n do
  if redis.call('GET', KEYS[i]) ~= ARGV[1] then
    return 0
  end
  local c = tonumber(redis.call('GET', KEYS[n + i]) or '0')
  if c == nil then
    return redis.error_reply('fence counter ' .. KEYS[n + i] .. ' is not an integer')
  end
  counters[i] = c
end
for i = 1, n do
  if counters[i] < t then
    redis.call('SET', KEYS[n + i], ARGV[2])
  end
end
return 1
