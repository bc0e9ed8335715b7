//! Snowflake message ids and their exact encodings.
//!
//! Layout: 41 bits of milliseconds since [`EPOCH_MS`], 10 bits of worker id, 12 bits of
//! sequence. Ids pass 2^53 within weeks of the epoch, so anything that orders or pages
//! them must not go through an `f64` alone. Redis ZSET members are the fixed-width
//! decimal form ([`MsgId::member`]): equal-score ties sort by member, lexicographic order
//! of fixed-width decimals is numeric order, and the (rounded, monotonic) `f64` score
//! never reorders two ids. Paging by score is therefore exact once members at the
//! boundary score are compared by their member string.

use std::fmt;
use std::str::FromStr;
use std::time::{SystemTime, UNIX_EPOCH};

/// 2024-01-01T00:00:00Z in Unix milliseconds.
pub const EPOCH_MS: u64 = 1_704_067_200_000;
pub const WORKER_BITS: u32 = 10;
pub const SEQUENCE_BITS: u32 = 12;
pub const MAX_WORKER_ID: u16 = (1 << WORKER_BITS) - 1;
const SEQUENCE_MASK: u64 = (1 << SEQUENCE_BITS) - 1;
/// Width of the decimal form of the largest u64.
pub const MEMBER_WIDTH: usize = 20;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct MsgId(pub u64);

impl MsgId {
    /// The fixed-width, zero-padded decimal used as a ZSET member.
    pub fn member(self) -> String {
        format!("{:020}", self.0)
    }

    /// The ZSET score: rounded to the nearest `f64`, monotonic in the id.
    pub fn score(self) -> f64 {
        self.0 as f64
    }

    pub fn from_member(member: &str) -> Option<MsgId> {
        if member.len() != MEMBER_WIDTH {
            return None;
        }
        member.parse().ok().map(MsgId)
    }

    /// The smallest id that can be generated at `unix_ms`.
    pub fn lowest_at(unix_ms: u64) -> MsgId {
        MsgId(unix_ms.saturating_sub(EPOCH_MS) << (WORKER_BITS + SEQUENCE_BITS))
    }

    pub fn unix_ms(self) -> u64 {
        (self.0 >> (WORKER_BITS + SEQUENCE_BITS)) + EPOCH_MS
    }

    pub fn worker(self) -> u16 {
        ((self.0 >> SEQUENCE_BITS) & u64::from(MAX_WORKER_ID)) as u16
    }
}

impl fmt::Display for MsgId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl FromStr for MsgId {
    type Err = std::num::ParseIntError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        s.parse().map(MsgId)
    }
}

impl serde::Serialize for MsgId {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// On the wire an id is its decimal string: ids pass 2^53, past JSON numbers' exact range.
impl schemars::JsonSchema for MsgId {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "MsgId".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "description": "A message id (a 64-bit snowflake) as its decimal string.",
            "type": "string",
            "pattern": "^[0-9]{1,20}$"
        })
    }
}

impl<'de> serde::Deserialize<'de> for MsgId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        s.parse().map_err(|_| serde::de::Error::custom("a message id is a decimal string"))
    }
}

pub fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// Generates ids for one worker id. Never goes backwards within a process, even when
/// the wall clock does: it keeps issuing from the last millisecond it used.
#[derive(Debug)]
pub struct Snowflake {
    worker: u64,
    last_ms: u64,
    sequence: u64,
}

impl Snowflake {
    pub fn new(worker: u16) -> Self {
        assert!(worker <= MAX_WORKER_ID, "worker id out of range");
        Snowflake { worker: u64::from(worker), last_ms: 0, sequence: 0 }
    }

    pub fn worker(&self) -> u16 {
        self.worker as u16
    }

    /// Switches to a new worker id (after a lease was lost and another acquired).
    /// The time floor is kept, so ids stay increasing.
    pub fn set_worker(&mut self, worker: u16) {
        assert!(worker <= MAX_WORKER_ID, "worker id out of range");
        self.worker = u64::from(worker);
    }

    /// Makes every later id greater than `floor` (an id issued elsewhere, perhaps by
    /// a process whose clock runs ahead).
    pub fn observe(&mut self, floor: MsgId) {
        let floor_ms = floor.0 >> (WORKER_BITS + SEQUENCE_BITS);
        if floor_ms >= self.last_ms {
            self.last_ms = floor_ms + 1;
            self.sequence = 0;
        }
    }

    pub fn next_id(&mut self) -> MsgId {
        self.next_at(now_ms())
    }

