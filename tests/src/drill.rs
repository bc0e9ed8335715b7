//! A fault drill: live traffic through a real cluster, a fault in the middle, then two
//! judgements. Catch-up: from the moment the fault is over, how long until every
//! device is online, caught up, has received every message acknowledged before that
//! moment, and has received one sent after it (bounded by the test). Integrity: after settling, the load-test
//! suite's check of what the devices showed against what the senders were told (0
//! lost, 0 shown twice, 0 out of order).
//!
//! The traffic is the load-test suite's: direct conversations, a paced sender per
//! conversation over HTTP (retrying with the same `cmid`, failing over between
//! gateways), and one client-library device per recipient.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::future::join_all;
use herald_client::device::{Device, DeviceSpec, Observer, Via};
use herald_client::token;
use herald_loadtest::engine::{self, AckLog, Conv, Recorder, SendPlan, Target};
use herald_loadtest::integrity::IntegrityReport;
use herald_shared::auth::Platform;
use herald_shared::protocol::Message;

use crate::{SECRET, TENANT};

/// What one device has been through, seen live (the recorder only counts in total).
#[derive(Default)]
struct DeviceState {
    online: bool,
    caught_up: bool,
    received: HashSet<u64>,
}

/// The observer of one device: feeds the shared recorder and keeps the device's state.
struct DeviceWatch {
    rec: Arc<Recorder>,
    state: Mutex<DeviceState>,
}

impl Observer for DeviceWatch {
    fn message(&self, msg: &Message, via: Via, into_session: Duration) {
        self.rec.message(msg, via, into_session);
        self.state.lock().expect("device state").received.insert(msg.id.0);
    }

    fn caught_up(&self, after: Duration) {
        self.rec.caught_up(after);
        self.state.lock().expect("device state").caught_up = true;
    }

    fn online(&self, up: bool) {
        self.rec.online(up);
        let mut st = self.state.lock().expect("device state");
        st.online = up;
        st.caught_up = false;
    }
}

/// A cluster with the drills' short timers, so that faults are noticed in seconds:
/// heartbeat 2 s (devices give a silent session up after 4 s, the gateway after 5 s),
/// ack timeout and probe 2 s, leases 1.5 s, send timeout 2 s.
pub fn drill_cluster(name: &str, redis_url: Option<String>) -> crate::Cluster {
    let mut c = match redis_url {
        Some(url) => crate::Cluster::with_redis(name, url),
        None => crate::Cluster::new(name),
    };
    c.set("HERALD_GATEWAY__HEARTBEAT_MS", "2000")
        .set("HERALD_GATEWAY__NAT_IDLE_TIMEOUT_MS", "6000")
        .set("HERALD_GATEWAY__ACK_TIMEOUT_MS", "2000")
        .set("HERALD_GATEWAY__ACK_PROBE_MS", "2000")
        .set("HERALD_GATEWAY__DRAIN_MS", "1000")
        .set("HERALD_GATEWAY__SEND_TIMEOUT_MS", "2000")
        // The watermark trails by the outbox's whole retry window (checked at start):
        // 1 s + 100 x 300 ms + a 2 s stale claim.
        .set("HERALD_GATEWAY__WATERMARK_MARGIN_MS", "35000")
        .set("HERALD_OUTBOX__SENDING_STALE_MS", "2000")
        .set("HERALD_GATEWAY__WATERMARK_FLUSH_MS", "300")
        .set("HERALD_WORKER__LEASE_TTL_MS", "1500")
        .set("HERALD_OUTBOX__FIXED_DELAY_MS", "200")
        .set("HERALD_OUTBOX__FIRST_RETRY_DELAY_MS", "1000")
        .set("HERALD_OUTBOX__BACKOFF_MS", "300")
        .set("HERALD_OUTBOX__MAX_ATTEMPTS", "100");
    c
}

/// How much traffic a drill runs.
#[derive(Clone, Debug)]
pub struct Traffic {
    /// Direct conversations, each with its own sender and one receiving device.
    pub conversations: usize,
    /// Sends per second, all senders together.
    pub rate: f64,
    /// Every this many messages a sender edits (then recalls) its latest: timeline
    /// events, which the integrity check counts like messages through every fault.
    pub change_every: u64,
}

impl Default for Traffic {
    fn default() -> Traffic {
        Traffic { conversations: 30, rate: 150.0, change_every: 10 }
    }
}

