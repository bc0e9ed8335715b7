//! Client identity: HS256 JWTs (docs/protocol.md section 1).
//!
//! The algorithm is pinned: the header must say `HS256`, so `alg: none` and
//! RS/HS confusion tokens are refused before any signature check. A device token is
//! never a service token (the server API's): those say `typ: herald-service`
//! in their header, which a device check refuses.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;

use crate::ids::now_ms;

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
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AuthError {
    #[error("token is not a JWT")]
    Malformed,
    #[error("token algorithm must be HS256")]
    Algorithm,
    #[error("token signature is invalid")]
    Signature,
    #[error("token claims are invalid: {0}")]
    Claims(&'static str),
    #[error("token has expired")]
    Expired,
    #[error("{0}")]
    WrongKind(&'static str),
}

/// The header `typ` of service tokens: device checks refuse it, service checks require it.
pub const SERVICE_TYP: &str = "herald-service";

#[derive(Deserialize)]
struct Header {
    alg: String,
    typ: Option<String>,
}

pub fn is_valid_tenant(tid: &str) -> bool {
    (1..=32).contains(&tid.len())
        && tid.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
}

/// User and device ids: 1..64 printable ASCII characters, no whitespace.
pub fn is_valid_ident(id: &str) -> bool {
    (1..=64).contains(&id.len()) && id.bytes().all(|b| b.is_ascii_graphic())
}

fn mac(secret: &[u8]) -> Hmac<Sha256> {
    // HMAC accepts keys of any length; this cannot fail.
    Hmac::<Sha256>::new_from_slice(secret).expect("hmac accepts any key length")
}

/// Mints a token (used by tests, the load-test and operators' tooling).
pub fn sign(claims: &Claims, secret: &[u8]) -> String {
    sign_typed("JWT", &serde_json::to_vec(claims).expect("claims serialize"), secret)
}

/// An HS256 JWT of `payload` with `typ` in its header.
pub(crate) fn sign_typed(typ: &str, payload: &[u8], secret: &[u8]) -> String {
    let header = serde_json::json!({"alg": "HS256", "typ": typ}).to_string();
    let header = URL_SAFE_NO_PAD.encode(header.as_bytes());
    let payload = URL_SAFE_NO_PAD.encode(payload);
    let signing_input = format!("{header}.{payload}");
    let mut m = mac(secret);
    m.update(signing_input.as_bytes());
    let sig = URL_SAFE_NO_PAD.encode(m.finalize().into_bytes());
    format!("{signing_input}.{sig}")
}

/// Checks the signature, the algorithm, expiry and the claim formats.
pub fn verify(token: &str, secret: &[u8]) -> Result<Claims, AuthError> {
    verify_at(token, secret, now_ms() / 1000)
}

pub fn verify_at(token: &str, secret: &[u8], now_s: u64) -> Result<Claims, AuthError> {
    let (typ, payload) = signed_payload(token, secret)?;
    if typ.as_deref() == Some(SERVICE_TYP) {
        return Err(AuthError::WrongKind("a service token is not a device token"));
    }
    let claims: Claims =
        serde_json::from_slice(&payload).map_err(|_| AuthError::Claims("tid, sub, dev, plat and exp are required"))?;
    if !is_valid_tenant(&claims.tid) {
        return Err(AuthError::Claims("tid must match [a-z0-9_-]{1,32}"));
    }
    if !is_valid_ident(&claims.sub) {
        return Err(AuthError::Claims("sub must be 1..64 printable ASCII characters"));
    }
    if !is_valid_ident(&claims.dev) {
        return Err(AuthError::Claims("dev must be 1..64 printable ASCII characters"));
    }
    if claims.exp <= now_s {
        return Err(AuthError::Expired);
    }
    Ok(claims)
}

/// The header's `typ` and the payload of a token whose algorithm label and signature
/// are right; its claims are not looked at yet.
pub(crate) fn signed_payload(token: &str, secret: &[u8]) -> Result<(Option<String>, Vec<u8>), AuthError> {
    let mut parts = token.split('.');
    let (Some(h), Some(p), Some(s), None) = (parts.next(), parts.next(), parts.next(), parts.next()) else {
        return Err(AuthError::Malformed);
    };
    let header: Header =
        URL_SAFE_NO_PAD.decode(h).ok().and_then(|b| serde_json::from_slice(&b).ok()).ok_or(AuthError::Malformed)?;
    if header.alg != "HS256" {
        return Err(AuthError::Algorithm);
    }
    let sig = URL_SAFE_NO_PAD.decode(s).map_err(|_| AuthError::Malformed)?;
    let mut m = mac(secret);
    m.update(&token.as_bytes()[..h.len() + 1 + p.len()]);
    m.verify_slice(&sig).map_err(|_| AuthError::Signature)?;
    let payload = URL_SAFE_NO_PAD.decode(p).map_err(|_| AuthError::Malformed)?;
    Ok((header.typ, payload))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claims() -> Claims {
        Claims {
            tid: "acme".into(),
            sub: "alice".into(),
            dev: "phone-1".into(),
            plat: Platform::Ios,
            exp: 2_000_000_000,
        }
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
