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

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use fred::prelude::*;
use fred::types::{ClusterHash, CustomCommand};
use herald_shared::keys::Keys;
use herald_shared::scripts;

use crate::batch::Committed;

/// How long a conversation's seen seq is kept after its last fan-out: a conversation
/// that gets no message for this long after a failover is no longer protected.
pub const SEEN_TTL_S: i64 = 7 * 24 * 3600;

/// Conversations remembered in this process before the memory is cleared (it is only
/// a cache of the Redis keys).
const REMEMBERED: usize = 100_000;

/// (tenant, conversation).
pub type ConvKey = (String, String);

#[derive(Debug)]
pub struct SeqFloors {
    redis: Pool,
    keys: Keys,
    /// The highest seq this process committed or read for a conversation.
    known: Mutex<HashMap<ConvKey, u64>>,
}

impl SeqFloors {
    pub fn new(redis: Pool, keys: Keys) -> SeqFloors {
        SeqFloors { redis, keys, known: Mutex::new(HashMap::new()) }
    }

    /// The highest seq seen of each conversation, from memory or else from Redis (one
    /// pipeline of GETs for those not in memory); 0 when none is known.
    async fn floors(&self, convs: &[(&str, &str)]) -> Result<HashMap<ConvKey, u64>, Error> {
        let mut out = HashMap::with_capacity(convs.len());
        let mut missing = Vec::new();
        {
            let known = self.known.lock().expect("seq floors");
            for &(t, c) in convs {
                match known.get(&(t.to_owned(), c.to_owned())) {
                    Some(&seq) => {
                        out.insert((t.to_owned(), c.to_owned()), seq);
                    }
                    None => missing.push((t, c)),
                }
            }
        }
        if missing.is_empty() {
            return Ok(out);
        }
        let pipe = self.redis.next().pipeline();
        for &(t, c) in &missing {
            let _: () = pipe.get(self.keys.seq_seen(t, c)).await?;
        }
        let seen: Vec<Option<u64>> = pipe.all().await?;
        for (&(t, c), seq) in missing.iter().zip(seen) {
            let seq = seq.unwrap_or(0);
            out.insert((t.to_owned(), c.to_owned()), seq);
            self.remember(t, c, seq);
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
                wanted
                    .iter()
                    .filter_map(|&(t, c)| known.get_key_value(&(t.to_owned(), c.to_owned())))
                    .map(|(k, v)| (k.clone(), *v))
                    .collect()
            }
        };
        for (t, c, last_seq) in &mut convs {
            let floor = floors.get(&(t.to_string(), c.to_string())).copied().unwrap_or(0);
            **last_seq = past_floor(t, c, **last_seq, floor);
        }
        Ok(())
    }

    /// Remembers a seq this process committed.
    pub fn remember(&self, tenant: &str, conv: &str, seq: u64) {
        let mut known = self.known.lock().expect("seq floors");
        if known.len() >= REMEMBERED {
            known.clear();
        }
        let e = known.entry((tenant.to_owned(), conv.to_owned())).or_insert(0);
        *e = (*e).max(seq);
    }

    /// Raises the seen seq of the conversations of `msgs` in Redis, before their
    /// devices are told (one pipeline, a script call per conversation).
    pub async fn raise(&self, msgs: &[&Committed]) -> Result<(), Error> {
        let mut highest: BTreeMap<(&str, &str), u64> = BTreeMap::new();
        for m in msgs {
            let e = highest.entry((m.tenant.as_str(), m.conv.as_str())).or_insert(0);
            *e = (*e).max(m.seq);
        }
        let client = self.redis.next();
        let run = || async {
            let pipe = client.pipeline();
            for (&(t, c), seq) in &highest {
                let args: Vec<Value> = vec![
                    scripts::SEQ_RAISE.script().sha1().clone().into(),
                    1.into(),
                    self.keys.seq_seen(t, c).into(),
                    SEEN_TTL_S.into(),
                    (*seq as i64).into(),
                ];
                let _: () = pipe.custom(CustomCommand::new("EVALSHA", ClusterHash::Offset(2), false), args).await?;
            }
            pipe.all::<Value>().await.map(|_| ())
        };
        match run().await {
            Err(e) if e.to_string().contains("NOSCRIPT") => {
                scripts::SEQ_RAISE.script().load(client).await?;
                run().await
            }
            other => other,
        }
    }
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
    fn only_a_floor_above_last_seq_moves_it() {
        assert_eq!(past_floor("t", "c", 7, 0), 7, "nothing seen");
        assert_eq!(past_floor("t", "c", 7, 7), 7);
        assert_eq!(past_floor("t", "c", 7, 5), 7, "seen below: MySQL is ahead (not fanned out yet)");
        assert_eq!(past_floor("t", "c", 3, 9), 9, "went back: numbered from what was seen");
    }
}
