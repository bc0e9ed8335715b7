-- Widens a device's overflow band to cover low..high (fixed-width ids): messages in
-- the band may be missing from the pending set and are read from MySQL instead.
--
-- KEYS: overflow hash. ARGV: device, low, high.
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
return band
