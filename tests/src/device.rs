//! AutoDevice: a connected device that acks every message at once and records what it
//! saw, for tests that check what reached whom.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use herald_client::{WsClient, WsEvent};
use herald_shared::protocol::{ClientFrame, ServerFrame};

use crate::{ack_frame, send_frame};

/// (conv, seq, id)
pub type Seen = (String, u64, u64);
type Shared<T> = std::sync::Arc<std::sync::Mutex<T>>;

/// What a test asks its device to send.
enum Outgoing {
    Frame(ClientFrame),
    /// Any JSON, for frames a well-behaved client never sends.
    Json(serde_json::Value),
}

/// A connected device that acks every `msg` at once and records what it saw.
pub struct AutoDevice {
    pub user: String,
    pub device: String,
    /// Every `msg`, repeats included, in arrival order.
    pub received: Shared<Vec<Seen>>,
    /// Answers to this device's sends, by cmid.
    pub sent: Shared<HashMap<String, Seen>>,
    outbox: tokio::sync::mpsc::Sender<Outgoing>,
    pub closed: Shared<Option<Option<u16>>>,
    /// Every frame after `hello` other than `msg` and `sent`, in arrival order.
    pub others: Shared<Vec<ServerFrame>>,
    task: tokio::task::JoinHandle<()>,
}

impl AutoDevice {
    pub async fn connect(base: &str, token: &str, user: &str, device: &str) -> AutoDevice {
        Self::connect_soft(base, token, user, device).await.expect("websocket connects and says hello")
    }

    /// `None` when the gateway is unreachable or closes before `hello`.
    pub async fn connect_soft(base: &str, token: &str, user: &str, device: &str) -> Option<AutoDevice> {
        let mut ws = WsClient::connect(base, token).await.ok()?;
        let hello = ws.next(Duration::from_secs(10)).await;
        if !matches!(&hello, Some(WsEvent::Frame(ServerFrame::Hello(_)))) {
            return None;
        }
        let received = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let sent = std::sync::Arc::new(std::sync::Mutex::new(HashMap::new()));
        let closed = std::sync::Arc::new(std::sync::Mutex::new(None));
        let others = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let (outbox, mut rx) = tokio::sync::mpsc::channel::<Outgoing>(1024);
        let (r, s, cl, o) = (received.clone(), sent.clone(), closed.clone(), others.clone());
        let task = tokio::spawn(async move {
            loop {
                tokio::select! {
                    out = rx.recv() => {
                        let sent = match out {
                            Some(Outgoing::Frame(f)) => ws.send(&f).await,
                            Some(Outgoing::Json(v)) => ws.send_json(&v).await,
                            None => { ws.close().await; break; }
                        };
                        if sent.is_err() { break; }
                    }
                    ev = ws.next(Duration::from_secs(3600)) => match ev {
                        Some(WsEvent::Frame(ServerFrame::Msg(m))) => {
                            r.lock().unwrap().push((m.conv.clone(), m.seq, m.id.0));
                            if ws.send(&ack_frame([m.id])).await.is_err() { break; }
                        }
                        Some(WsEvent::Frame(ServerFrame::Sent(a))) => {
                            s.lock().unwrap().insert(a.cmid.clone(), (a.conv.clone(), a.seq, a.id.0));
                        }
                        Some(WsEvent::Frame(f)) => o.lock().unwrap().push(f),
                        Some(WsEvent::Other(_)) | None => {}
                        Some(WsEvent::Closed(code)) => { *cl.lock().unwrap() = Some(code); break; }
                    },
                }
            }
        });
        Some(AutoDevice { user: user.into(), device: device.into(), received, sent, outbox, closed, others, task })
    }

    /// Sends any frame.
    pub async fn send_frame(&self, frame: ClientFrame) {
        self.outbox.send(Outgoing::Frame(frame)).await.expect("device running");
    }

    /// Sends any JSON (for frames a well-behaved client never sends).
    pub async fn send_raw(&self, frame: serde_json::Value) {
        self.outbox.send(Outgoing::Json(frame)).await.expect("device running");
    }

    pub async fn send(&self, cmid: &str, conv: &str, body: serde_json::Value) {
        self.send_frame(send_frame(cmid, conv, &body)).await;
    }

    /// Ids received so far (repeats dropped).
    pub fn ids(&self) -> BTreeSet<u64> {
        self.received.lock().unwrap().iter().map(|(_, _, id)| *id).collect()
    }

    pub fn is_closed(&self) -> bool {
        self.closed.lock().unwrap().is_some()
    }

    pub async fn stop(self) {
        drop(self.outbox);
        let _ = tokio::time::timeout(Duration::from_secs(5), self.task).await;
    }
}
