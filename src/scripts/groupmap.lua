-- The group-map record: which lock groups the clients of this node route resources with.
-- KEYS[1] the record; ARGV[1] this client's map; ARGV[2] the record's lease in ms, or 0 to
-- only read it. Written with PSETEX so that a node's SET count stays the lock's attempts.
-- Reply: {1, map} when the node records no other map (written, or its lease refreshed,
-- when ARGV[2] is not 0); {0, recorded} when it records another map, which is left as is.
local cur = redis.call('GET', KEYS[1])
if cur and cur ~= ARGV[1] then
  return {0, cur}
end
-- The lease goes to Redis as the text it came as: a Lua number past 2^53 would be sent in
-- exponent form, which PSETEX and PEXPIRE refuse.
local lease = tonumber(ARGV[2])
if lease and lease > 0 then
  if not cur then
    redis.call('PSETEX', KEYS[1], ARGV[2], ARGV[1])
  elseif redis.call('PTTL', KEYS[1]) < lease then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
  end
end
return {1, ARGV[1]}
