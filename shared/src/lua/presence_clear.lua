-- Gives up a device's presence if it is still this session's: to the device's newer
-- session on the same node when there is one (its value in ARGV[3]), else cleared.
-- A session replaced on its own node can still hold the presence: its claim reached
-- Redis after the newer session's (two pool connections), and clearing it then would
-- leave the device that is still connected without a presence, so workers would skip
-- its pushes.
--
-- KEYS: presence hash. ARGV: device, value (node|session), [successor's value].
-- Returns: 1 when given up, else 0.
if redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[2] then
  if ARGV[3] then
    redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
    return 1
  end
  return redis.call('HDEL', KEYS[1], ARGV[1])
end
return 0
