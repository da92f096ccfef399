-- A waiter for several resources (notify waiting) listens: its id goes into each
-- resource's leases (queue.lua) for the lease, not into its queue (no release hands it
-- anything), so every release of those resources here sees someone waiting and announces
-- itself. The waiter renews it while it waits; its lock's release drops it.
-- KEYS: four per resource: the queue, its leases, its attributes, the lock key (as
-- enqueue.lua's). ARGV[1]: the listener's id. ARGV[2]: the lease (ms). ARGV[3] (may be
-- absent): the token of the waiter's own latest attempt, refused; a key holding it counts
-- as free (that attempt's clean-up is on its way: it may have landed here after the
-- attempt was decided).
-- Returns 1 when no lock key of the set is held here by another, else 0.
local now = clock()
local free = 1
for r = 0, #KEYS / 4 - 1 do
  local q, lock = group(r)
  purge(q, now)
  redis.call('ZADD', q[2], now + tonumber(ARGV[2]), ARGV[1])
  tidy(q)
  -- pcall: a key of another type is held (an error table is not the token), and the
  -- marks of the other resources are still made.
  local holder = redis.pcall('GET', lock)
  if holder and holder ~= ARGV[3] then
    free = 0
  end
end
return free
