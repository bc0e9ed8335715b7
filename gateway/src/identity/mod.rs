//! Who is calling: a token checked against the node's key set (reloaded in the
//! background, [`KeyRefresher`]) and against the revocations of its user and device
//! ([`Revocations`]). Every path that takes a token goes through [`Identity`]: the
//! HTTP extractors, the WebSocket upgrade and `auth` frame, and `refresh`.
//!
//! # Layout
//! - this module: [`Identity`], the current key set and the two checks.
//! - `key_refresher`: builds the key set from `jwt_secret`, `service_secret` and the
//!   trust file with its JWKS files and URLs; reloads it, keeping the last good keys.
//! - `revocations`: per-user and per-device `not_before`, kept in Redis and announced
//!   to every gateway.
//! - `verified_tokens`: the HTTP API's tokens already verified under a key set.

mod key_refresher;
mod revocations;
mod verified_tokens;

use std::sync::{Arc, RwLock};

use herald_shared::auth::{AuthError, Claims};
use herald_shared::identity::{device_claims, KeySet, TokenKind, Verified};
use herald_shared::ids::now_ms;
use herald_shared::service_token::{service_claims, ServiceClaims};

pub use key_refresher::KeyRefresher;
pub use revocations::{RevocationError, Revocations};
use verified_tokens::VerifiedTokens;

/// A key set, and the device tokens verified under it (for the HTTP API).
#[derive(Debug)]
struct Keys {
    set: Arc<KeySet>,
    verified: VerifiedTokens,
}

impl Keys {
    fn new(set: KeySet) -> Arc<Keys> {
        Arc::new(Keys { set: Arc::new(set), verified: VerifiedTokens::default() })
    }
}

#[derive(Debug)]
pub struct Identity {
    keys: RwLock<Arc<Keys>>,
    pub revocations: Revocations,
    /// Told when a token names a key nobody knows: an identity provider may have
    /// rotated its keys, and the refresher reads them again early.
    pub(crate) unknown_key: tokio::sync::Notify,
}

impl Identity {
    pub fn new(keys: KeySet, revocations: Revocations) -> Identity {
        Identity { keys: RwLock::new(Keys::new(keys)), revocations, unknown_key: tokio::sync::Notify::new() }
    }

    fn current(&self) -> Arc<Keys> {
        self.keys.read().expect("key set").clone()
    }

    fn verify(&self, token: &str, kind: TokenKind) -> Result<Verified, AuthError> {
        self.verify_with(&self.current().set, token, kind)
    }

    fn verify_with(&self, keys: &KeySet, token: &str, kind: TokenKind) -> Result<Verified, AuthError> {
        let verified = keys.verify_at(token, kind, now_ms() / 1000);
        if verified.as_ref().is_err_and(|e| *e == AuthError::UnknownKey) {
            self.unknown_key.notify_one();
        }
        verified
    }

    /// The key set tokens are checked against now.
    pub fn keys(&self) -> Arc<KeySet> {
        self.current().set.clone()
    }

    /// Replaces the key set: tokens are checked against the new one from now on;
    /// sessions already open stay (their tokens were valid when they opened). Tokens
    /// verified under the old set are verified again.
    pub fn replace(&self, keys: KeySet) {
        *self.keys.write().expect("key set") = Keys::new(keys);
    }

    /// A device token's claims, if a trusted key signed it for its tenant and its user
    /// or device has not revoked it. Revocations that cannot be read (Redis) refuse the
    /// token for now ([`DeviceRefusal::Unavailable`]): never let a revoked one in.
    pub async fn device(&self, token: &str) -> Result<Claims, DeviceRefusal> {
        let claims = device_claims(self.verify(token, TokenKind::Device)?)?;
        self.not_revoked(claims).await
    }

    /// [`Identity::device`] for an HTTP request: a token verified before under the
    /// current key set and not expired is not verified again (`verified_tokens.rs`);
    /// its revocations are checked all the same.
    pub async fn device_of_request(&self, token: &str) -> Result<Claims, DeviceRefusal> {
        let keys = self.current();
        let now_s = now_ms() / 1000;
        let claims = match keys.verified.get(token, now_s) {
            Some(claims) => claims,
            None => {
                let claims = device_claims(self.verify_with(&keys.set, token, TokenKind::Device)?)?;
                keys.verified.insert(token, &claims, keys.set.leeway_s());
                claims
            }
        };
        self.not_revoked(claims).await
    }

    async fn not_revoked(&self, claims: Claims) -> Result<Claims, DeviceRefusal> {
        match self.revocations.not_before(&claims.tid, &claims.sub, &claims.dev).await {
            Ok(Some(nbf)) if revoked_by(&claims, nbf) => Err(AuthError::Revoked.into()),
            Ok(_) => Ok(claims),
            Err(e) => Err(DeviceRefusal::Unavailable(e)),
        }
    }

    /// A service token's claims, if a trusted key signed it for its tenant.
    pub fn service(&self, token: &str) -> Result<ServiceClaims, AuthError> {
        service_claims(self.verify(token, TokenKind::Service)?)
    }

    /// Whether any key verifies service tokens (else the server API is off).
    pub fn serves_services(&self) -> bool {
        self.keys().has(TokenKind::Service)
    }
}

/// Whether a `not_before` revokes the token of `claims`: issued before it, or not
/// saying when (no `iat`). A token issued in the revocation's second stays valid.
pub fn revoked_by(claims: &Claims, not_before: u64) -> bool {
    claims.iat.is_none_or(|iat| iat < not_before)
}

/// Why a device token was not taken.
#[derive(Debug, thiserror::Error)]
pub enum DeviceRefusal {
    /// The token is refused: 401, or close 4001.
    #[error(transparent)]
    Token(#[from] AuthError),
    /// Its revocations could not be read: retry.
    #[error(transparent)]
    Unavailable(RevocationError),
}

#[cfg(test)]
mod tests {
    use super::*;
    use herald_shared::auth::Platform;

    #[test]
    fn a_revocation_ends_only_sessions_of_older_tokens_or_tokens_without_iat() {
        let c =
            Claims { tid: "t".into(), sub: "u".into(), dev: "d".into(), plat: Platform::Web, exp: 1, iat: Some(100) };
        assert!(revoked_by(&c, 101));
        assert!(!revoked_by(&c, 100), "a token of the revocation's second stays");
        assert!(!revoked_by(&c, 99));
        assert!(revoked_by(&Claims { iat: None, ..c }, 1));
    }
}
