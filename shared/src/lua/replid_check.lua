-- Starts a new epoch when the Redis master changed under the same address: a replica
-- promoted after its master died keeps the master's data up to the last write it
-- received, and silently lacks the rest, so every pending set must be read again.
-- The replication id a master reports changes on promotion.
--
-- KEYS: the replication id seen last, the epoch. ARGV: the master's replication id now,
-- a fresh epoch.
-- Returns: 1 when a new epoch began, else 0.
local seen = redis.call('GET', KEYS[1])
if not seen then
  redis.call('SET', KEYS[1], ARGV[1])
  return 0
end
if seen == ARGV[1] then
  return 0
end
redis.call('SET', KEYS[1], ARGV[1])
redis.call('SET', KEYS[2], ARGV[2])
return 1
