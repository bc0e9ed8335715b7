-- Gives a lease up if this holder still has it.
--
-- KEYS: lease key. ARGV: holder token.
-- Returns: 1 when released, else 0.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
