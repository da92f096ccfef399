-- Join or renew a multi-resource waiter's place in the wait queues of all its resources at
-- once: one entry per queue, all with the same token and ticket, kind 'm' (a release
-- hands the waiter every key of its set at once, or none: see release_one.lua).
-- KEYS: four per resource (its queue, leases, attributes, lock key), then the waiter's
-- set key (one per token).
-- ARGV[1]: the waiter's token. ARGV[2]: its ticket, or '' to have this node assign one
-- (its time in us). ARGV[3]: the lease (ms). ARGV[4]: the TTL (ms) a transfer sets the
-- keys with. ARGV[5]: '1' for the first join of this token on this node, '0' for a
-- renewal. ARGV[6]: the channel a transfer to this waiter is announced on.
-- Each entry's attributes are "<ttl ms>:m:<set key>". The set key holds the channel, then
-- each resource's lock key, queue, leases and attributes, every one as "<length>:<bytes>",
-- and lapses with the entries' lease.
-- The token is queued in every queue of the set or in none: a renewal that finds it
-- missing from some (popped, lapsed) drops it from all and answers gone. Only a first join
-- adds it, and not when any of the lock keys holds it.
-- Lapsed entries are purged first; each queue's keys expire with its latest lease.
-- Returns {state, ahead, score, holds, free}: state 0 queued (renewed), 1 added, 2 gone;
-- ahead the most live entries with an earlier ticket in any one queue, blocked
-- multi-resource entries not counted (sets.lua's `ahead_of`; nil when not queued); score
-- its ticket (nil when not queued); holds 1 when every lock key holds the token; free 1
-- when no lock key holds any token.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local token = ARGV[1]
local n = (#KEYS - 1) / 4
local set = KEYS[#KEYS]
local function k(r, j)
  return KEYS[4 * (r - 1) + j]
end
for r = 1, n do
  local lapsed = redis.call('ZRANGEBYSCORE', k(r, 2), '-inf', now)
  for i = 1, #lapsed do
    redis.call('ZREM', k(r, 1), lapsed[i])
    redis.call('HDEL', k(r, 3), lapsed[i])
  end
  redis.call('ZREMRANGEBYSCORE', k(r, 2), '-inf', now)
end
local all, any, free = 1, 0, 1
for r = 1, n do
  local held = redis.call('GET', k(r, 4))
  if held == token then
    any = 1
  else
    all = 0
  end
  if held then
    free = 0
  end
end
local queued = 0
for r = 1, n do
  if redis.call('ZSCORE', k(r, 1), token) then
    queued = queued + 1
  end
end
local lapse = now + tonumber(ARGV[3])
local state = 2
if queued == n then
  state = 0
  for r = 1, n do
    redis.call('ZADD', k(r, 2), lapse, token)
  end
  redis.call('PEXPIREAT', set, lapse)
elseif queued > 0 then
  for r = 1, n do
    redis.call('ZREM', k(r, 1), token)
    redis.call('ZREM', k(r, 2), token)
    redis.call('HDEL', k(r, 3), token)
  end
  redis.call('DEL', set)
elseif ARGV[5] == '1' and any == 0 then
  local ticket = ARGV[2]
  if ticket == '' then
    ticket = string.format('%.0f', tonumber(t[1]) * 1000000 + tonumber(t[2]))
  end
  local parts = {#ARGV[6] .. ':' .. ARGV[6]}
  for r = 1, n do
    for _, j in ipairs({4, 1, 2, 3}) do
      local key = k(r, j)
      parts[#parts + 1] = #key .. ':' .. key
    end
  end
  redis.call('SET', set, table.concat(parts), 'PXAT', lapse)
  for r = 1, n do
    redis.call('ZADD', k(r, 1), ticket, token)
    redis.call('ZADD', k(r, 2), lapse, token)
    redis.call('HSET', k(r, 3), token, ARGV[4] .. ':m:' .. set)
  end
  state = 1
end
for r = 1, n do
  local last = redis.call('ZRANGE', k(r, 2), -1, -1, 'WITHSCORES')
  if #last == 0 then
    redis.call('DEL', k(r, 1), k(r, 2), k(r, 3))
  else
    redis.call('PEXPIREAT', k(r, 1), last[2])
    redis.call('PEXPIREAT', k(r, 2), last[2])
    redis.call('PEXPIREAT', k(r, 3), last[2])
  end
end
local score = redis.call('ZSCORE', k(1, 1), token)
local ahead = false
if score then
  ahead = 0
  for r = 1, n do
    local a = ahead_of(k(r, 1), k(r, 3), k(r, 4), score)
    if a > ahead then
      ahead = a
    end
  end
end
return {state, ahead, score, all, free}
