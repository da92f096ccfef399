-- Leave a resource's wait queue. KEYS[1]: the queue. KEYS[2]: the leases. KEYS[3]: the
-- attributes (see enqueue.lua). ARGV[1]: the waiter's token. Lapsed entries are purged
-- too; an emptied queue is deleted, and otherwise its keys expire with the latest lease
-- left. Returns 1.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('HDEL', KEYS[3], ARGV[1])
local lapsed = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now)
for i = 1, #lapsed do
  redis.call('ZREM', KEYS[1], lapsed[i])
  redis.call('HDEL', KEYS[3], lapsed[i])
end
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
local last = redis.call('ZRANGE', KEYS[2], -1, -1, 'WITHSCORES')
if #last == 0 then
  redis.call('DEL', KEYS[1], KEYS[2], KEYS[3])
else
  redis.call('PEXPIREAT', KEYS[1], last[2])
  redis.call('PEXPIREAT', KEYS[2], last[2])
  redis.call('PEXPIREAT', KEYS[3], last[2])
end
return 1
