-- Compare-and-delete for a single-resource lock, handing the lock to the queue's head.
-- KEYS[1]: the lock key. KEYS[2]: the resource's wait queue (a sorted set of waiter ids
-- by arrival). KEYS[3]: the waiters' expiry times (a hash, server milliseconds).
-- ARGV[1]: our token. ARGV[2]: the channel to announce the release on ('' for none).
-- ARGV[3]: the queue id this holder waited under ('' if none): removed first, so a release
-- never names its own holder.
-- Deletes the key only if it holds our token. When it did and a channel is given, pops the
-- first live waiter from the queue (expired ones are dropped) and announces
-- "<token prefix>[:<waiter>]": the named waiter tries at once, everyone else keeps waiting.
-- Returns {deleted, waiters}: how many live waiters the queue held (named one included).
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return {0, 0}
end
redis.call('DEL', KEYS[1])
if ARGV[2] == '' then
  return {1, 0}
end
if ARGV[3] ~= '' then
  redis.call('ZREM', KEYS[2], ARGV[3])
  redis.call('HDEL', KEYS[3], ARGV[3])
end
local payload = string.sub(ARGV[1], 1, 8)
local named = 0
if redis.call('ZCARD', KEYS[2]) > 0 then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  for _ = 1, 16 do
    local head = redis.call('ZPOPMIN', KEYS[2])
    if #head == 0 then
      break
    end
    local expiry = tonumber(redis.call('HGET', KEYS[3], head[1]) or '0') or 0
    redis.call('HDEL', KEYS[3], head[1])
    if expiry >= now then
      payload = payload .. ':' .. head[1]
      named = 1
      break
    end
  end
end
redis.call('PUBLISH', ARGV[2], payload)
return {1, named + redis.call('ZCARD', KEYS[2])}