    /// `next_id` with the clock given; exposed for tests of clock regressions.
    pub fn next_at(&mut self, unix_ms: u64) -> MsgId {
        let ms = unix_ms.saturating_sub(EPOCH_MS).max(self.last_ms);
        if ms == self.last_ms {
            self.sequence = (self.sequence + 1) & SEQUENCE_MASK;
            if self.sequence == 0 {
                // 4096 ids in one millisecond: borrow the next millisecond.
                self.last_ms += 1;
            }
        } else {
            self.last_ms = ms;
            self.sequence = 0;
        }
        MsgId((self.last_ms << (WORKER_BITS + SEQUENCE_BITS)) | (self.worker << SEQUENCE_BITS) | self.sequence)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_increase_even_when_the_clock_goes_back() {
        let mut g = Snowflake::new(7);
        let t = EPOCH_MS + 90 * 24 * 3600 * 1000;
        let a = g.next_at(t);
        let b = g.next_at(t - 5_000);
        let c = g.next_at(t + 1);
        assert!(a < b && b < c, "{a} {b} {c}");
        assert_eq!(a.worker(), 7);
        assert!(a.0 > 1 << 53, "tests must use ids above 2^53");
    }

    #[test]
    fn observed_ids_from_a_clock_ahead_are_never_undercut() {
        let mut g = Snowflake::new(1);
        let t = EPOCH_MS + 1_000_000;
        let ahead = MsgId::lowest_at(t + 60_000).0 | (900 << SEQUENCE_BITS);
        g.observe(MsgId(ahead));
        let next = g.next_at(t);
        assert!(next.0 > ahead);
    }

    #[test]
    fn sequence_overflow_borrows_the_next_millisecond() {
        let mut g = Snowflake::new(1);
        let t = EPOCH_MS + 1_000_000_000;
        let ids: Vec<MsgId> = (0..10_000).map(|_| g.next_at(t)).collect();
        assert!(ids.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn members_sort_like_ids_above_2_pow_53() {
        // Adjacent ids above 2^53 share an f64 score; the member must break the tie.
        let base = (1u64 << 60) + 3;
        let ids = [MsgId(base + 1), MsgId(base), MsgId(base + 2), MsgId(9), MsgId(u64::MAX)];
        assert_eq!(MsgId(base).score(), MsgId(base + 1).score());
        let mut by_member: Vec<(f64, String)> = ids.iter().map(|i| (i.score(), i.member())).collect();
        by_member.sort_by(|a, b| a.0.total_cmp(&b.0).then_with(|| a.1.cmp(&b.1)));
        let decoded: Vec<MsgId> = by_member.iter().map(|(_, m)| MsgId::from_member(m).unwrap()).collect();
        let mut sorted = ids.to_vec();
        sorted.sort();
        assert_eq!(decoded, sorted);
    }

    #[test]
    fn ids_round_trip_as_json_strings() {
        let id = MsgId(7_405_329_411_723_264_001);
        let json = serde_json::to_string(&id).unwrap();
        assert_eq!(json, "\"7405329411723264001\"");
        assert_eq!(serde_json::from_str::<MsgId>(&json).unwrap(), id);
        assert!(serde_json::from_str::<MsgId>("7405329411723264001").is_err());
    }
}

/// Property tests of the id codec; `PROPTEST_CASES=100000` runs them longer
/// (docs/reliability.md).
#[cfg(test)]
mod proptests {
    use super::*;
    use proptest::prelude::*;

    /// Ids at and above 2^53, where adjacent ids share an `f64` score; a third of the
    /// cases are neighbours, the hard part.
    fn id_pair() -> impl Strategy<Value = (u64, u64)> {
        let high = (1u64 << 53)..=u64::MAX;
        prop_oneof![(high.clone(), high.clone()), (high, 0u64..4096).prop_map(|(a, d)| (a, a.saturating_add(d))),]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn member_order_is_numeric_order((a, b) in id_pair()) {
            let (ma, mb) = (MsgId(a).member(), MsgId(b).member());
            prop_assert_eq!(ma.len(), MEMBER_WIDTH);
            prop_assert_eq!(ma.cmp(&mb), a.cmp(&b));
        }

        #[test]
        fn members_and_decimal_strings_round_trip(a in any::<u64>()) {
            prop_assert_eq!(MsgId::from_member(&MsgId(a).member()), Some(MsgId(a)));
            prop_assert_eq!(MsgId(a).to_string().parse::<MsgId>().unwrap(), MsgId(a));
            let json = serde_json::to_string(&MsgId(a)).unwrap();
            prop_assert_eq!(serde_json::from_str::<MsgId>(&json).unwrap(), MsgId(a));
        }

        #[test]
        fn scores_never_reorder_ids((a, b) in id_pair()) {
            let (lo, hi) = (a.min(b), a.max(b));
            prop_assert!(MsgId(lo).score() <= MsgId(hi).score());
        }

        /// Sorting as Redis does (score, then member) gives numeric order.
        #[test]
        fn redis_order_is_numeric_order(ids in proptest::collection::vec((1u64 << 53)..=u64::MAX, 0..64),
                                         base in (1u64 << 53)..(u64::MAX - 10_000),
                                         dense in proptest::collection::vec(0u64..10_000, 0..64)) {
            let mut all: Vec<u64> = ids;
            all.extend(dense.iter().map(|d| base + d));
            all.sort_unstable();
            all.dedup();
            let mut redis: Vec<(f64, String)> = all.iter().map(|i| (MsgId(*i).score(), MsgId(*i).member())).collect();
            redis.sort_by(|x, y| x.0.total_cmp(&y.0).then_with(|| x.1.cmp(&y.1)));
            let decoded: Vec<u64> = redis.iter().map(|(_, m)| MsgId::from_member(m).unwrap().0).collect();
            prop_assert_eq!(decoded, all);
        }

        #[test]
        fn members_of_another_width_are_refused(s in "[0-9]{0,19}|[0-9]{21,24}") {
            prop_assert_eq!(MsgId::from_member(&s), None);
        }
    }
}
