//! A device as a real client app runs it: it keeps a session open across gateways,
//! acks every message, drops repeats by `id`, shows each conversation in `seq` order,
//! fills gaps that outlive the backlog with `sync`, and reconnects with jittered
//! backoff. A session that hears nothing for two heartbeats is given up as lost (a
//! network cut without FIN or RST would otherwise hold it forever). The load-test suite
//! drives thousands of these; what each one showed, and when, is what its integrity
//! check judges.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::Rng;
use serde_json::{json, Value};
use tokio::sync::watch;

use crate::client::{WsClient, WsEvent};

/// Who the device is and where it may connect.
#[derive(Clone, Debug)]
pub struct DeviceSpec {
    pub user: String,
    pub device: String,
    pub token: String,
    /// Gateways (`http://host:port`), tried in turn starting at `first_gateway`.
    pub gateways: Vec<String>,
    pub first_gateway: usize,
    /// Local address to connect from (spreads many connections over loopback addresses).
    pub local_ip: Option<IpAddr>,
    /// A gap still open this long after `caught_up` is filled with `sync`.
    pub gap_sync_after: Duration,
}

/// How a message reached the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Via {
    /// Pushed while the device was caught up.
    Realtime,
    /// Pushed before this session's `caught_up`.
    Backlog,
    /// Pulled with `sync` to fill a gap.
    Sync,
}

/// One `msg` as it arrived (repeats included), or one item of a `history` answer.
#[derive(Clone, Debug)]
pub struct Arrival {
    pub id: u64,
    pub conv: String,
    pub seq: u64,
    pub via: Via,
}

/// A message put on screen: each conversation's timeline in display order.
#[derive(Clone, Debug)]
pub struct Shown {
    pub id: u64,
    pub conv: String,
    pub seq: u64,
}

/// Everything a device saw, returned by [`Device::stop`].
#[derive(Debug, Default)]
pub struct DeviceLog {
    pub arrivals: Vec<Arrival>,
    pub shown: Vec<Shown>,
    /// Per session: time from the upgrade to `caught_up`.
    pub catch_ups: Vec<Duration>,
    pub sessions: u32,
}

/// Live callbacks, for counters and latency histograms while a run goes on.
pub trait Observer: Send + Sync + 'static {
    /// A `msg` frame arrived (repeats included), this long after its session's upgrade.
    fn message(&self, frame: &Value, via: Via, into_session: Duration);
    /// A session reached `caught_up`, this long after its upgrade.
    fn caught_up(&self, after: Duration);
    /// The device is connected (`true`) or lost its session (`false`).
    fn online(&self, up: bool);
}

/// A running device; [`Device::stop`] ends it and returns its log.
#[derive(Debug)]
pub struct Device {
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<DeviceLog>,
}

impl Device {
    pub fn spawn(spec: DeviceSpec, observer: Arc<dyn Observer>) -> Device {
        let (stop, stopped) = watch::channel(false);
        let task = tokio::spawn(run(spec, observer, stopped));
        Device { stop, task }
    }

    pub async fn stop(self) -> DeviceLog {
        let _ = self.stop.send(true);
        self.task.await.unwrap_or_default()
    }
}

/// One conversation's display state.
#[derive(Default)]
struct Timeline {
    /// Highest seq shown; everything up to it is on screen.
    shown: u64,
    /// Arrived above a gap: seq -> id.
    waiting: BTreeMap<u64, u64>,
    /// When the current gap was first seen open after `caught_up`.
    gap_since: Option<Instant>,
    syncing: bool,
}

struct State {
    log: DeviceLog,
    seen: HashSet<u64>,
    timelines: HashMap<String, Timeline>,
}

impl State {
    fn arrive(&mut self, id: u64, conv: &str, seq: u64, via: Via) {
        self.log.arrivals.push(Arrival { id, conv: conv.to_owned(), seq, via });
        if !self.seen.insert(id) {
            return;
        }
        // One allocation per conversation, not per message.
        if !self.timelines.contains_key(conv) {
            self.timelines.insert(conv.to_owned(), Timeline::default());
        }
        let t = self.timelines.get_mut(conv).expect("just inserted");
        if seq <= t.shown {
            return;
        }
        t.waiting.entry(seq).or_insert(id);
        while let Some(id) = t.waiting.remove(&(t.shown + 1)) {
            t.shown += 1;
            self.log.shown.push(Shown { id, conv: conv.to_owned(), seq: t.shown });
        }
        if t.waiting.is_empty() {
            t.gap_since = None;
        }
    }

