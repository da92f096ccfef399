-- Fenced acquire, round 1: take every lock key or none; on success raise each resource's
-- fence counter to max(counter + 1, this node's clock in microseconds) and return the
-- largest new value. The clock floor keeps tokens rising on a node that lost its counters:
-- it came back after a restart delayed by more than the nodes' clocks ever disagree
-- (including when the earlier tokens were issued), so its clock is past every token
-- issued before it went down.
-- KEYS[1..n]: the lock keys. KEYS[n+1..2n]: the fence counters, in the same order.
-- ARGV[1]: our token. ARGV[2]: the TTL in milliseconds.
-- Returns {0} when any lock key exists (one key holding our token excepted, see below),
-- else {1, largest counter}; an error (and no
-- write) when a counter is not a plain decimal integer below 2^53.
-- Values stay below 2^53, exact as Lua numbers; a counter is only ever written by INCR,
-- as the decimal string built from TIME, or (by the commit) as the client's decimal t,
-- never formatted from a Lua number. A counter at or above 2^53 is refused: Lua would
-- round INCR's answer, and two holders could get the same token.
local n = #KEYS / 2
local counters = {}
for i = 1, n do
  if redis.call('EXISTS', KEYS[i]) == 1 then
    -- One key that already holds our token (transferred to our queued token) counts as
    -- free: it is taken again, with our TTL, and the counter raised as for a fresh grant.
    if n ~= 1 or redis.call('TYPE', KEYS[i])['ok'] ~= 'string'
        or redis.call('GET', KEYS[i]) ~= ARGV[1] then
      return {0}
    end
  end
  local raw = redis.call('GET', KEYS[n + i])
  local c = 0
  if raw then
    -- Exactly what INCR accepts and Lua holds exactly: a decimal without sign, spaces,
    -- exponent or leading zeros, below 2^53. Anything else ('1e16', ' 5', '007') would
    -- pass tonumber but make INCR fail after the lock keys were set.
    if raw ~= '0' and not (string.match(raw, '^[1-9]%d*$') and #raw <= 16) then
      return redis.error_reply('fence counter ' .. KEYS[n + i] .. ' is not an integer')
    end
    c = tonumber(raw)
    if c >= 9007199254740992 then
      return redis.error_reply('fence counter ' .. KEYS[n + i] .. ' is not below 2^53')
    end
  end
  counters[i] = c
end
local now = redis.call('TIME')
local now_us = now[1] .. string.format('%06d', tonumber(now[2]))
local floor = tonumber(now_us)
local top = 0
for i = 1, n do
  redis.call('SET', KEYS[i], ARGV[1], 'PX', ARGV[2])
  local v
  if counters[i] + 1 > floor then
    v = redis.call('INCR', KEYS[n + i])
  else
    redis.call('SET', KEYS[n + i], now_us)
    v = floor
  end
  if v > top then
    top = v
  end
end
return {1, top}
