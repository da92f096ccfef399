-- Join (or re-join, or renew) a resource's wait queue, keeping the original arrival order.
-- KEYS[1]: the queue (waiter ids by arrival). KEYS[2]: the leases (waiter ids by the server
-- time, in ms, at which each entry lapses unless its waiter renews it).
-- ARGV[1]: the waiter id. ARGV[2]: its arrival score on this node, as an earlier call
-- returned it, or '' on a first join: then the arrival is this server's time (us), so that
-- arrival order is the order in which joins reached this node, whatever the clients'
-- clocks say. ARGV[3]: the lease (ms).
-- Lapsed entries are purged first; both keys expire with the latest lease, so a queue
-- whose waiters all vanished (crashed, cut off) disappears by itself.
-- Returns {added, ahead, score}: added is 1 when the waiter was not queued here (a first
-- join, or its place was popped or lapsed), 0 when it was (a renewal); ahead is how many
-- live waiters are queued before it; score is its arrival score here, for re-joins.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lapsed = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now)
for i = 1, #lapsed do
  redis.call('ZREM', KEYS[1], lapsed[i])
end
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
local arrival = ARGV[2]
if arrival == '' then
  arrival = string.format('%.0f', tonumber(t[1]) * 1000000 + tonumber(t[2]))
end
local added = redis.call('ZADD', KEYS[1], 'NX', arrival, ARGV[1])
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[3]), ARGV[1])
local last = redis.call('ZRANGE', KEYS[2], -1, -1, 'WITHSCORES')
redis.call('PEXPIREAT', KEYS[1], last[2])
redis.call('PEXPIREAT', KEYS[2], last[2])
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
return {added, redis.call('ZRANK', KEYS[1], ARGV[1]), score}