/// What a finished drill measured.
#[derive(Debug)]
pub struct DrillReport {
    pub integrity: IntegrityReport,
    /// From the end of the fault until every device had everything acknowledged before
    /// and a message sent after (see [`Drill::catch_up`]).
    pub catch_up: Duration,
    pub send_errors: u64,
    /// WebSocket sessions of all devices (1 each when nothing broke).
    pub sessions: u32,
    pub duration: Duration,
}

/// A drill in progress: traffic is flowing until [`Drill::finish`].
pub struct Drill {
    name: String,
    started: Instant,
    rec: Arc<Recorder>,
    convs: Vec<Conv>,
    devices: Vec<(String, Device)>,
    watches: Vec<Arc<DeviceWatch>>,
    acked: AckLog,
    stop: Arc<AtomicBool>,
    senders: Vec<tokio::task::JoinHandle<()>>,
    monitor_stop: Arc<AtomicBool>,
    monitor: tokio::task::JoinHandle<()>,
    catch_up: Option<Duration>,
}

impl Drill {
    /// Provisions the conversations, connects a device per recipient (spread over
    /// `device_gateways`, each device failing over along the list) and waits until every
    /// one is caught up, then starts the senders (through `send_gateways`).
    pub async fn start(
        name: &'static str,
        send_gateways: Vec<String>,
        device_gateways: Vec<String>,
        t: Traffic,
    ) -> Drill {
        let started = Instant::now();
        let target = Target {
            gateways: send_gateways,
            tenant: TENANT.into(),
            secret: SECRET.into(),
            run: format!("{name}-{:06x}", rand::random::<u32>() & 0xff_ffff),
            local_ips: Vec::new(),
            http: reqwest::Client::builder().timeout(Duration::from_secs(10)).build().expect("http client"),
            tls: herald_client::Tls::system(),
        };
        let convs: Vec<Conv> = (0..t.conversations)
            .map(|k| Conv {
                id: target.user(&format!("c{k}")),
                sender: target.user(&format!("a{k}")),
                receivers: vec![target.user(&format!("b{k}"))],
            })
            .collect();
        engine::provision(&target, &convs, "direct").await.expect("conversations created");
        let rec = Recorder::new();
        let monitor_stop = Arc::new(AtomicBool::new(false));
        let monitor = rec.monitor(name, Duration::from_secs(1), monitor_stop.clone());
        let mut devices = Vec::new();
        let mut watches = Vec::new();
        for (k, c) in convs.iter().enumerate() {
            let user = c.receivers[0].clone();
            let watch = Arc::new(DeviceWatch { rec: rec.clone(), state: Mutex::default() });
            let token = token(SECRET, TENANT, &user, "d", Platform::Desktop);
            // Like the load-test's devices: back whatever ended a session, backoff capped at 5 s.
            let spec = DeviceSpec {
                first_gateway: k,
                reconnect_after_stop_codes: true,
                backoff_max: Duration::from_secs(5),
                ..DeviceSpec::new(&user, "d", &token, device_gateways.clone())
            };
            devices.push((user, Device::spawn(spec, watch.clone())));
            watches.push(watch);
        }
        let n = convs.len() as u64;
        crate::eventually(Duration::from_secs(60), "every device connected and caught up", || {
            let done = rec.caught_up.load(Ordering::Relaxed) >= n;
            async move { done.then_some(()) }
        })
        .await;
        let acked: AckLog = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let plan = SendPlan { rate: t.rate, payload: 100, cmid_prefix: "m".into(), change_every: t.change_every };
        let senders = herald_loadtest::senders::spawn_http(&target, &convs, &plan, &rec, &acked, &stop);
        rec.note(format!("{} devices online; sending {} msg/s", convs.len(), t.rate));
        Drill {
            name: name.into(),
            started,
            rec,
            convs,
            devices,
            watches,
            acked,
            stop,
            senders,
            monitor_stop,
            monitor,
            catch_up: None,
        }
    }

    /// A line in the progress output.
    pub fn note(&self, text: impl Into<String>) {
        self.rec.note(text);
    }

    /// Lets traffic run for `d`.
    pub async fn traffic(&self, d: Duration) {
        tokio::time::sleep(d).await;
    }

    /// Sends acknowledged so far.
    pub fn acknowledged(&self) -> usize {
        self.acked.lock().expect("ack log").len()
    }

    /// Devices with a session open now.
    pub fn online(&self) -> usize {
        self.watches.iter().filter(|w| w.state.lock().expect("device state").online).count()
    }

