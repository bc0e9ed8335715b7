//! What every WebSocket scenario is made of: provisioning through the API, devices of
//! the client library, paced senders that fail over between gateways, a recorder of
//! HDR histograms and per-tick series with a progress line, and the integrity check.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use futures::{stream, StreamExt, TryStreamExt};
use hdrhistogram::Histogram;
use herald_shared::auth::Platform;
use herald_shared::client::{token, ClientError, HttpClient};
use herald_shared::device::{Device, DeviceLog, DeviceSpec, Observer, Via};
use herald_shared::error::ErrorCode;
use serde::Serialize;
use serde_json::{json, Value};

use crate::cli::TargetArgs;
use crate::integrity::{self, Acked, EventLog, IntegrityReport, Received};

pub fn micros_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_micros() as u64).unwrap_or(0)
}

pub fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("histogram bounds")
}

/// p50/p95/p99/max in milliseconds.
#[derive(Clone, Debug, Default, Serialize, serde::Deserialize)]
pub struct Pct {
    pub count: u64,
    pub p50: f64,
    pub p95: f64,
    pub p99: f64,
    pub max: f64,
}

impl Pct {
    pub fn of(h: &Histogram<u64>) -> Pct {
        let ms = |q: f64| h.value_at_quantile(q) as f64 / 1000.0;
        Pct { count: h.len(), p50: ms(0.5), p95: ms(0.95), p99: ms(0.99), max: h.max() as f64 / 1000.0 }
    }
}

/// One sample of the run, every `tick`.
#[derive(Clone, Debug, Default, Serialize, serde::Deserialize)]
pub struct Tick {
    pub t_s: f64,
    pub sends_per_s: f64,
    pub deliveries_per_s: f64,
    pub backlog_delivered: u64,
    pub send_ack_p99_ms: f64,
    pub realtime_p50_ms: f64,
    pub realtime_p99_ms: f64,
    pub online: i64,
    pub note: Option<String>,
}

/// A latency histogram for the whole run and one for the current tick.
struct Hist {
    total: Histogram<u64>,
    window: Histogram<u64>,
}

impl Hist {
    fn new() -> Mutex<Hist> {
        Mutex::new(Hist { total: histogram(), window: histogram() })
    }

    fn record(&mut self, micros: u64) {
        let v = micros.max(1);
        let _ = self.total.record(v);
        let _ = self.window.record(v);
    }
}

/// Counters and histograms shared by senders, devices and the progress display.
pub struct Recorder {
    started: Instant,
    pub sends: AtomicU64,
    pub send_errors: AtomicU64,
    pub delivered: AtomicU64,
    pub backlog_delivered: AtomicU64,
    pub caught_up: AtomicU64,
    pub online: AtomicI64,
    send_ack: Mutex<Hist>,
    realtime: Mutex<Hist>,
    backlog: Mutex<Hist>,
    catch_up: Mutex<Histogram<u64>>,
    series: Mutex<Vec<Tick>>,
    notes: Mutex<Vec<String>>,
}

impl Recorder {
    pub fn new() -> Arc<Recorder> {
        Arc::new(Recorder {
            started: Instant::now(),
            sends: AtomicU64::new(0),
            send_errors: AtomicU64::new(0),
            delivered: AtomicU64::new(0),
            backlog_delivered: AtomicU64::new(0),
            caught_up: AtomicU64::new(0),
            online: AtomicI64::new(0),
            send_ack: Hist::new(),
            realtime: Hist::new(),
            backlog: Hist::new(),
            catch_up: Mutex::new(histogram()),
            series: Mutex::new(Vec::new()),
            notes: Mutex::new(Vec::new()),
        })
    }

    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    pub fn send_acked(&self, took: Duration) {
        self.sends.fetch_add(1, Ordering::Relaxed);
        self.send_ack.lock().expect("histogram").record(took.as_micros() as u64);
    }

    /// A line in the series at the next tick (chaos actions, phase changes).
    pub fn note(&self, text: impl Into<String>) {
        let text = text.into();
        eprintln!("[{:>6.1}s] {text}", self.elapsed().as_secs_f64());
        self.notes.lock().expect("notes").push(text);
    }

    pub fn send_ack(&self) -> Pct {
        Pct::of(&self.send_ack.lock().expect("histogram").total)
    }
    pub fn realtime(&self) -> Pct {
        Pct::of(&self.realtime.lock().expect("histogram").total)
    }
    pub fn backlog(&self) -> Pct {
        Pct::of(&self.backlog.lock().expect("histogram").total)
    }
    pub fn catch_up(&self) -> Pct {
        Pct::of(&self.catch_up.lock().expect("histogram"))
    }
    pub fn series(&self) -> Vec<Tick> {
        self.series.lock().expect("series").clone()
    }

