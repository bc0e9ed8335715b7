//! A device as a real client app runs it (docs/client.md): it opens each session with
//! its token in the first frame and `herald.v1` offered, keeps a session open across
//! gateways, acks every message, drops repeats by `id`, shows each conversation in `seq`
//! order, fills gaps that outlive the backlog with `sync`, and reconnects with jittered
//! backoff. A session that hears nothing for two heartbeats is given up as lost (a
//! network cut without FIN or RST would otherwise hold it forever). The load-test suite
//! drives thousands of these; what each one showed, and when, is what its integrity
//! check judges. The end-to-end tests drive them too, one session at a time.

mod liveness;
mod spec;
mod timeline;

use std::sync::Arc;
use std::time::{Duration, Instant};

use herald_shared::error::ErrorCode;
use herald_shared::protocol::{
    AckFrame, ClientFrame, Message, PingFrame, ServerFrame, SyncFrame, TokenFrame, SUBPROTOCOL,
};
use rand::Rng;
use tokio::sync::{mpsc, watch};

use crate::ws::{Upgrade, WsClient, WsEvent};
use liveness::Liveness;
pub use spec::{DeviceSpec, TokenIn};
use timeline::State;
pub use timeline::{Arrival, DeviceLog, Shown, Stored, Via};

/// Live callbacks, for counters and latency histograms while a run goes on.
pub trait Observer: Send + Sync + 'static {
    /// A `msg` frame arrived (repeats included), this long after its session's upgrade.
    fn message(&self, msg: &Message, via: Via, into_session: Duration);
    /// A session reached `caught_up`, this long after its upgrade.
    fn caught_up(&self, after: Duration);
    /// The device is connected (`true`) or lost its session (`false`).
    fn online(&self, up: bool);
    /// Any frame other than `msg` (answers, read positions, errors, ...).
    fn frame(&self, _frame: &ServerFrame) {}
    /// The server closed a session with this code (`None`: lost without a close frame).
    fn closed(&self, _code: Option<u16>) {}
}

/// Where the device stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    Connecting,
    /// A session said `hello`.
    Online,
    /// The device stopped (or, without `reconnect`, its one session ended).
    Ended,
}

/// What the app asked the device to send.
#[derive(Debug)]
enum Outgoing {
    Frame(ClientFrame),
    Text(String),
}

/// The device has ended; nothing more can be sent.
#[derive(Debug, thiserror::Error)]
#[error("the device has ended")]
pub struct DeviceEnded;

/// A running device; [`Device::stop`] ends it and returns its log.
#[derive(Debug)]
pub struct Device {
    stop: watch::Sender<bool>,
    status: watch::Receiver<Status>,
    out: mpsc::Sender<Outgoing>,
    task: tokio::task::JoinHandle<DeviceLog>,
}

/// Frames the app queued while no session was up wait here, in order.
const OUTGOING_QUEUE: usize = 1_024;

impl Device {
    pub fn spawn(spec: DeviceSpec, observer: Arc<dyn Observer>) -> Device {
        let (stop, stopped) = watch::channel(false);
        let (status_tx, status) = watch::channel(Status::Connecting);
        let (out, out_rx) = mpsc::channel(OUTGOING_QUEUE);
        let task = tokio::spawn(run(spec, observer, stopped, status_tx, out_rx));
        Device { stop, status, out, task }
    }

    /// Queues a frame for the current session (or the next one).
    pub async fn send(&self, frame: ClientFrame) -> Result<(), DeviceEnded> {
        self.out.send(Outgoing::Frame(frame)).await.map_err(|_| DeviceEnded)
    }

    /// Queues any text (for tests of frames a well-behaved client never sends).
    pub async fn send_text(&self, text: String) -> Result<(), DeviceEnded> {
        self.out.send(Outgoing::Text(text)).await.map_err(|_| DeviceEnded)
    }

    pub fn status(&self) -> Status {
        *self.status.borrow()
    }

    /// Waits until a session is up (`true`) or the device ended or `timeout` passed.
    pub async fn wait_online(&self, timeout: Duration) -> bool {
        let mut status = self.status.clone();
        let reached = tokio::time::timeout(timeout, status.wait_for(|s| *s != Status::Connecting)).await;
        matches!(reached, Ok(Ok(s)) if *s == Status::Online)
    }

    pub async fn stop(self) -> DeviceLog {
        let _ = self.stop.send(true);
        self.task.await.unwrap_or_default()
    }
}

