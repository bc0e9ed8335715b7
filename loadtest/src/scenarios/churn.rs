//! The devices of `soak` as they come and go: at each churn some go away for good,
//! new devices of existing users register and connect, and some reconnect (stopped
//! now, started again at the next churn). What each device showed across its
//! instances makes up the integrity check's log.

use std::collections::HashMap;
use std::sync::Arc;

use anyhow::Result;
use futures::future::join_all;
use herald_client::device::{Device, DeviceLog};
use herald_client::HttpClient;
use herald_shared::ids::{now_ms, MsgId};
use rand::seq::{IndexedRandom, SliceRandom};

use crate::engine::{self, AckLog, Conv, Recorder, Target};
use crate::integrity::{self, IntegrityReport};

/// A new device is owed the messages committed from this long after its registration
/// on: a commit that read the conversation's devices just before it was registered
/// may still draw its ids just after.
const JOIN_MARGIN_MS: u64 = 1_000;

/// One device of the run, across its instances.
struct Member {
    user: String,
    device: String,
    /// Ids below this were committed before the device existed (0: from the start).
    since: u64,
    running: Option<Device>,
    /// The logs of its stopped instances, oldest first.
    logs: Vec<DeviceLog>,
}

impl Member {
    async fn stop(&mut self) {
        if let Some(d) = self.running.take() {
            self.logs.push(d.stop().await);
        }
    }

    /// One log of all its instances. A real app keeps what it showed across restarts
    /// (each instance resumes from the previous one's [`DeviceLog::stored`]), so a
    /// message shown by an earlier instance and again by a later one is a repeat the
    /// check counts, as are repeats within one instance.
    fn merged(&self) -> DeviceLog {
        let mut out = DeviceLog::default();
        for l in &self.logs {
            out.arrivals.extend(l.arrivals.iter().cloned());
            out.shown.extend(l.shown.iter().cloned());
            out.catch_ups.extend(l.catch_ups.iter().copied());
            out.sessions += l.sessions;
        }
        out
    }
}

/// What the churn did, for the report.
#[derive(Clone, Copy, Debug, Default)]
pub struct Churned {
    pub churns: u64,
    pub left: u64,
    pub joined: u64,
    pub reconnected: u64,
    pub join_errors: u64,
}

/// The run's devices: running, offline until the next churn, and gone for good.
pub struct Fleet {
    target: Target,
    rec: Arc<Recorder>,
    /// Users who may get a new device (the conversations' recipients).
    users: Vec<String>,
    running: Vec<Member>,
    offline: Vec<Member>,
    gone: Vec<Member>,
    /// Spreads devices over gateways and local addresses.
    next_index: usize,
    pub churned: Churned,
}

impl Fleet {
    /// One device per user, each online and caught up.
    pub async fn start(target: &Target, rec: &Arc<Recorder>, users: &[String]) -> Result<Fleet> {
        let devices = super::connect(target, users, rec, 0).await?;
        let running = devices
            .into_iter()
            .map(|(user, d)| Member { user, device: "d".into(), since: 0, running: Some(d), logs: Vec::new() })
            .collect();
        Ok(Fleet {
            target: target.clone(),
            rec: rec.clone(),
            users: users.to_vec(),
            running,
            offline: Vec::new(),
            gone: Vec::new(),
            next_index: users.len(),
            churned: Churned::default(),
        })
    }

    /// Devices that are running or will be at the next churn.
    pub fn live(&self) -> usize {
        self.running.len() + self.offline.len()
    }

    /// Starts `m` again from what its last instance stored, as the app restarted.
    fn spawn(&mut self, m: &mut Member) {
        self.next_index += 1;
        let mut spec = self.target.device_spec(self.next_index, &m.user, &m.device);
        if let Some(last) = m.logs.last() {
            spec.resume = last.stored.clone();
        }
        m.running = Some(Device::spawn(spec, self.rec.clone()));
    }

    /// Starts again the devices stopped at the previous churn.
    pub fn bring_back(&mut self) {
        for mut m in std::mem::take(&mut self.offline) {
            self.spawn(&mut m);
            self.running.push(m);
        }
    }

