//! The Redis key schema (DESIGN.md section 3) and the Lua scripts that run on it.
//!
//! `{t:u}` is a hash tag of tenant and user: every key of one user lives in one Redis
//! Cluster slot, so a script may touch all of them at once. Ingress streams carry their
//! shard number as the tag so they spread over slots.

use crate::ids::MsgId;

/// Builds key names under one prefix (`hd` by default; tests use their own).
#[derive(Clone, Debug)]
pub struct Keys {
    prefix: String,
}

impl Keys {
    pub fn new(prefix: impl Into<String>) -> Self {
        Keys { prefix: prefix.into() }
    }

    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// ZSET of a device's unacked messages: score = id (as f64), member = fixed-width id.
    pub fn pending(&self, tenant: &str, user: &str, device: &str) -> String {
        format!("{}:{{{tenant}:{user}}}:pend:{device}", self.prefix)
    }

    /// HASH of a user's devices: `device` -> platform, and `epoch:{device}` -> the
    /// Redis epoch in which the device's pending set was last known complete.
    pub fn devices(&self, tenant: &str, user: &str) -> String {
        format!("{}:{{{tenant}:{user}}}:devs", self.prefix)
    }

    /// HASH device -> "node|session" of a user's connected devices.
    pub fn presence(&self, tenant: &str, user: &str) -> String {
        format!("{}:{{{tenant}:{user}}}:presence", self.prefix)
    }

    /// HASH device -> lowest id dropped when its pending set went over the cap: the
    /// device must be rebuilt from MySQL.
    pub fn overflow(&self, tenant: &str, user: &str) -> String {
        format!("{}:{{{tenant}:{user}}}:ovf", self.prefix)
    }

    /// HASH of read positions waiting for a device: `{conv} {reader}` -> seq. The
    /// latest position only; removed once the device has confirmed it (pong).
    pub fn reads(&self, tenant: &str, user: &str, device: &str) -> String {
        format!("{}:{{{tenant}:{user}}}:reads:{device}", self.prefix)
    }

    /// The serialized `msg` frame, stored once for every recipient.
    pub fn message(&self, id: MsgId) -> String {
        format!("{}:m:{id}", self.prefix)
    }

    pub fn ingress(&self, shard: u32) -> String {
        format!("{}:ingress:{{{shard}}}", self.prefix)
    }

    /// Pub/sub channel of one gateway node.
    pub fn node_channel(&self, node: &str) -> String {
        format!("{}:gw:{node}", self.prefix)
    }

    pub fn lease(&self, name: &str) -> String {
        format!("{}:lease:{name}", self.prefix)
    }

    /// ZSET worker node -> last heartbeat (ms): the live workers sharing the shards.
    pub fn workers(&self) -> String {
        format!("{}:workers", self.prefix)
    }

    pub fn epoch(&self) -> String {
        format!("{}:epoch", self.prefix)
    }
}

/// The consumer group every worker reads the ingress streams with.
pub const INGRESS_GROUP: &str = "workers";

/// Adds messages to the pending sets of one user's devices and reports where each
/// device is connected. One slot: every key is the user's.
///
/// KEYS: presence, overflow, pending set of device 1..n.
/// ARGV: cap, n, then per device: device id, count, count x (score, member).
/// Returns: device 1, presence of device 1 (or false), ..., for every device.
pub const FANOUT_LUA: &str = r#"
local cap = tonumber(ARGV[1])
local n = tonumber(ARGV[2])
local pos = 3
local out = {}
for i = 1, n do
  local dev = ARGV[pos]
  local count = tonumber(ARGV[pos + 1])
  pos = pos + 2
  local key = KEYS[i + 2]
  local j = 0
  while j < count do
    local args = {}
    local chunk = math.min(count - j, 500)
    for k = 1, chunk do
      args[#args + 1] = ARGV[pos]
      args[#args + 1] = ARGV[pos + 1]
      pos = pos + 2
    end
    redis.call('ZADD', key, unpack(args))
    j = j + chunk
  end
  local card = redis.call('ZCARD', key)
  if card > cap then
    local dropped = redis.call('ZRANGE', key, 0, card - cap - 1)
    redis.call('ZREMRANGEBYRANK', key, 0, card - cap - 1)
    local prev = redis.call('HGET', KEYS[2], dev)
    if not prev or prev > dropped[1] then
      redis.call('HSET', KEYS[2], dev, dropped[1])
    end
  end
  out[#out + 1] = dev
  out[#out + 1] = redis.call('HGET', KEYS[1], dev)
end
return out
"#;

/// Records a read position for one user's devices (only forward) and reports where
/// each device is connected.
///
/// KEYS: presence, then the reads hash of device 1..n. ARGV: field, seq, ttl ms, device 1..n.
/// Returns: device, presence (or false), for every device.
pub const READS_LUA: &str = r#"
local field, seq, ttl = ARGV[1], tonumber(ARGV[2]), ARGV[3]
local out = {}
for i = 2, #KEYS do
  local cur = redis.call('HGET', KEYS[i], field)
  if not cur or tonumber(cur) < seq then
    redis.call('HSET', KEYS[i], field, seq)
  end
  redis.call('PEXPIRE', KEYS[i], ttl)
  local dev = ARGV[i + 2]
  out[#out + 1] = dev
  out[#out + 1] = redis.call('HGET', KEYS[1], dev)
end
return out
"#;

/// Removes confirmed read positions unless a newer one arrived meanwhile.
/// KEYS: reads hash. ARGV: field, seq pairs.
pub const READS_CONFIRM_LUA: &str = r#"
local n = 0
for i = 1, #ARGV, 2 do
  local cur = redis.call('HGET', KEYS[1], ARGV[i])
  if cur and tonumber(cur) <= tonumber(ARGV[i + 1]) then
    n = n + redis.call('HDEL', KEYS[1], ARGV[i])
  end
end
return n
"#;

/// The next page of a pending set after a cursor, exact for any number of ids that
/// share one `f64` score (ids above 2^53: up to 64 per score today, 1 024 near 2^63).
/// Within one score Redis orders members lexicographically, which for the fixed-width
/// members is id order, so the first entry after the cursor is found by its rank: the
/// cursor's own rank when it is still in the set, else a binary search among the
/// members of the cursor's score.
///
/// KEYS: pending set. ARGV: cursor member ("" = from the start), cursor score, count.
/// Returns: up to `count` members after the cursor, in id order.
pub const PENDING_PAGE_LUA: &str = r#"
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
"#;

/// Stable shard of a conversation: FNV-1a over tenant and conversation id. Every process
/// must agree on it, so it must never change.
pub fn shard_of(tenant: &str, conv: &str, shards: u32) -> u32 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in tenant.bytes().chain([0u8]).chain(conv.bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    (h % u64::from(shards)) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_of_one_user_share_a_hash_tag() {
        let k = Keys::new("hd");
        assert_eq!(k.pending("acme", "alice", "p1"), "hd:{acme:alice}:pend:p1");
        assert_eq!(k.presence("acme", "alice"), "hd:{acme:alice}:presence");
        assert_eq!(k.ingress(3), "hd:ingress:{3}");
    }

    #[test]
    fn shards_are_stable_and_spread() {
        assert_eq!(shard_of("acme", "c1", 8), shard_of("acme", "c1", 8));
        let used: std::collections::HashSet<u32> = (0..200).map(|i| shard_of("acme", &format!("c{i}"), 8)).collect();
        assert_eq!(used.len(), 8);
        assert_ne!(shard_of("a", "bc", 1 << 20), shard_of("ab", "c", 1 << 20));
    }
}
