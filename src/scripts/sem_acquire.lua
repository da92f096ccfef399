-- Semaphore acquire: add our token to the holders' set while it has fewer than c live
-- entries (the per-node limit).
-- KEYS[1]: the holders (member = token, score = expiry in ms by this node's clock).
-- KEYS[2]: the configuration "P:c:Q:N" of the clients using the semaphore.
-- ARGV[1]: our token. ARGV[2]: the TTL in milliseconds. ARGV[3]: our "P:c:Q:N".
-- ARGV[4]: c.
-- A node with live holders whose configuration differs refuses with the error
-- "PERMITS <stored>" before writing anything: clients that disagree on P, c, Q or N would
-- void the bound on holders. Otherwise lapsed holders are purged; our token, if already a
-- live member, is granted again; a full set refuses (0); else our entry is added, the set
-- expires at its largest score, and the configuration is stored to expire with it.
-- A grant returns {1, load}: the live entries now on this node, ours included (the client
-- keeps its entries where the load is lowest and gives the others back). An invalid TTL
-- (as in read_acquire.lua) or limit is an error before any write.
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
local limit = tonumber(ARGV[4])
if not limit then
  return redis.error_reply('ERR per-node limit is not a number')
end
if redis.call('ZCOUNT', KEYS[1], '(' .. now, '+inf') > 0 then
  local stored = redis.call('GET', KEYS[2])
  if stored and stored ~= ARGV[3] then
    return redis.error_reply('PERMITS ' .. stored)
  end
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZSCORE', KEYS[1], ARGV[1]) then
  return {1, redis.call('ZCARD', KEYS[1])}
end
if redis.call('ZCARD', KEYS[1]) >= limit then
  return 0
end
redis.call('ZADD', KEYS[1], expiry, ARGV[1])
local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
redis.call('PEXPIREAT', KEYS[1], ms(last[2]))
redis.call('SET', KEYS[2], ARGV[3], 'PXAT', ms(last[2]))
return {1, redis.call('ZCARD', KEYS[1])}
