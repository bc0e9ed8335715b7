//! Client identity: device tokens (docs/protocol.md section 1).
//!
//! Tokens are checked against a key set ([`crate::identity::KeySet`]): each key pins
//! its algorithm, so `alg: none` and RS/HS confusion tokens are refused before any
//! signature check. A device token is never a service token (the server API's): those
//! say `typ: herald-service` in their header, which a device check refuses. [`sign`]
//! mints the shared-secret deployment's tokens (`jwt_secret`), for tools and tests; the
//! checks are [`crate::identity`]'s.

use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Platform {
    Ios,
    Android,
    Web,
    Desktop,
    Server,
    Probe,
}

impl Platform {
    /// Phones: smaller backlog pages and a slower backlog rate than desktops and browsers.
    pub fn is_mobile(self) -> bool {
        matches!(self, Platform::Ios | Platform::Android)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Platform::Ios => "ios",
            Platform::Android => "android",
            Platform::Web => "web",
            Platform::Desktop => "desktop",
            Platform::Server => "server",
            Platform::Probe => "probe",
        }
    }
}

/// The claims of a valid token: who is asking, from which device.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claims {
    pub tid: String,
    pub sub: String,
    pub dev: String,
    pub plat: Platform,
    /// Expiry, seconds since the Unix epoch.
    pub exp: u64,
    /// When the token was issued, seconds since the Unix epoch: a user's or device's
    /// `not_before` (revocation) refuses tokens issued before it, and those without.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iat: Option<u64>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AuthError {
    #[error("token is not a JWT")]
    Malformed,
    #[error("token algorithm is not the one its key is pinned to")]
    Algorithm,
    #[error("no key is trusted for the token's tenant and kid")]
    UnknownKey,
    #[error("token signature is invalid")]
    Signature,
    #[error("token claims are invalid: {0}")]
    Claims(&'static str),
    #[error("token has expired")]
    Expired,
    #[error("token is not valid yet (nbf or iat in the future)")]
    NotYetValid,
    #[error("token issuer (iss) is not the one trusted for its key")]
    Issuer,
    #[error("token audience (aud) does not name this service")]
    Audience,
    #[error("token was revoked: issued before its user's or device's not_before")]
    Revoked,
    #[error("{0}")]
    WrongKind(&'static str),
}

/// The header `typ` of service tokens: device checks refuse it, service checks require it.
pub const SERVICE_TYP: &str = "herald-service";

pub fn is_valid_tenant(tid: &str) -> bool {
    (1..=32).contains(&tid.len())
        && tid.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
}

/// User and device ids: 1..64 printable ASCII characters, no whitespace.
pub fn is_valid_ident(id: &str) -> bool {
    (1..=64).contains(&id.len()) && id.bytes().all(|b| b.is_ascii_graphic())
}

/// Mints an HS256 token (used by tests, the load-test and operators' tooling).
pub fn sign(claims: &Claims, secret: &[u8]) -> String {
    sign_typed("JWT", None, claims, secret)
}

/// An HS256 JWT of `payload` with `typ` and `kid` in its header.
pub fn sign_typed<T: Serialize>(typ: &str, kid: Option<&str>, payload: &T, secret: &[u8]) -> String {
    let mut header = Header::new(Algorithm::HS256);
    header.typ = Some(typ.to_owned());
    header.kid = kid.map(str::to_owned);
    jsonwebtoken::encode(&header, payload, &EncodingKey::from_secret(secret)).expect("HS256 signs any payload")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::verify_at;
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    use base64::Engine;
    use hmac::{Hmac, Mac};
    use sha2::Sha256;

    fn claims() -> Claims {
        Claims {
            tid: "acme".into(),
            sub: "alice".into(),
            dev: "phone-1".into(),
            plat: Platform::Ios,
            exp: 2_000_000_000,
            iat: None,
        }
    }

    fn mac(secret: &[u8]) -> Hmac<Sha256> {
        Hmac::<Sha256>::new_from_slice(secret).unwrap()
    }

    #[test]
    fn a_signed_token_verifies() {
        let t = sign(&claims(), b"secret");
        assert_eq!(verify_at(&t, b"secret", 1_900_000_000).unwrap(), claims());
    }

    #[test]
    fn wrong_secret_expired_and_bad_claims_are_refused() {
        let t = sign(&claims(), b"secret");
        assert_eq!(verify_at(&t, b"other", 1_900_000_000), Err(AuthError::Signature));
        assert_eq!(verify_at(&t, b"secret", 2_000_000_000), Err(AuthError::Expired));
        let bad = Claims { tid: "ACME".into(), ..claims() };
        assert!(matches!(verify_at(&sign(&bad, b"s"), b"s", 0), Err(AuthError::Claims(_))));
        let bad = Claims { sub: "al ice".into(), ..claims() };
        assert!(matches!(verify_at(&sign(&bad, b"s"), b"s", 0), Err(AuthError::Claims(_))));
        assert_eq!(verify_at("abc", b"s", 0), Err(AuthError::Malformed));
    }

    #[test]
    fn alg_none_and_tampered_payloads_are_refused() {
        let t = sign(&claims(), b"secret");
        let parts: Vec<&str> = t.split('.').collect();
        let none = format!("{}.{}.", URL_SAFE_NO_PAD.encode(br#"{"alg":"none"}"#), parts[1]);
        assert_eq!(verify_at(&none, b"secret", 0), Err(AuthError::Algorithm));
        let other = Claims { sub: "mallory".into(), ..claims() };
        let forged =
            format!("{}.{}.{}", parts[0], URL_SAFE_NO_PAD.encode(serde_json::to_vec(&other).unwrap()), parts[2]);
        assert_eq!(verify_at(&forged, b"secret", 0), Err(AuthError::Signature));
    }

    /// Alg confusion: a token labelled RS256 (or any other algorithm, or HS256 spelled
    /// otherwise) is refused before its signature is looked at, even when the signature
    /// is a valid HMAC of the secret.
    #[test]
    fn only_the_hs256_label_is_accepted() {
        let t = sign(&claims(), b"secret");
        let payload = t.split('.').nth(1).unwrap();
        for alg in ["RS256", "ES256", "HS384", "HS512", "hs256", "HS256 ", "", "None", "NONE"] {
            let header = URL_SAFE_NO_PAD.encode(format!(r#"{{"alg":"{alg}","typ":"JWT"}}"#));
            let input = format!("{header}.{payload}");
            let mut m = mac(b"secret");
            m.update(input.as_bytes());
            let token = format!("{input}.{}", URL_SAFE_NO_PAD.encode(m.finalize().into_bytes()));
            assert_eq!(verify_at(&token, b"secret", 0), Err(AuthError::Algorithm), "alg {alg:?}");
        }
        // No alg at all is malformed.
        let header = URL_SAFE_NO_PAD.encode(br#"{"typ":"JWT"}"#);
        assert_eq!(verify_at(&format!("{header}.{payload}.x"), b"secret", 0), Err(AuthError::Malformed));
    }
}
