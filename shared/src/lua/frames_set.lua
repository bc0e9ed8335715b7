-- Stores the frames of a fan-out run, each under its message key with one expiry: a
-- call for the run's frames whose keys live on this node's slot (all of them on a
-- single Redis) instead of a SET each, which cost the worker a client command per
-- message.
--
-- KEYS: the messages' frame keys. ARGV: the expiry in seconds, then the frame of each
-- key, in the same order.
-- Returns: how many frames were stored.
for i, key in ipairs(KEYS) do
  redis.call('SET', key, ARGV[i + 1], 'EX', ARGV[1])
end
return #KEYS
