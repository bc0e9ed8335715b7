//! Fan-out of committed messages into Redis.
//!
//! For each message: its `msg` frame is serialized once and stored at `m:{id}`; every
//! eligible device of every member (except the sending device) gets the id in its
//! pending set through a Lua call per group of users sharing a cluster slot (on a
//! single Redis, every user in one call, cut at 2 048 entries); the gateways holding online
//! devices get one PUBLISH per node carrying the frames. Two pipelines: the frames and
//! pending entries, then the PUBLISHes with the markers of the finished outbox events
//! (only once every pending entry is written). Fan-out is idempotent, so the outbox may
//! run it again after a partial failure.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use fred::prelude::*;
use fred::types::{ClusterHash, CustomCommand};
use herald_shared::db::TextColumns;
use herald_shared::ids::MsgId;
use herald_shared::keys::{DeviceKey, Keys, PresenceValue};
use herald_shared::protocol::{Delivery, NodeEnvelope, TimelineEvent};
use herald_shared::scripts;
use serde_json::value::RawValue;
use sqlx::mysql::MySqlPool;
use sqlx::{MySql, QueryBuilder, Row};
use tokio::sync::mpsc;

use crate::batch::{live_since, push_pairs, Committed, PushCandidate, Recipient};
use crate::seq_floor::SeqFloors;
use calls::calls;

