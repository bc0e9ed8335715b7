-- Extends a lease if this holder still has it.
--
-- KEYS: lease key. ARGV: holder token, ttl ms.
-- Returns: 1 when renewed, 0 when the lease is gone or someone else's.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
