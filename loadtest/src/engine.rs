//! What every WebSocket scenario is made of: provisioning through the API, devices of
//! the client library, paced senders that fail over between gateways, the recorder
//! (in [`crate::recorder`]) and the integrity check.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use futures::{stream, StreamExt, TryStreamExt};
use herald_client::device::{Device, DeviceLog, DeviceSpec, TokenSource, Via};
use herald_client::{token, ClientError, HttpClient};
use herald_shared::auth::Platform;
use herald_shared::error::ErrorCode;
use serde_json::Value;

use crate::cli::TargetArgs;
use crate::integrity::{self, Acked, EventLog, IntegrityReport, Received};
pub use crate::recorder::{histogram, micros_now, Pct, Recorder, Tick};

/// Where the scenario runs and who it is.
#[derive(Clone)]
pub struct Target {
    pub gateways: Vec<String>,
    pub tenant: String,
    pub secret: String,
    /// A tag unique to this run: user and conversation ids start with it.
    pub run: String,
    /// Loopback addresses devices connect from, in turn (none: the default).
    pub local_ips: Vec<IpAddr>,
    pub http: reqwest::Client,
    /// Whom to trust for `https://` gateways (`--ca-file`).
    pub tls: herald_client::Tls,
}

impl Target {
    pub fn from_args(args: &TargetArgs) -> Result<Target> {
        let tls = args.gateways.tls()?;
        Ok(Target {
            gateways: args.gateways.urls.clone(),
            tenant: args.tenant.clone(),
            secret: args.secret.get()?,
            run: format!("{:x}", herald_shared::ids::now_ms()),
            local_ips: args.local_ips.clone(),
            http: tls.http().pool_max_idle_per_host(4096).timeout(Duration::from_secs(30)).build()?,
            tls,
        })
    }

    pub fn user(&self, name: &str) -> String {
        format!("{}-{name}", self.run)
    }

    pub fn http_as(&self, gateway: usize, user: &str, device: &str) -> HttpClient {
        HttpClient::with_http(
            self.http.clone(),
            self.gateways[gateway % self.gateways.len()].clone(),
            token(&self.secret, &self.tenant, user, device, Platform::Server),
        )
    }

    pub fn device(&self, index: usize, user: &str, rec: &Arc<Recorder>) -> Device {
        self.device_of(index, user, "d", rec)
    }

    /// The client token of one of `user`'s devices (a desktop app).
    pub fn device_token(&self, user: &str, device: &str) -> String {
        token(&self.secret, &self.tenant, user, device, Platform::Desktop)
    }

    /// `user`'s device `device`, started; `index` spreads devices over gateways and addresses.
    pub fn device_of(&self, index: usize, user: &str, device: &str, rec: &Arc<Recorder>) -> Device {
        Device::spawn(self.device_spec(index, user, device), rec.clone())
    }

    /// What [`Target::device_of`] starts: a device of the spec, except that it comes back
    /// whatever ended its session (a run judges what every device showed, and a device
    /// that stopped would show nothing more), with the backoff capped at 5 s, and new
    /// tokens minted when its day-long token runs out (a soak may outlast it).
    pub fn device_spec(&self, index: usize, user: &str, device: &str) -> DeviceSpec {
        let (secret, tenant, who) = (self.secret.clone(), self.tenant.clone(), (user.to_owned(), device.to_owned()));
        let source = TokenSource::new(move |_| {
            let t = token(&secret, &tenant, &who.0, &who.1, Platform::Desktop);
            std::future::ready(Some(t))
        });
        DeviceSpec {
            first_gateway: index,
            local_ip: (!self.local_ips.is_empty()).then(|| self.local_ips[index % self.local_ips.len()]),
            tls: self.tls.clone(),
            gap_sync_after: Duration::from_secs(5),
            token_source: Some(source),
            reconnect_after_stop_codes: true,
            backoff_max: Duration::from_secs(5),
            ..DeviceSpec::new(user, device, &self.device_token(user, device), self.gateways.clone())
        }
    }
}

/// A conversation of the workload: its sender (over HTTP) and its receiving users.
#[derive(Clone, Debug)]
pub struct Conv {
    pub id: String,
    pub sender: String,
    pub receivers: Vec<String>,
}

/// Creates the conversations through the API, 32 at a time, with a progress line.
pub async fn provision(target: &Target, convs: &[Conv], kind: &str) -> Result<()> {
    let done = AtomicU64::new(0);
    let started = Instant::now();
    stream::iter(convs.iter().enumerate())
        .map(|(k, c)| {
            let done = &done;
            async move {
                let mut members: Vec<&str> = c.receivers.iter().map(String::as_str).collect();
                members.push(&c.sender);
                target.http_as(k, &c.sender, "s").create_conversation(Some(&c.id), kind, &members).await?;
                let n = done.fetch_add(1, Ordering::Relaxed) + 1;
                if n.is_multiple_of(500) {
                    eprintln!("  provisioned {n}/{} conversations", convs.len());
                }
                Ok::<_, ClientError>(())
            }
        })
        .buffer_unordered(32)
        .try_collect::<Vec<_>>()
        .await
        .context("provisioning conversations")?;
    eprintln!("provisioned {} {kind} conversations in {:.1} s", convs.len(), started.elapsed().as_secs_f64());
    Ok(())
}

/// Registers devices without connecting them (so fan-out queues for them).
pub async fn register(target: &Target, users: &[String]) -> Result<()> {
    stream::iter(users.iter().enumerate())
        .map(|(k, u)| async move {
            HttpClient::with_http(
                target.http.clone(),
                target.gateways[k % target.gateways.len()].clone(),
                target.device_token(u, "d"),
            )
            .register_device()
            .await
        })
        .buffer_unordered(32)
        .try_collect::<Vec<_>>()
        .await
        .context("registering devices")?;
    Ok(())
}

