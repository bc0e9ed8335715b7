//! AutoDevice: the client library's `Device` for one session, recording what it saw
//! (every message, the answers to its sends, every other frame, the close code) for
//! tests that check what reached whom.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use herald_client::device::{Device, DeviceSpec, EndedBy, Observer, Status, Via};
use herald_shared::protocol::{ClientFrame, Message, ServerFrame};

use crate::send_frame;

/// (conv, seq, id)
pub type Seen = (String, u64, u64);
type Shared<T> = Arc<Mutex<T>>;

/// Longer than any test: an AutoDevice never fills a gap with `sync`. Tests check what
/// was pushed to it, and a device that joined a conversation late or sent into it sees
/// gaps that are no loss.
const NEVER: Duration = Duration::from_secs(365 * 24 * 3600);

/// How long `connect_soft` waits for `hello`: the device's own connect and hello
/// timeouts (10 s each), and a margin.
const HELLO_WITHIN: Duration = Duration::from_secs(25);

/// The device's observer: records into the vectors and maps the AutoDevice shares.
struct Recorder {
    received: Shared<Vec<Seen>>,
    messages: Shared<Vec<Message>>,
    sent: Shared<HashMap<String, Seen>>,
    others: Shared<Vec<ServerFrame>>,
    closed: Shared<Option<Option<u16>>>,
    hello: AtomicBool,
}

impl Observer for Recorder {
    fn message(&self, msg: &Message, _via: Via, _into_session: Duration) {
        self.received.lock().unwrap().push((msg.conv.clone(), msg.seq, msg.id.0));
        self.messages.lock().unwrap().push(msg.clone());
    }

    fn caught_up(&self, _after: Duration) {}

    fn online(&self, _up: bool) {}

    fn frame(&self, frame: &ServerFrame) {
        match frame {
            ServerFrame::Hello(_) => self.hello.store(true, Ordering::SeqCst),
            ServerFrame::Sent(s) => {
                self.sent.lock().unwrap().insert(s.cmid.clone(), (s.conv.clone(), s.seq, s.id.0));
            }
            other => self.others.lock().unwrap().push(other.clone()),
        }
    }

    fn closed(&self, code: Option<u16>) {
        *self.closed.lock().unwrap() = Some(code);
    }
}

/// A connected device that acks every `msg` at once and records what it saw: the
/// client library's [`Device`] with one session (no reconnect, no gap filling).
pub struct AutoDevice {
    pub user: String,
    pub device: String,
    /// Every `msg`, repeats included, in arrival order.
    pub received: Shared<Vec<Seen>>,
    /// The same `msg` frames whole (bodies, timeline events).
    pub messages: Shared<Vec<Message>>,
    /// Answers to this device's sends, by cmid.
    pub sent: Shared<HashMap<String, Seen>>,
    /// The server's close code once the session was closed (`Some(None)`: lost without
    /// a close frame).
    pub closed: Shared<Option<Option<u16>>>,
    /// Every frame after `hello` other than `msg` and `sent`, in arrival order (with the
    /// `pong`s to the device's own pings).
    pub others: Shared<Vec<ServerFrame>>,
    inner: Device,
}

impl AutoDevice {
    pub async fn connect(base: &str, token: &str, user: &str, device: &str) -> AutoDevice {
        Self::connect_soft(base, token, user, device).await.expect("websocket connects and says hello")
    }

    /// `None` when the gateway is unreachable or closes before `hello`.
    pub async fn connect_soft(base: &str, token: &str, user: &str, device: &str) -> Option<AutoDevice> {
        Self::start(Self::spec(base, token, user, device)).await
    }

    /// What [`AutoDevice::connect`] starts: one session, no gap filling, otherwise the
    /// library's defaults (the token in the first frame, `herald.v1` offered).
    pub fn spec(base: &str, token: &str, user: &str, device: &str) -> DeviceSpec {
        DeviceSpec {
            reconnect: false,
            gap_sync_after: NEVER,
            ..DeviceSpec::new(user, device, token, vec![base.to_owned()])
        }
    }

    /// A device of `spec`, once it said `hello`; `None` when it did not.
    pub async fn start(spec: DeviceSpec) -> Option<AutoDevice> {
        let recorder = Arc::new(Recorder {
            received: Shared::default(),
            messages: Shared::default(),
            sent: Shared::default(),
            others: Shared::default(),
            closed: Shared::default(),
            hello: AtomicBool::new(false),
        });
        let (user, device) = (spec.user.clone(), spec.device.clone());
        let inner = Device::spawn(spec, recorder.clone());
        // A session that said hello and ended at once still said hello.
        if !inner.wait_online(HELLO_WITHIN).await && !recorder.hello.load(Ordering::SeqCst) {
            inner.stop().await;
            return None;
        }
        Some(AutoDevice {
            user,
            device,
            received: recorder.received.clone(),
            messages: recorder.messages.clone(),
            sent: recorder.sent.clone(),
            closed: recorder.closed.clone(),
            others: recorder.others.clone(),
            inner,
        })
    }

    /// Sends any frame.
    pub async fn send_frame(&self, frame: ClientFrame) {
        self.inner.send(frame).await.expect("device running");
    }

    /// Sends any JSON (for frames a well-behaved client never sends).
    pub async fn send_raw(&self, frame: serde_json::Value) {
        self.inner.send_text(frame.to_string()).await.expect("device running");
    }

    pub async fn send(&self, cmid: &str, conv: &str, body: serde_json::Value) {
        self.send_frame(send_frame(cmid, conv, &body)).await;
    }

    /// The timeline events received so far, with their `seq` (repeats included).
    pub fn events(&self, conv: &str) -> Vec<(u64, herald_shared::protocol::TimelineEvent)> {
        let messages = self.messages.lock().unwrap();
        messages.iter().filter(|m| m.conv == conv).filter_map(|m| Some((m.seq, m.event.clone()?))).collect()
    }

    /// Ids received so far (repeats dropped).
    pub fn ids(&self) -> BTreeSet<u64> {
        self.received.lock().unwrap().iter().map(|(_, _, id)| *id).collect()
    }

    /// The session is over: closed by the server, or lost.
    pub fn is_closed(&self) -> bool {
        matches!(self.inner.status(), Status::Ended(_))
    }

    /// Why the device stopped, once it has.
    pub fn ended_by(&self) -> Option<EndedBy> {
        self.inner.ended_by()
    }

    pub async fn stop(self) {
        let _ = tokio::time::timeout(Duration::from_secs(5), self.inner.stop()).await;
    }

    /// Stops the session, then returns every id it received. Ids read before `stop` miss
    /// the messages that arrive (and are acked) while the session ends, which no later
    /// session of the device receives again.
    pub async fn stop_with_ids(self) -> BTreeSet<u64> {
        let received = self.received.clone();
        self.stop().await;
        let ids = received.lock().unwrap().iter().map(|(_, _, id)| *id).collect();
        ids
    }
}