#[derive(Debug, thiserror::Error)]
pub enum FanoutError {
    #[error("mysql: {0}")]
    Db(#[from] sqlx::Error),
    #[error("redis: {0}")]
    Redis(#[from] fred::error::Error),
    #[error("stored message {0} has a body that is not JSON")]
    Corrupt(MsgId),
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

/// Pending-set additions for one user: device -> messages.
type UserPlan = BTreeMap<String, Vec<MsgId>>;

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

    /// Reads committed messages back from MySQL (for the outbox dispatcher).
    pub async fn load(&self, ids: &[MsgId]) -> Result<Vec<Committed>, sqlx::Error> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let mut q = QueryBuilder::<MySql>::new(
            "SELECT id, tenant_id, conv_id, seq, sender_id, sender_device, client_msg_id, body, created_at, event FROM messages WHERE id IN (",
        );
        let mut sep = q.separated(", ");
        for id in ids {
            sep.push_bind(id.0);
        }
        q.push(") ORDER BY id");
        let rows = q.build().fetch_all(&self.db).await?;
        rows.iter()
            .map(|r| {
                Ok(Committed {
                    id: MsgId(r.try_get::<u64, _>(0)?),
                    tenant: r.text(1)?,
                    conv: r.text(2)?,
                    seq: r.try_get(3)?,
                    sender: r.text(4)?,
                    sender_device: r.text(5)?,
                    cmid: r.text(6)?,
                    body: r.text(7)?,
                    ts: r.try_get::<i64, _>(8)? as u64,
                    event: r.opt_text(9)?.map(|e| serde_json::from_str(&e).unwrap_or(TimelineEvent::Unknown)),
                })
            })
            .collect()
    }

    /// Every member device of the conversations of `msgs`, with the member's range.
    async fn recipients(&self, msgs: &[Committed]) -> Result<Vec<Recipient>, sqlx::Error> {
        let mut pairs: Vec<(&str, &str)> = msgs.iter().map(|m| (m.tenant.as_str(), m.conv.as_str())).collect();
        pairs.sort();
        pairs.dedup();
        let mut q = QueryBuilder::<MySql>::new(
            "SELECT m.tenant_id, m.conv_id, m.user_id, m.joined_seq, m.left_seq, d.device_id, d.push_token IS NOT NULL FROM members m \
             JOIN devices d ON d.tenant_id = m.tenant_id AND d.user_id = m.user_id \
             AND d.expired_at IS NULL AND d.last_seen_at >= ",
        );
        q.push_bind(live_since(self.device_ttl_ms)).push(" WHERE ");
        push_pairs(&mut q, "m.tenant_id", "m.conv_id", &pairs);
        let rows = q.build().fetch_all(&self.db).await?;
        rows.iter()
            .map(|r| {
                Ok(Recipient {
                    tenant: r.text(0)?,
                    conv: r.text(1)?,
                    user: r.text(2)?,
                    joined_seq: r.try_get(3)?,
                    left_seq: r.try_get(4)?,
                    device: r.text(5)?,
                    push: r.try_get::<i64, _>(6)? == 1,
                })
            })
            .collect()
    }

    /// Fans out the messages of outbox event `event`, read back from MySQL, looking up
    /// their recipients.
    pub async fn deliver(&self, msgs: &[Committed], event: u64) -> Result<(), FanoutError> {
        if msgs.is_empty() {
            return Ok(());
        }
        let recipients = self.recipients(msgs).await?;
        self.deliver_to(&[(msgs, &recipients)], &[event]).await
    }

    /// Fans out groups of committed messages, each to the member devices its commit read
    /// under its locks, and remembers that outbox `events` (the rows covering them)
    /// finished, so a redo (the worker died before marking them SENT, a SENDING claim
    /// went stale) does not put back pending entries their devices already acked.
    /// Remembering is best effort: forgetting costs a repeat, never a loss.
    pub async fn deliver_to(&self, groups: &[(&[Committed], &[Recipient])], events: &[u64]) -> Result<(), FanoutError> {
        let msgs: Vec<&Committed> = groups.iter().flat_map(|(msgs, _)| msgs.iter()).collect();
        if msgs.is_empty() {
            return Ok(());
        }
        let mut frames: HashMap<MsgId, String> = HashMap::with_capacity(msgs.len());
        let mut plans: BTreeMap<(String, String), UserPlan> = BTreeMap::new();
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
                    if r.receives(m.seq) && !m.skips(&r.user, &r.device) {
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
                            });
                        }
                        plans
                            .entry((m.tenant.clone(), r.user.clone()))
                            .or_default()
                            .entry(r.device.clone())
                            .or_default()
                            .push(m.id);
                    }
                }
            }
        }

        let client = self.redis.next();
        // Devices are told only after both (the PUBLISH below).
        let raise = async {
            if let Some(floors) = &self.floors {
                floors.raise(&msgs).await
            } else {
                Ok(())
            }
        };
        let (raised, written) = tokio::join!(raise, self.write(client, &msgs, &frames, &plans));
        raised?;
        let results = match written {
            Err(e) if e.to_string().contains("NOSCRIPT") => {
                scripts::FANOUT.script().load(client).await?;
                self.write(client, &msgs, &frames, &plans).await?
            }
            other => other?,
        };

        // Online devices, grouped by the node that holds them.
        let mut by_node: BTreeMap<String, BTreeMap<MsgId, Vec<DeviceKey>>> = BTreeMap::new();
        for (((tenant, user), plan), online) in plans.iter().zip(results) {
            for (device, node) in online {
                let Some(ids) = plan.get(&device) else {
                    continue;
                };
                for id in ids {
                    by_node.entry(node.clone()).or_default().entry(*id).or_default().push(DeviceKey::new(
                        tenant.as_str(),
                        user.as_str(),
                        device.as_str(),
                    ));
                }
            }
        }
        self.publish(client, by_node, &frames, events).await?;
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
        by_node: BTreeMap<String, BTreeMap<MsgId, Vec<DeviceKey>>>,
        frames: &HashMap<MsgId, String>,
        events: &[u64],
    ) -> Result<(), FanoutError> {
        let publishes = by_node.len();
        if publishes + events.len() == 0 {
            return Ok(());
        }
        let pipe = client.pipeline();
        for (node, deliveries) in by_node {
            let mut env = NodeEnvelope::default();
            for (id, to) in deliveries {
                let frame = RawValue::from_string(frames[&id].clone()).map_err(|_| FanoutError::Corrupt(id))?;
                env.deliver.push(Delivery { id, frame, to });
            }
            let payload = serde_json::to_string(&env).expect("envelope serializes");
            herald_shared::redis::publish_to_node(&pipe, self.keys.node_channel(&node), payload).await?;
        }
        let expiry = Expiration::PX(self.done_ttl_ms as i64);
        for event in events {
            let _: () = pipe.set(self.keys.fanned_out(*event), 1, Some(expiry.clone()), None, false).await?;
        }
        let results = pipe.try_all::<Value>().await;
        if results.len() != publishes + events.len() {
            // The pipeline failed as a whole: the devices online were not told.
            let first_error = results.into_iter().find_map(Result::err);
            return Err(first_error
                .unwrap_or_else(|| {
                    fred::error::Error::new(fred::error::ErrorKind::Unknown, "publish pipeline answered short")
                })
                .into());
        }
        let mut results = results.into_iter();
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

    /// Stores frames and pending entries; returns, per user plan, the online devices
    /// and their nodes. The users go in a few script calls (see [`calls`]), not one each.
    async fn write(
        &self,
        client: &Client,
        msgs: &[&Committed],
        frames: &HashMap<MsgId, String>,
        plans: &BTreeMap<(String, String), UserPlan>,
    ) -> Result<Vec<Vec<(String, String)>>, fred::error::Error> {
        let pipe = client.pipeline();
        for m in msgs {
            let _: () = pipe
                .set(
                    self.keys.message(m.id),
                    frames[&m.id].as_str(),
                    Some(Expiration::EX(self.message_ttl_s)),
                    None,
                    false,
                )
                .await?;
        }
        // A recall or edit drops its message's stored frame (after it was written, in
        // commit order): devices that still owe it read it from MySQL, as it is now.
        let stale: Vec<MsgId> = msgs.iter().filter_map(|m| m.event.as_ref()?.target()).collect();
        for id in &stale {
            let _: () = pipe.del(self.keys.message(*id)).await?;
        }
        let plans: Vec<(&(String, String), &UserPlan)> = plans.iter().collect();
        let calls = calls(&self.keys, &plans, client.is_clustered());
        for call in &calls {
            let mut keys: Vec<Value> = Vec::new();
            let mut args: Vec<Value> = vec![self.pending_cap.to_string().into(), call.len().to_string().into()];
            for &i in call {
                let ((tenant, user), plan) = plans[i];
                keys.push(self.keys.presence(tenant, user).into());
                keys.push(self.keys.overflow(tenant, user).into());
                args.push(plan.len().to_string().into());
                for (device, ids) in plan {
                    keys.push(self.keys.pending(tenant, user, device).into());
                    args.push(device.as_str().into());
                    args.push(ids.len().to_string().into());
                    for id in ids {
                        args.push(id.score().into());
                        args.push(id.member().into());
                    }
                }
            }
            // EVALSHA through `custom`: pipelines have no Lua interface. The slot is
            // the first key's (offset 2: sha, numkeys, key...).
            let mut command: Vec<Value> = Vec::with_capacity(2 + keys.len() + args.len());
            command.push(scripts::FANOUT.script().sha1().clone().into());
            command.push((keys.len() as i64).into());
            command.extend(keys);
            command.extend(args);
            let _: () = pipe.custom(CustomCommand::new("EVALSHA", ClusterHash::Offset(2), false), command).await?;
        }
        let results = pipe.try_all::<Value>().await;
        // A pipeline that failed as a whole answers with fewer results than commands:
        // that is a failed fan-out (retried by the outbox), never a partial success.
        if results.len() != msgs.len() + stale.len() + calls.len() {
            let first_error = results.into_iter().find_map(Result::err);
            return Err(first_error.unwrap_or_else(|| {
                fred::error::Error::new(fred::error::ErrorKind::Unknown, "fan-out pipeline answered short")
            }));
        }
        let mut results = results.into_iter();
        for _ in 0..msgs.len() + stale.len() {
            results.next().transpose()?;
        }
        let mut online = vec![Vec::new(); plans.len()];
        for (call, r) in calls.iter().zip(results) {
            let per_user = r?.into_array();
            if per_user.len() != call.len() {
                return Err(fred::error::Error::new(fred::error::ErrorKind::Unknown, "fan-out script answered short"));
            }
            for (&i, user) in call.iter().zip(per_user) {
                for pair in user.into_array().chunks(2) {
                    if let [dev, Value::String(presence)] = pair {
                        if let (Some(dev), Some(p)) = (dev.as_string(), PresenceValue::parse(presence)) {
                            online[i].push((dev, p.node));
                        }
                    }
                }
            }
        }
        Ok(online)
    }
}

mod calls;
#[cfg(test)]
mod tests;
