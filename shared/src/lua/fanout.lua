-- Adds messages to the pending sets of the devices of one or more users and reports
-- where each device is connected. Every key must be in one Redis Cluster slot: the
-- caller groups users by the slot of their keys (on a single Redis, any users).
-- A set over the cap drops its oldest entries and widens the device's overflow band
-- ("low high", fixed-width ids) to cover them: the device reads that band from MySQL
-- before its pending set (the gateway's backlog pager).
--
-- A device whose entries cannot be written (its key holds another type) is reported
-- and the others still get theirs: a redo of the fan-out skips the devices that got
-- their entries, so ids they acked meanwhile are not put back.
--
-- KEYS: per user: presence, overflow, then the pending set of each of its devices.
-- ARGV: cap, users, ids, then ids x (score, member), then per user: its number of
--       devices n, then per device: device id, count, count x the position (from 1)
--       of an id in the list before. A message to a group is one id for all its users,
--       sent once.
-- Returns: one flat array, two elements per device in the order of ARGV: its presence
-- (or false), then 1 when its entries were written (else 0).
--
-- Most devices get one entry per call (a message to a group): its ZADD takes the
-- score and member as they are, without a table of arguments.
local cap = tonumber(ARGV[1])
local users = tonumber(ARGV[2])
local ids = tonumber(ARGV[3])
local scores, members = {}, {}
for i = 1, ids do
  scores[i] = ARGV[2 + 2 * i]
  members[i] = ARGV[3 + 2 * i]
end
local pos = 4 + 2 * ids
local k = 0
local out = {}
local o = 0
for u = 1, users do
  local presence, overflow = KEYS[k + 1], KEYS[k + 2]
  k = k + 2
  local n = tonumber(ARGV[pos])
  pos = pos + 1
  for i = 1, n do
    local dev = ARGV[pos]
    local count = tonumber(ARGV[pos + 1])
    pos = pos + 2
    k = k + 1
    local key = KEYS[k]
    local written = 1
    if count == 1 then
      local at = tonumber(ARGV[pos])
      local added = redis.pcall('ZADD', key, scores[at], members[at])
      if type(added) == 'table' and added.err then
        written = 0
      end
      pos = pos + 1
    else
      local j = 0
      while j < count do
        local args = {}
        local chunk = math.min(count - j, 500)
        for c = 1, chunk do
          local at = tonumber(ARGV[pos])
          args[#args + 1] = scores[at]
          args[#args + 1] = members[at]
          pos = pos + 1
        end
        local added = redis.pcall('ZADD', key, unpack(args))
        if type(added) == 'table' and added.err then
          written = 0
        end
        j = j + chunk
      end
    end
    local card = 0
    if written == 1 then
      card = redis.call('ZCARD', key)
    end
    if card > cap then
      local dropped = redis.call('ZRANGE', key, 0, card - cap - 1)
      redis.call('ZREMRANGEBYRANK', key, 0, card - cap - 1)
      local low, high = dropped[1], dropped[#dropped]
      local prev = redis.call('HGET', overflow, dev)
      if prev then
        local pl, ph = string.match(prev, '^(%d+) (%d+)$')
        -- A mark of an older version holds only its low end.
        pl = pl or prev
        ph = ph or high
        if pl < low then low = pl end
        if ph > high then high = ph end
      end
      redis.call('HSET', overflow, dev, low .. ' ' .. high)
    end
    out[o + 1] = redis.call('HGET', presence, dev)
    out[o + 2] = written
    o = o + 2
  end
end
return out
