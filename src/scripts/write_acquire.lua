-- Read-write lock, the writer's acquire: set the writer key to our token, unless a writer
-- holds it or a live reader is there; optionally fenced.
-- KEYS[1]: the writer key. KEYS[2]: the readers. KEYS[3]: the waiting writers' intents.
-- KEYS[4]: the writer fence counter.
-- ARGV[1]: our token. ARGV[2]: the TTL in milliseconds. ARGV[3]: our intent id ('' for an
-- attempt that does not wait). ARGV[4]: the intent lease in milliseconds. ARGV[5]: '1' for
-- a fenced acquire, '0' otherwise.
-- Granted: the writer key is set (PX TTL) and our intent removed; fenced, the counter is
-- raised to max(counter + 1, this node's clock in microseconds) as in acquire_fenced.lua.
-- Refused: with an intent id, our intent is added (or its lease renewed) so that new
-- readers are refused while we wait; nothing else is written.
-- Returns 1 / 0, or when fenced {1, counter} / {0}; an error (and no write) when the fence
-- counter is not a plain decimal integer below 2^53.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local fenced = ARGV[5] == '1'
-- Every check comes before the first write. The intents' expiry is written as integer
-- text (Redis prints a large score with an exponent, which PEXPIREAT refuses).
local lease = tonumber(ARGV[4])
if ARGV[3] ~= '' and (not lease or lease < 1 or lease ~= math.floor(lease) or now + lease > 9e18) then
  return redis.error_reply('ERR intent lease out of range')
end
local busy = redis.call('EXISTS', KEYS[1]) == 1
if not busy then
  -- Counted, not purged: the fence check below may still refuse, and writes nothing then.
  busy = redis.call('ZCOUNT', KEYS[2], '(' .. now, '+inf') > 0
end
local function fix(key)
  local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  if #last > 0 then
    redis.call('PEXPIREAT', key, string.format('%.0f', tonumber(last[2])))
  end
end
if busy then
  if ARGV[3] ~= '' then
    redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
    redis.call('ZADD', KEYS[3], string.format('%.0f', now + lease), ARGV[3])
    fix(KEYS[3])
  end
  if fenced then
    return {0}
  end
  return 0
end
local c = 0
if fenced then
  local raw = redis.call('GET', KEYS[4])
  if raw then
    if raw ~= '0' and not (string.match(raw, '^[1-9]%d*$') and #raw <= 16) then
      return redis.error_reply('fence counter ' .. KEYS[4] .. ' is not an integer')
    end
    c = tonumber(raw)
    if c >= 9007199254740992 then
      return redis.error_reply('fence counter ' .. KEYS[4] .. ' is not below 2^53')
    end
  end
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
if ARGV[3] ~= '' then
  redis.call('ZREM', KEYS[3], ARGV[3])
  fix(KEYS[3])
end
if not fenced then
  return 1
end
local now_us = t[1] .. string.format('%06d', tonumber(t[2]))
local floor = tonumber(now_us)
if c + 1 > floor then
  return {1, redis.call('INCR', KEYS[4])}
end
redis.call('SET', KEYS[4], now_us)
return {1, floor}
