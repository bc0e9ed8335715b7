-- Reads a pending set's oldest member, only if the set is trusted in this epoch (its
-- device's marker names the epoch).
--
-- KEYS: devices hash, pending set. ARGV: marker field, epoch.
-- Returns: false (not trusted), '' (empty) or the oldest member.
if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then
  return false
end
local m = redis.call('ZRANGE', KEYS[2], 0, 0)
return m[1] or ''