    /// Conversations whose gap has been open long enough: (conv, after_seq).
    fn gaps_to_fill(&mut self, now: Instant, after: Duration) -> Vec<(String, u64)> {
        let mut out = Vec::new();
        for (conv, t) in &mut self.timelines {
            if t.waiting.is_empty() || t.syncing {
                continue;
            }
            let since = *t.gap_since.get_or_insert(now);
            if now.duration_since(since) >= after {
                t.syncing = true;
                out.push((conv.clone(), t.shown));
            }
        }
        out
    }
}

/// Whether the server is still there. The device pings every half heartbeat and the
/// server answers each ping with `pong`, so a healthy session never stays silent for two
/// heartbeats; one that does sits on a dead path (a cut without FIN or RST) that TCP
/// would take minutes to notice.
struct Liveness {
    silent_limit: Duration,
    last_heard: Instant,
}

impl Liveness {
    fn new(hb: Duration, now: Instant) -> Liveness {
        Liveness { silent_limit: hb * 2, last_heard: now }
    }

    fn heard(&mut self, now: Instant) {
        self.last_heard = now;
    }

    fn is_lost(&self, now: Instant) -> bool {
        now.duration_since(self.last_heard) > self.silent_limit
    }
}

fn jitter(base: Duration) -> Duration {
    let ms = base.as_millis() as u64;
    Duration::from_millis(ms / 2 + rand::rng().random_range(0..=ms.max(1)))
}

fn parse_id(v: &Value) -> Option<u64> {
    v.as_str().and_then(|s| s.parse().ok())
}

async fn run(spec: DeviceSpec, observer: Arc<dyn Observer>, mut stopped: watch::Receiver<bool>) -> DeviceLog {
    let mut st = State { log: DeviceLog::default(), seen: HashSet::new(), timelines: HashMap::new() };
    let mut gw = spec.first_gateway;
    let mut backoff = Duration::from_millis(100);
    loop {
        let stop = *stopped.borrow();
        if stop {
            break;
        }
        let base = &spec.gateways[gw % spec.gateways.len()];
        let started = Instant::now();
        let connected =
            tokio::time::timeout(Duration::from_secs(10), WsClient::connect_from(base, &spec.token, spec.local_ip));
        let mut ws = match connected.await {
            Ok(Ok(ws)) => ws,
            _ => {
                gw += 1;
                wait_or_stop(&mut stopped, jitter(backoff)).await;
                backoff = (backoff * 2).min(Duration::from_secs(5));
                continue;
            }
        };
        let hb = match ws.next(Duration::from_secs(10)).await {
            Some(WsEvent::Frame(f)) if f["t"] == "hello" => {
                Duration::from_millis(f["hb_ms"].as_u64().unwrap_or(25_000))
            }
            Some(WsEvent::Frame(f)) if f["code"] == "rate_limited" => {
                let wait = Duration::from_millis(f["retry_after_ms"].as_u64().unwrap_or(500));
                wait_or_stop(&mut stopped, jitter(wait)).await;
                continue;
            }
            _ => {
                gw += 1;
                wait_or_stop(&mut stopped, jitter(backoff)).await;
                backoff = (backoff * 2).min(Duration::from_secs(5));
                continue;
            }
        };
        backoff = Duration::from_millis(100);
        st.log.sessions += 1;
        observer.online(true);
        let ended = session(&spec, &mut ws, &mut st, &*observer, &mut stopped, started, hb).await;
        observer.online(false);
        for t in st.timelines.values_mut() {
            t.syncing = false;
            t.gap_since = None;
        }
        match ended {
            Ended::Stopped => {
                ws.close().await;
                break;
            }
            Ended::Lost => {
                gw += 1;
                wait_or_stop(&mut stopped, jitter(Duration::from_millis(200))).await;
            }
            Ended::Reconnect(after) => wait_or_stop(&mut stopped, jitter(after)).await,
        }
    }
    st.log
}

async fn wait_or_stop(stopped: &mut watch::Receiver<bool>, d: Duration) {
    let _ = tokio::time::timeout(d, async { stopped.wait_for(|s| *s).await.is_ok() }).await;
}

enum Ended {
    Stopped,
    Lost,
    Reconnect(Duration),
}

