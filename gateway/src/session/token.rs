//! The session's token: its expiry ends the session (4001), and a `refresh` frame with a
//! new token of the same device moves that expiry (docs/protocol.md section 3.3).

use std::ops::ControlFlow;
use std::time::Duration;

use futures::{Sink, Stream};
use herald_shared::auth::{verify, Claims};
use herald_shared::error::ErrorCode;
use herald_shared::protocol::{ErrorFrame, Refreshed, TokenFrame};
use tokio::time::Instant;

use super::{Flow, Session};

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
        let answer = match verify(&f.token, self.env.cfg.jwt_secret.0.as_bytes()) {
            Err(e) => refused(ErrorCode::Unauthorized, e.to_string()).into(),
            Ok(c) if !same_device(&self.claims, &c) => {
                refused(ErrorCode::Forbidden, "the token is for another tenant, user, device or platform".into()).into()
            }
            Ok(c) => {
                self.expires = expiry(c.exp);
                self.claims.exp = c.exp;
                Refreshed { exp: c.exp, reference: f.reference }.into()
            }
        };
        metrics::counter!("herald_token_refreshes_total", "outcome" => outcome(&answer)).increment(1);
        self.send_frame(answer).await;
        ControlFlow::Continue(())
    }
}

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
        let c = Claims { tid: "t".into(), sub: "u".into(), dev: "d".into(), plat: Platform::Web, exp: 1 };
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
