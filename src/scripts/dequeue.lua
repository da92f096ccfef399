-- Leave a resource's wait queue. KEYS[1]: the queue. KEYS[2]: the expiry hash.
-- ARGV[1]: the waiter id. Returns 1.
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
return 1