async fn session(
    spec: &DeviceSpec,
    ws: &mut WsClient,
    st: &mut State,
    observer: &dyn Observer,
    stopped: &mut watch::Receiver<bool>,
    started: Instant,
    hb: Duration,
) -> Ended {
    let mut caught_up = false;
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    let mut last_ping = Instant::now();
    let mut liveness = Liveness::new(hb, Instant::now());
    let mut reconnect_after = None;
    loop {
        tokio::select! {
            _ = stopped.changed() => return Ended::Stopped,
            _ = tick.tick() => {
                let now = Instant::now();
                if liveness.is_lost(now) {
                    return Ended::Lost;
                }
                if now.duration_since(last_ping) >= hb / 2 {
                    last_ping = now;
                    if ws.send(&json!({"t": "ping"})).await.is_err() {
                        return Ended::Lost;
                    }
                }
                if caught_up {
                    for (conv, after) in st.gaps_to_fill(now, spec.gap_sync_after) {
                        let f = json!({"t": "sync", "conv": conv, "after_seq": after, "limit": 200, "ref": conv});
                        if ws.send(&f).await.is_err() {
                            return Ended::Lost;
                        }
                    }
                }
            }
            ev = ws.next(Duration::from_secs(3600)) => match ev {
                Some(WsEvent::Frame(f)) => {
                    liveness.heard(Instant::now());
                    match f["t"].as_str() {
                        Some("msg") => {
                            let via = if caught_up { Via::Realtime } else { Via::Backlog };
                            observer.message(&f, via, started.elapsed());
                            if let (Some(id), Some(conv), Some(seq)) = (parse_id(&f["id"]), f["conv"].as_str(), f["seq"].as_u64()) {
                                st.arrive(id, conv, seq, via);
                            }
                            if ws.send(&json!({"t": "ack", "ids": [f["id"]]})).await.is_err() {
                                return Ended::Lost;
                            }
                        }
                        Some("caught_up") if !caught_up => {
                            caught_up = true;
                            st.log.catch_ups.push(started.elapsed());
                            observer.caught_up(started.elapsed());
                        }
                        Some("history") => {
                            let conv = f["conv"].as_str().unwrap_or_default().to_owned();
                            for m in f["items"].as_array().into_iter().flatten() {
                                if let (Some(id), Some(seq)) = (parse_id(&m["id"]), m["seq"].as_u64()) {
                                    st.arrive(id, &conv, seq, Via::Sync);
                                }
                            }
                            if let Some(t) = st.timelines.get_mut(&conv) {
                                t.syncing = false;
                                t.gap_since = None;
                            }
                        }
                        Some("reconnect") => {
                            reconnect_after = Some(Duration::from_millis(f["after_ms"].as_u64().unwrap_or(500)));
                        }
                        _ => {}
                    }
                }
                Some(WsEvent::Closed(_)) | None => {
                    return reconnect_after.map_or(Ended::Lost, Ended::Reconnect);
                }
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state() -> State {
        State { log: DeviceLog::default(), seen: HashSet::new(), timelines: HashMap::new() }
    }

    #[test]
    fn shows_in_seq_order_and_drops_repeats() {
        let mut st = state();
        st.arrive(13, "c", 3, Via::Realtime);
        st.arrive(11, "c", 1, Via::Backlog);
        assert_eq!(st.log.shown.iter().map(|s| s.seq).collect::<Vec<_>>(), [1]);
        st.arrive(11, "c", 1, Via::Backlog);
        st.arrive(12, "c", 2, Via::Backlog);
        assert_eq!(st.log.shown.iter().map(|s| s.id).collect::<Vec<_>>(), [11, 12, 13]);
        assert_eq!(st.log.arrivals.len(), 4);
    }

    #[test]
    fn a_session_silent_for_two_heartbeats_is_lost() {
        let (hb, t0) = (Duration::from_secs(1), Instant::now());
        let mut live = Liveness::new(hb, t0);
        assert!(!live.is_lost(t0 + Duration::from_millis(2000)), "two heartbeats of silence are allowed");
        assert!(live.is_lost(t0 + Duration::from_millis(2001)));
        live.heard(t0 + Duration::from_millis(1500));
        assert!(!live.is_lost(t0 + Duration::from_millis(3000)), "any frame restarts the count");
        assert!(live.is_lost(t0 + Duration::from_millis(3600)));
    }

    #[test]
    fn a_gap_is_synced_only_after_it_stayed_open() {
        let mut st = state();
        st.arrive(12, "c", 2, Via::Realtime);
        let t0 = Instant::now();
        assert!(st.gaps_to_fill(t0, Duration::from_secs(1)).is_empty());
        let due = st.gaps_to_fill(t0 + Duration::from_secs(2), Duration::from_secs(1));
        assert_eq!(due, [("c".to_string(), 0)]);
        assert!(st.gaps_to_fill(t0 + Duration::from_secs(3), Duration::from_secs(1)).is_empty(), "one sync at a time");
        st.arrive(11, "c", 1, Via::Sync);
        assert_eq!(st.log.shown.len(), 2);
    }
}
