-- Multi-resource wait-queue entries (enqueue_many.lua), for the scripts that read them:
-- this file is put in front of release_one.lua, enqueue.lua and enqueue_many.lua (node.rs's
-- `lua!` with `sets`), which share its local functions.

-- The entries of a set key's text: "<length>:<bytes>" each (a malformed rest is ignored).
local function entries(raw)
  local out, i = {}, 1
  while i <= #raw do
    local _, e, digits = string.find(raw, '^(%d+):', i)
    if not e then
      return out
    end
    local len = tonumber(digits)
    out[#out + 1] = string.sub(raw, e + 1, e + len)
    i = e + len + 1
  end
  return out
end

-- For each multi-resource entry looked at (by token and attributes): the lock keys of its
-- set that hold another token, with that token (empty for any other entry).
local held_by_others = {}
local function others_of(attr, tok)
  local memo = tok .. ' ' .. (attr or '')
  if held_by_others[memo] then
    return held_by_others[memo]
  end
  local out = {}
  held_by_others[memo] = out
  if not attr then
    return out
  end
  local mttl, set = string.match(attr, '^(%d+):m:(.+)$')
  if not mttl or tonumber(mttl) == 0 then
    return out
  end
  local raw = redis.call('GET', set)
  if not raw then
    return out
  end
  local e = entries(raw)
  for g = 0, math.floor((#e - 1) / 4) - 1 do
    local lock = e[4 * g + 2]
    local held = redis.call('GET', lock)
    if held and held ~= tok then
      out[#out + 1] = {lock, held}
    end
  end
  return out
end

-- Whether the entry `tok` (its attributes `attr`) is a multi-resource entry that cannot be
-- served now: a lock key of its set other than `own` (the queue's own key, which the
-- release being waited for frees) holds another token than `own`'s holder `ownv` (a
-- holder of several of its keys frees them all in that release).
local function blocked(attr, tok, own, ownv)
  local held = others_of(attr, tok)
  for i = 1, #held do
    if held[i][1] ~= own and held[i][2] ~= ownv then
      return true
    end
  end
  return false
end

-- How many entries of `queue` (of the lock key `own`) have a ticket below `score`, not
-- counting those of the first 64 of them that are blocked multi-resource entries (a release
-- serves the waiters behind such an entry, so it is not ahead of them).
local function ahead_of(queue, attrs, own, score)
  local n = redis.call('ZCOUNT', queue, '-inf', '(' .. score)
  if n == 0 then
    return 0
  end
  local ownv = redis.call('GET', own)
  local first = redis.call('ZRANGEBYSCORE', queue, '-inf', '(' .. score, 'LIMIT', 0, 64)
  for i = 1, #first do
    if blocked(redis.call('HGET', attrs, first[i]), first[i], own, ownv) then
      n = n - 1
    end
  end
  return n
end

