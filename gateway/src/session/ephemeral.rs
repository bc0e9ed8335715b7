//! The session's ephemeral frames (docs/protocol.md section 4.12): typing indicators it
//! sends (limited per conversation, relayed, never stored) and those and presence
//! changes it is shown, only when it asked for them at the upgrade (`features=`).

use std::collections::HashMap;
use std::ops::ControlFlow;
use std::time::Duration;

use axum::extract::ws::{Message, Utf8Bytes};
use futures::{Sink, Stream};
use herald_shared::error::ErrorCode;
use herald_shared::protocol::{ErrorFrame, PresenceSubscribeFrame, TypingFrame};
use tokio::time::Instant;

use super::{Flow, Session};
use crate::sessions::{Ephemeral, EphemeralKind};
use crate::typing::Relayed;

/// Conversations whose typing frames are counted at once: a session typing in more
/// within one window has the extra frames dropped, so the count stays small.
const TYPING_CONVERSATIONS: usize = 64;

/// At most `burst` typing frames per conversation per `window` (a fixed window from
/// the first frame); the rest are dropped.
#[derive(Debug)]
pub(super) struct TypingLimit {
    burst: u32,
    window: Duration,
    /// conversation -> (its window's start, frames in it)
    counts: HashMap<String, (Instant, u32)>,
}

impl TypingLimit {
    pub(super) fn new(burst: u32, window: Duration) -> TypingLimit {
        TypingLimit { burst, window, counts: HashMap::new() }
    }

    /// Whether one more typing frame for `conv` may go now.
    fn allow(&mut self, conv: &str, now: Instant) -> bool {
        if !self.counts.contains_key(conv) && self.counts.len() >= TYPING_CONVERSATIONS {
            let window = self.window;
            self.counts.retain(|_, (start, _)| now.duration_since(*start) < window);
            if self.counts.len() >= TYPING_CONVERSATIONS {
                return false;
            }
        }
        let (start, count) = self.counts.entry(conv.to_owned()).or_insert((now, 0));
        if now.duration_since(*start) >= self.window {
            (*start, *count) = (now, 0);
        }
        if *count >= self.burst {
            return false;
        }
        *count += 1;
        true
    }
}

