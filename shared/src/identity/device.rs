//! The claims of a verified device token, their formats checked; and the check of a
//! token against one shared secret (the shared-key deployment: tools and tests).

use crate::auth::{is_valid_ident, is_valid_tenant, AuthError, Claims};
use crate::ids::now_ms;

use super::{KeySet, TokenKind, Verified};

/// Checks a token against one shared secret (the shared-key deployment).
pub fn verify(token: &str, secret: &[u8]) -> Result<Claims, AuthError> {
    verify_at(token, secret, now_ms() / 1000)
}

pub fn verify_at(token: &str, secret: &[u8], now_s: u64) -> Result<Claims, AuthError> {
    device_claims(KeySet::shared_secret(secret, TokenKind::Device).verify_at(token, TokenKind::Device, now_s)?)
}

/// The device claims of a verified token, their formats checked.
pub fn device_claims(verified: Verified) -> Result<Claims, AuthError> {
    let mut claims: Claims = serde_json::from_value(verified.payload)
        .map_err(|_| AuthError::Claims("tid, sub, dev, plat and exp are required"))?;
    claims.iat = verified.iat;
    if !is_valid_tenant(&claims.tid) {
        return Err(AuthError::Claims("tid must match [a-z0-9_-]{1,32}"));
    }
    if !is_valid_ident(&claims.sub) {
        return Err(AuthError::Claims("sub must be 1..64 printable ASCII characters"));
    }
    if !is_valid_ident(&claims.dev) {
        return Err(AuthError::Claims("dev must be 1..64 printable ASCII characters"));
    }
    Ok(claims)
}
