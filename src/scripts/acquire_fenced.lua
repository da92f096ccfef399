-- Fenced acquire, round 1: take every lock key or none; on success increment each
-- resource's fence counter and return the largest new value.
-- KEYS[1..n]: the lock keys. KEYS[n+1..2n]: the fence counters. KEYS[2n+1..3n]: the
-- "unseeded" flags, all in the same resource order.
-- ARGV[1]: our token. ARGV[2]: the TTL in milliseconds.
-- Returns {0} when any lock key exists, else {1, largest counter, unseeded count}.
-- A counter that is missing (first use, or the node lost its data) is flagged unseeded;
-- the flag stays until a client that re-seeded the counter from a quorum commits.
local n = #KEYS / 3
for i = 1, n do
  if redis.call('EXISTS', KEYS[i]) == 1 then
    return {0}
  end
end
local top = 0
local unseeded = 0
for i = 1, n do
  if redis.call('EXISTS', KEYS[n + i]) == 0 then
    redis.call('SET', KEYS[2 * n + i], '1')
  end
  if redis.call('EXISTS', KEYS[2 * n + i]) == 1 then
    unseeded = unseeded + 1
  end
  redis.call('SET', KEYS[i], ARGV[1], 'PX', ARGV[2])
  local c = redis.call('INCR', KEYS[n + i])
  if c > top then
    top = c
  end
end
return {1, top, unseeded}
