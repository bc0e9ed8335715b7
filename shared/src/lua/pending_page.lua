-- The next page of a pending set after a cursor, exact for any number of ids that
-- share one double score (ids above 2^53: up to 64 per score today, 1 024 near 2^63).
-- Within one score Redis orders members lexicographically, which for the fixed-width
-- members is id order, so the first entry after the cursor is found by rank: the
-- cursor's own rank when it is still in the set, else a binary search among the
-- members of the cursor's score.
--
-- KEYS: pending set.
-- ARGV: cursor member ('' = from the start), cursor score, count.
-- Returns: up to count members after the cursor, in id order.
local key, cursor, n = KEYS[1], ARGV[1], tonumber(ARGV[3])
local start = 0
if cursor ~= '' then
  local rank = redis.call('ZRANK', key, cursor)
  if rank then
    start = rank + 1
  else
    local lo = redis.call('ZCOUNT', key, '-inf', '(' .. ARGV[2])
    local hi = lo + redis.call('ZCOUNT', key, ARGV[2], ARGV[2])
    while lo < hi do
      local mid = math.floor((lo + hi) / 2)
      if redis.call('ZRANGE', key, mid, mid)[1] <= cursor then lo = mid + 1 else hi = mid end
    end
    start = lo
  end
end
return redis.call('ZRANGE', key, start, start + n - 1)
