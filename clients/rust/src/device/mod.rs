//! A device as a real client app runs it (docs/client.md): it opens each session with
//! its token in the first frame and `herald.v1` offered, keeps a session open across
//! gateways, acks every message, drops repeats by `id`, shows each conversation in `seq`
//! order, fills gaps that outlive the backlog with `sync`, refreshes its token before it
//! expires, and reconnects by the close code: with full-jitter backoff, after the
//! server's hints, with a new token after 4001, not at all after 4002 and 4009. A
//! session that hears nothing for two heartbeats is given up as lost (a network cut
//! without FIN or RST would otherwise hold it forever). The load-test suite drives
//! thousands of these; what each one showed, and when, is what its integrity check
//! judges. The end-to-end tests drive them too, one session at a time.
//!
//! # Layout
//! - `spec`: who the device is and how it connects ([`DeviceSpec`]).
//! - `reconnect`: what a session's end leads to, and the backoff.
//! - `token`: the app's [`TokenSource`] and when to refresh.
//! - `session`: one session's loop.
//! - `liveness`, `timeline`, `screen`: whether the server is there; what the device
//!   shows, in order, and (when kept) the text of each line.

mod liveness;
mod reconnect;
mod screen;
mod session;
mod spec;
mod timeline;
mod token;

use std::sync::Arc;
use std::time::{Duration, Instant};

use herald_shared::error::ErrorCode;
use herald_shared::ids::now_ms;
use herald_shared::protocol::{ClientFrame, Hello, Message, ServerFrame, TokenFrame, SUBPROTOCOL};
use tokio::sync::{mpsc, watch};

use crate::ws::{Upgrade, WsClient, WsEvent};
pub use reconnect::EndedBy;
use reconnect::{after_session, Backoff, Hints, Next, Policy};
pub use screen::Line;
use session::{Session, SessionEnd};
pub use spec::{DeviceSpec, TokenIn};
use timeline::State;
pub use timeline::{Arrival, DeviceLog, Shown, Stored, Via};
pub use token::{TokenReason, TokenSource};

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
    /// The device stopped for good, and why; a new device is needed.
    Ended(EndedBy),
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

    /// Why the device stopped, once it has.
    pub fn ended_by(&self) -> Option<EndedBy> {
        match *self.status.borrow() {
            Status::Ended(by) => Some(by),
            _ => None,
        }
    }

    pub async fn stop(self) -> DeviceLog {
        let _ = self.stop.send(true);
        self.task.await.unwrap_or_default()
    }
}

/// The first backoff cap, doubling after each failed attempt (docs/client.md section 2).
const BACKOFF_BASE: Duration = Duration::from_millis(500);

/// How long a connection may take from the TCP connect to `hello` before it is given up
/// and counts as lost: the gateway's own handshake deadline (10 s by default), as an
/// attempt through a dead network path would otherwise wait for TCP.
const HELLO_WITHIN: Duration = Duration::from_secs(10);

