//! Delivery status, both ways (docs/architecture.md section 4, "Delivery status"):
//!
//! - as a recipient, the session notes the highest `seq` its device acked per
//!   conversation (messages of other users only) and, once the acks are in Redis and
//!   its backlog is caught up, reports them to the node's [`crate::delivered`] flusher,
//!   which moves the user's delivered positions through the ingress streams;
//! - as a sender's session that opted in (`features=delivered`), it shows the
//!   `delivered` frames workers push, at most one per conversation per
//!   `delivery.status_interval_ms` ([`StatusThrottle`]): the latest of an interval is
//!   held and shown at its end.

use std::borrow::Cow;
use std::collections::HashMap;
use std::time::Duration;

use axum::extract::ws::{Message, Utf8Bytes};
use futures::{Sink, Stream};
use herald_shared::protocol::{DeliveredEntry, DeliveryStatus};
use serde::Deserialize;
use tokio::time::Instant;

use super::Session;

/// The fields of a `msg` frame a delivered position needs; the body is skipped.
#[derive(Deserialize)]
struct MsgHead<'a> {
    #[serde(borrow)]
    conv: Cow<'a, str>,
    seq: u64,
    #[serde(borrow)]
    from: Cow<'a, str>,
}

/// The highest `seq` acked per conversation in this session, and which moved since the
/// last report. A report carries the session's highest, not only what moved since: a
/// worker holds a position below a message whose fan-out is being retried, and when
/// that message arrives and is acked, the report must carry the later ones acked before
/// it too.
#[derive(Debug, Default)]
pub struct DeliveredMarks {
    /// conversation -> (highest seq acked, moved since the last report)
    by_conv: HashMap<String, (u64, bool)>,
    moved: usize,
}

impl DeliveredMarks {
    /// An acked `msg` frame; the user's own messages (from its other devices) move
    /// nothing.
    pub fn note(&mut self, frame: &Utf8Bytes, user: &str) {
        let Ok(head) = serde_json::from_str::<MsgHead>(frame.as_str()) else { return };
        if head.from == user {
            return;
        }
        let entry = match self.by_conv.get_mut(head.conv.as_ref()) {
            Some(entry) => entry,
            None => self.by_conv.entry(head.conv.into_owned()).or_insert((head.seq, false)),
        };
        entry.0 = entry.0.max(head.seq);
        if !entry.1 {
            entry.1 = true;
            self.moved += 1;
        }
    }

    /// The conversations acked in since the last report, each with the highest `seq`
    /// acked in this session.
    pub fn take(&mut self) -> HashMap<String, u64> {
        let mut out = HashMap::with_capacity(self.moved);
        for (conv, (seq, moved)) in self.by_conv.iter_mut() {
            if std::mem::take(moved) {
                out.insert(conv.clone(), *seq);
            }
        }
        self.moved = 0;
        out
    }

    pub fn is_empty(&self) -> bool {
        self.moved == 0
    }
}

/// At most one `delivered` frame per conversation per interval.
#[derive(Debug)]
pub struct StatusThrottle {
    interval: Duration,
    /// When each conversation's last frame was shown (pruned once an interval old).
    shown: HashMap<String, Instant>,
    /// The latest status of a conversation that came within its interval.
    held: HashMap<String, DeliveryStatus>,
}

impl StatusThrottle {
    pub fn new(interval: Duration) -> StatusThrottle {
        StatusThrottle { interval, shown: HashMap::new(), held: HashMap::new() }
    }

    /// A status pushed to the session: `Some` to show it now, else it is held (a later
    /// one of the same conversation replaces it, unless it is about an older message).
    pub fn offer(&mut self, status: DeliveryStatus, now: Instant) -> Option<DeliveryStatus> {
        let (interval, held) = (self.interval, &self.held);
        self.shown.retain(|c, at| now.duration_since(*at) < interval || held.contains_key(c));
        if self.shown.contains_key(&status.conv) {
            match self.held.get_mut(&status.conv) {
                Some(h) if h.seq > status.seq => {}
                Some(h) => *h = status,
                None => {
                    self.held.insert(status.conv.clone(), status);
                }
            }
            return None;
        }
        self.shown.insert(status.conv.clone(), now);
        Some(status)
    }

    /// When the first held status may be shown.
    pub fn due(&self) -> Option<Instant> {
        self.held.keys().filter_map(|c| self.shown.get(c)).min().map(|at| *at + self.interval)
    }

    /// The held statuses whose interval has passed, marked shown now.
    pub fn take_due(&mut self, now: Instant) -> Vec<DeliveryStatus> {
        let interval = self.interval;
        let ready: Vec<String> = self
            .held
            .keys()
            .filter(|c| self.shown.get(*c).is_none_or(|at| now.duration_since(*at) >= interval))
            .cloned()
            .collect();
        let mut out = Vec::with_capacity(ready.len());
        for conv in ready {
            if let Some(s) = self.held.remove(&conv) {
                self.shown.insert(conv, now);
                out.push(s);
            }
        }
        if self.held.is_empty() {
            self.held.shrink_to_fit();
        }
        out
    }
}

