//! The fan-out's writes: the conversations' seq floors, frames, and pending entries
//! through the fan-out script, sent together (one socket write, [`Batch`]).

use std::collections::{BTreeMap, HashMap};

use fred::prelude::*;
use fred::types::{ClusterHash, CustomCommand};
use herald_shared::ids::MsgId;
use herald_shared::keys::PresenceValue;
use herald_shared::protocol::TimelineEvent;
use herald_shared::redis::Batch;
use herald_shared::scripts;
use serde_json::value::RawValue;

use super::calls::calls;
use super::{Fanout, UserPlan};
use crate::batch::Committed;

/// Frame bytes per script call at most (a larger frame is stored by a SET of its own).
const FRAME_CALL_BYTES: usize = 512 * 1024;

/// What the fan-out script did for one device.
#[derive(Clone, Debug)]
pub(super) struct Written<'a> {
    pub device: &'a str,
    /// Where the device is connected, if it is.
    pub node: Option<String>,
    /// Its entries were written.
    pub written: bool,
}

impl Fanout {
    /// Stores frames and pending entries; returns, per user plan, its devices: whether
    /// their entries were written, and the node of those online. The users go in a few
    /// script calls (see [`calls`]), not one each; a call that failed as a whole wrote
    /// none of its users' entries.
    pub(super) async fn write<'a>(
        &self,
        client: &Client,
        msgs: &[&Committed],
        frames: &HashMap<MsgId, Box<RawValue>>,
        plans: &BTreeMap<(&'a str, &'a str), UserPlan<'a>>,
    ) -> Result<Vec<Vec<Written<'a>>>, fred::error::Error> {
        let mut batch = Batch::new();
        // The conversations' seq floors first (`crate::seq_floor`), in the same write.
        if let Some(floors) = &self.floors {
            floors.push_raise(&mut batch, client, msgs);
        }
        // A recall or edit drops its message's stored frame: devices that still owe it
        // read it from MySQL, as it is now. A frame dropped in the same run is not
        // stored at all.
        let stale: Vec<MsgId> = msgs.iter().filter_map(|m| m.event.as_ref()?.target()).collect();
        // An edit's frame carries text a later recall must take back from everyone:
        // it is not kept here, and devices that owe it read it from MySQL, as it is now.
        let mut cached: Vec<(String, &str)> = msgs
            .iter()
            .filter(|m| !matches!(m.event, Some(TimelineEvent::Edited { .. })) && !stale.contains(&m.id))
            .map(|m| (self.keys.message(m.id), frames[&m.id].get()))
            .collect();
        // The frames of a slot in one script call; a frame alone (a slot's only one, or
        // one the size of a call) by a plain SET.
        // Each key is made once and handed to its command (taken, not copied).
        let sizes = cached.iter().map(|(key, frame)| (key.as_str(), frame.len()));
        for call in herald_shared::redis::calls_by_slot(sizes, client.is_clustered(), FRAME_CALL_BYTES) {
            if let [i] = call[..] {
                let (key, frame) = (std::mem::take(&mut cached[i].0), cached[i].1);
                let expiry = Some(Expiration::EX(self.message_ttl_s));
                batch.push(client.set::<Value, _, _>(key, frame, expiry, None, false));
                continue;
            }
            let mut command: Vec<Value> = Vec::with_capacity(3 + 2 * call.len());
            command.push(scripts::FRAMES_SET.script().sha1().clone().into());
            command.push((call.len() as i64).into());
            command.extend(call.iter().map(|&i| Value::from(std::mem::take(&mut cached[i].0))));
            command.push(self.message_ttl_s.into());
            command.extend(call.iter().map(|&i| Value::from(cached[i].1)));
            batch
                .push(client.custom::<Value, _>(CustomCommand::new("EVALSHA", ClusterHash::Offset(2), false), command));
        }
        for id in &stale {
            batch.push(client.del::<Value, _>(self.keys.message(*id)));
        }
        // The raises and the frames: any failed fails the fan-out (it is done again).
        let stores = batch.len();
        let plans: Vec<(&(&str, &str), &UserPlan)> = plans.iter().collect();
        let calls = calls(&self.keys, &plans, client.is_clustered());
        for call in &calls {
            let mut keys: Vec<Value> = Vec::new();
            // Each id of the call once (score, member), and each device's entries as
            // positions in that list: a message to a group is one id for all its users.
            let mut ids_of_call: Vec<MsgId> = Vec::new();
            let mut position: HashMap<MsgId, i64> = HashMap::new();
            let mut per_user: Vec<Value> = Vec::new();
            for &i in call {
                let (&(tenant, user), plan) = plans[i];
                keys.push(self.keys.presence(tenant, user).into());
                keys.push(self.keys.overflow(tenant, user).into());
                per_user.push((plan.len() as i64).into());
                for (device, ids) in plan {
                    keys.push(self.keys.pending(tenant, user, device).into());
                    per_user.push((*device).into());
                    per_user.push((ids.len() as i64).into());
                    for id in ids {
                        let at = *position.entry(*id).or_insert_with(|| {
                            ids_of_call.push(*id);
                            ids_of_call.len() as i64
                        });
                        per_user.push(at.into());
                    }
                }
            }
            let mut args: Vec<Value> = Vec::with_capacity(3 + 2 * ids_of_call.len() + per_user.len());
            args.push((self.pending_cap as i64).into());
            args.push((call.len() as i64).into());
            args.push((ids_of_call.len() as i64).into());
            for id in &ids_of_call {
                args.push(id.score().into());
                args.push(id.member().into());
            }
            args.extend(per_user);
            // EVALSHA through `custom`: the slot is the first key's (offset 2: sha,
            // numkeys, key...).
            let mut command: Vec<Value> = Vec::with_capacity(2 + keys.len() + args.len());
            command.push(scripts::FANOUT.script().sha1().clone().into());
            command.push((keys.len() as i64).into());
            command.extend(keys);
            command.extend(args);
            batch
                .push(client.custom::<Value, _>(CustomCommand::new("EVALSHA", ClusterHash::Offset(2), false), command));
        }
        let mut results = batch.run().await.into_iter();
        for r in results.by_ref().take(stores) {
            r?;
        }
        let mut devices: Vec<Vec<Written>> = vec![Vec::new(); plans.len()];
        let mut calls_failed = None;
        for (call, r) in calls.iter().zip(results) {
            let answer = match r {
                Ok(v) => v.into_array(),
                Err(e) => {
                    // None of this call's users got their entries.
                    for &i in call {
                        devices[i] =
                            plans[i].1.keys().map(|&d| Written { device: d, node: None, written: false }).collect();
                    }
                    calls_failed = Some(e);
                    continue;
                }
            };
            // Two elements per device, in the order the call named them.
            let named: usize = call.iter().map(|&i| plans[i].1.len()).sum();
            if answer.len() != 2 * named {
                return Err(fred::error::Error::new(fred::error::ErrorKind::Unknown, "fan-out script answered short"));
            }
            let mut answer = answer.into_iter();
            for &i in call {
                for &device in plans[i].1.keys() {
                    let (Some(presence), Some(written)) = (answer.next(), answer.next()) else { break };
                    let node = presence.as_str().as_deref().and_then(PresenceValue::parse).map(|p| p.node);
                    let written = written.as_i64() == Some(1);
                    devices[i].push(Written { device, node, written });
                }
            }
        }
        if let Some(e) = calls_failed {
            if devices.iter().flatten().all(|d| !d.written) {
                return Err(e);
            }
        }
        Ok(devices)
    }
}
