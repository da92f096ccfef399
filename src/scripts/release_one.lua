-- Compare-and-delete for a mutex of one or more resources, with hand-off where someone
-- waits. Runs on every node. node.rs puts queue.lua and handoff.lua after this part: only
-- a resource someone waits for or listens to runs them.
-- KEYS, five per resource: the lock key; its queue, leases and attributes (queue.lua);
-- its fence counter.
-- ARGV[1]: our token. ARGV[2]: the queue entry this holder waited under, or its listener
-- id ('' if none). Then two per resource, in the order of KEYS: its channel; '1' when this
-- node announces the resource's plain releases (notify waiting: the resource's heralds
-- for a lock on one resource, every node for several), '0' otherwise.
-- A resource whose leases key is absent (no one waits or listens) is released as a plain
-- compare-and-delete: GET, DEL, nothing announced, nothing else looked at.
-- Returns, for one resource no one waits for or listens to: 1 when the key held our token
-- and was deleted, 0 when it did not hold it. For one resource someone waits for: {1,
-- waiters} or {0, waiters} as above, {2, waiters left, fence} when it was handed to the
-- queue's head (handoff.lua). For several: {how many keys held our token, the most
-- waiters any queue had or subscribers a plain announcement reached}. A wrong number of
-- keys or arguments is an error (nothing written).

-- The uncontended release, first and on its own: one resource, and no one waits or
-- listens. Nothing is allocated and nothing else is read (a release's server time is
-- mostly this path; the general one below builds tables for the hand-off). Its
-- compare-and-delete is the general loop's below, written out for resource 0 (the loop
-- runs for several resources only).
local single = #KEYS == 5 and #ARGV == 4
if single and redis.call('EXISTS', KEYS[3]) == 0 then
  if redis.call('GET', KEYS[1]) == ARGV[1] then
    redis.call('DEL', KEYS[1])
    return 1
  end
  return 0
end

local n = #KEYS / 5
if n < 1 or n ~= math.floor(n) or #ARGV ~= 2 + 2 * n then
  return redis.error_reply('ERR release_one: five keys and two arguments per resource')
end
-- Resource r's (from 0) lock key, queue keys (queue.lua's q), fence counter, channel and
-- whether this node announces: the one place the layout above is read (handoff.lua too),
-- besides the uncontended path's lock and leases keys of one resource (KEYS[1], KEYS[3]).
local function resource(r)
  local k, a = 5 * r, 2 * r + 2
  return KEYS[k + 1], {KEYS[k + 2], KEYS[k + 3], KEYS[k + 4]}, KEYS[k + 5], ARGV[a + 1], ARGV[a + 2] == '1'
end
local token = ARGV[1]
local left, waited = 0, {}
if single then
  -- The path above found the leases key: someone waits or listens (not looked at again).
  waited[1] = 0
else
  for r = 0, n - 1 do
    local key, q = resource(r)
    if redis.call('EXISTS', q[2]) == 1 then
      waited[#waited + 1] = r
    elseif redis.call('GET', key) == token then
      redis.call('DEL', key)
      left = left + 1
    end
  end
end
if #waited == 0 then
  return {left, 0}
end