impl<S, E> Session<S>
where
    S: Stream<Item = Result<Message, E>> + Sink<Message> + Unpin + Send,
{
    /// Reports the delivered positions noted, once the backlog is caught up: before
    /// that, an ack of a realtime message could claim older ones still on their way.
    pub(super) fn report_delivered(&mut self) {
        if self.delivered.is_empty() || !self.backlog.done {
            return;
        }
        for (conv, seq) in self.delivered.take() {
            self.env.delivered.report(DeliveredEntry {
                tenant: self.device.tenant.clone(),
                user: self.device.user.clone(),
                conv,
                seq,
            });
        }
    }

    /// A status from a worker: shown now, held for the end of its interval, or dropped
    /// when the session did not opt in.
    pub(super) async fn on_status(&mut self, status: DeliveryStatus) {
        let Some(throttle) = self.status.as_mut() else { return };
        match throttle.offer(status, Instant::now()) {
            Some(now) => {
                metrics::counter!("herald_status_frames_total", "outcome" => "shown").increment(1);
                self.send_frame(now).await;
            }
            None => metrics::counter!("herald_status_frames_total", "outcome" => "held").increment(1),
        }
    }

    pub(super) fn status_due(&self) -> Option<Instant> {
        self.status.as_ref().and_then(|t| t.due())
    }

    /// Shows the held statuses whose interval passed.
    pub(super) async fn show_due_statuses(&mut self, now: Instant) {
        let Some(throttle) = self.status.as_mut() else { return };
        for s in throttle.take_due(now) {
            metrics::counter!("herald_status_frames_total", "outcome" => "shown").increment(1);
            self.send_frame(s).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(conv: &str, seq: u64, count: u64) -> DeliveryStatus {
        DeliveryStatus { conv: conv.into(), seq, count, user: None }
    }

    #[test]
    fn acks_note_the_highest_seq_of_other_users_messages() {
        let mut m = DeliveredMarks::default();
        let frame = |conv: &str, seq: u64, from: &str| {
            Utf8Bytes::from(format!(
                r#"{{"t":"msg","id":"1","conv":"{conv}","seq":{seq},"from":"{from}","cmid":"x","ts":1,"body":{{"a":[1,{{"b":2}}]}}}}"#
            ))
        };
        m.note(&frame("ab", 3, "bob"), "alice");
        m.note(&frame("ab", 2, "bob"), "alice");
        m.note(&frame("ab", 9, "alice"), "alice");
        m.note(&frame("g", 5, "carol"), "alice");
        m.note(&Utf8Bytes::from_static("not json"), "alice");
        let taken = m.take();
        assert_eq!(taken.get("ab"), Some(&3), "the highest, and not the user's own message");
        assert_eq!(taken.get("g"), Some(&5));
        assert!(m.is_empty());
        // An older message acked later (its fan-out was retried) reports the highest.
        m.note(&frame("ab", 1, "bob"), "alice");
        assert_eq!(m.take(), HashMap::from([("ab".to_string(), 3)]), "only the conversation acked in");
    }

    #[tokio::test(start_paused = true)]
    async fn one_frame_per_conversation_per_interval_the_latest_held_for_its_end() {
        let mut t = StatusThrottle::new(Duration::from_millis(1_000));
        let t0 = Instant::now();
        assert_eq!(t.offer(status("a", 1, 1), t0), Some(status("a", 1, 1)), "the first is shown at once");
        assert_eq!(t.offer(status("b", 1, 1), t0), Some(status("b", 1, 1)), "another conversation is not held");
        for n in 2..20 {
            assert_eq!(t.offer(status("a", n, 1), t0 + Duration::from_millis(10 * n)), None);
        }
        assert_eq!(t.offer(status("a", 5, 3), t0 + Duration::from_millis(300)), None, "an older message: kept out");
        assert_eq!(t.due(), Some(t0 + Duration::from_millis(1_000)));
        assert!(t.take_due(t0 + Duration::from_millis(999)).is_empty());
        assert_eq!(t.take_due(t0 + Duration::from_millis(1_000)), vec![status("a", 19, 1)], "the latest, once");
        assert_eq!(t.due(), None);
        // Shown at 1 000 ms: the next one waits until 2 000 ms.
        assert_eq!(t.offer(status("a", 20, 2), t0 + Duration::from_millis(1_500)), None);
        assert_eq!(t.due(), Some(t0 + Duration::from_millis(2_000)));
        assert_eq!(t.take_due(t0 + Duration::from_millis(2_000)), vec![status("a", 20, 2)]);
        // A quiet conversation is forgotten after its interval and shown at once again.
        let later = t0 + Duration::from_millis(5_000);
        assert_eq!(t.offer(status("b", 2, 1), later), Some(status("b", 2, 1)));
        assert_eq!(t.shown.len(), 1, "conversations quiet for an interval are pruned");
    }
}
