-- Keeps a device's presence alive; sets it again when it is missing (Redis lost its
-- data, or the key expired while Redis was unreachable), but never over another
-- session's, nor for a session a newer one of the device has claimed over (its kick
-- was lost).
--
-- KEYS: presence hash, devices hash. ARGV: device, value (node|session|flags), ttl ms, epoch.
-- Returns: 1 when it had to set the presence again, 2 when a newer session holds the
-- device (this one must end), else 0.
local claimed = tonumber(redis.call('HGET', KEYS[2], 'claimed:' .. ARGV[1]) or '0')
if tonumber(ARGV[4]) < claimed then
  return 2
end
local set = 0
if not redis.call('HGET', KEYS[1], ARGV[1]) then
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
  set = 1
end
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return set
