-- Raises the highest seq of a conversation that devices may have seen (its messages
-- fanned out), never lowering it: a fan-out redone for an older batch leaves it. The
-- expiry is renewed either way.
--
-- KEYS: the conversation's seen-seq key. ARGV: the expiry in seconds, the seq.
-- Returns: 1 when raised, else 0.
local seen = tonumber(redis.call('GET', KEYS[1]) or '0')
if tonumber(ARGV[2]) > seen then
  redis.call('SET', KEYS[1], ARGV[2], 'EX', ARGV[1])
  return 1
end
redis.call('EXPIRE', KEYS[1], ARGV[1])
return 0
