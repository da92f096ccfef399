-- Read-write lock, a reader's acquire: add our token to the readers' set, unless a writer
-- holds the lock or a writer waits (a live intent: writers are preferred).
-- KEYS[1]: the writer key. KEYS[2]: the readers (member = token, score = expiry in ms by
-- this node's clock). KEYS[3]: the waiting writers' intents (score = lease expiry, ms).
-- ARGV[1]: our token. ARGV[2]: the TTL in milliseconds.
-- Returns 1 when added, 0 when refused (nothing of ours written). Lapsed readers and
-- intents are purged first; the readers' set expires at its largest score, so it vanishes
-- with its last reader. (`PEXPIRE ... GT` would not do: a key without a TTL counts as
-- infinite for GT, so the first reader's expiry would never be set.)
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if redis.call('EXISTS', KEYS[1]) == 1 then
  return 0
end
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
if redis.call('ZCARD', KEYS[3]) > 0 then
  return 0
end
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[2]), ARGV[1])
local last = redis.call('ZRANGE', KEYS[2], -1, -1, 'WITHSCORES')
redis.call('PEXPIREAT', KEYS[2], last[2])
return 1
