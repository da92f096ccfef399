-- An ordered waiter lets go of a reservation once its conversion was granted: the
-- reservation's own queue entries leave the queue, and the lock key is deleted if it still
-- holds the reservation token, with no hand-over and no announcement. (Where the key still
-- holds it, this node refused the conversion: handing the key to the queue's head here
-- would make that waiter count this node and claim against the converted lock, which holds
-- a quorum; it hears that lock's release instead. And entries left behind would let a
-- later release on this node hand the key to a token no one waits with.)
-- KEYS[1]: the lock key. KEYS[2]: the wait queue. KEYS[3]: the leases. KEYS[4]: the
-- attributes (see enqueue.lua).
-- ARGV[1]: the reservation token. ARGV[2]: the queue entry it waited under ('' if none).
-- Returns {deleted (0 or 1), waiters left}.
for j = 1, 2 do
  local t = ARGV[j]
  if t ~= nil and t ~= '' then
    redis.call('ZREM', KEYS[2], t)
    redis.call('ZREM', KEYS[3], t)
    redis.call('HDEL', KEYS[4], t)
  end
end
local waiters = redis.call('ZCARD', KEYS[2])
if waiters == 0 then
  redis.call('DEL', KEYS[2], KEYS[3], KEYS[4])
end
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return {1, waiters}
end
return {0, waiters}
