-- Compare-and-delete for a mutex of one or more resources, handing each key to its wait
-- queue's head (one waiter per key). Runs on every node.
-- KEYS, five per resource: the lock key; the wait queue (tokens by ticket); the leases;
-- the attributes (token -> "<ttl ms>:<kind>[:<channel>]", see enqueue.lua); the
-- resource's fence counter.
-- ARGV[1]: our token. ARGV[2]: the queue entry this holder waited under ('' if none).
-- Then two per resource, in the order of KEYS: its channel; '1' when this node announces
-- the resource's plain releases and names its name-only entries (a herald, notify
-- waiting), '0' otherwise.
-- Each resource on its own, in order. First, always: our own entries (ARGV[1] and ARGV[2])
-- leave the queue, whether or not the key holds our token, so no later release can
-- transfer to a holder that is done.
-- If the key does not hold our token: {0, waiters}. Otherwise lapsed entries are purged
-- and the head is popped:
-- * a transfer entry ('t', 'f'): the key is set to its token with its TTL; 'f' also
--   raises the fence counter as acquire_fenced.lua does (a bad counter: no transfer, the
--   key is deleted and the waiter named instead); announced as
--   "<our token's first 8 chars>:>:<token>[:<fence>]" on the entry's channel when it has
--   one (only its waiter listens there), else on the resource's; {2, waiters left, fence}
--   (fence 0 for 't');
-- * a name-only entry ('n', or no attributes), when loud: the key is deleted,
--   "<prefix>:<token>" announced; {1, waiters left + 1};
-- * otherwise (empty queue; or a name-only head on a node that does not name): the key
--   is deleted, "<prefix>" announced when loud; {1, waiters}.
-- An emptied queue is deleted; otherwise its keys expire with the latest lease left.
-- Returns, for one resource, its answer as above; for several, {keys that left our
-- token (deleted or transferred), the most waiters any of them had}.
local token, waiter = ARGV[1], ARGV[2]
local prefix = string.sub(token, 1, 8)

local function tidy(queue, leases, attrs)
  local last = redis.call('ZRANGE', leases, -1, -1, 'WITHSCORES')
  if #last == 0 then
    redis.call('DEL', queue, leases, attrs)
  else
    redis.call('PEXPIREAT', queue, last[2])
    redis.call('PEXPIREAT', leases, last[2])
    redis.call('PEXPIREAT', attrs, last[2])
  end
end

local function drop(queue, leases, attrs, entry)
  redis.call('ZREM', queue, entry)
  redis.call('ZREM', leases, entry)
  redis.call('HDEL', attrs, entry)
end

-- A fenced transfer's counter, raised as acquire_fenced.lua raises it; nil (nothing
-- written) when the counter is not a plain decimal integer below 2^53.
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
  local floor = tonumber(now_us)
  if c + 1 > floor then
    return redis.call('INCR', fence)
  end
  redis.call('SET', fence, now_us)
  return floor
end

-- The release of one resource: its keys start at KEYS[k], its channel at ARGV[a].
local function release(k, a)
  local key, queue, leases, attrs, fence = KEYS[k], KEYS[k + 1], KEYS[k + 2], KEYS[k + 3], KEYS[k + 4]
  local channel, loud = ARGV[a], ARGV[a + 1] == '1'
  drop(queue, leases, attrs, token)
  if waiter ~= '' then
    drop(queue, leases, attrs, waiter)
  end
  if redis.call('GET', key) ~= token then
    return {0, redis.call('ZCARD', queue)}
  end
  if redis.call('EXISTS', leases) == 1 then
    local t = redis.call('TIME')
    local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    local lapsed = redis.call('ZRANGEBYSCORE', leases, '-inf', now)
    for i = 1, #lapsed do
      redis.call('ZREM', queue, lapsed[i])
      redis.call('HDEL', attrs, lapsed[i])
    end
    redis.call('ZREMRANGEBYSCORE', leases, '-inf', now)
    local head = redis.call('ZRANGE', queue, 0, 0)
    if #head > 0 then
      local tok = head[1]
      local attr = redis.call('HGET', attrs, tok)
      local ttl, kind, inbox = nil, 'n', channel
      if attr then
        local x, y, c = string.match(attr, '^(%d+):([tfn]):(.+)$')
        if not x then
          x, y = string.match(attr, '^(%d+):([tfn])$')
        end
        if x then
          ttl, kind = x, y
          if c then
            inbox = c
          end
        end
      end
      if ttl == nil or tonumber(ttl) == 0 then
        kind = 'n'
      end
      if kind ~= 'n' or loud then
        drop(queue, leases, attrs, tok)
        local fenced = 0
        if kind == 'f' then
          fenced = raise(fence, t)
          if fenced == nil then
            kind, fenced = 'n', 0
          end
        end
        tidy(queue, leases, attrs)
        local left = redis.call('ZCARD', queue)
        if kind == 'n' then
          redis.call('DEL', key)
          redis.call('PUBLISH', channel, prefix .. ':' .. tok)
          return {1, left + 1}
        end
        redis.call('SET', key, tok, 'PX', ttl)
        local payload = prefix .. ':>:' .. tok
        if fenced > 0 then
          payload = payload .. ':' .. string.format('%.0f', fenced)
        end
        redis.call('PUBLISH', inbox, payload)
        return {2, left, fenced}
      end
    end
    tidy(queue, leases, attrs)
  end
  redis.call('DEL', key)
  if loud then
    redis.call('PUBLISH', channel, prefix)
  end
  return {1, redis.call('ZCARD', queue)}
end

local n = #KEYS / 5
if n == 1 then
  return release(1, 3)
end
local left, most = 0, 0
for r = 0, n - 1 do
  local got = release(5 * r + 1, 2 * r + 3)
  if got[1] > 0 then
    left = left + 1
  end
  if got[2] > most then
    most = got[2]
  end
end
return {left, most}
