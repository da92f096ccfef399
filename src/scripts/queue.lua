-- Wait-queue helpers, put in front of enqueue.lua, listen.lua and handoff.lua (node.rs's
-- `lua!` with `queue`); they only define functions, so nothing runs until called.
-- A resource's waiting state is three keys, passed as a table q: q[1] the queue (tokens
-- by ticket), q[2] the leases (each waiter's token, or a listener's id, by the server
-- time in ms at which it lapses unless renewed), q[3] the attributes (token ->
-- "<ttl ms>:<kind>[:<channel>]"). The leases key exists exactly while someone waits or
-- listens: it is the marker release_one.lua looks at (one EXISTS) before anything else.

-- Resource r's (from 0) queue keys (a table q as above) and lock key, for the scripts
-- that take four keys per resource (enqueue.lua, listen.lua): the one place that layout
-- is read.
local function group(r)
  return {KEYS[4 * r + 1], KEYS[4 * r + 2], KEYS[4 * r + 3]}, KEYS[4 * r + 4]
end

-- This server's clock: its time in ms, and TIME's raw answer.
local function clock()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000), t
end

-- Removes one entry from a queue's three keys.
local function drop(q, entry)
  redis.call('ZREM', q[1], entry)
  redis.call('ZREM', q[2], entry)
  redis.call('HDEL', q[3], entry)
end

-- Removes a releaser's own entry (its token, or its listener id), usually gone already (a
-- lock handed over pops its entry): one ZREM then. Every entry of the queue and of the
-- attributes has a lease (a join writes all three, and drop and purge remove all three;
-- the three keys expire together), so an entry without one is in neither. Only a lost
-- leases key (evicted: the deployment contract asks for noeviction) breaks that; the
-- releaser's own entry would then stay queued, and a release could hand the key to that
-- finished token: the lock would sit unused on that node until its TTL.
local function leave(q, entry)
  if redis.call('ZREM', q[2], entry) == 1 then
    redis.call('ZREM', q[1], entry)
    redis.call('HDEL', q[3], entry)
  end
end

-- Removes the entries whose lease lapsed by `now` (each entry is purged once: amortized
-- O(log n) per entry; one read when none lapsed).
local function purge(q, now)
  local lapsed = redis.call('ZRANGEBYSCORE', q[2], '-inf', now)
  if #lapsed == 0 then
    return
  end
  for i = 1, #lapsed do
    redis.call('ZREM', q[1], lapsed[i])
    redis.call('HDEL', q[3], lapsed[i])
  end
  redis.call('ZREMRANGEBYSCORE', q[2], '-inf', now)
end

-- The queue's keys expire with its latest lease (PEXPIREAT, not PEXPIRE GT: GT takes a
-- key without an expiry for infinite), or are deleted when no lease is left.
local function tidy(q)
  local last = redis.call('ZRANGE', q[2], -1, -1, 'WITHSCORES')
  if #last == 0 then
    redis.call('DEL', q[1], q[2], q[3])
  else
    for i = 1, 3 do
      redis.call('PEXPIREAT', q[i], last[2])
    end
  end
end

