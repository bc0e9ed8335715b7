//! Fan-out of committed messages into Redis.
//!
//! For each message: its `msg` frame is serialized once and stored at `m:{id}`; every
//! eligible device of every member (except the sending device) gets the id in its
//! pending set through a Lua call per group of users sharing a cluster slot (on a
//! single Redis, every user in one call, cut at 2 048 entries); the gateways holding online
//! devices get one PUBLISH per node carrying the frames. Two batches of commands, each
//! sent in one socket write ([`Batch`]): the frames and pending entries, then the
//! PUBLISHes with the markers of the finished outbox events (only once every pending
//! entry is written). Fan-out is idempotent, so the outbox may
//! run it again after a failure.
//!
//! A fan-out that failed for some devices (their entries could not be written) still
//! publishes to the others, and names the devices that got their entries: the outbox
//! keeps them with the event and its redo skips them, so an id one of them acked in
//! between is not put back (docs/architecture.md section 3, "Acked ids stay acked").

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use fred::prelude::*;
use herald_shared::ids::MsgId;
use herald_shared::keys::{DeviceKey, Keys};
use herald_shared::protocol::{DeliveriesOut, DeliveryOut};
use herald_shared::redis::Batch;
use herald_shared::scripts;
use serde_json::value::RawValue;
use sqlx::mysql::MySqlPool;
use tokio::sync::mpsc;

use crate::batch::{Committed, PushCandidate, Recipient};
use crate::seq_floor::SeqFloors;

#[derive(Debug, thiserror::Error)]
pub enum FanoutError {
    #[error("mysql: {0}")]
    Db(#[from] sqlx::Error),
    #[error("redis: {0}")]
    Redis(#[from] fred::error::Error),
    #[error("stored message {0} has a body that is not JSON")]
    Corrupt(MsgId),
    #[error("the pending entries of {failed} device(s) could not be written (the others were)")]
    Partial { failed: usize, done: Vec<DeviceKey> },
}

impl FanoutError {
    /// The failure's kind, as a fan-out's trace span names it.
    pub fn kind(&self) -> &'static str {
        match self {
            FanoutError::Db(_) => "mysql",
            FanoutError::Redis(_) => "redis",
            FanoutError::Corrupt(_) => "corrupt",
            FanoutError::Partial { .. } => "partial",
        }
    }

    /// The devices that got their entries although the fan-out failed.
    pub fn done(&self) -> &[DeviceKey] {
        match self {
            FanoutError::Partial { done, .. } => done,
            _ => &[],
        }
    }
}

#[derive(Debug)]
pub struct Fanout {
    db: MySqlPool,
    redis: Pool,
    keys: Keys,
    message_ttl_s: i64,
    pending_cap: u64,
    /// How long a finished fan-out is remembered: the outbox's whole retry window.
    done_ttl_ms: u64,
    /// Devices unseen this long are no recipients.
    device_ttl_ms: u64,
    /// Where the messages for devices with a push token go once fanned out (the push
    /// scheduler); none when no tenant has a webhook.
    push: Option<mpsc::Sender<Vec<PushCandidate>>>,
    /// Where the seqs handed on are raised (`seq_floor.rs`); none in unit tests.
    floors: Option<Arc<SeqFloors>>,
}

/// Pending-set additions for one user: device -> messages. Ids and names are borrowed
/// from the commit's messages and recipients, never copied per delivery.
type UserPlan<'a> = BTreeMap<&'a str, Vec<MsgId>>;

/// Where each message goes on each node: node -> message -> (tenant, user, device).
type ByNode<'a> = BTreeMap<String, BTreeMap<MsgId, Vec<(&'a str, &'a str, &'a str)>>>;

impl Fanout {
    pub fn new(db: MySqlPool, redis: Pool, keys: Keys, message_ttl_s: u64, pending_cap: u64, done_ttl_ms: u64) -> Self {
        Fanout {
            db,
            redis,
            keys,
            message_ttl_s: message_ttl_s as i64,
            pending_cap,
            done_ttl_ms,
            device_ttl_ms: u64::MAX,
            push: None,
            floors: None,
        }
    }

    /// Hands the messages for devices with a push token to the push scheduler.
    pub fn with_push(mut self, scheduler: mpsc::Sender<Vec<PushCandidate>>) -> Self {
        self.push = Some(scheduler);
        self
    }