    /// One churn: the devices stopped last time come back, `leave` running devices go
    /// for good, `reconnect` others stop until the next churn, `join` new ones come.
    pub async fn churn(&mut self, leave: usize, join: usize, reconnect: usize) {
        self.churned.churns += 1;
        self.bring_back();
        self.running.shuffle(&mut rand::rng());
        let leave = leave.min(self.running.len());
        let reconnect = reconnect.min(self.running.len() - leave);
        let mut stopping: Vec<Member> = self.running.drain(..leave + reconnect).collect();
        join_all(stopping.iter_mut().map(Member::stop)).await;
        let offline = stopping.split_off(leave);
        self.churned.left += stopping.len() as u64;
        self.churned.reconnected += offline.len() as u64;
        self.gone.extend(stopping);
        self.offline.extend(offline);
        let new = self.join(join).await;
        self.running.extend(new);
    }

    /// `n` new devices of existing users, registered over HTTP, then connected.
    async fn join(&mut self, n: usize) -> Vec<Member> {
        let mut rng = rand::rng();
        let picks: Vec<(String, String)> = (0..n)
            .filter_map(|_| self.users.choose(&mut rng).cloned())
            .map(|u| {
                self.next_index += 1;
                (u, format!("n{}", self.next_index))
            })
            .collect();
        let registered = join_all(picks.iter().enumerate().map(|(k, (user, device))| {
            let gw = self.target.gateways[k % self.target.gateways.len()].clone();
            let http = HttpClient::with_http(self.target.http.clone(), gw, self.target.device_token(user, device));
            async move { http.register_device().await }
        }))
        .await;
        let since = MsgId::lowest_at(now_ms() + JOIN_MARGIN_MS).0;
        let mut out = Vec::new();
        for ((user, device), r) in picks.into_iter().zip(registered) {
            if let Err(e) = r {
                self.churned.join_errors += 1;
                eprintln!("registering a new device failed: {e}");
                continue;
            }
            let mut m = Member { user, device, since, running: None, logs: Vec::new() };
            self.spawn(&mut m);
            out.push(m);
        }
        self.churned.joined += out.len() as u64;
        out
    }

    /// Stops every device and checks what they showed: every device still there at the
    /// end owes every message of its user's conversations (a new one, those from when it
    /// joined); devices gone for good owe nothing, but what they showed must not repeat
    /// or disorder. The merged logs, one per device, come back for the report. Devices
    /// still offline are left out: [`Fleet::bring_back`] them and settle first.
    pub async fn finish(mut self, convs: &[Conv], acked: &AckLog) -> (IntegrityReport, Vec<(String, DeviceLog)>) {
        join_all(self.running.iter_mut().map(Member::stop)).await;
        let mut devices_of: HashMap<&str, Vec<(String, String)>> = HashMap::new();
        let mut since = HashMap::new();
        for m in &self.running {
            devices_of.entry(m.user.as_str()).or_default().push((m.user.clone(), m.device.clone()));
            if m.since > 0 {
                since.insert((m.user.clone(), m.device.clone()), m.since);
            }
        }
        let recipients = convs
            .iter()
            .map(|c| {
                let devices = c.receivers.iter().flat_map(|u| devices_of.get(u.as_str()).cloned().unwrap_or_default());
                (c.id.clone(), devices.collect())
            })
            .collect();
        let members: Vec<&Member> = self.running.iter().chain(&self.gone).collect();
        let merged: Vec<DeviceLog> = members.iter().map(|m| m.merged()).collect();
        let shown: Vec<(String, String, &DeviceLog)> =
            members.iter().zip(&merged).map(|(m, l)| (m.user.clone(), m.device.clone(), l)).collect();
        let log = integrity::EventLog { recipients, since, ..engine::event_log(acked, &shown) };
        let report = integrity::check(&log);
        eprintln!("integrity: {report:?}");
        let logs = members.iter().map(|m| m.user.clone()).zip(merged).collect();
        (report, logs)
    }
}

#[cfg(test)]
mod tests {
    use herald_client::device::Shown;

    use super::*;

    fn shown(ids: &[u64]) -> DeviceLog {
        let shown = ids.iter().map(|&id| Shown { id, conv: "c".into(), seq: id }).collect();
        DeviceLog { shown, sessions: 1, ..Default::default() }
    }

    #[test]
    fn what_a_later_instance_shows_again_counts_as_a_repeat() {
        let m = Member {
            user: "u".into(),
            device: "d".into(),
            since: 0,
            running: None,
            logs: vec![shown(&[1, 2, 3]), shown(&[3, 4, 4, 5])],
        };
        let l = m.merged();
        assert_eq!(l.shown.iter().map(|s| s.id).collect::<Vec<_>>(), [1, 2, 3, 3, 4, 4, 5]);
        assert_eq!(l.sessions, 2);
    }
}