    /// Realtime delivery latency of the ticks in `[from, to)` seconds (from the per-tick
    /// p99s: the worst tick's p99 is reported).
    pub fn realtime_p99_between(&self, from: f64, to: f64) -> f64 {
        self.series
            .lock()
            .expect("series")
            .iter()
            .filter(|t| t.t_s > from && t.t_s <= to + 1e-9)
            .map(|t| t.realtime_p99_ms)
            .fold(0.0, f64::max)
    }

    /// Samples the counters every `every` and prints a progress line about once a
    /// second, until `stop`.
    pub fn monitor(
        self: &Arc<Self>,
        label: &'static str,
        every: Duration,
        stop: Arc<AtomicBool>,
    ) -> tokio::task::JoinHandle<()> {
        let rec = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.tick().await;
            let (mut sends, mut delivered) = (0u64, 0u64);
            let mut printed = Instant::now();
            while !stop.load(Ordering::Relaxed) {
                tick.tick().await;
                let secs = every.as_secs_f64();
                let (s, d) = (rec.sends.load(Ordering::Relaxed), rec.delivered.load(Ordering::Relaxed));
                let window = |h: &Mutex<Hist>, q: &[f64]| {
                    let mut h = h.lock().expect("histogram");
                    let out: Vec<f64> = q.iter().map(|q| h.window.value_at_quantile(*q) as f64 / 1000.0).collect();
                    h.window.reset();
                    out
                };
                let ack = window(&rec.send_ack, &[0.99]);
                let rt = window(&rec.realtime, &[0.5, 0.99]);
                let notes = std::mem::take(&mut *rec.notes.lock().expect("notes"));
                let t = Tick {
                    t_s: rec.elapsed().as_secs_f64(),
                    sends_per_s: (s - sends) as f64 / secs,
                    deliveries_per_s: (d - delivered) as f64 / secs,
                    backlog_delivered: rec.backlog_delivered.load(Ordering::Relaxed),
                    send_ack_p99_ms: ack[0],
                    realtime_p50_ms: rt[0],
                    realtime_p99_ms: rt[1],
                    online: rec.online.load(Ordering::Relaxed),
                    note: (!notes.is_empty()).then(|| notes.join("; ")),
                };
                (sends, delivered) = (s, d);
                if printed.elapsed() >= Duration::from_millis(990) {
                    printed = Instant::now();
                    eprintln!(
                        "[{:>6.1}s] {label}: sends {:>6.0}/s (ack p99 {:>6.1} ms, errors {})  deliveries {:>7.0}/s (realtime p99 {:>6.1} ms)  backlog delivered {}  online {}",
                        t.t_s,
                        t.sends_per_s,
                        t.send_ack_p99_ms,
                        rec.send_errors.load(Ordering::Relaxed),
                        t.deliveries_per_s,
                        t.realtime_p99_ms,
                        t.backlog_delivered,
                        t.online,
                    );
                }
                rec.series.lock().expect("series").push(t);
            }
        })
    }
}

impl Observer for Recorder {
    fn message(&self, frame: &Value, via: Via, into_session: Duration) {
        self.delivered.fetch_add(1, Ordering::Relaxed);
        let age = frame["body"]["t0"].as_u64().map(|t0| micros_now().saturating_sub(t0));
        match via {
            Via::Realtime => {
                if let Some(age) = age {
                    self.realtime.lock().expect("histogram").record(age);
                }
            }
            Via::Backlog | Via::Sync => {
                self.backlog_delivered.fetch_add(1, Ordering::Relaxed);
                // Backlog latency counts from when the device came back, not from the send.
                let since = into_session.as_micros() as u64;
                self.backlog.lock().expect("histogram").record(age.map_or(since, |a| a.min(since)));
            }
        }
    }

    fn caught_up(&self, after: Duration) {
        self.caught_up.fetch_add(1, Ordering::Relaxed);
        let _ = self.catch_up.lock().expect("histogram").record((after.as_micros() as u64).max(1));
    }

    fn online(&self, up: bool) {
        self.online.fetch_add(if up { 1 } else { -1 }, Ordering::Relaxed);
    }
}

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
}

