//! Seqs that went back: the highest seq of each conversation that devices may hold, kept
//! outside MySQL, so that a conversation whose `last_seq` is below it is never numbered
//! from the lower value.
//!
//! With asynchronous replication a promoted replica may lack the last commits: their
//! messages reached devices (through Redis), yet `last_seq` there is lower, and the next
//! messages would take seqs that devices already show as other messages. The fan-out
//! raises `seq:{tenant:conv}` in Redis (kept [`SEEN_TTL_S`]) as it hands messages on;
//! every commit numbers a conversation from the highest of its `last_seq`, what this
//! process committed or read before, and that key. A conversation found behind is
//! reported (`herald_seq_rollbacks_total`, an error naming it) and moved past.

use std::collections::BTreeMap;
use std::sync::Mutex;

use fred::prelude::*;
use fred::types::{ClusterHash, CustomCommand};
use herald_shared::keys::Keys;
use herald_shared::names::{NameMap, Names2};
use herald_shared::redis::Batch;
use herald_shared::scripts;

use crate::batch::Committed;

/// How long a conversation's seen seq is kept after its last fan-out: a conversation
/// that gets no message for this long after a failover is no longer protected.
pub const SEEN_TTL_S: i64 = 7 * 24 * 3600;

/// Conversations remembered in this process before the memory is cleared (it is only
/// a cache of the Redis keys).
const REMEMBERED: usize = 100_000;

#[derive(Debug)]
pub struct SeqFloors {
    redis: Pool,
    keys: Keys,
    /// The highest seq this process committed or read for a conversation.
    known: Mutex<Remembered>,
}

/// The remembered seqs by (tenant, conversation): looked up by borrowed names
/// (`herald_shared::names`), so a commit allocates nothing for the conversations
/// already known (nearly all of them).
#[derive(Debug, Default)]
struct Remembered {
    convs: NameMap<(String, String), u64>,
}

impl Remembered {
    fn get(&self, tenant: &str, conv: &str) -> Option<u64> {
        self.convs.get(&Names2(tenant, conv)).copied()
    }

    /// Keeps the higher of `seq` and what is remembered; past [`REMEMBERED`]
    /// conversations the memory starts again empty.
    fn raise(&mut self, tenant: &str, conv: &str, seq: u64) {
        if let Some(known) = self.convs.get_mut(&Names2(tenant, conv)) {
            *known = (*known).max(seq);
            return;
        }
        if self.convs.len() >= REMEMBERED {
            self.convs.clear();
        }
        self.convs.insert((tenant.to_owned(), conv.to_owned()), seq);
    }
}

impl SeqFloors {
    pub fn new(redis: Pool, keys: Keys) -> SeqFloors {
        SeqFloors { redis, keys, known: Mutex::new(Remembered::default()) }
    }

    /// The highest seq seen of each conversation of `convs`, in their order, from memory
    /// or else from Redis (one pipeline of GETs for those not in memory); 0 when none is
    /// known.
    async fn floors(&self, convs: &[(&str, &str)]) -> Result<Vec<u64>, Error> {
        let mut out = vec![0; convs.len()];
        let mut missing = Vec::new();
        {
            let known = self.known.lock().expect("seq floors");
            for (i, &(t, c)) in convs.iter().enumerate() {
                match known.get(t, c) {
                    Some(seq) => out[i] = seq,
                    None => missing.push(i),
                }
            }
        }
        if missing.is_empty() {
            return Ok(out);
        }
        let pipe = self.redis.next().pipeline();
        for &i in &missing {
            let (t, c) = convs[i];
            let _: () = pipe.get(self.keys.seq_seen(t, c)).await?;
        }
        let seen: Vec<Option<u64>> = pipe.all().await?;
        for (&i, seq) in missing.iter().zip(seen) {
            let (t, c) = convs[i];
            out[i] = seq.unwrap_or(0);
            self.remember(t, c, out[i]);
        }
        Ok(out)
    }

    /// Reads the floors of `convs` not in memory yet, before a transaction takes its
    /// locks: the commit then reads them from memory, with no Redis round trip while it
    /// holds them. Best effort: what is missed is read (or not) by [`SeqFloors::lift`].
    pub async fn prefetch(&self, convs: &[(&str, &str)]) {
        if let Err(e) = self.floors(convs).await {
            tracing::debug!(error = %e, "seq floors not read ahead");
        }
    }

