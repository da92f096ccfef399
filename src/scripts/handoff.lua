-- The hand-off part of release_one.lua (after queue.lua), for the resources `waited`
-- (someone waits or listens). For each, first our own entries (ARGV[1], ARGV[2]) leave
-- its queue, whether or not the key holds our token, so no later release can hand the
-- lock to a holder that is done. Then, if the key holds our token, lapsed entries are
-- purged and the queue's head is popped: a transfer entry ('t', 'f') gets the key, set to
-- its token with its TTL ('f' also raises the fence counter as acquire_fenced.lua does),
-- announced as "<our token's first 8 chars>:>:<token>[:<fence>]" on the entry's channel
-- (its waiter's inbox) or else the resource's. A head that cannot be served (unreadable
-- attributes, a bad fence counter) is popped and named instead: the key is deleted and
-- "<prefix>:<token>" announced on the resource's channel. With no head, the key is
-- deleted and "<prefix>" announced when this node announces (ARGV, '1'). Nothing here
-- moves the queue keys' expiry: a join sets it to the latest lease, and the keys of an
-- emptied queue go by themselves (Redis deletes an empty sorted set or hash).
local waiter = ARGV[2]
local prefix = string.sub(token, 1, 8)
local heard = 0

-- A channel holding byte 0xFE (the shard mark; never in UTF-8) is a shard channel in
-- this script's slot (Redis Cluster voters): SPUBLISH keeps the message on this shard.
local function publish(channel, message)
  local cmd = string.find(channel, '\254', 1, true) and 'SPUBLISH' or 'PUBLISH'
  local got = redis.call(cmd, channel, message)
  if got > heard then
    heard = got
  end
end

-- A fenced transfer's counter, raised as acquire_fenced.lua raises it (TIME's answer
-- `t`); nil (nothing written) when the counter is not a decimal integer below 2^53.
local function raise(fence, t)
  local raw = redis.call('GET', fence)
  local c = 0
  if raw then
    if raw ~= '0' and not (string.match(raw, '^[1-9]%d*$') and #raw <= 16) then
      return nil
    end
    c = tonumber(raw)
    if c >= 9007199254740992 then
      return nil
    end
  end
  local now_us = t[1] .. string.format('%06d', tonumber(t[2]))
  if c + 1 > tonumber(now_us) then
    return redis.call('INCR', fence)
  end
  redis.call('SET', fence, now_us)
  return tonumber(now_us)
end

local function release(r)
  local key, q, fence, channel, loud = resource(r)
  leave(q, token)
  if waiter ~= '' and waiter ~= token then
    leave(q, waiter)
  end
  if redis.call('GET', key) ~= token then
    return {0, redis.call('ZCARD', q[1])}
  end
  local now, t = clock()
  purge(q, now)
  local head = redis.call('ZRANGE', q[1], 0, 0)[1]
  if head then
    local ttl, kind, inbox = string.match(redis.call('HGET', q[3], head) or '', '^(%d+):([tf]):?(.*)$')
    drop(q, head)
    local fenced = 0
    if kind == 'f' then
      fenced = raise(fence, t)
    end
    if fenced and tonumber(ttl or 0) > 0 then
      redis.call('SET', key, head, 'PX', ttl)
      local payload = prefix .. ':>:' .. head
      if fenced > 0 then
        payload = payload .. ':' .. string.format('%.0f', fenced)
      end
      publish(inbox ~= '' and inbox or channel, payload)
      return {2, redis.call('ZCARD', q[1]), fenced}
    end
    redis.call('DEL', key)
    publish(channel, prefix .. ':' .. head)
    return {1, redis.call('ZCARD', q[1]) + 1}
  end
  redis.call('DEL', key)
  if loud then
    publish(channel, prefix)
  end
  return {1, redis.call('ZCARD', q[1])}
end

if n == 1 then
  return release(0)
end
local most = 0
for i = 1, #waited do
  local got = release(waited[i])
  if got[1] > 0 then
    left = left + 1
  end
  most = math.max(most, got[2])
end
return {left, math.max(most, heard)}
