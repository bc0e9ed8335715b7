//! The directory of sessions held by this gateway node, one per device, and the way
//! pushes, read positions and kicks from the node channel reach them.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use herald_shared::ids::MsgId;
use herald_shared::protocol::ReadPosition;
use tokio::sync::mpsc;

pub use herald_shared::keys::DeviceKey;

/// A realtime push: the frame's bytes are allocated once per node and shared
/// (reference counted) by every session that writes them.
#[derive(Debug, Clone)]
pub struct Push {
    pub id: MsgId,
    pub frame: axum::extract::ws::Utf8Bytes,
    /// When it came in on the node channel: the start of its realtime latency.
    pub arrived: tokio::time::Instant,
}

/// Control messages to a session.
#[derive(Debug)]
pub enum Control {
    /// A newer session of the same device exists (close 4002).
    Replaced,
    /// A read position to show; kept in Redis until a pong confirms it.
    Read(ReadPosition),
}

#[derive(Debug)]
struct Entry {
    session: String,
    pushes: mpsc::Sender<Push>,
    control: mpsc::Sender<Control>,
    /// Set when a push was dropped because the session's queue was full: the session
    /// re-reads its pending set, where the message still is.
    lagged: Arc<AtomicBool>,
}

#[derive(Debug, Default)]
pub struct SessionRegistry {
    sessions: Mutex<HashMap<DeviceKey, Entry>>,
}

/// What a session needs from its registration.
#[derive(Debug)]
pub struct Registration {
    pub pushes: mpsc::Receiver<Push>,
    pub control: mpsc::Receiver<Control>,
    pub lagged: Arc<AtomicBool>,
}

impl SessionRegistry {
    /// Registers a session; an older local session of the device is told it is replaced.
    pub fn register(&self, key: DeviceKey, session: String, queue: usize) -> Registration {
        let (push_tx, pushes) = mpsc::channel(queue);
        // Kicks and read positions; a full queue loses nothing (positions wait in Redis).
        let (control_tx, control) = mpsc::channel(1_024);
        let lagged = Arc::new(AtomicBool::new(false));
        let entry = Entry { session, pushes: push_tx, control: control_tx, lagged: lagged.clone() };
        if let Some(old) = self.sessions.lock().expect("sessions").insert(key, entry) {
            let _ = old.control.try_send(Control::Replaced);
        }
        metrics::gauge!("herald_gateway_sessions").increment(1.0);
        Registration { pushes, control, lagged }
    }

    /// Removes the session if it is still the registered one for its device.
    pub fn unregister(&self, key: &DeviceKey, session: &str) {
        let mut map = self.sessions.lock().expect("sessions");
        if map.get(key).is_some_and(|e| e.session == session) {
            map.remove(key);
        }
        metrics::gauge!("herald_gateway_sessions").decrement(1.0);
    }

    /// Closes the device's session if it is `session` (replaced on another node).
    pub fn kick(&self, key: &DeviceKey, session: &str) {
        let map = self.sessions.lock().expect("sessions");
        if let Some(e) = map.get(key).filter(|e| e.session == session) {
            let _ = e.control.try_send(Control::Replaced);
        }
    }

    /// Hands a push to the device's session, if it is here. Never waits: a full queue
    /// marks the session lagged instead.
    pub fn push(&self, key: &DeviceKey, push: Push) {
        let map = self.sessions.lock().expect("sessions");
        let Some(e) = map.get(key) else {
            metrics::counter!("herald_pushes_total", "outcome" => "not_here").increment(1);
            return;
        };
        match e.pushes.try_send(push) {
            Ok(()) => metrics::counter!("herald_pushes_total", "outcome" => "queued").increment(1),
            Err(_) => {
                e.lagged.store(true, Ordering::Release);
                metrics::counter!("herald_pushes_total", "outcome" => "dropped_slow_consumer").increment(1);
            }
        }
    }

    /// Hands a read position to the device's session, if it is here. A full queue
    /// loses nothing: the position waits in Redis for the next session.
    pub fn push_read(&self, key: &DeviceKey, conv: &str, user: &str, seq: u64) {
        let map = self.sessions.lock().expect("sessions");
        if let Some(e) = map.get(key) {
            let position = ReadPosition { conv: conv.to_owned(), user: user.to_owned(), seq };
            let _ = e.control.try_send(Control::Read(position));
        }
    }

    /// Makes every session here read its pending set again: pushes published while the
    /// node channel was disconnected never arrived, but they are still pending.
    pub fn reread_all(&self) {
        for e in self.sessions.lock().expect("sessions").values() {
            e.lagged.store(true, Ordering::Release);
        }
    }

    pub fn len(&self) -> usize {
        self.sessions.lock().expect("sessions").len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
