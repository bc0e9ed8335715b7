//! The scheduler: messages for devices with a push token wait `push.delay_ms` in memory,
//! collapsed per device and conversation; then those still unacked become rows of
//! `push_notifications` for the dispatcher.
//!
//! Memory, not MySQL, holds the wait: most messages are acked within it (their device is
//! online) and never cost a write. A worker that stops loses what waits in it: those
//! messages get no notification (they are still delivered, as always, from the pending
//! sets).

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use herald_shared::ids::MsgId;
use herald_shared::keys::Keys;
use herald_shared::otel::TraceParent;
use tokio::sync::{mpsc, Mutex, Notify};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::store::{Collapsed, PushStore};
use super::traces::{PushTraces, MAX_PER_NOTIFICATION};
use super::Webhooks;
use crate::batch::PushCandidate;

/// One device's notification for one conversation: (tenant, user, device, conversation).
pub type Target = (String, String, String, String);

/// Most notifications handed over (checked in Redis, written to MySQL) at once.
const HAND_OVER_MAX: usize = 1_000;

/// A notification due: its target, its messages, and the trace contexts of those that
/// are traced (oldest first).
pub type Due = (Target, Collapsed, Vec<TraceParent>);

/// Messages waiting out the delay, collapsed per target. The delay is the same for all,
/// so the order of first arrival is the order they fall due: a queue, not a heap.
#[derive(Debug)]
pub struct WaitingRoom {
    delay: Duration,
    max: usize,
    waiting: HashMap<Target, Collapsed>,
    order: VecDeque<(Instant, Target)>,
    /// The traced messages' contexts, by target (only traced sends have any).
    traces: HashMap<Target, Vec<TraceParent>>,
}

impl WaitingRoom {
    pub fn new(delay: Duration, max: usize) -> WaitingRoom {
        WaitingRoom { delay, max, waiting: HashMap::new(), order: VecDeque::new(), traces: HashMap::new() }
    }

    /// Adds a message: it joins its target's notification, or starts one due after the
    /// delay. False when the room is full and it starts nothing.
    pub fn add(&mut self, c: PushCandidate, now: Instant) -> bool {
        let target = (c.tenant, c.user, c.device, c.conv);
        if let Some(w) = self.waiting.get_mut(&target) {
            w.join(c.id, &c.sender, 1);
            self.trace(&target, c.trace);
            return true;
        }
        if self.waiting.len() >= self.max {
            return false;
        }
        self.trace(&target, c.trace);
        self.order.push_back((now + self.delay, target.clone()));
        self.waiting.insert(target, Collapsed { id: c.id, sender: c.sender, count: 1 });
        true
    }

    /// Notes a traced message's context for its target's notification (the latest kept).
    fn trace(&mut self, target: &Target, trace: Option<TraceParent>) {
        let Some(trace) = trace else { return };
        let kept = self.traces.entry(target.clone()).or_default();
        if kept.len() >= MAX_PER_NOTIFICATION {
            kept.remove(0);
        }
        kept.push(trace);
    }

    /// When the next notification falls due.
    pub fn next_due(&self) -> Option<Instant> {
        self.order.front().map(|(due, _)| *due)
    }

    /// The notifications due by `now`, oldest first, at most `max`.
    pub fn take_due(&mut self, now: Instant, max: usize) -> Vec<Due> {
        let mut due = Vec::new();
        while due.len() < max && self.order.front().is_some_and(|(at, _)| *at <= now) {
            let (_, target) = self.order.pop_front().expect("front exists");
            if let Some(w) = self.waiting.remove(&target) {
                let traces = self.traces.remove(&target).unwrap_or_default();
                due.push((target, w, traces));
            }
        }
        due
    }

    pub fn len(&self) -> usize {
        self.waiting.len()
    }

    pub fn is_empty(&self) -> bool {
        self.waiting.is_empty()
    }
}

impl Collapsed {
    /// Another `count` messages, `id` among them, join the notification: it names the
    /// latest message and its sender.
    pub fn join(&mut self, id: MsgId, sender: &str, count: u32) {
        self.count += count;
        if id > self.id {
            self.id = id;
            self.sender = sender.to_owned();
        }
    }
}

/// The loop between the fan-out and the dispatcher.
#[derive(Clone, Debug)]
pub struct PushScheduler {
    /// Outlives a restart of the loop.
    pub rx: Arc<Mutex<mpsc::Receiver<Vec<PushCandidate>>>>,
    pub redis: fred::prelude::Pool,
    pub keys: Keys,
    pub store: Arc<PushStore>,
    pub webhooks: Arc<Webhooks>,
    pub delay: Duration,
    pub max_waiting: usize,
    /// Wakes the dispatcher once rows are written.
    pub dispatcher: Arc<Notify>,
    /// Where the written notifications' trace contexts go for the dispatcher.
    pub traces: Arc<PushTraces>,
}

