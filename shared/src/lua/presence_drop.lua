-- Drops presence entries left by sessions that no longer exist (their gateway died,
-- or it restarted under the same node id): each given device's entry is removed only
-- if it still holds the given value, so a device that connected again elsewhere
-- keeps its new entry.
--
-- KEYS: presence hash. ARGV: device, value, device, value, ...
-- Returns: {entries dropped, devices of the user still connected}.
local dropped = 0
for i = 1, #ARGV, 2 do
  if redis.call('HGET', KEYS[1], ARGV[i]) == ARGV[i + 1] then
    redis.call('HDEL', KEYS[1], ARGV[i])
    dropped = dropped + 1
  end
end
return {dropped, redis.call('HLEN', KEYS[1])}