impl<S, E> Session<S>
where
    S: Stream<Item = Result<Message, E>> + Sink<Message> + Unpin + Send,
{
    /// `typing`: relayed to the other members' online devices unless over the limit
    /// (dropped without an answer). Refusals (`not_found`, `forbidden`, `unavailable`)
    /// are answered with the frame's `ref`.
    pub(super) async fn on_typing(&mut self, t: TypingFrame) -> Flow {
        if t.conv.is_empty() || t.conv.len() > 64 {
            let f = ErrorFrame::new(ErrorCode::BadRequest, "conv must be 1..64 characters").with_ref(t.reference);
            self.send_frame(f).await;
            return ControlFlow::Continue(());
        }
        let g = &self.env.cfg.gateway;
        let limit = self.typing_limit.get_or_insert_with(|| {
            Box::new(TypingLimit::new(g.typing_burst, Duration::from_millis(g.typing_window_ms)))
        });
        if !limit.allow(&t.conv, Instant::now()) {
            metrics::counter!("herald_ephemeral_total", "outcome" => "dropped_rate").increment(1);
            return ControlFlow::Continue(());
        }
        let relay = self.env.typing.clone();
        let (tenant, user) = (self.claims.tid.clone(), self.claims.sub.clone());
        self.requests.spawn(async move {
            match relay.relay(&tenant, &user, &t.conv, t.state).await {
                Ok(Relayed::To(_)) => None,
                Ok(Relayed::TooManyMembers) => {
                    metrics::counter!("herald_ephemeral_total", "outcome" => "not_relayed").increment(1);
                    None
                }
                Err(e) => Some(ErrorFrame::new(e.code, e.message).with_ref(t.reference).into()),
            }
        });
        ControlFlow::Continue(())
    }

    /// `presence_subscribe`: the session follows these users (those that are the
    /// user's contacts), and is shown each one's presence now, then its changes.
    pub(super) async fn on_presence_subscribe(&mut self, p: PresenceSubscribeFrame) -> Flow {
        if !self.features.presence {
            let why = "presence_subscribe needs features=presence at the upgrade";
            self.send_frame(ErrorFrame::new(ErrorCode::BadRequest, why).with_ref(p.reference)).await;
            return ControlFlow::Continue(());
        }
        if let Some(flow) = self.limit_request("presence_subscribe", p.reference.clone()).await {
            return flow;
        }
        let roster = self.env.roster.clone();
        let users = match roster.users_of(p.users) {
            Ok(users) => users,
            Err(e) => {
                self.send_frame(ErrorFrame::new(e.code, e.message).with_ref(p.reference)).await;
                return ControlFlow::Continue(());
            }
        };
        let (tenant, user) = (self.claims.tid.clone(), self.claims.sub.clone());
        // Kept, to be checked again when a membership change reaches the device.
        self.presence_asked = (!users.is_empty()).then(|| users.clone().into_boxed_slice());
        // Followed before the states are read: a change in between is shown after them.
        let states = match roster.contacts(&tenant, &user, &users).await {
            Ok(contacts) => {
                self.env.watchers.follow(&self.device, &self.id, contacts.clone());
                roster.states(&tenant, &contacts).await
            }
            Err(e) => Err(e),
        };
        match states {
            Ok(states) => {
                for s in states {
                    self.send_frame(s).await;
                }
            }
            Err(e) => {
                self.send_frame(ErrorFrame::new(e.code, e.message).with_ref(p.reference)).await;
            }
        }
        ControlFlow::Continue(())
    }

    /// A frame written to the device was a membership change (a `member_added`,
    /// `member_removed` or `member_left` event): the users it follows are its contacts
    /// again, checked now, so a user who no longer shares a conversation with it stops
    /// being shown and one who came to share one starts. Only sessions that follow
    /// someone pay for it, one query per membership change they receive.
    pub(super) async fn recheck_follows(&mut self, frame: &Utf8Bytes) {
        let Some(asked) = self.presence_asked.as_deref() else { return };
        if !frame.as_str().contains(r#""type":"member_"#) {
            return;
        }
        match self.env.roster.contacts(&self.claims.tid, &self.claims.sub, asked).await {
            Ok(contacts) => self.env.watchers.follow(&self.device, &self.id, contacts),
            Err(e) => tracing::debug!(error = %e.message, "presence follows not checked again"),
        }
    }

    /// A typing or presence frame for this device: written if the session asked for
    /// its kind.
    pub(super) async fn on_ephemeral(&mut self, e: Ephemeral) -> Flow {
        let shown = match e.kind {
            EphemeralKind::Typing => self.features.typing,
            EphemeralKind::Presence => self.features.presence,
        };
        if shown {
            self.write(e.frame).await;
        }
        ControlFlow::Continue(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn typing_is_limited_per_conversation_within_its_window() {
        let mut l = TypingLimit::new(2, Duration::from_secs(5));
        let now = Instant::now();
        assert!(l.allow("a", now) && l.allow("a", now));
        assert!(!l.allow("a", now), "the third within the window is dropped");
        assert!(l.allow("b", now), "another conversation has its own count");
        assert!(l.allow("a", now + Duration::from_secs(5)), "a new window");
    }

    #[tokio::test(start_paused = true)]
    async fn the_conversations_counted_are_bounded() {
        let mut l = TypingLimit::new(1, Duration::from_secs(5));
        let now = Instant::now();
        for i in 0..TYPING_CONVERSATIONS {
            assert!(l.allow(&format!("c{i}"), now));
        }
        assert!(!l.allow("one-more", now), "too many conversations at once");
        assert!(l.allow("one-more", now + Duration::from_secs(5)), "the old windows are pruned");
        assert_eq!(l.counts.len(), 1);
    }
}
