-- Join or renew a waiter's place in a resource's wait queue (single-resource mutex).
-- KEYS[1]: the queue (tokens by ticket). KEYS[2]: the leases (tokens by the server time,
-- in ms, at which each entry lapses unless its waiter renews it). KEYS[3]: the entries'
-- attributes (a hash: token -> "<ttl ms>:<kind>"). KEYS[4]: the lock key.
-- ARGV[1]: the waiter's token (the lock token it will hold). ARGV[2]: its ticket (the
-- score), or '' to have this node assign one: this server's time in us. ARGV[3]: the
-- lease (ms). ARGV[4]: the TTL (ms) a transfer sets the key with. ARGV[5]: the kind: 't'
-- transfer, 'f' fenced transfer, 'n' name-only. ARGV[6]: '1' for the first join of this
-- token on this node, '0' for a renewal. ARGV[7]: the channel a transfer to this entry is
-- announced on (the waiter's own), or '' for the resource's channel.
-- The attributes are "<ttl ms>:<kind>", or "<ttl ms>:<kind>:<channel>" with a channel.
-- A token is added at most once per node: only a first join adds it, and not when the
-- lock key already holds it. A renewal of a token that is not queued (popped by a
-- transfer or a naming, or lapsed) never adds it back: it answers gone.
-- Lapsed entries are purged first; the queue's keys expire with the latest lease.
-- Returns {state, ahead, score, holds, free}: state 0 queued (renewed), 1 added, 2 gone; ahead
-- how many live entries have an earlier ticket, blocked multi-resource entries not counted
-- (nil when not queued: entries with the same ticket, a waiter's retired tokens, are not
-- ahead of it); score its ticket here
-- (nil when not queued); holds 1 when the lock key holds the token; free 1 when the lock
-- key is absent (a waiter at the head claims on a quorum of those: a release it heard may
-- have reached this node only after its claim was refused here, and is not announced
-- twice).

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lapsed = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now)
for i = 1, #lapsed do
  redis.call('ZREM', KEYS[1], lapsed[i])
  redis.call('HDEL', KEYS[3], lapsed[i])
end
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
local held = redis.call('GET', KEYS[4])
local holds, free = 0, 0
if held == ARGV[1] then
  holds = 1
elseif not held then
  free = 1
end
local state = 2
if redis.call('ZSCORE', KEYS[1], ARGV[1]) then
  state = 0
  redis.call('ZADD', KEYS[2], now + tonumber(ARGV[3]), ARGV[1])
elseif ARGV[6] == '1' and holds == 0 then
  local ticket = ARGV[2]
  if ticket == '' then
    ticket = string.format('%.0f', tonumber(t[1]) * 1000000 + tonumber(t[2]))
  end
  redis.call('ZADD', KEYS[1], ticket, ARGV[1])
  redis.call('ZADD', KEYS[2], now + tonumber(ARGV[3]), ARGV[1])
  local attr = ARGV[4] .. ':' .. ARGV[5]
  if ARGV[7] ~= nil and ARGV[7] ~= '' then
    attr = attr .. ':' .. ARGV[7]
  end
  redis.call('HSET', KEYS[3], ARGV[1], attr)
  state = 1
end
local last = redis.call('ZRANGE', KEYS[2], -1, -1, 'WITHSCORES')
if #last == 0 then
  redis.call('DEL', KEYS[1], KEYS[2], KEYS[3])
else
  redis.call('PEXPIREAT', KEYS[1], last[2])
  redis.call('PEXPIREAT', KEYS[2], last[2])
  redis.call('PEXPIREAT', KEYS[3], last[2])
end
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
local ahead = false
if score then
  ahead = ahead_of(KEYS[1], KEYS[3], KEYS[4], score)
end
return {state, ahead, score, holds, free}
