-- Compare-and-delete for a mutex of one or more resources, handing each key to its wait
-- queue's head (one waiter per key). Runs on every node.
-- KEYS, five per resource: the lock key; the wait queue (tokens by ticket); the leases;
-- the attributes (token -> "<ttl ms>:<kind>[:<channel>]", see enqueue.lua); the
-- resource's fence counter. Then, optionally, one more: the releaser's set key (see
-- enqueue_many.lua), deleted first.
-- ARGV[1]: our token. ARGV[2]: the queue entry this holder waited under ('' if none).
-- Then two per resource, in the order of KEYS: its channel; '1' when this node announces
-- the resource's plain releases and names its name-only entries (a herald, notify
-- waiting), '0' otherwise.
-- First, always: our own entries (ARGV[1] and ARGV[2]) leave every resource's queue
-- (where the queue exists), whether or not the keys hold our token, so no later release
-- can transfer to a holder that is done. Then each resource on its own, in order.
-- If the key does not hold our token: {0, waiters}. Otherwise lapsed entries are purged
-- and the head is looked at:
-- * a multi-resource entry ('m', "<ttl ms>:m:<set key>", see enqueue_many.lua): the
--   waiter gets every key of its set at once, or none. When each of its lock keys is free
--   (or holds our token: it is being released here) and its token heads each of its
--   queues (lapsed entries purged), its token leaves each of those queues, each key is
--   set to it with its TTL, the set key is deleted, "<prefix>:>:<token>" is announced on
--   the waiter's channel and {2, waiters left, 0} returned. Otherwise the entry stays at
--   the head, and the key goes to the first of the next BACKFILL entries that can be
--   served now: a transfer entry as below, or a multi-resource entry as above (heading
--   each of its other queues; only entries ahead of it here); with none, the key is
--   deleted as below (a plain release). An entry whose set key is gone (lapsed) leaves
--   this queue;
-- * else the head is popped. A transfer entry ('t', 'f'): the key is set to its token
--   with its TTL; 'f' also raises the fence counter as acquire_fenced.lua does (a bad
--   counter: no transfer, the key is deleted and the waiter named instead); announced as
--   "<our token's first 8 chars>:>:<token>[:<fence>]" on the entry's channel when it has
--   one (only its waiter listens there), else on the resource's; {2, waiters left, fence}
--   (fence 0 for 't');
-- * a name-only entry ('n', or no attributes), when loud: the key is deleted,
--   "<prefix>:<token>" announced; {1, waiters left + 1};
-- * otherwise (empty queue; or a name-only head on a node that does not name): the key
--   is deleted, "<prefix>" announced when loud; {1, waiters}.
-- An emptied queue is deleted; otherwise its keys expire with the latest lease left.
-- Returns, for one resource, its answer as above; for several, {how many resources'
-- releases found our token (a key handed over with an earlier resource's is not counted
-- again), the most waiters any of them had or subscribers a plain announcement reached}.
-- A wrong number of keys or arguments is an error (nothing written).
local token, waiter = ARGV[1], ARGV[2]
local prefix = string.sub(token, 1, 8)

-- A channel that holds byte 0xFE (the shard mark, right after "<namespace>:released:";
-- it never occurs in UTF-8, so never in a namespace or a name) is a shard channel, in this
-- script's slot (Redis Cluster voters): SPUBLISH keeps the message on this shard.
local function publish(channel, message)
  if string.find(channel, '\254', 1, true) then
    return redis.call('SPUBLISH', channel, message)
  end
  return redis.call('PUBLISH', channel, message)
end
-- The most subscribers one plain announcement reached.
local heard = 0

local function announce(channel)
  local got = publish(channel, prefix)
  if got > heard then
    heard = got
  end
end

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

-- Purges the lapsed entries of one queue (its queue, leases and attributes keys).
local function purge(queue, leases, attrs, now)
  local lapsed = redis.call('ZRANGEBYSCORE', leases, '-inf', now)
  for i = 1, #lapsed do
    redis.call('ZREM', queue, lapsed[i])
    redis.call('HDEL', attrs, lapsed[i])
  end
  redis.call('ZREMRANGEBYSCORE', leases, '-inf', now)
end