impl Target {
    pub fn from_args(args: &TargetArgs) -> Result<Target> {
        Ok(Target {
            gateways: args.gateways.urls.clone(),
            tenant: args.tenant.clone(),
            secret: args.secret.get()?,
            run: format!("{:x}", herald_shared::ids::now_ms()),
            local_ips: args.local_ips.clone(),
            http: reqwest::Client::builder().pool_max_idle_per_host(4096).timeout(Duration::from_secs(30)).build()?,
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
        let spec = DeviceSpec {
            user: user.to_owned(),
            device: "d".into(),
            token: token(&self.secret, &self.tenant, user, "d", Platform::Desktop),
            gateways: self.gateways.clone(),
            first_gateway: index,
            local_ip: (!self.local_ips.is_empty()).then(|| self.local_ips[index % self.local_ips.len()]),
            gap_sync_after: Duration::from_secs(5),
        };
        Device::spawn(spec, rec.clone())
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
                token(&target.secret, &target.tenant, u, "d", Platform::Desktop),
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
    let started = Instant::now();
    let mut gw = first;
    let mut pause = Duration::from_millis(50);
    loop {
        let e = match clients[gw % clients.len()].send(cmid, conv, body).await {
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
}

/// One sender per conversation, together sending at `plan.rate`, until `stop`.
pub fn spawn_senders(
    target: &Target,
    convs: &[Conv],
    plan: &SendPlan,
    rec: &Arc<Recorder>,
    acked: &AckLog,
    stop: &Arc<AtomicBool>,
) -> Vec<tokio::task::JoinHandle<()>> {
    let (rate, pad) = (plan.rate, "x".repeat(plan.payload.saturating_sub(30)));
    convs
        .iter()
        .enumerate()
        .map(|(k, c)| {
            let clients: Vec<HttpClient> =
                (0..target.gateways.len()).map(|g| target.http_as(g, &c.sender, "s")).collect();
            let (rec, acked, stop, c, pad) = (rec.clone(), acked.clone(), stop.clone(), c.clone(), pad.clone());
            let prefix = plan.cmid_prefix.clone();
            let interval = (rate > 0.0).then(|| Duration::from_secs_f64(convs.len() as f64 / rate));
            tokio::spawn(async move {
                // Spread the first sends over one interval so the senders do not beat in step.
                if let Some(i) = interval {
                    tokio::time::sleep(i.mul_f64(k as f64 / 97.0 % 1.0)).await;
                }
                let mut n = 0u64;
                let mut next = tokio::time::Instant::now();
                while !stop.load(Ordering::Relaxed) {
                    let cmid = format!("{prefix}{n}");
                    let t = Instant::now();
                    let body = json!({"t0": micros_now(), "pad": pad});
                    match send_durably(&clients, k, &cmid, &c.id, &body, Duration::from_secs(120)).await {
                        Ok(r) => {
                            rec.send_acked(t.elapsed());
                            acked.lock().expect("log").push(Acked::of(&r, &c.sender, "s", cmid));
                        }
                        Err(e) => {
                            if rec.send_errors.fetch_add(1, Ordering::Relaxed) < 5 {
                                eprintln!("send failed: {e}");
                            }
                        }
                    }
                    n += 1;
                    if let Some(i) = interval {
                        next += i;
                        tokio::time::sleep_until(next).await;
                        // After a stall, do not burst to catch up.
                        next = next.max(tokio::time::Instant::now() - i);
                    }
                }
            })
        })
        .collect()
}

/// Waits until every device is online and caught up and no delivery happened for
/// `quiet`, or `limit` passed. Returns how long it took.
pub async fn settle(rec: &Recorder, devices: usize, quiet: Duration, limit: Duration) -> Duration {
    let started = Instant::now();
    let mut last = rec.delivered.load(Ordering::Relaxed);
    let mut still = Instant::now();
    while started.elapsed() < limit {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = rec.delivered.load(Ordering::Relaxed);
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
    let mut log = EventLog { acked: std::mem::take(&mut *acked.lock().expect("log")), ..Default::default() };
    let recipients: HashMap<String, Vec<(String, String)>> = convs
        .iter()
        .map(|c| (c.id.clone(), c.receivers.iter().map(|u| (u.clone(), "d".to_string())).collect()))
        .collect();
    log.recipients = recipients;
    for (user, l) in &logs {
        let dev = (user.clone(), "d".to_string());
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
    let report = integrity::check(&log);
    eprintln!("integrity: {report:?}");
    (report, logs)
}