fn jitter(base: Duration) -> Duration {
    let ms = base.as_millis() as u64;
    Duration::from_millis(ms / 2 + rand::rng().random_range(0..=ms.max(1)))
}

async fn run(
    spec: DeviceSpec,
    observer: Arc<dyn Observer>,
    mut stopped: watch::Receiver<bool>,
    status: watch::Sender<Status>,
    mut out: mpsc::Receiver<Outgoing>,
) -> DeviceLog {
    let mut st = State::resume(&spec.resume);
    let mut gw = spec.first_gateway;
    let mut backoff = Duration::from_millis(100);
    loop {
        if *stopped.borrow() {
            break;
        }
        let _ = status.send(Status::Connecting);
        let base = &spec.gateways[gw % spec.gateways.len()];
        let started = Instant::now();
        let session = connect(&spec, base, &spec.token);
        let connected = tokio::time::timeout(Duration::from_secs(10), session);
        let retry = |gw: &mut usize, backoff: &mut Duration| {
            *gw += 1;
            let wait = jitter(*backoff);
            *backoff = (*backoff * 2).min(Duration::from_secs(5));
            wait
        };
        let mut ws = match connected.await {
            Ok(Ok(ws)) => ws,
            _ if !spec.reconnect => break,
            _ => {
                let wait = retry(&mut gw, &mut backoff);
                wait_or_stop(&mut stopped, wait).await;
                continue;
            }
        };
        let hb = match ws.next(Duration::from_secs(10)).await {
            Some(WsEvent::Frame(ServerFrame::Hello(h))) => {
                observer.frame(&ServerFrame::Hello(h.clone()));
                Duration::from_millis(h.hb_ms)
            }
            other => {
                if let Some(WsEvent::Frame(f)) = &other {
                    observer.frame(f);
                }
                if let Some(WsEvent::Closed(code)) = other {
                    observer.closed(code);
                }
                if !spec.reconnect {
                    break;
                }
                let wait = match other {
                    Some(WsEvent::Frame(ServerFrame::Error(e))) if e.code == ErrorCode::RateLimited => {
                        jitter(Duration::from_millis(e.retry_after_ms.unwrap_or(500)))
                    }
                    _ => retry(&mut gw, &mut backoff),
                };
                wait_or_stop(&mut stopped, wait).await;
                continue;
            }
        };
        backoff = Duration::from_millis(100);
        st.log.sessions += 1;
        let _ = status.send(Status::Online);
        observer.online(true);
        let mut session = Session { spec: &spec, ws: &mut ws, st: &mut st, observer: &*observer, started, hb };
        let ended = session.run(&mut stopped, &mut out).await;
        observer.online(false);
        for t in st.timelines.values_mut() {
            t.settle(false);
        }
        match ended {
            Ended::Stopped => {
                ws.close().await;
                break;
            }
            _ if !spec.reconnect => break,
            Ended::Lost => {
                gw += 1;
                wait_or_stop(&mut stopped, jitter(Duration::from_millis(200))).await;
            }
            Ended::Reconnect(after) => wait_or_stop(&mut stopped, jitter(after)).await,
        }
    }
    let _ = status.send(Status::Ended);
    st.log.stored = st.stored();
    st.log
}

/// Opens a session as the spec says: the token in the first frame (or the URL), and
/// `herald.v1` offered, which the server must choose (tungstenite fails a handshake
/// whose answer is another; an answer of none is checked here).
async fn connect(
    spec: &DeviceSpec,
    base: &str,
    token: &str,
) -> Result<WsClient, tokio_tungstenite::tungstenite::Error> {
    use tokio_tungstenite::tungstenite::error::{Error, ProtocolError, SubProtocolError};
    let protocols: &[&str] = if spec.offer_subprotocol { &[SUBPROTOCOL] } else { &[] };
    let query_token = (spec.token_in == TokenIn::Query).then_some(token);
    let upgrade = Upgrade { query_token, protocols, local: spec.local_ip, tls: Some(&spec.tls) };
    let (mut ws, chosen) = WsClient::open(base, &upgrade).await?;
    if spec.offer_subprotocol && chosen.as_deref() != Some(SUBPROTOCOL) {
        let none = SubProtocolError::NoSubProtocol;
        return Err(Error::Protocol(ProtocolError::SecWebSocketSubProtocolError(none)));
    }
    if spec.token_in == TokenIn::Frame {
        ws.send(&ClientFrame::Auth(TokenFrame { token: token.to_owned(), reference: None })).await?;
    }
    Ok(ws)
}

