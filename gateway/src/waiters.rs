//! Requests waiting for a worker's answer (sends and read receipts), by request id.
//!
//! Ids start at a random 64-bit base in every process life, so an answer meant for an
//! earlier life of this node (same node id, restarted while its requests waited) does
//! not find a waiter; and every answer echoes its request (tenant, sender,
//! conversation, cmid), so one that still meets a waiter of another request is dropped
//! and counted, never handed over. The answer comes on this node's channel, whose
//! listener resolves the waiter.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use herald_shared::protocol::{Echo, SendOutcome};
use tokio::sync::oneshot;

/// Requests waiting for their worker's answer.
#[derive(Debug)]
pub struct SendWaiters {
    next: AtomicU64,
    waiting: Mutex<HashMap<u64, (Echo, oneshot::Sender<SendOutcome>)>>,
}

impl Default for SendWaiters {
    fn default() -> Self {
        SendWaiters { next: AtomicU64::new(rand::random()), waiting: Mutex::default() }
    }
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
    /// Waits for the answer to the request `expect` describes.
    pub fn register(self: &Arc<Self>, expect: Echo) -> Waiter {
        let rid = self.next.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.waiting.lock().expect("waiters").insert(rid, (expect, tx));
        Waiter { rid, rx, owner: self.clone() }
    }

    /// Hands a worker's answer to its waiter, if it is still waiting and the answer is
    /// for its request (answers of workers too old to echo are taken by id alone).
    pub fn resolve(&self, rid: u64, echo: Option<&Echo>, outcome: SendOutcome) {
        let mut waiting = self.waiting.lock().expect("waiters");
        let Some((expect, _)) = waiting.get(&rid) else { return };
        if echo.is_some_and(|e| e != expect) {
            metrics::counter!("herald_notices_mismatched_total").increment(1);
            tracing::warn!(rid, "an answer for another request carried this request's id; dropped");
            return;
        }
        if let Some((_, tx)) = waiting.remove(&rid) {
            let _ = tx.send(outcome);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use herald_shared::error::ErrorCode;

    fn echo(tenant: &str, cmid: &str) -> Echo {
        Echo { tenant: tenant.into(), user: "u".into(), conv: "c".into(), cmid: Some(cmid.into()) }
    }

    #[test]
    fn ids_start_anywhere_and_an_answer_for_another_request_is_dropped() {
        let (a, b) = (Arc::new(SendWaiters::default()), Arc::new(SendWaiters::default()));
        let (wa, wb) = (a.register(echo("t1", "m")), b.register(echo("t1", "m")));
        assert_ne!(wa.rid, wb.rid, "two lives of a node do not reuse ids");
        let mut w = a.register(echo("t2", "m1"));
        let outcome = SendOutcome::Err { code: ErrorCode::Internal, message: "x".into() };
        a.resolve(w.rid, Some(&echo("t1", "m1")), outcome.clone());
        assert!(w.rx.try_recv().is_err(), "another tenant's answer is not handed over");
        a.resolve(w.rid, Some(&echo("t2", "m1")), outcome.clone());
        assert_eq!(w.rx.try_recv().unwrap(), outcome);
        let mut old = a.register(echo("t2", "m2"));
        a.resolve(old.rid, None, outcome.clone());
        assert_eq!(old.rx.try_recv().unwrap(), outcome, "an old worker's answer goes by id");
    }
}
