-- Join (or re-join) a resource's wait queue, keeping the original arrival order.
-- KEYS[1]: the queue (sorted set). KEYS[2]: the expiry hash.
-- ARGV[1]: the waiter id. ARGV[2]: its arrival score. ARGV[3]: how long it may wait (ms).
-- Both keys expire when no waiter has joined for that long, so an abandoned queue vanishes.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZADD', KEYS[1], 'NX', ARGV[2], ARGV[1])
redis.call('HSET', KEYS[2], ARGV[1], now + tonumber(ARGV[3]))
redis.call('PEXPIRE', KEYS[1], ARGV[3])
redis.call('PEXPIRE', KEYS[2], ARGV[3])
return 1
