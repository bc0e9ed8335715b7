//! Requests waiting for a worker's answer (sends and read receipts), by request id.
//!
//! Request ids are unique within this process's life; the answer comes on this node's
//! channel, whose listener resolves the waiter.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use herald_shared::protocol::SendOutcome;
use tokio::sync::oneshot;

/// Requests waiting for their worker's answer.
#[derive(Debug, Default)]
pub struct SendWaiters {
    next: AtomicU64,
    waiting: Mutex<HashMap<u64, oneshot::Sender<SendOutcome>>>,
}

/// Removes the waiter when the request ends, answered or not (timeouts, client gone).
#[derive(Debug)]
pub struct Waiter {
    pub rid: u64,
    pub rx: oneshot::Receiver<SendOutcome>,
    owner: Arc<SendWaiters>,
}

impl Drop for Waiter {
    fn drop(&mut self) {
        self.owner.waiting.lock().expect("waiters").remove(&self.rid);
    }
}

impl SendWaiters {
    pub fn register(self: &Arc<Self>) -> Waiter {
        let rid = self.next.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.waiting.lock().expect("waiters").insert(rid, tx);
        Waiter { rid, rx, owner: self.clone() }
    }

    /// Hands a worker's answer to its waiter, if it is still waiting.
    pub fn resolve(&self, rid: u64, outcome: SendOutcome) {
        if let Some(tx) = self.waiting.lock().expect("waiters").remove(&rid) {
            let _ = tx.send(outcome);
        }
    }
}
