-- Sets a device's presence to this session, returning what was there before (the
-- session it replaces, maybe on another node) and how many devices of the user are
-- connected now (1 with no previous value: the user has just come online) -- unless
-- a newer session of the device claimed it already: sessions are ordered by the epoch
-- each drew when it was admitted (`session:{device}` in the devices hash, HINCRBY), so a
-- session whose claim lands late never replaces the newer one.
--
-- KEYS: presence hash, devices hash. ARGV: device, value (node|session|flags), ttl ms, epoch.
-- Returns: {the previous value or false, the devices connected, 1 when claimed or 0
-- when a newer session holds the device (nothing changed)}.
local claimed = tonumber(redis.call('HGET', KEYS[2], 'claimed:' .. ARGV[1]) or '0')
if tonumber(ARGV[4]) < claimed then
  return {false, redis.call('HLEN', KEYS[1]), 0}
end
redis.call('HSET', KEYS[2], 'claimed:' .. ARGV[1], ARGV[4])
local old = redis.call('HGET', KEYS[1], ARGV[1])
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return {old, redis.call('HLEN', KEYS[1]), 1}