    /// Raises the seqs devices may hold before they are told (`seq_floor.rs`).
    pub fn with_seq_floors(mut self, floors: Arc<SeqFloors>) -> Self {
        self.floors = Some(floors);
        self
    }

    /// Devices unseen this long are no recipients (`delivery.device_ttl_s`).
    pub fn with_device_ttl(mut self, device_ttl_ms: u64) -> Self {
        self.device_ttl_ms = device_ttl_ms;
        self
    }

    /// Whether the fan-out of `event` is known to have finished.
    pub async fn is_done(&self, event: u64) -> Result<bool, fred::error::Error> {
        let n: i64 = self.redis.next().exists(self.keys.fanned_out(event)).await?;
        Ok(n == 1)
    }

    /// Fans out the messages of outbox event `event`, read back from MySQL, looking up
    /// their recipients, except to the devices `done` (they got their entries from an
    /// earlier attempt).
    pub async fn deliver(&self, msgs: &[Committed], event: u64, done: &HashSet<DeviceKey>) -> Result<(), FanoutError> {
        if msgs.is_empty() {
            return Ok(());
        }
        let recipients = self.recipients(msgs).await?;
        self.deliver_except(&[(msgs, &recipients)], &[event], done).await
    }

    /// Fans out groups of committed messages, each to the member devices its commit read
    /// under its locks, and remembers that outbox `events` (the rows covering them)
    /// finished, so a redo (the worker died before marking them SENT, a SENDING claim
    /// went stale) does not put back pending entries their devices already acked.
    /// Remembering is best effort: forgetting costs a repeat, never a loss.
    pub async fn deliver_to(&self, groups: &[(&[Committed], &[Recipient])], events: &[u64]) -> Result<(), FanoutError> {
        self.deliver_except(groups, events, &HashSet::new()).await
    }

    /// [`Fanout::deliver_to`] except to the devices `done`. When some devices' entries
    /// cannot be written, the others are still published to and handed to push, the
    /// events are not remembered as finished, and the error names the devices done.
    async fn deliver_except(
        &self,
        groups: &[(&[Committed], &[Recipient])],
        events: &[u64],
        done: &HashSet<DeviceKey>,
    ) -> Result<(), FanoutError> {
        let msgs: Vec<&Committed> = groups.iter().flat_map(|(msgs, _)| msgs.iter()).collect();
        if msgs.is_empty() {
            return Ok(());
        }
        let mut frames: HashMap<MsgId, Box<RawValue>> = HashMap::with_capacity(msgs.len());
        let mut plans: BTreeMap<(&str, &str), UserPlan> = BTreeMap::new();
        let mut push = Vec::new();
        for (group, recipients) in groups {
            // Each group with its own recipients: a member who left between two commits
            // still gets the messages of the first.
            let mut by_conv: HashMap<(&str, &str), Vec<&Recipient>> = HashMap::new();
            for r in recipients.iter() {
                by_conv.entry((r.tenant.as_str(), r.conv.as_str())).or_default().push(r);
            }
            for m in group.iter() {
                frames.insert(m.id, m.frame().ok_or(FanoutError::Corrupt(m.id))?);
                for r in by_conv.get(&(m.tenant.as_str(), m.conv.as_str())).into_iter().flatten() {
                    let skipped = !done.is_empty() && done.contains(&DeviceKey::new(&*r.tenant, &*r.user, &*r.device));
                    if r.receives(m.seq) && !m.skips(&r.user, &r.device) && !skipped {
                        // Nobody is notified of their own messages (sent from another
                        // device), nor of timeline events.
                        if r.push && r.user != m.sender && m.event.is_none() && self.push.is_some() {
                            push.push(PushCandidate {
                                tenant: m.tenant.clone(),
                                user: r.user.clone(),
                                device: r.device.clone(),
                                conv: m.conv.clone(),
                                id: m.id,
                                sender: m.sender.clone(),
                                trace: m.trace,
                            });
                        }
                        plans
                            .entry((m.tenant.as_str(), r.user.as_str()))
                            .or_default()
                            .entry(r.device.as_str())
                            .or_default()
                            .push(m.id);
                    }
                }
            }
        }

        let client = self.redis.next();
        // The seq floors are raised with the writes; devices are told only after (the
        // PUBLISH below).
        let results = match self.write(client, &msgs, &frames, &plans).await {
            Err(e) if e.to_string().contains("NOSCRIPT") => {
                scripts::FANOUT.script().load(client).await?;
                scripts::FRAMES_SET.script().load(client).await?;
                scripts::SEQ_RAISE.script().load(client).await?;
                self.write(client, &msgs, &frames, &plans).await?
            }
            other => other?,
        };

        // Online devices, grouped by the node that holds them; the devices whose
        // entries were written, and how many were not.
        let mut by_node: ByNode = BTreeMap::new();
        let (mut written, mut failed) = (Vec::new(), 0);
        for ((&(tenant, user), plan), devices) in plans.iter().zip(results) {
            for device in devices {
                if !device.written {
                    failed += 1;
                    continue;
                }
                let key = (tenant, user, device.device);
                if let (Some(node), Some(ids)) = (device.node, plan.get(device.device)) {
                    let on_node = by_node.entry(node).or_default();
                    for id in ids {
                        on_node.entry(*id).or_default().push(key);
                    }
                }
                written.push(key);
            }
        }
        if failed > 0 {
            // Those written are told now (their entries are there); the events stay
            // unfinished for the outbox, which skips these devices when it redoes them.
            let written_set: HashSet<(&str, &str, &str)> = written.iter().copied().collect();
            push.retain(|c| written_set.contains(&(c.tenant.as_str(), c.user.as_str(), c.device.as_str())));
            self.publish(client, &by_node, &frames, &[]).await?;
            self.hand_to_push(push);
            metrics::counter!("herald_fanout_partial_total").increment(1);
            let done = written.into_iter().map(|(t, u, d)| DeviceKey::new(t, u, d)).collect();
            return Err(FanoutError::Partial { failed, done });
        }
        self.publish(client, &by_node, &frames, events).await?;
        metrics::counter!("herald_fanout_messages_total").increment(msgs.len() as u64);
        self.hand_to_push(push);
        Ok(())
    }

