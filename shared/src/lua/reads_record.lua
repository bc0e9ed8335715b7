-- Records a read position for one user's devices (only forward) and reports where
-- each device is connected.
--
-- KEYS: presence, then the reads hash of device 1..n.
-- ARGV: field, seq, ttl ms, device 1..n.
-- Returns: device, presence (or false), for every device.
local field, seq, ttl = ARGV[1], tonumber(ARGV[2]), ARGV[3]
local out = {}
for i = 2, #KEYS do
  local cur = redis.call('HGET', KEYS[i], field)
  if not cur or tonumber(cur) < seq then
    redis.call('HSET', KEYS[i], field, seq)
  end
  redis.call('PEXPIRE', KEYS[i], ttl)
  local dev = ARGV[i + 2]
  out[#out + 1] = dev
  out[#out + 1] = redis.call('HGET', KEYS[1], dev)
end
return out
