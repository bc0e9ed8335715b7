-- Starts a new epoch when the master of a Redis shard changed: a replica promoted after
-- its master died keeps the master's data up to the last write it received, and
-- silently lacks the rest, so every pending set must be read again. The replication id
-- a master reports changes on promotion. A standalone Redis is one shard; a cluster's
-- shards are named by the lowest slot their master serves, which a promoted replica
-- takes over with the rest of its master's slots.
--
-- KEYS: the replication ids seen last (a hash: shard -> id, in the epoch's slot), the
-- epoch. ARGV: a fresh epoch, then pairs of a shard and its master's replication id now.
-- Returns: the shards whose master changed; a new epoch began when there is any.
local changed = {}
for i = 2, #ARGV, 2 do
  local seen = redis.call('HGET', KEYS[1], ARGV[i])
  if seen ~= ARGV[i + 1] then
    redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
    if seen then
      changed[#changed + 1] = ARGV[i]
    end
  end
end
if #changed > 0 then
  redis.call('SET', KEYS[2], ARGV[1])
end
return changed