/// Acknowledged sends, for the integrity check.
pub type AckLog = Arc<Mutex<Vec<Acked>>>;

/// One send until the server commits it: on `unavailable`, `rate_limited` or a broken
/// connection it retries with the same `cmid`, moving to the next gateway when one is
/// unreachable. Gives up after `deadline` (then the message counts as not acknowledged).
pub async fn send_durably(
    clients: &[HttpClient],
    first: usize,
    cmid: &str,
    conv: &str,
    body: &Value,
    deadline: Duration,
) -> Result<herald_shared::protocol::SendResult, ClientError> {
    durably(clients, first, deadline, |c| c.send(cmid, conv, body)).await
}

/// A timeline change of a committed message, durable like a send: `Some(body)` edits
/// it, `None` recalls it, under the idempotency key `cmid`.
pub async fn change_durably(
    clients: &[HttpClient],
    first: usize,
    target: herald_shared::ids::MsgId,
    cmid: &str,
    edit: Option<&Value>,
    deadline: Duration,
) -> Result<herald_shared::protocol::SendResult, ClientError> {
    durably(clients, first, deadline, |c| async move {
        match edit {
            Some(body) => c.edit(target, cmid, body).await,
            None => c.recall(target, cmid).await,
        }
    })
    .await
}

/// Runs `call` until the server commits (it retries with the same idempotency key).
async fn durably<'a, F, Fut>(
    clients: &'a [HttpClient],
    first: usize,
    deadline: Duration,
    call: F,
) -> Result<herald_shared::protocol::SendResult, ClientError>
where
    F: Fn(&'a HttpClient) -> Fut,
    Fut: std::future::Future<Output = Result<herald_shared::protocol::SendResult, ClientError>>,
{
    let started = Instant::now();
    let mut gw = first;
    let mut pause = Duration::from_millis(50);
    loop {
        let e = match call(&clients[gw % clients.len()]).await {
            Ok(r) => return Ok(r),
            Err(e) => e,
        };
        let wait = match &e {
            _ if matches!(e.code(), Some(ErrorCode::Unavailable) | Some(ErrorCode::RateLimited)) => pause,
            ClientError::Transport(_) => {
                gw += 1;
                pause
            }
            _ => return Err(e),
        };
        if started.elapsed() + wait > deadline {
            return Err(e);
        }
        tokio::time::sleep(wait).await;
        pause = (pause * 2).min(Duration::from_secs(2));
    }
}

/// How the senders of a scenario send.
#[derive(Clone, Debug)]
pub struct SendPlan {
    /// Messages per second in total; 0: each sender as fast as its acks come back.
    pub rate: f64,
    /// Body size in bytes (about).
    pub payload: usize,
    /// `cmid`s are this prefix and a counter.
    pub cmid_prefix: String,
    /// Every this many messages a sender changes its latest one, over HTTP: edits it,
    /// and the next time recalls it (timeline events, counted by the integrity check
    /// like messages). 0: no changes.
    pub change_every: u64,
}

/// Waits until every device is online and caught up and no delivery and no `sync`
/// answer came for `quiet`, or `limit` passed. Returns how long it took.
pub async fn settle(rec: &Recorder, devices: usize, quiet: Duration, limit: Duration) -> Duration {
    let started = Instant::now();
    let activity = || rec.delivered.load(Ordering::Relaxed) + rec.histories.load(Ordering::Relaxed);
    let mut last = activity();
    let mut still = Instant::now();
    while started.elapsed() < limit {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = activity();
        if now != last {
            last = now;
            still = Instant::now();
        }
        if rec.online.load(Ordering::Relaxed) >= devices as i64 && still.elapsed() >= quiet {
            break;
        }
    }
    started.elapsed()
}

/// Stops the devices and checks what they showed against what was acknowledged.
pub async fn finish(
    devices: Vec<(String, Device)>,
    convs: &[Conv],
    acked: &AckLog,
) -> (IntegrityReport, Vec<(String, DeviceLog)>) {
    let mut logs = Vec::with_capacity(devices.len());
    for (user, d) in devices {
        logs.push((user, d.stop().await));
    }
    let recipients: HashMap<String, Vec<(String, String)>> = convs
        .iter()
        .map(|c| (c.id.clone(), c.receivers.iter().map(|u| (u.clone(), "d".to_string())).collect()))
        .collect();
    let shown: Vec<(String, String, &DeviceLog)> = logs.iter().map(|(u, l)| (u.clone(), "d".into(), l)).collect();
    let log = EventLog { recipients, ..event_log(acked, &shown) };
    let report = integrity::check(&log);
    eprintln!("integrity: {report:?}");
    (report, logs)
}

/// The check's log of what was acknowledged and what each (user, device) saw; its
/// recipients are left to the caller.
pub fn event_log(acked: &AckLog, logs: &[(String, String, &DeviceLog)]) -> EventLog {
    let mut log = EventLog { acked: std::mem::take(&mut *acked.lock().expect("log")), ..Default::default() };
    for (user, device, l) in logs {
        let dev = (user.clone(), device.clone());
        log.received.extend(l.arrivals.iter().map(|a| Received {
            device: dev.clone(),
            id: a.id,
            conv: a.conv.clone(),
            seq: a.seq,
            via_sync: a.via == Via::Sync,
        }));
        log.shown.extend(l.shown.iter().map(|s| Received {
            device: dev.clone(),
            id: s.id,
            conv: s.conv.clone(),
            seq: s.seq,
            via_sync: false,
        }));
    }
    log
}