    /// Once the pending entries are written (an ack can only remove what is there), the
    /// push scheduler gets the messages for devices with a push token. It never waits:
    /// a full queue costs those messages their notification, never the fan-out.
    fn hand_to_push(&self, candidates: Vec<PushCandidate>) {
        let Some(scheduler) = self.push.as_ref().filter(|_| !candidates.is_empty()) else {
            return;
        };
        let n = candidates.len() as u64;
        if scheduler.try_send(candidates).is_err() {
            metrics::counter!("herald_push_dropped_total").increment(n);
            tracing::debug!(messages = n, "push hand-off queue full; no notification for these");
        }
    }

    /// Once the pending entries are written: one PUBLISH per node carrying its
    /// deliveries, and the markers of the finished `events`, in one round trip.
    async fn publish(
        &self,
        client: &Client,
        by_node: &ByNode<'_>,
        frames: &HashMap<MsgId, Box<RawValue>>,
        events: &[u64],
    ) -> Result<(), FanoutError> {
        let publishes = by_node.len();
        if publishes + events.len() == 0 {
            return Ok(());
        }
        let mut batch = Batch::new();
        for (node, deliveries) in by_node {
            // The frames as they were made (checked once, not parsed again), and the
            // recipients as the plans named them: nothing copied but into the payload.
            let env = DeliveriesOut {
                deliver: deliveries
                    .iter()
                    .map(|(id, to)| DeliveryOut { id: *id, frame: &frames[id], to: to.clone() })
                    .collect(),
            };
            let payload = serde_json::to_string(&env).expect("envelope serializes");
            let channel = self.keys.node_channel(node);
            batch.publish_to_node(client, channel, payload);
        }
        let expiry = Expiration::PX(self.done_ttl_ms as i64);
        for event in events {
            batch.push(client.set::<Value, _, _>(self.keys.fanned_out(*event), 1, Some(expiry.clone()), None, false));
        }
        let mut results = batch.run().await.into_iter();
        for r in results.by_ref().take(publishes) {
            r?;
        }
        for (event, r) in events.iter().zip(results) {
            if let Err(e) = r {
                tracing::debug!(event, error = %e, "finished fan-out not remembered");
            }
        }
        Ok(())
    }
}

mod calls;
mod reads;
#[cfg(test)]
mod tests;
mod write;