    /// Moves each conversation's `last_seq` past its floor, reporting those it had to.
    pub async fn lift<'a>(
        &self,
        convs: impl IntoIterator<Item = (&'a str, &'a str, &'a mut u64)>,
    ) -> Result<(), Error> {
        let mut convs: Vec<(&str, &str, &mut u64)> = convs.into_iter().collect();
        let wanted: Vec<(&str, &str)> = convs.iter().map(|(t, c, _)| (*t, *c)).collect();
        // Best effort: a commit never waits for Redis (an acknowledged message needs
        // MySQL only). Without Redis, this process's memory still guards the
        // conversations it numbered; a failover to a lagging MySQL replica while Redis
        // is also down is not caught (docs/reliability.md).
        let floors = match self.floors(&wanted).await {
            Ok(floors) => floors,
            Err(e) => {
                tracing::warn!(error = %e, "seq floors unread (Redis); numbering from MySQL and this process's memory");
                let known = self.known.lock().expect("seq floors");
                wanted.iter().map(|&(t, c)| known.get(t, c).unwrap_or(0)).collect()
            }
        };
        for ((t, c, last_seq), floor) in convs.iter_mut().zip(floors) {
            **last_seq = past_floor(t, c, **last_seq, floor);
        }
        Ok(())
    }

    /// Remembers a seq this process committed.
    pub fn remember(&self, tenant: &str, conv: &str, seq: u64) {
        self.known.lock().expect("seq floors").raise(tenant, conv, seq);
    }

    /// Adds to `batch` the calls that raise the seen seq of the conversations of
    /// `msgs`, to be answered before their devices are told: each call raises every
    /// conversation of the run whose key shares a cluster slot (all of them on a single
    /// Redis), at most [`RAISE_KEYS`] per call. A call per conversation cost Redis a
    /// script call per message. Returns how many calls were added; a call Redis does
    /// not know the script for answers `NOSCRIPT`.
    pub fn push_raise<'a>(&self, batch: &mut Batch<'a>, client: &'a Client, msgs: &[&Committed]) -> usize {
        let mut highest: BTreeMap<(&str, &str), u64> = BTreeMap::new();
        for m in msgs {
            let e = highest.entry((m.tenant.as_str(), m.conv.as_str())).or_insert(0);
            *e = (*e).max(m.seq);
        }
        let calls = raise_calls(
            highest.into_iter().map(|((t, c), seq)| (self.keys.seq_seen(t, c), seq)),
            client.is_clustered(),
        );
        let added = calls.len();
        for call in calls {
            let mut args: Vec<Value> = Vec::with_capacity(3 + 2 * call.len());
            args.push(scripts::SEQ_RAISE.script().sha1().clone().into());
            args.push((call.len() as i64).into());
            let seqs: Vec<Value> = call.iter().map(|&(_, seq)| Value::from(seq as i64)).collect();
            args.extend(call.into_iter().map(|(key, _)| Value::from(key)));
            args.push(SEEN_TTL_S.into());
            args.extend(seqs);
            batch.push(client.custom::<Value, _>(CustomCommand::new("EVALSHA", ClusterHash::Offset(2), false), args));
        }
        added
    }
}

/// Conversations per raise call at most: a call runs alone in Redis.
const RAISE_KEYS: usize = 1_000;

/// The raise calls of a run: (key, seq) grouped by cluster slot (one group on a single
/// Redis), at most [`RAISE_KEYS`] per call.
fn raise_calls(keys: impl Iterator<Item = (String, u64)>, clustered: bool) -> Vec<Vec<(String, u64)>> {
    let mut by_slot: BTreeMap<u16, Vec<(String, u64)>> = BTreeMap::new();
    for (key, seq) in keys {
        let slot = if clustered { fred::util::redis_keyslot(key.as_bytes()) } else { 0 };
        by_slot.entry(slot).or_default().push((key, seq));
    }
    by_slot.into_values().flat_map(|keys| chunks(keys, RAISE_KEYS)).collect()
}

fn chunks<T>(mut items: Vec<T>, size: usize) -> Vec<Vec<T>> {
    let mut out = Vec::new();
    while items.len() > size {
        let rest = items.split_off(size);
        out.push(std::mem::replace(&mut items, rest));
    }
    out.push(items);
    out
}

