-- Compare-and-delete for a single-resource lock, handing the lock to the queue's head.
-- KEYS[1]: the lock key. KEYS[2]: the resource's wait queue (waiter ids by arrival).
-- KEYS[3]: the waiters' leases (see enqueue.lua).
-- ARGV[1]: our token. ARGV[2]: the channel to announce the release on ('' for none: a node
-- that keeps no queue). ARGV[3]: the queue id this holder waited under ('' if none):
-- removed first, so a release never names its own holder.
-- Deletes the key only if it holds our token. When it did and a channel is given, purges
-- lapsed entries, pops the first waiter and announces "<token prefix>[:<waiter>]": the
-- named waiter tries at once, everyone else keeps waiting. An emptied queue is deleted;
-- otherwise both queue keys expire with the latest lease left.
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
  redis.call('ZREM', KEYS[3], ARGV[3])
end
local payload = string.sub(ARGV[1], 1, 8)
local named = 0
if redis.call('EXISTS', KEYS[3]) == 1 then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local lapsed = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now)
  for i = 1, #lapsed do
    redis.call('ZREM', KEYS[2], lapsed[i])
  end
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
  local head = redis.call('ZPOPMIN', KEYS[2])
  if #head > 0 then
    redis.call('ZREM', KEYS[3], head[1])
    payload = payload .. ':' .. head[1]
    named = 1
  end
  local last = redis.call('ZRANGE', KEYS[3], -1, -1, 'WITHSCORES')
  if #last == 0 then
    redis.call('DEL', KEYS[2], KEYS[3])
  else
    redis.call('PEXPIREAT', KEYS[2], last[2])
    redis.call('PEXPIREAT', KEYS[3], last[2])
  end
end
redis.call('PUBLISH', ARGV[2], payload)
return {1, named + redis.call('ZCARD', KEYS[2])}
