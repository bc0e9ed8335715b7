//! The session's token: its expiry ends the session (4001), and a `refresh` frame with a
//! new token of the same device moves that expiry (docs/protocol.md section 3.3).

use std::ops::ControlFlow;
use std::time::Duration;

use futures::{Sink, Stream};
use herald_shared::auth::Claims;
use herald_shared::error::ErrorCode;
use herald_shared::protocol::{ErrorFrame, Refreshed, TokenFrame};
use tokio::time::Instant;

use super::{End, Flow, Session};
use crate::identity::{revoked_by, DeviceRefusal, Identity};
use herald_shared::protocol::CloseCode;
use std::sync::Arc;

/// When a token whose `exp` is `exp` (seconds) stops being valid, on the session's clock.
pub(super) fn expiry(exp: u64) -> Instant {
    let left = exp.saturating_mul(1000).saturating_sub(herald_shared::ids::now_ms());
    // Capped at a year: `Instant` overflows far sooner than `exp` does.
    Instant::now() + Duration::from_millis(left.min(365 * 86_400_000))
}

/// A refresh token must name the session's device (`tid`, `sub`, `dev`) and platform.
fn same_device(session: &Claims, new: &Claims) -> bool {
    (&session.tid, &session.sub, &session.dev, session.plat) == (&new.tid, &new.sub, &new.dev, new.plat)
}

impl<S, E> Session<S>
where
    S: Stream<Item = Result<axum::extract::ws::Message, E>> + Sink<axum::extract::ws::Message> + Unpin + Send,
{
    /// `refresh`: a valid token of this device becomes the session's token, its `exp` the
    /// session's end. A refused one leaves the session as it was (it still ends at the
    /// old `exp`); the client may try again with another token.
    pub(super) async fn on_refresh(&mut self, f: TokenFrame) -> Flow {
        let refused = |code, message: String| ErrorFrame::new(code, message).with_ref(f.reference.clone());
        let answer = match self.env.identity.device(&f.token).await {
            Err(DeviceRefusal::Token(e)) => refused(ErrorCode::Unauthorized, e.to_string()).into(),
            Err(DeviceRefusal::Unavailable(e)) => refused(ErrorCode::Unavailable, e.to_string()).into(),
            Ok(c) if !same_device(&self.claims, &c) => {
                refused(ErrorCode::Forbidden, "the token is for another tenant, user, device or platform".into()).into()
            }
            Ok(c) => {
                self.expires = expiry(c.exp);
                self.claims.exp = c.exp;
                self.claims.iat = c.iat;
                Refreshed { exp: c.exp, reference: f.reference }.into()
            }
        };
        metrics::counter!("herald_token_refreshes_total", "outcome" => outcome(&answer)).increment(1);
        self.send_frame(answer).await;
        ControlFlow::Continue(())
    }
}

impl<S, E> Session<S>
where
    S: Stream<Item = Result<axum::extract::ws::Message, E>> + Sink<axum::extract::ws::Message> + Unpin + Send,
{
    /// A revocation of this session's user or device: the session ends (4004) if its
    /// token was issued before `not_before` (or says not when), else it goes on (its
    /// token is newer: a client that reconnected, or refreshed, with a new one).
    pub(super) fn on_revoked(&mut self, not_before: u64) -> Flow {
        if !revoked_by(&self.claims, not_before) {
            return ControlFlow::Continue(());
        }
        metrics::counter!("herald_sessions_revoked_total").increment(1);
        ControlFlow::Break(End::Close(CloseCode::Revoked, REVOKED))
    }
}

/// Whether the session's token `c` was revoked after it was checked (a read of the
/// revocations cache, filled by that check moments ago). Unknown counts as no: the
/// token was valid a moment ago, and a revocation still reaches the session by its
/// announcement. Owned arguments: the session (its socket) is not `Sync`.
pub(super) async fn revoked_meanwhile(identity: Arc<Identity>, c: Claims) -> bool {
    let nbf = identity.revocations.not_before(&c.tid, &c.sub, &c.dev).await;
    let revoked = nbf.ok().flatten().is_some_and(|nbf| revoked_by(&c, nbf));
    if revoked {
        metrics::counter!("herald_sessions_revoked_total").increment(1);
    }
    revoked
}

/// The close reason of a revoked session.
pub(super) const REVOKED: &str = "token revoked; do not reconnect with it";

fn outcome(answer: &herald_shared::protocol::ServerFrame) -> &'static str {
    match answer {
        herald_shared::protocol::ServerFrame::Refreshed(_) => "refreshed",
        _ => "refused",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use herald_shared::auth::Platform;

    #[test]
    fn only_a_token_of_the_same_device_and_platform_refreshes() {
        let c = Claims { tid: "t".into(), sub: "u".into(), dev: "d".into(), plat: Platform::Web, exp: 1, iat: None };
        assert!(same_device(&c, &Claims { exp: 99, ..c.clone() }));
        assert!(!same_device(&c, &Claims { tid: "t2".into(), ..c.clone() }));
        assert!(!same_device(&c, &Claims { sub: "u2".into(), ..c.clone() }));
        assert!(!same_device(&c, &Claims { dev: "d2".into(), ..c.clone() }));
        assert!(!same_device(&c, &Claims { plat: Platform::Ios, ..c.clone() }));
    }

    #[test]
    fn expiry_follows_exp_and_a_past_exp_is_now() {
        let now = Instant::now();
        assert!(expiry(0) <= Instant::now());
        let exp = herald_shared::ids::now_ms() / 1000 + 60;
        let at = expiry(exp);
        assert!(at > now + Duration::from_secs(58) && at <= Instant::now() + Duration::from_secs(60));
        assert!(expiry(u64::MAX) > now + Duration::from_secs(86_400 * 364));
    }
}
