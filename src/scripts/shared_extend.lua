-- Compare-and-extend of a sorted-set entry (a reader, a semaphore permit): push our entry's
-- expiry out to at least now + TTL, only while it is live.
-- KEYS[1]: the set (member = token, score = expiry in ms by this node's clock). KEYS[2]
-- (optional): a key that must live as long as the set (a semaphore's configuration).
-- ARGV[1]: our token. ARGV[2]: the new TTL in milliseconds.
-- Returns 1 when our entry was live (its score is then at least now + TTL: `ZADD XX GT`
-- never lowers it), 0 when it is missing or lapsed (nothing changed: an extension never
-- re-creates an entry). Lapsed entries are purged first; the set's expiry (and KEYS[2]'s)
-- is set to its largest score. An invalid TTL (as in read_acquire.lua) is an error before
-- any write.
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
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if not redis.call('ZSCORE', KEYS[1], ARGV[1]) then
  return 0
end
redis.call('ZADD', KEYS[1], 'XX', 'GT', expiry, ARGV[1])
local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
redis.call('PEXPIREAT', KEYS[1], ms(last[2]))
if #KEYS > 1 then
  redis.call('PEXPIREAT', KEYS[2], ms(last[2]))
end
return 1
