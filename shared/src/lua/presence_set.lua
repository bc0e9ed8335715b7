-- Sets a device's presence to this session, returning what was there before (the
-- session it replaces, maybe on another node) and how many devices of the user are
-- connected now (1 with no previous value: the user has just come online).
--
-- KEYS: presence hash. ARGV: device, value (node|session), ttl ms.
-- Returns: {the previous value or false, the devices connected}.
local old = redis.call('HGET', KEYS[1], ARGV[1])
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return {old, redis.call('HLEN', KEYS[1])}
