-- Keeps a device's presence alive; sets it again when it is missing (Redis lost its
-- data, or the key expired while Redis was unreachable), but never over another
-- session's.
--
-- KEYS: presence hash. ARGV: device, value (node|session), ttl ms.
-- Returns: 1 when it had to set the presence again, else 0.
local set = 0
if not redis.call('HGET', KEYS[1], ARGV[1]) then
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
  set = 1
end
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return set
