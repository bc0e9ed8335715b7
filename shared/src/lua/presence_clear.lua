-- Gives up a device's presence if it is still this session's: to the device's newer
-- session on the same node when there is one (its value in ARGV[3]), else cleared.
-- A session replaced on its own node can still hold the presence: its claim reached
-- Redis after the newer session's (two pool connections), and clearing it then would
-- leave the device that is still connected without a presence, so workers would skip
-- its pushes.
--
-- KEYS: presence hash. ARGV: device, value (node|session|flags), [successor's value].
-- Returns: 0 when it was not this session's; 1 when given up and the user still has a
-- device connected; 2 when cleared and none is left (the user has gone offline).
if redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[2] then
  if ARGV[3] then
    redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
    return 1
  end
  redis.call('HDEL', KEYS[1], ARGV[1])
  if redis.call('HLEN', KEYS[1]) == 0 then
    return 2
  end
  return 1
end
return 0
