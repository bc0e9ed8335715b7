-- Removes acked ids from the pending sets of many devices in one call: a client
-- library writes every command of a pipeline on its own, so one call instead of a ZREM
-- per set is one write. Every key must be in one Redis Cluster slot: the caller groups
-- the sets by slot (on a single Redis, any sets).
--
-- KEYS: the pending sets. ARGV: per key, its number of ids n, then its n ids.
-- Returns: per key, 1 when its ids are gone, 0 when Redis refused the removal (the key
-- holds another type); the other keys' removals are done either way.
local pos = 1
local out = {}
for k = 1, #KEYS do
  local n = tonumber(ARGV[pos])
  local from, last = pos + 1, pos + n
  pos = last + 1
  local removed = 1
  while from <= last do
    local to = math.min(last, from + 499)
    local r = redis.pcall('ZREM', KEYS[k], unpack(ARGV, from, to))
    if type(r) == 'table' and r.err then
      removed = 0
    end
    from = to + 1
  end
  out[k] = removed
end
return out
