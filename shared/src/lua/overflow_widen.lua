-- Widens a device's overflow band to cover low..high (fixed-width ids): messages in
-- the band may be missing from the pending set and are read from MySQL instead. Then
-- marks the set trusted in the epoch: only once the band covers what it may lack.
--
-- KEYS: overflow hash, the user's device registry (`devs`). ARGV: device, low, high,
-- the device's epoch marker field, the epoch.
-- Returns: the band now ("low high").
local low, high = ARGV[2], ARGV[3]
local prev = redis.call('HGET', KEYS[1], ARGV[1])
if prev then
  local pl, ph = string.match(prev, '^(%d+) (%d+)$')
  pl = pl or prev
  ph = ph or high
  if pl < low then low = pl end
  if ph > high then high = ph end
end
local band = low .. ' ' .. high
redis.call('HSET', KEYS[1], ARGV[1], band)
redis.call('HSET', KEYS[2], ARGV[4], ARGV[5])
return band
