-- Raises the highest seq of conversations that devices may have seen (their messages
-- fanned out), never lowering one: a fan-out redone for an older batch leaves it. The
-- expiry is renewed either way. One call raises every conversation of a fan-out run
-- whose key lives on this node's slot (all of them on a single Redis).
--
-- KEYS: the conversations' seen-seq keys. ARGV: the expiry in seconds, then the seq of
-- each key, in the same order.
-- Returns: how many were raised.
local raised = 0
for i, key in ipairs(KEYS) do
  local seq = tonumber(ARGV[i + 1])
  if seq > tonumber(redis.call('GET', key) or '0') then
    redis.call('SET', key, ARGV[i + 1], 'EX', ARGV[1])
    raised = raised + 1
  else
    redis.call('EXPIRE', key, ARGV[1])
  end
end
return raised