async fn wait_or_stop(stopped: &mut watch::Receiver<bool>, d: Duration) {
    let _ = tokio::time::timeout(d, async { stopped.wait_for(|s| *s).await.is_ok() }).await;
}

enum Ended {
    Stopped,
    Lost,
    Reconnect(Duration),
}

/// One session of the device.
struct Session<'a> {
    spec: &'a DeviceSpec,
    ws: &'a mut WsClient,
    st: &'a mut State,
    observer: &'a dyn Observer,
    started: Instant,
    hb: Duration,
}

impl Session<'_> {
    async fn run(&mut self, stopped: &mut watch::Receiver<bool>, out: &mut mpsc::Receiver<Outgoing>) -> Ended {
        let mut caught_up = false;
        let mut tick = tokio::time::interval(Duration::from_millis(500));
        let mut last_ping = Instant::now();
        let mut liveness = Liveness::new(self.hb, Instant::now());
        let mut reconnect_after = None;
        loop {
            tokio::select! {
                _ = stopped.changed() => return Ended::Stopped,
                Some(o) = out.recv() => {
                    let sent = match o {
                        Outgoing::Frame(f) => self.ws.send(&f).await,
                        Outgoing::Text(t) => self.ws.send_text(&t).await,
                    };
                    if sent.is_err() {
                        return Ended::Lost;
                    }
                }
                _ = tick.tick() => {
                    let now = Instant::now();
                    if liveness.is_lost(now) {
                        return Ended::Lost;
                    }
                    if now.duration_since(last_ping) >= self.hb / 2 {
                        last_ping = now;
                        if self.ws.send(&ClientFrame::Ping(PingFrame { ts: None })).await.is_err() {
                            return Ended::Lost;
                        }
                    }
                    if caught_up && !self.fill_gaps(now).await {
                        return Ended::Lost;
                    }
                }
                ev = self.ws.next(Duration::from_secs(3600)) => match ev {
                    Some(WsEvent::Frame(f)) => {
                        liveness.heard(Instant::now());
                        match f {
                            ServerFrame::Msg(m) => {
                                let via = if caught_up { Via::Realtime } else { Via::Backlog };
                                self.observer.message(&m, via, self.started.elapsed());
                                self.st.arrive(m.id.0, &m.conv, m.seq, via);
                                if self.ws.send(&ClientFrame::Ack(AckFrame { ids: vec![m.id] })).await.is_err() {
                                    return Ended::Lost;
                                }
                            }
                            other => {
                                self.observer.frame(&other);
                                match other {
                                    ServerFrame::CaughtUp(_) if !caught_up => {
                                        caught_up = true;
                                        self.st.log.catch_ups.push(self.started.elapsed());
                                        self.observer.caught_up(self.started.elapsed());
                                    }
                                    ServerFrame::History(h) => {
                                        if let Some(joined) = h.joined_seq {
                                            self.st.joined(&h.conv, joined);
                                        }
                                        for m in &h.items {
                                            self.st.arrive(m.id.0, &h.conv, m.seq, Via::Sync);
                                        }
                                        if let Some(t) = self.st.timelines.get_mut(&h.conv) {
                                            t.settle(h.more);
                                        }
                                    }
                                    ServerFrame::Reconnect(r) => reconnect_after = Some(Duration::from_millis(r.after_ms)),
                                    _ => {}
                                }
                            }
                        }
                    }
                    Some(WsEvent::Other(_)) => liveness.heard(Instant::now()),
                    Some(WsEvent::Closed(code)) => {
                        self.observer.closed(code);
                        return reconnect_after.map_or(Ended::Lost, Ended::Reconnect);
                    }
                    None => return reconnect_after.map_or(Ended::Lost, Ended::Reconnect),
                },
            }
        }
    }

    /// Asks for what a gap still open after `caught_up` is missing; false when the
    /// session is gone.
    async fn fill_gaps(&mut self, now: Instant) -> bool {
        for (conv, after) in self.st.gaps_to_fill(now, self.spec.gap_sync_after) {
            let f = ClientFrame::Sync(SyncFrame {
                conv: conv.clone(),
                after_seq: after,
                limit: Some(200),
                reference: Some(conv),
            });
            if self.ws.send(&f).await.is_err() {
                return false;
            }
        }
        true
    }
}
