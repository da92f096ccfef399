-- Join or renew a waiter's place in a resource's wait queue (single-resource mutex).
-- KEYS: the queue, its leases, its attributes (queue.lua), the lock key.
-- ARGV[1]: the waiter's token (the lock token it will hold). ARGV[2]: its ticket (the
-- score), or '' to have this node assign one: this server's time in us. ARGV[3]: the
-- lease (ms). ARGV[4]: the TTL (ms) a transfer sets the key with. ARGV[5]: the kind: 't'
-- transfer, 'f' fenced transfer. ARGV[6]: '1' for the first join of this token on this
-- node, '0' for a renewal. ARGV[7]: the channel a transfer to this entry is announced on
-- (the waiter's own), or '' for the resource's channel.
-- A token is added at most once per node: only a first join adds it, and not when the
-- lock key already holds it. A renewal of a token that is not queued (popped by a
-- transfer, or lapsed) never adds it back: it answers gone.
-- Returns {state, ahead, score, holds, free}: state 0 queued (renewed), 1 added, 2 gone;
-- ahead how many entries have an earlier ticket (a waiter's retired tokens share its
-- ticket and are not ahead of it) and score its ticket (a first join answers it as given
-- or built here, a renewal as ZSCORE prints it), both nil when not queued; holds 1
-- when the lock key holds the token; free 1 when the lock key is absent (a waiter at the
-- head claims on a quorum of those: a release may have run before its join landed).
local q, lock = group(0)
local token = ARGV[1]
local now, t = clock()
purge(q, now)
local held = redis.call('GET', lock)
local holds = held == token and 1 or 0
local free = held and 0 or 1
local lapse = now + tonumber(ARGV[3])
local state = 2
local score = redis.call('ZSCORE', q[1], token)
if score then
  state = 0
  redis.call('ZADD', q[2], lapse, token)
elseif ARGV[6] == '1' and holds == 0 then
  local ticket = ARGV[2]
  if ticket == '' then
    ticket = t[1] .. string.format('%06d', tonumber(t[2]))
  end
  redis.call('ZADD', q[1], ticket, token)
  -- The ticket as given (a herald's printed score) or as built here: the text ZSCORE
  -- would answer for the digits clients send, and the very bound ZCOUNT reads below.
  score = ticket
  redis.call('ZADD', q[2], lapse, token)
  local attr = ARGV[4] .. ':' .. ARGV[5]
  if (ARGV[7] or '') ~= '' then
    attr = attr .. ':' .. ARGV[7]
  end
  redis.call('HSET', q[3], token, attr)
  state = 1
end
tidy(q)
local ahead = false
if score then
  ahead = redis.call('ZCOUNT', q[1], '-inf', '(' .. score)
end
return {state, ahead, score, holds, free}
