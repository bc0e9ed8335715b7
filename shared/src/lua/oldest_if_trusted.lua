-- What bounds a device's watermark, only if its pending set is trusted in this epoch
-- (its marker names the epoch): the pending set's oldest member, or the low end of its
-- overflow band when that is lower (those messages are neither acked nor pending).
--
-- KEYS: devices hash, pending set, overflow hash. ARGV: marker field, epoch, device.
-- Returns: false (not trusted), '' (nothing pending) or the oldest fixed-width id.
if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then
  return false
end
local m = redis.call('ZRANGE', KEYS[2], 0, 0)[1] or ''
local band = redis.call('HGET', KEYS[3], ARGV[3])
if band then
  local low = string.match(band, '^(%d+)')
  if low and (m == '' or low < m) then
    m = low
  end
end
return m