    /// Call when the fault is over: waits until every device is online, caught up, has
    /// received every message acknowledged until now, and has received a message sent
    /// after now (every conversation flows again end to end), and returns how long that
    /// took. Panics, naming what is missing, when it takes longer than `bound`.
    pub async fn catch_up(&mut self, bound: Duration) -> Duration {
        let from = Instant::now();
        self.note("fault over: waiting for every device to catch up");
        let receiver: HashMap<&str, usize> = self.convs.iter().enumerate().map(|(k, c)| (c.id.as_str(), k)).collect();
        let mut want: Vec<HashSet<u64>> = vec![HashSet::new(); self.convs.len()];
        let before = {
            let acked = self.acked.lock().expect("ack log");
            for a in acked.iter() {
                want[receiver[a.conv.as_str()]].insert(a.id);
            }
            acked.len()
        };
        let mut flowing = vec![false; self.convs.len()];
        loop {
            for a in self.acked.lock().expect("ack log").iter().skip(before) {
                let k = receiver[a.conv.as_str()];
                if !flowing[k] && self.watches[k].state.lock().expect("device state").received.contains(&a.id) {
                    flowing[k] = true;
                }
            }
            let (mut offline, mut behind, mut missing) = (0, 0, 0);
            for (w, want) in self.watches.iter().zip(&want) {
                let st = w.state.lock().expect("device state");
                offline += usize::from(!st.online);
                behind += usize::from(st.online && !st.caught_up);
                missing += want.difference(&st.received).count();
            }
            let stalled = flowing.iter().filter(|f| !**f).count();
            if offline + behind + missing + stalled == 0 {
                break;
            }
            assert!(
                from.elapsed() < bound,
                "{}: not caught up {bound:?} after the fault: {offline} devices offline, {behind} not caught up, \
                 {missing} messages acknowledged before recovery not received, {stalled} conversations without a \
                 message sent and received since",
                self.name
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let took = from.elapsed();
        self.note(format!("caught up {:.2} s after the fault", took.as_secs_f64()));
        self.catch_up = Some(took);
        took
    }

    /// Stops the senders, lets deliveries settle, stops the devices and checks
    /// integrity. The drill must have measured its catch-up.
    pub async fn finish(self) -> DrillReport {
        let catch_up = self.catch_up.expect("the drill measured its catch-up");
        self.stop.store(true, Ordering::Relaxed);
        self.rec.note("sending stopped; settling");
        join_all(self.senders).await;
        engine::settle(&self.rec, self.convs.len(), Duration::from_secs(2), Duration::from_secs(60)).await;
        self.monitor_stop.store(true, Ordering::Relaxed);
        let _ = self.monitor.await;
        let (integrity, logs) = engine::finish(self.devices, &self.convs, &self.acked).await;
        let report = DrillReport {
            integrity,
            catch_up,
            send_errors: self.rec.send_errors.load(Ordering::Relaxed),
            sessions: logs.iter().map(|(_, l)| l.sessions).sum(),
            duration: self.started.elapsed(),
        };
        eprintln!(
            "DRILL {}: catch-up {:.2} s; {} acknowledged, {} lost, {} shown twice, {} out of order, \
             {} repeats on the wire, {} recovered by sync, {} send errors, {} sessions; {:.1} s in all",
            self.name,
            report.catch_up.as_secs_f64(),
            report.integrity.acknowledged,
            report.integrity.lost,
            report.integrity.shown_twice,
            report.integrity.out_of_order,
            report.integrity.repeats_on_wire,
            report.integrity.recovered_by_sync,
            report.send_errors,
            report.sessions,
            report.duration.as_secs_f64(),
        );
        report
    }
}

impl DrillReport {
    /// The drill's common verdict: traffic flowed, nothing was lost, doubled or
    /// reordered, every send was acknowledged in the end, and catch-up stayed in bound.
    pub fn assert_clean(&self) {
        assert!(self.integrity.acknowledged > 0, "no send was acknowledged: {self:?}");
        assert!(self.integrity.is_clean(), "integrity: {:?}", self.integrity);
        assert_eq!(self.send_errors, 0, "sends that never got acknowledged (retries ran out)");
    }
}

/// The sum of a Prometheus counter or gauge over all its label sets, from a process's
/// `/metrics` (0 when absent).
pub async fn metric(admin_url: &str, name: &str) -> f64 {
    let text = reqwest::get(format!("{admin_url}/metrics"))
        .await
        .expect("metrics reachable")
        .text()
        .await
        .expect("metrics text");
    text.lines()
        .filter(|l| l.strip_prefix(name).is_some_and(|rest| rest.starts_with([' ', '{'])))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}
