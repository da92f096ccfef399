-- Compare-and-delete for a single-resource mutex, transferring the lock to the wait
-- queue's head. Runs on every node.
-- KEYS[1]: the lock key. KEYS[2]: the wait queue (tokens by ticket). KEYS[3]: the
-- leases. KEYS[4]: the attributes (token -> "<ttl ms>:<kind>[:<channel>]", see
-- enqueue.lua).
-- KEYS[5]: the resource's fence counter.
-- ARGV[1]: our token. ARGV[2]: the resource's channel. ARGV[3]: the queue entry this
-- holder waited under ('' if none). ARGV[4]: '1' when this node announces plain releases
-- and names name-only entries (a herald, notify waiting), '0' otherwise.
-- First, always: our own entries (ARGV[1] and ARGV[3]) leave the queue, whether or not
-- the key holds our token, so no later release can transfer to a holder that is done.
-- If the key does not hold our token: {0, waiters}. Otherwise lapsed entries are purged
-- and the head is popped:
-- * a transfer entry ('t', 'f'): the key is set to its token with its TTL; 'f' also
--   raises the fence counter as acquire_fenced.lua does (a bad counter: no transfer, the
--   key is deleted and the waiter named instead); announced as
--   "<our token's first 8 chars>:>:<token>[:<fence>]" on the entry's channel when it has
--   one (only its waiter listens there), else on the resource's; returns
--   {2, waiters left, fence} (fence 0 for 't');
-- * a name-only entry ('n', or no attributes), when ARGV[4] is '1': the key is deleted,
--   "<prefix>:<token>" announced; returns {1, waiters left + 1};
-- * otherwise (empty queue; or a name-only head on a node that does not name): the key
--   is deleted, "<prefix>" announced when ARGV[4] is '1'; returns {1, waiters}.
-- An emptied queue is deleted; otherwise its keys expire with the latest lease left.
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[1])
redis.call('HDEL', KEYS[4], ARGV[1])
if ARGV[3] ~= '' then
  redis.call('ZREM', KEYS[2], ARGV[3])
  redis.call('ZREM', KEYS[3], ARGV[3])
  redis.call('HDEL', KEYS[4], ARGV[3])
end
local function tidy()
  local last = redis.call('ZRANGE', KEYS[3], -1, -1, 'WITHSCORES')
  if #last == 0 then
    redis.call('DEL', KEYS[2], KEYS[3], KEYS[4])
  else
    redis.call('PEXPIREAT', KEYS[2], last[2])
    redis.call('PEXPIREAT', KEYS[3], last[2])
    redis.call('PEXPIREAT', KEYS[4], last[2])
  end
end
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return {0, redis.call('ZCARD', KEYS[2])}
end
local prefix = string.sub(ARGV[1], 1, 8)
local loud = ARGV[4] == '1'
if redis.call('EXISTS', KEYS[3]) == 1 then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local lapsed = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now)
  for i = 1, #lapsed do
    redis.call('ZREM', KEYS[2], lapsed[i])
    redis.call('HDEL', KEYS[4], lapsed[i])
  end
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
  local head = redis.call('ZRANGE', KEYS[2], 0, 0)
  if #head > 0 then
    local tok = head[1]
    local attr = redis.call('HGET', KEYS[4], tok)
    local ttl, kind, inbox = nil, 'n', ARGV[2]
    if attr then
      local a, k, c = string.match(attr, '^(%d+):([tfn]):(.+)$')
      if not a then
        a, k = string.match(attr, '^(%d+):([tfn])$')
      end
      if a then
        ttl, kind = a, k
        if c then
          inbox = c
        end
      end
    end
    if ttl == nil or tonumber(ttl) == 0 then
      kind = 'n'
    end
    if kind ~= 'n' or loud then
      redis.call('ZREM', KEYS[2], tok)
      redis.call('ZREM', KEYS[3], tok)
      redis.call('HDEL', KEYS[4], tok)
      local fence = 0
      if kind == 'f' then
        local raw = redis.call('GET', KEYS[5])
        local c = 0
        if raw then
          if raw ~= '0' and not (string.match(raw, '^[1-9]%d*$') and #raw <= 16) then
            kind = 'n'
          else
            c = tonumber(raw)
            if c >= 9007199254740992 then
              kind = 'n'
            end
          end
        end
        if kind == 'f' then
          local now_us = t[1] .. string.format('%06d', tonumber(t[2]))
          local floor = tonumber(now_us)
          if c + 1 > floor then
            fence = redis.call('INCR', KEYS[5])
          else
            redis.call('SET', KEYS[5], now_us)
            fence = floor
          end
        end
      end
      tidy()
      local left = redis.call('ZCARD', KEYS[2])
      if kind == 'n' then
        redis.call('DEL', KEYS[1])
        redis.call('PUBLISH', ARGV[2], prefix .. ':' .. tok)
        return {1, left + 1}
      end
      redis.call('SET', KEYS[1], tok, 'PX', ttl)
      local payload = prefix .. ':>:' .. tok
      if fence > 0 then
        payload = payload .. ':' .. string.format('%.0f', fence)
      end
      redis.call('PUBLISH', inbox, payload)
      return {2, left, fence}
    end
  end
  tidy()
end
redis.call('DEL', KEYS[1])
if loud then
  redis.call('PUBLISH', ARGV[2], prefix)
end
return {1, redis.call('ZCARD', KEYS[2])}
