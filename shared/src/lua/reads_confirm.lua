-- Removes confirmed read positions unless a newer one arrived meanwhile.
--
-- KEYS: reads hash. ARGV: field, seq pairs.
-- Returns: the number of positions removed.
local n = 0
for i = 1, #ARGV, 2 do
  local cur = redis.call('HGET', KEYS[1], ARGV[i])
  if cur and tonumber(cur) <= tonumber(ARGV[i + 1]) then
    n = n + redis.call('HDEL', KEYS[1], ARGV[i])
  end
end
return n