/// The seq to number a conversation from: its `last_seq`, or the floor when that is
/// higher (reported: the conversation's seqs went back).
pub fn past_floor(tenant: &str, conv: &str, last_seq: u64, floor: u64) -> u64 {
    if floor <= last_seq {
        return last_seq;
    }
    metrics::counter!("herald_seq_rollbacks_total").increment(1);
    tracing::error!(
        tenant,
        conv,
        last_seq,
        seen = floor,
        "the conversation's last_seq is below a seq its devices may hold (a failover to a replica that \
         missed commits: asynchronous replication?); numbering goes on above what was seen"
    );
    floor
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_memory_keeps_each_conversations_highest_seq_within_its_bound() {
        let mut known = Remembered::default();
        known.raise("t", "a", 5);
        known.raise("t", "a", 3);
        known.raise("u", "a", 2);
        assert_eq!(known.get("t", "a"), Some(5), "never lowered");
        assert_eq!(known.get("u", "a"), Some(2), "tenants apart");
        assert_eq!(known.get("t", "b"), None);
        for i in 0..REMEMBERED {
            known.raise("t", &format!("c{i}"), 1);
        }
        assert!(known.convs.len() <= REMEMBERED, "bounded: {}", known.convs.len());
        assert_eq!(known.get("t", "a"), None, "past the bound the memory starts again");
    }

    #[test]
    fn only_a_floor_above_last_seq_moves_it() {
        assert_eq!(past_floor("t", "c", 7, 0), 7, "nothing seen");
        assert_eq!(past_floor("t", "c", 7, 7), 7);
        assert_eq!(past_floor("t", "c", 7, 5), 7, "seen below: MySQL is ahead (not fanned out yet)");
        assert_eq!(past_floor("t", "c", 3, 9), 9, "went back: numbered from what was seen");
    }

    fn committed(conv: &str, seq: u64) -> Committed {
        Committed {
            id: herald_shared::ids::MsgId(seq),
            tenant: "t".into(),
            conv: conv.into(),
            seq,
            sender: "alice".into(),
            sender_device: "a1".into(),
            cmid: format!("m{seq}"),
            ts: 1,
            body: "{}".into(),
            event: None,
            trace: None,
        }
    }

    /// Against the real Redis the tests use: one run raises several conversations to
    /// their highest seq, a later run with lower seqs (a fan-out redone) lowers none,
    /// and every key keeps an expiry.
    #[tokio::test]
    async fn a_raise_moves_each_conversation_up_and_never_down() {
        let url = std::env::var("IT_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/0".into());
        let redis = herald_shared::redis::pool(&url, &Default::default(), 1).await.expect("the test Redis");
        let keys = Keys::new(format!("ut{:08x}", rand::random::<u32>()));
        let floors = SeqFloors::new(redis.clone(), keys.clone());
        let client = redis.next();
        scripts::SEQ_RAISE.script().load(client).await.expect("loaded");
        let raise = |run: Vec<Committed>| {
            let floors = &floors;
            async move {
                let mut batch = Batch::new();
                assert_eq!(floors.push_raise(&mut batch, client, &run.iter().collect::<Vec<_>>()), 1, "one call");
                for r in batch.run().await {
                    r.expect("raised");
                }
            }
        };
        raise(vec![committed("a", 3), committed("b", 7), committed("a", 5)]).await;
        raise(vec![committed("a", 4), committed("b", 2), committed("c", 1)]).await;
        for (conv, want) in [("a", 5), ("b", 7), ("c", 1)] {
            let seen: Option<u64> = client.get(keys.seq_seen("t", conv)).await.unwrap();
            assert_eq!(seen, Some(want), "conversation {conv}");
            let ttl: i64 = client.ttl(keys.seq_seen("t", conv)).await.unwrap();
            assert!(ttl > 0 && ttl <= SEEN_TTL_S, "conversation {conv} expires ({ttl})");
        }
    }

    #[test]
    fn a_run_raises_its_conversations_in_one_call_per_slot() {
        let keys = Keys::new("hd");
        let convs: Vec<(String, u64)> = (0..2_500).map(|i| (keys.seq_seen("t", &format!("c{i}")), i)).collect();
        let single = raise_calls(convs.clone().into_iter(), false);
        assert_eq!(single.iter().map(Vec::len).collect::<Vec<_>>(), [1_000, 1_000, 500]);
        let clustered = raise_calls(convs.into_iter(), true);
        assert_eq!(clustered.iter().map(Vec::len).sum::<usize>(), 2_500, "every conversation raised");
        for call in &clustered {
            let slot = fred::util::redis_keyslot(call[0].0.as_bytes());
            assert!(call.iter().all(|(k, _)| fred::util::redis_keyslot(k.as_bytes()) == slot), "one slot per call");
            assert!(call.len() <= RAISE_KEYS);
        }
    }
}