async fn run(
    spec: DeviceSpec,
    observer: Arc<dyn Observer>,
    mut stopped: watch::Receiver<bool>,
    status: watch::Sender<Status>,
    mut out: mpsc::Receiver<Outgoing>,
) -> DeviceLog {
    let mut st = State::resume(&spec.resume);
    if spec.keep_screen {
        st.keep_screens();
    }
    let mut gw = spec.first_gateway;
    let mut backoff = Backoff::new(BACKOFF_BASE, spec.backoff_max.max(BACKOFF_BASE));
    let policy =
        Policy { can_renew_token: spec.token_source.is_some(), reconnect_anyway: spec.reconnect_after_stop_codes };
    let mut token = spec.token.clone();
    let mut new_token = None;
    let ended_by = loop {
        if *stopped.borrow() {
            break EndedBy::App;
        }
        let _ = status.send(Status::Connecting);
        if let Some(source) = &spec.token_source {
            let why = new_token.take().or_else(|| (!token::usable(&token, now_ms())).then_some(TokenReason::Connect));
            if let Some(why) = why {
                let fetched = tokio::select! {
                    t = source.get(why) => t,
                    _ = stopped.wait_for(|s| *s) => break EndedBy::App,
                };
                match fetched {
                    Some(t) => token = t,
                    None => break EndedBy::Unauthorized,
                }
            }
        }
        let base = &spec.gateways[gw % spec.gateways.len()];
        let started = Instant::now();
        let opened = tokio::select! {
            o = tokio::time::timeout(HELLO_WITHIN, open(&spec, base, &token, &*observer)) => o,
            _ = stopped.wait_for(|s| *s) => break EndedBy::App,
        };
        let end = match opened {
            Ok(Ok((mut ws, hello))) => {
                backoff.reset();
                st.log.sessions += 1;
                let _ = status.send(Status::Online);
                observer.online(true);
                let hb = Duration::from_millis(hello.hb_ms);
                let (observer, token) = (&*observer, &mut token);
                let mut session = Session { spec: &spec, ws: &mut ws, st: &mut st, observer, started, hb, token };
                let end = session.run(&mut stopped, &mut out).await;
                observer.online(false);
                for t in st.timelines.values_mut() {
                    t.settle(false);
                }
                if let SessionEnd::Stopped = end {
                    ws.close().await;
                    break EndedBy::App;
                }
                end
            }
            Ok(Err(end)) => end,
            Err(_) => SessionEnd::Closed { code: None, hints: Hints::default() },
        };
        let SessionEnd::Closed { code, hints } = end else { break EndedBy::App };
        match after_session(code, hints, policy, &mut backoff) {
            Next::Stop(why) => break why,
            Next::Reconnect { .. } if !spec.reconnect => break EndedBy::OneSession,
            Next::Reconnect { after, new_token: renew } => {
                // With several gateways, the next one: the last may be what failed.
                gw += 1;
                new_token = renew.then_some(TokenReason::Expired);
                let _ = tokio::time::timeout(after, stopped.wait_for(|s| *s)).await;
            }
        }
    };
    let _ = status.send(Status::Ended(ended_by));
    st.log.stored = st.stored();
    st.log.screens = st.screens.take().map(|s| s.lines).unwrap_or_default();
    st.log
}

/// Opens a session and waits for its `hello`: the token in the first frame (or the URL)
/// and `herald.v1` offered, which the server must choose (tungstenite fails a handshake
/// whose answer is another; an answer of none is checked here).
async fn open(
    spec: &DeviceSpec,
    base: &str,
    token: &str,
    observer: &dyn Observer,
) -> Result<(WsClient, Hello), SessionEnd> {
    let lost = SessionEnd::Closed { code: None, hints: Hints::default() };
    let protocols: &[&str] = if spec.offer_subprotocol { &[SUBPROTOCOL] } else { &[] };
    let query_token = (spec.token_in == TokenIn::Query).then_some(token);
    let features: Vec<&str> = [
        (spec.delivery_status, "delivered"),
        (spec.typing_and_presence, "typing"),
        (spec.typing_and_presence, "presence"),
    ]
    .into_iter()
    .filter_map(|(on, name)| on.then_some(name))
    .collect();
    let features = features.as_slice();
    let upgrade = Upgrade { query_token, protocols, local: spec.local_ip, tls: Some(&spec.tls), features };
    let Ok((mut ws, chosen)) = WsClient::open(base, &upgrade).await else { return Err(lost) };
    if spec.offer_subprotocol && chosen.as_deref() != Some(SUBPROTOCOL) {
        ws.close().await;
        return Err(lost);
    }
    if spec.token_in == TokenIn::Frame {
        let auth = ClientFrame::Auth(TokenFrame { token: token.to_owned(), reference: None });
        if ws.send(&auth).await.is_err() {
            return Err(lost);
        }
    }
    // A refused session says why before it closes: `error rate_limited` with a hint.
    let mut hints = Hints::default();
    loop {
        match ws.next(HELLO_WITHIN).await {
            Some(WsEvent::Frame(ServerFrame::Hello(h))) => {
                observer.frame(&ServerFrame::Hello(h.clone()));
                return Ok((ws, h));
            }
            Some(WsEvent::Frame(f)) => {
                if let ServerFrame::Error(e) = &f {
                    if e.code == ErrorCode::RateLimited {
                        hints.retry_after = e.retry_after_ms.map(Duration::from_millis);
                    }
                }
                observer.frame(&f);
            }
            Some(WsEvent::Other(_)) => {}
            Some(WsEvent::Closed(code)) => {
                observer.closed(code);
                return Err(SessionEnd::Closed { code, hints });
            }
            None => return Err(SessionEnd::Closed { code: None, hints }),
        }
    }
}
