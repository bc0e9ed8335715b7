//! The trace contexts of push notifications, from the scheduler to the dispatcher, and
//! the dispatcher's `herald.push` span of a webhook call (`otel.*`).
//!
//! A notification stands for the messages of one conversation collapsed for a device;
//! its span is a child of the latest traced message's fan-out span and links the other
//! traced messages'. The contexts are kept in this worker's memory, not in
//! `push_notifications`: a notification another worker dispatches, or one retried after
//! its first attempt, has no span. Contexts not taken within [`KEEP`] are forgotten.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use herald_shared::otel::span::PUSH;
use herald_shared::otel::{attr, HeraldSpan, SpanKind, TraceParent, Tracer};

use super::schedule::Target;
use super::store::Claimed;

/// Notifications whose contexts are kept at most; past it new ones go untraced.
const MAX: usize = 10_000;
/// How long a notification's contexts wait for its webhook call.
const KEEP: Duration = Duration::from_secs(600);
/// Traced messages one notification keeps (the latest as its parent, the rest linked).
pub const MAX_PER_NOTIFICATION: usize = 16;

/// Contexts of notifications written for the dispatcher, by target.
#[derive(Debug, Default)]
pub struct PushTraces(Mutex<HashMap<Target, (Instant, Vec<TraceParent>)>>);

impl PushTraces {
    /// Keeps the contexts of notifications just written (joining those of a notification
    /// still waiting for its call, as its row does).
    pub fn keep(&self, traced: Vec<(Target, Vec<TraceParent>)>) {
        if traced.is_empty() {
            return;
        }
        let mut map = self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let now = Instant::now();
        if map.len() + traced.len() > MAX {
            map.retain(|_, (at, _)| now.duration_since(*at) < KEEP);
        }
        for (target, contexts) in traced {
            if map.len() >= MAX && !map.contains_key(&target) {
                continue;
            }
            let (at, kept) = map.entry(target).or_insert_with(|| (now, Vec::new()));
            *at = now;
            kept.extend(contexts);
            let over = kept.len().saturating_sub(MAX_PER_NOTIFICATION);
            kept.drain(..over);
        }
    }

    /// Takes the contexts of a claimed notification (none: it is not traced here).
    fn take(&self, c: &Claimed) -> Vec<TraceParent> {
        let target = (c.tenant.clone(), c.user.clone(), c.device.clone(), c.conv.clone());
        let mut map = self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        map.remove(&target).map(|(_, contexts)| contexts).unwrap_or_default()
    }

    /// Starts the span of a notification's webhook call, when it has contexts here.
    pub fn start(&self, tracer: &Tracer, c: &Claimed) -> HeraldSpan {
        if !tracer.is_on() {
            return HeraldSpan::none();
        }
        let mut contexts = self.take(c);
        let Some(parent) = contexts.pop() else { return HeraldSpan::none() };
        let mut span = tracer.start_at(PUSH, SpanKind::Client, Some(parent), &contexts, None);
        span.set_str(attr::TENANT, &c.tenant);
        span.set_str(attr::CONV, &c.conv);
        span.set_str(attr::MSG_ID, &c.msg.id.0.to_string());
        span.set_u64(attr::PUSH_MESSAGES, u64::from(c.msg.count));
        span.set_u64(attr::ATTEMPT, u64::from(c.failures) + 1);
        span
    }

    pub fn len(&self) -> usize {
        self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::push::store::Collapsed;
    use herald_shared::ids::MsgId;

    fn context(n: u8) -> TraceParent {
        TraceParent::parse(&format!("00-4bf92f3577b34da6a3ce929d0e0e47{n:02x}-00f067aa0ba902b7-01")).unwrap()
    }

    fn claimed(conv: &str) -> Claimed {
        Claimed {
            row: 1,
            tenant: "t".into(),
            user: "u".into(),
            device: "d".into(),
            conv: conv.into(),
            msg: Collapsed { id: MsgId(9), sender: "s".into(), count: 2 },
            failures: 0,
            created_at: 1,
        }
    }

    fn target(conv: &str) -> Target {
        ("t".into(), "u".into(), "d".into(), conv.into())
    }

    #[test]
    fn contexts_are_taken_once_by_their_notification_and_bounded() {
        let traces = PushTraces::default();
        traces.keep(vec![(target("c"), vec![context(1)])]);
        traces.keep(vec![(target("c"), (2..40).map(context).collect())]);
        assert_eq!(traces.len(), 1);
        let taken = traces.take(&claimed("c"));
        assert_eq!(taken.len(), MAX_PER_NOTIFICATION);
        assert_eq!(taken.last(), Some(&context(39)), "the latest is kept, the parent");
        assert!(traces.take(&claimed("c")).is_empty(), "a retry has none");
        assert!(traces.is_empty());
    }

    #[test]
    fn with_tracing_off_nothing_is_taken_or_recorded() {
        let traces = PushTraces::default();
        traces.keep(vec![(target("c"), vec![context(1)])]);
        let span = traces.start(&Tracer::off(), &claimed("c"));
        assert!(!span.is_recording());
        assert_eq!(traces.len(), 1);
    }
}