-- A multi-resource entry `tok`: every key of its set, or none. It must head each of its
-- queues, except `at` (a queue where only entries that cannot be served now are ahead of
-- it; nil for none). Returns 'moved', 'blocked', or 'gone' (its set key lapsed).
local function hand_set(tok, ttl, set, now, at)
  local raw = redis.call('GET', set)
  if not raw then
    return 'gone'
  end
  local e = entries(raw)
  local groups = math.floor((#e - 1) / 4)
  if groups < 1 then
    return 'gone'
  end
  for g = 0, groups - 1 do
    local lock, queue, leases, attrs = e[4 * g + 2], e[4 * g + 3], e[4 * g + 4], e[4 * g + 5]
    purge(queue, leases, attrs, now)
    if queue ~= at then
      local head = redis.call('ZRANGE', queue, 0, 0)
      if #head == 0 or head[1] ~= tok then
        return 'blocked'
      end
    end
    local held = redis.call('GET', lock)
    if held and held ~= token then
      return 'blocked'
    end
  end
  for g = 0, groups - 1 do
    local lock, queue, leases, attrs = e[4 * g + 2], e[4 * g + 3], e[4 * g + 4], e[4 * g + 5]
    drop(queue, leases, attrs, tok)
    tidy(queue, leases, attrs)
    redis.call('SET', lock, tok, 'PX', ttl)
  end
  redis.call('DEL', set)
  publish(e[1], prefix .. ':>:' .. tok)
  return 'moved'
end

-- What an entry's attributes say: 'm' with its TTL and set key; else 't', 'f' or 'n' with
-- its TTL and the channel its transfer is announced on (`channel` when it names none). No
-- attributes, an unreadable text or a TTL of 0: 'n'.
local function kind_of(attr, channel)
  if attr then
    local mttl, set = string.match(attr, '^(%d+):m:(.+)$')
    if mttl and tonumber(mttl) > 0 then
      return 'm', mttl, set
    end
  end
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
  return kind, ttl, inbox
end

-- Hands the key to the entry `tok` of kind 't' or 'f' (its TTL, its channel), or names a
-- name-only one ('n'): pops it first. A fenced entry whose counter is unreadable is named.
local function give(key, queue, leases, attrs, fence, channel, t, tok, kind, ttl, inbox)
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
    publish(channel, prefix .. ':' .. tok)
    return {1, left + 1}
  end
  redis.call('SET', key, tok, 'PX', ttl)
  local payload = prefix .. ':>:' .. tok
  if fenced > 0 then
    payload = payload .. ':' .. string.format('%.0f', fenced)
  end
  publish(inbox, payload)
  return {2, left, fenced}
end

-- How many entries behind a blocked multi-resource head a release looks at for one it can
-- serve now.
local BACKFILL = 8

-- The release of one resource: its keys start at KEYS[k], its channel at ARGV[a].
local function release(k, a)
  local key, queue, leases, attrs, fence = KEYS[k], KEYS[k + 1], KEYS[k + 2], KEYS[k + 3], KEYS[k + 4]
  local channel, loud = ARGV[a], ARGV[a + 1] == '1'
  if redis.call('GET', key) ~= token then
    return {0, redis.call('ZCARD', queue)}
  end
  if redis.call('EXISTS', leases) == 1 then
    local t = redis.call('TIME')
    local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    purge(queue, leases, attrs, now)
    local head = redis.call('ZRANGE', queue, 0, 0)
    if #head > 0 then
      local tok = head[1]
      local kind, ttl, x = kind_of(redis.call('HGET', attrs, tok), channel)
      if kind == 'm' then
        local got = hand_set(tok, ttl, x, now, nil)
        if got == 'gone' then
          drop(queue, leases, attrs, tok)
        elseif got == 'blocked' then
          -- Another of its keys is held: serve the first entry behind it that can be
          -- served now (it keeps its place, and gets its set at the first release that
          -- finds all of it free), so that no free key waits for a held one.
          local behind = redis.call('ZRANGE', queue, 1, BACKFILL)
          for i = 1, #behind do
            local e = behind[i]
            local ek, ettl, ex = kind_of(redis.call('HGET', attrs, e), channel)
            if ek == 'm' then
              if hand_set(e, ettl, ex, now, queue) == 'moved' then
                got = 'moved'
                break
              end
            elseif ek ~= 'n' then
              return give(key, queue, leases, attrs, fence, channel, t, e, ek, ettl, ex)
            end
          end
        end
        if got == 'moved' then
          -- (Its set names this key; should it not, the key still leaves our token.)
          if redis.call('GET', key) == token then
            redis.call('DEL', key)
          end
          return {2, redis.call('ZCARD', queue), 0}
        end
        tidy(queue, leases, attrs)
        redis.call('DEL', key)
        if loud then
          announce(channel)
        end
        return {1, redis.call('ZCARD', queue)}
      end
      if kind ~= 'n' or loud then
        return give(key, queue, leases, attrs, fence, channel, t, tok, kind, ttl, x)
      end
    end
    tidy(queue, leases, attrs)
  end
  redis.call('DEL', key)
  if loud then
    announce(channel)
  end
  return {1, redis.call('ZCARD', queue)}
end

local n = math.floor(#KEYS / 5)
local extra = #KEYS - 5 * n
if n < 1 or extra > 1 or #ARGV ~= 2 + 2 * n then
  return redis.error_reply('ERR release_one: five keys and two arguments per resource')
end
if extra == 1 then
  redis.call('DEL', KEYS[#KEYS])
end
for r = 0, n - 1 do
  local queue, leases, attrs = KEYS[5 * r + 2], KEYS[5 * r + 3], KEYS[5 * r + 4]
  if redis.call('EXISTS', queue) == 1 then
    drop(queue, leases, attrs, token)
    if waiter ~= '' then
      drop(queue, leases, attrs, waiter)
    end
  end
end
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
if heard > most then
  most = heard
end
return {left, most}
