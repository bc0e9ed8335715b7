//! Where a device's tokens come from: the app's [`TokenSource`], asked for a new token
//! after a 4001 and before the session's token expires, so that the session goes on
//! with a `refresh` frame (docs/client.md section 3.3, docs/protocol.md section 3.3).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;

/// Why the device asks for a token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenReason {
    /// Before a connection, when the token it has is expired (or there is none).
    Connect,
    /// After the server closed a session with 4001.
    Expired,
    /// In a session, before its token expires.
    Refresh,
}

type TokenFuture = Pin<Box<dyn Future<Output = Option<String>> + Send>>;

/// The app's way to get a fresh token of the device; `None`: it has none (the device
/// stops at a connect, and a session then ends at its token's `exp`).
#[derive(Clone)]
pub struct TokenSource(Arc<dyn Fn(TokenReason) -> TokenFuture + Send + Sync>);

impl TokenSource {
    /// `TokenSource::new(|why| async move { Some(fetch_token().await) })`.
    pub fn new<F, Fut>(source: F) -> TokenSource
    where
        F: Fn(TokenReason) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Option<String>> + Send + 'static,
    {
        TokenSource(Arc::new(move |why| Box::pin(source(why))))
    }

    pub(super) fn get(&self, why: TokenReason) -> TokenFuture {
        (self.0)(why)
    }
}

impl std::fmt::Debug for TokenSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TokenSource")
    }
}

/// A token's `exp` (seconds since the Unix epoch), read without checking the
/// signature (only the server can): `None` when it is no readable JWT.
pub(super) fn exp_of(token: &str) -> Option<u64> {
    let payload = URL_SAFE_NO_PAD.decode(token.split('.').nth(1)?).ok()?;
    serde_json::from_slice::<serde_json::Value>(&payload).ok()?.get("exp")?.as_u64()
}

/// Whether a token is still worth connecting with: readable and not expiring within a
/// few seconds (the server refuses it at `exp` itself).
pub(super) fn usable(token: &str, now_ms: u64) -> bool {
    exp_of(token).is_some_and(|exp| exp.saturating_mul(1000) > now_ms + 5_000)
}

/// When to refresh a session's token whose `exp` is `exp`: `before` ahead of it, and
/// not within a second (a token shorter-lived than `before` is refreshed at once).
pub(super) fn refresh_at(exp: u64, before: Duration, now: Instant, now_ms: u64) -> Instant {
    let left = Duration::from_millis(exp.saturating_mul(1000).saturating_sub(now_ms));
    now + left.saturating_sub(before).max(Duration::from_secs(1))
}

#[cfg(test)]
mod tests {
    use super::*;
    use herald_shared::auth::{sign, Claims, Platform};

    fn token(exp: u64) -> String {
        let claims = Claims { tid: "t".into(), sub: "u".into(), dev: "d".into(), plat: Platform::Web, exp, iat: None };
        sign(&claims, b"0123456789abcdef")
    }

    #[test]
    fn exp_is_read_from_the_payload() {
        assert_eq!(exp_of(&token(1_900_000_000)), Some(1_900_000_000));
        assert_eq!(exp_of("garbage"), None);
        assert_eq!(exp_of("a.b.c"), None);
        assert!(usable(&token(2_000), 1_000_000));
        assert!(!usable(&token(1_004), 1_000_000), "expiring within seconds");
        assert!(!usable("", 0));
    }

    #[test]
    fn refresh_comes_before_exp_and_not_at_once() {
        let (now, now_ms) = (Instant::now(), 1_000_000_000);
        let exp = now_ms / 1000 + 3_600;
        assert_eq!(refresh_at(exp, Duration::from_secs(60), now, now_ms), now + Duration::from_secs(3_540));
        assert_eq!(refresh_at(now_ms / 1000 + 30, Duration::from_secs(60), now, now_ms), now + Duration::from_secs(1));
        assert_eq!(refresh_at(0, Duration::from_secs(60), now, now_ms), now + Duration::from_secs(1));
    }
}
