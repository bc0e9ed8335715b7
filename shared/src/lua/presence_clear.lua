-- Clears a device's presence if it is still this session's.
--
-- KEYS: presence hash. ARGV: device, value (node|session).
-- Returns: 1 when cleared, else 0.
if redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[2] then
  return redis.call('HDEL', KEYS[1], ARGV[1])
end
return 0
