-- Compare-and-delete of a sorted-set entry: a reader's release, a semaphore permit's
-- release or give-back, a waiting writer leaving (its intent id as the member).
-- KEYS[1]: the set (score = expiry in ms by this node's clock). KEYS[2] (optional): a key
-- that lives as long as the set (a semaphore's configuration).
-- ARGV[1]: the member.
-- Lapsed entries are purged first. The set's expiry (and KEYS[2]'s) follows its largest
-- score left; an emptied set is gone, and KEYS[2] with it.
-- Returns {removed, 0}: 1 when our live entry was removed, 0 when it was not there (the
-- second field keeps the shape of the release scripts, which count listeners).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
-- Expiries as integer text: Redis prints a large score with an exponent, which
-- PEXPIREAT refuses.
local function ms(x)
  return string.format('%.0f', tonumber(x))
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local removed = redis.call('ZREM', KEYS[1], ARGV[1])
local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
if #last > 0 then
  redis.call('PEXPIREAT', KEYS[1], ms(last[2]))
  if #KEYS > 1 then
    redis.call('PEXPIREAT', KEYS[2], ms(last[2]))
  end
elseif #KEYS > 1 then
  redis.call('DEL', KEYS[2])
end
return {removed, 0}
