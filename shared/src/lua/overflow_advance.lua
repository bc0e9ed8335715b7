-- Moves a device's overflow band's low end up once the device acked everything below
-- it, or removes the band once it is passed: only if the band is still the one the
-- session read (a fan-out may have widened it meanwhile).
--
-- KEYS: overflow hash. ARGV: device, the band as read ("low high"), new low.
-- Returns: 1 when moved or removed, 0 when the band changed (read it again).
local cur = redis.call('HGET', KEYS[1], ARGV[1])
if cur ~= ARGV[2] then
  return 0
end
local high = string.match(cur, ' (%d+)$')
if ARGV[3] > high then
  redis.call('HDEL', KEYS[1], ARGV[1])
else
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[3] .. ' ' .. high)
end
return 1
