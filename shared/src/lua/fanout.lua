-- Adds messages to the pending sets of one user's devices and reports where each
-- device is connected. One Redis Cluster slot: every key is the user's.
-- A set over the cap drops its oldest entries and widens the device's overflow band
-- ("low high", fixed-width ids) to cover them: the device reads that band from MySQL
-- before its pending set (the gateway's backlog pager).
--
-- KEYS: presence, overflow, pending set of device 1..n.
-- ARGV: cap, n, then per device: device id, count, count x (score, member).
-- Returns: device 1, presence of device 1 (or false), ..., for every device.
local cap = tonumber(ARGV[1])
local n = tonumber(ARGV[2])
local pos = 3
local out = {}
for i = 1, n do
  local dev = ARGV[pos]
  local count = tonumber(ARGV[pos + 1])
  pos = pos + 2
  local key = KEYS[i + 2]
  local j = 0
  while j < count do
    local args = {}
    local chunk = math.min(count - j, 500)
    for k = 1, chunk do
      args[#args + 1] = ARGV[pos]
      args[#args + 1] = ARGV[pos + 1]
      pos = pos + 2
    end
    redis.call('ZADD', key, unpack(args))
    j = j + chunk
  end
  local card = redis.call('ZCARD', key)
  if card > cap then
    local dropped = redis.call('ZRANGE', key, 0, card - cap - 1)
    redis.call('ZREMRANGEBYRANK', key, 0, card - cap - 1)
    local low, high = dropped[1], dropped[#dropped]
    local prev = redis.call('HGET', KEYS[2], dev)
    if prev then
      local pl, ph = string.match(prev, '^(%d+) (%d+)$')
      -- A mark of an older version holds only its low end.
      pl = pl or prev
      ph = ph or high
      if pl < low then low = pl end
      if ph > high then high = ph end
    end
    redis.call('HSET', KEYS[2], dev, low .. ' ' .. high)
  end
  out[#out + 1] = dev
  out[#out + 1] = redis.call('HGET', KEYS[1], dev)
end
return out
