-- Read-write lock, a reader's acquire: add our token to the readers' set, unless a writer
-- holds the lock or a writer waits (a live intent: writers are preferred).
-- KEYS[1]: the writer key. KEYS[2]: the readers (member = token, score = expiry in ms by
-- this node's clock). KEYS[3]: the waiting writers' intents (score = lease expiry, ms).
-- ARGV[1]: our token. ARGV[2]: the TTL in milliseconds.
-- Returns 1 when added, 0 when refused (nothing of ours written); an error, before any
-- write, for a TTL that is not a whole number of ms with an expiry below 9e18. Lapsed readers and
-- intents are purged first; the readers' set expires at its largest score, so it vanishes
-- with its last reader. (`PEXPIRE ... GT` would not do: a key without a TTL counts as
-- infinite for GT, so the first reader's expiry would never be set.)
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
-- Every check comes before the first write. Expiries are written as integer text: Redis
-- prints a large score with an exponent (1e+17), which PEXPIREAT refuses.
local function ms(x)
  return string.format('%.0f', tonumber(x))
end
local ttl = tonumber(ARGV[2])
if not ttl or ttl < 1 or ttl ~= math.floor(ttl) or now + ttl > 9e18 then
  return redis.error_reply('ERR ttl out of range')
end
local expiry = ms(now + ttl)
if redis.call('EXISTS', KEYS[1]) == 1 then
  return 0
end
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
if redis.call('ZCARD', KEYS[3]) > 0 then
  return 0
end
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
redis.call('ZADD', KEYS[2], expiry, ARGV[1])
local last = redis.call('ZRANGE', KEYS[2], -1, -1, 'WITHSCORES')
redis.call('PEXPIREAT', KEYS[2], ms(last[2]))
return 1