impl PushScheduler {
    pub async fn run(self, cancel: CancellationToken) {
        let mut rx = self.rx.lock().await;
        let mut room = WaitingRoom::new(self.delay, self.max_waiting);
        loop {
            let next = room.next_due().unwrap_or_else(|| Instant::now() + Duration::from_secs(3600));
            tokio::select! {
                _ = cancel.cancelled() => return,
                batch = rx.recv() => {
                    let Some(batch) = batch else { return };
                    let now = Instant::now();
                    let mut dropped = 0;
                    for c in batch {
                        // A tenant without a webhook costs nothing further.
                        if self.webhooks.url(&c.tenant).is_some() && !room.add(c, now) {
                            dropped += 1;
                        }
                    }
                    if dropped > 0 {
                        metrics::counter!("herald_push_dropped_total").increment(dropped);
                    }
                }
                _ = tokio::time::sleep_until(next) => {
                    let due = room.take_due(Instant::now(), HAND_OVER_MAX);
                    self.hand_over(due).await;
                }
            }
            metrics::gauge!("herald_push_waiting").set(room.len() as f64);
        }
    }

    /// Drops what was acked meanwhile and writes the rest for the dispatcher.
    async fn hand_over(&self, due: Vec<Due>) {
        if due.is_empty() {
            return;
        }
        let checks: Vec<_> =
            due.iter().map(|((t, u, d, _), w, _)| (t.as_str(), u.as_str(), d.as_str(), w.id)).collect();
        let unacked = super::unacked(&self.redis, &self.keys, &checks).await;
        let (send, quiet): (Vec<_>, Vec<_>) = due.into_iter().zip(unacked).partition(|(_, unacked)| *unacked);
        metrics::counter!("herald_push_quiet_total").increment(quiet.len() as u64);
        let mut traced = Vec::new();
        let mut rows: Vec<(Target, Collapsed)> = Vec::with_capacity(send.len());
        for ((target, w, traces), _) in send {
            if !traces.is_empty() {
                traced.push((target.clone(), traces));
            }
            rows.push((target, w));
        }
        if rows.is_empty() {
            return;
        }
        match self.store.upsert(&rows).await {
            Ok(()) => {
                self.traces.keep(traced);
                self.dispatcher.notify_one();
            }
            Err(e) => {
                metrics::counter!("herald_push_errors_total", "stage" => "schedule").increment(1);
                tracing::warn!(error = %e, notifications = rows.len(), source = "mysql", "push notifications not recorded");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn candidate(device: &str, conv: &str, id: u64, sender: &str) -> PushCandidate {
        PushCandidate {
            tenant: "t".into(),
            user: "u".into(),
            device: device.into(),
            conv: conv.into(),
            id: MsgId(id),
            sender: sender.into(),
            trace: None,
        }
    }

    #[test]
    fn messages_of_one_conversation_collapse_and_fall_due_with_the_first() {
        let start = Instant::now();
        let mut room = WaitingRoom::new(Duration::from_millis(100), 10);
        assert!(room.add(candidate("d", "c", 5, "alice"), start));
        assert!(room.add(candidate("d", "other", 6, "bob"), start + Duration::from_millis(10)));
        assert!(room.add(candidate("d", "c", 9, "carol"), start + Duration::from_millis(50)));
        assert!(room.add(candidate("d", "c", 7, "dave"), start + Duration::from_millis(60)));
        assert_eq!(room.len(), 2);
        assert_eq!(room.next_due(), Some(start + Duration::from_millis(100)));
        assert!(room.take_due(start + Duration::from_millis(99), 10).is_empty());

        let due = room.take_due(start + Duration::from_millis(100), 10);
        assert_eq!(due.len(), 1, "the other conversation is due 10 ms later");
        let (target, w, traces) = &due[0];
        assert!(traces.is_empty(), "no message was traced");
        assert_eq!(target.3, "c");
        assert_eq!((w.count, w.id, w.sender.as_str()), (3, MsgId(9), "carol"), "names the latest message");
        // A message after the hand-over starts a new notification.
        assert!(room.add(candidate("d", "c", 10, "alice"), start + Duration::from_millis(105)));
        assert_eq!(room.take_due(start + Duration::from_millis(110), 10).len(), 1);
        assert_eq!(room.take_due(start + Duration::from_millis(205), 10)[0].1.count, 1);
        assert!(room.is_empty());
    }

    #[test]
    fn a_full_room_starts_nothing_but_still_collapses() {
        let now = Instant::now();
        let mut room = WaitingRoom::new(Duration::from_millis(100), 1);
        assert!(room.add(candidate("d", "c", 1, "a"), now));
        assert!(!room.add(candidate("d", "c2", 2, "a"), now), "a second target does not fit");
        assert!(room.add(candidate("d", "c", 3, "a"), now), "the waiting one still collapses");
        assert_eq!(room.take_due(now + Duration::from_millis(100), 1)[0].1.count, 2);
    }

    #[test]
    fn a_notification_carries_the_contexts_of_its_traced_messages() {
        let now = Instant::now();
        let mut room = WaitingRoom::new(Duration::from_millis(100), 10);
        let traced = |id: u64, n: u8| PushCandidate {
            trace: TraceParent::parse(&format!("00-4bf92f3577b34da6a3ce929d0e0e47{n:02x}-00f067aa0ba902b7-01")),
            ..candidate("d", "c", id, "a")
        };
        assert!(room.add(traced(1, 1), now));
        assert!(room.add(candidate("d", "c", 2, "a"), now), "an untraced message joins without a context");
        assert!(room.add(traced(3, 3), now));
        let due = room.take_due(now + Duration::from_millis(100), 10);
        let (_, w, traces) = &due[0];
        assert_eq!(w.count, 3);
        assert_eq!(traces, &vec![traced(1, 1).trace.unwrap(), traced(3, 3).trace.unwrap()], "oldest first");
    }
}
