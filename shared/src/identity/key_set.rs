//! The keys a gateway trusts, and the checks of a token against them.
//!
//! In order: the header (`alg` one of the known names, exactly; `typ` the token's
//! kind), the keys trusted for the token's `tid` and kind whose `kid` is the token's
//! (a token without `kid`, or with one no key of its tenant has, is tried against the
//! tenant's keys without `kid`: the shared-key deployment), the key's pinned algorithm,
//! the signature, then `iss` and `aud` when the key's issuer names them, and the times
//! (`exp`, `nbf`, `iat`) with the set's leeway. The `tid` read before the signature is
//! only used to pick keys: a token whose `tid` was changed fails their signature.

use std::collections::HashSet;
use std::fmt;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde::Deserialize;

use crate::auth::{AuthError, SERVICE_TYP};

/// Which tenants a key signs for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Tenants {
    /// Every tenant: the shared-key deployment (`jwt_secret`, `service_secret`, or
    /// `"tenants": ["*"]` in the trust file).
    All,
    /// Only these.
    Only(HashSet<String>),
}

impl Tenants {
    pub fn allows(&self, tid: &str) -> bool {
        match self {
            Tenants::All => true,
            Tenants::Only(set) => set.contains(tid),
        }
    }
}

/// The two kinds of token, never taken for each other.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TokenKind {
    /// A device's token: the public API and WebSocket sessions.
    Device,
    /// A backend's token (`typ: herald-service`): the server API.
    Service,
}

/// One key: what it verifies, for whom, and what its tokens must name.
#[derive(Clone)]
pub struct TrustedKey {
    pub kid: Option<String>,
    /// The only algorithm this key verifies.
    pub alg: Algorithm,
    pub key: DecodingKey,
    pub tenants: Tenants,
    pub kind: TokenKind,
    /// The `iss` its tokens must carry, when set.
    pub iss: Option<String>,
    /// One of these must be in the tokens' `aud`, when not empty.
    pub aud: Vec<String>,
}

impl fmt::Debug for TrustedKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TrustedKey")
            .field("kid", &self.kid)
            .field("alg", &self.alg)
            .field("tenants", &self.tenants)
            .field("kind", &self.kind)
            .field("iss", &self.iss)
            .field("aud", &self.aud)
            .finish_non_exhaustive()
    }
}

impl TrustedKey {
    /// An HS256 secret without `kid`, for every tenant: `jwt_secret` and
    /// `service_secret`.
    pub fn shared_secret(secret: &[u8], kind: TokenKind) -> TrustedKey {
        TrustedKey {
            kid: None,
            alg: Algorithm::HS256,
            key: DecodingKey::from_secret(secret),
            tenants: Tenants::All,
            kind,
            iss: None,
            aud: Vec::new(),
        }
    }
}

/// A token's verified payload, and when it was issued.
#[derive(Debug)]
pub struct Verified {
    pub payload: serde_json::Value,
    /// `iat`, seconds since the Unix epoch, if the token has it.
    pub iat: Option<u64>,
}

/// Every key trusted, and the clock leeway of the time checks.
#[derive(Clone, Debug, Default)]
pub struct KeySet {
    keys: Vec<TrustedKey>,
    leeway_s: u64,
}

#[derive(Deserialize)]
struct Header {
    alg: String,
    kid: Option<String>,
    typ: Option<String>,
}

/// The claims every check reads before the token's own type does.
#[derive(Deserialize)]
struct Common {
    tid: Option<serde_json::Value>,
}

/// Times of a verified token.
#[derive(Deserialize)]
struct Times {
    exp: Option<serde_json::Value>,
    nbf: Option<serde_json::Value>,
    iat: Option<serde_json::Value>,
}

/// The algorithms a header may name; any other value (`none`, `hs256`, ...) is refused
/// before a key is looked at.
const ALGORITHMS: [(&str, Algorithm); 12] = [
    ("HS256", Algorithm::HS256),
    ("HS384", Algorithm::HS384),
    ("HS512", Algorithm::HS512),
    ("RS256", Algorithm::RS256),
    ("RS384", Algorithm::RS384),
    ("RS512", Algorithm::RS512),
    ("PS256", Algorithm::PS256),
    ("PS384", Algorithm::PS384),
    ("PS512", Algorithm::PS512),
    ("ES256", Algorithm::ES256),
    ("ES384", Algorithm::ES384),
    ("EdDSA", Algorithm::EdDSA),
];

impl KeySet {
    pub fn new(keys: Vec<TrustedKey>, leeway_s: u64) -> KeySet {
        KeySet { keys, leeway_s }
    }

    /// One shared HS256 secret for every tenant, no leeway (tools and tests).
    pub fn shared_secret(secret: &[u8], kind: TokenKind) -> KeySet {
        KeySet::new(vec![TrustedKey::shared_secret(secret, kind)], 0)
    }

    pub fn keys(&self) -> &[TrustedKey] {
        &self.keys
    }

    pub fn leeway_s(&self) -> u64 {
        self.leeway_s
    }

    /// Whether any key verifies tokens of `kind`.
    pub fn has(&self, kind: TokenKind) -> bool {
        self.keys.iter().any(|k| k.kind == kind)
    }

    /// Checks a token of `kind` at `now_s`; its payload is returned for the kind's own
    /// claim checks.
    pub fn verify_at(&self, token: &str, kind: TokenKind, now_s: u64) -> Result<Verified, AuthError> {
        let mut parts = token.split('.');
        let (Some(h), Some(p), Some(_), None) = (parts.next(), parts.next(), parts.next(), parts.next()) else {
            return Err(AuthError::Malformed);
        };
        let header: Header = decode_json(h).ok_or(AuthError::Malformed)?;
        let alg =
            ALGORITHMS.iter().find(|(name, _)| *name == header.alg).map(|(_, a)| *a).ok_or(AuthError::Algorithm)?;
        let is_service = header.typ.as_deref() == Some(SERVICE_TYP);
        match kind {
            TokenKind::Device if is_service => {
                return Err(AuthError::WrongKind("a service token is not a device token"));
            }
            TokenKind::Service if !is_service => {
                return Err(AuthError::WrongKind("a device token is not a service token"));
            }
            _ => {}
        }
        let common: Common = decode_json(p).ok_or(AuthError::Malformed)?;
        let Some(serde_json::Value::String(tid)) = common.tid else {
            return Err(AuthError::Claims("tid is required"));
        };
        let (candidates, kid_known) = self.candidates(&tid, kind, header.kid.as_deref());
        if candidates.is_empty() {
            return Err(AuthError::UnknownKey);
        }
        // A `kid` the tenant has no key of, which no key without `kid` verified either:
        // the key is unknown (perhaps an identity provider's new one, not fetched yet).
        let mut refusal = if kid_known { AuthError::Signature } else { AuthError::UnknownKey };
        for key in candidates {
            if key.alg != alg {
                refusal = AuthError::Algorithm;
                continue;
            }
            match jsonwebtoken::decode::<serde_json::Value>(token, &key.key, &validation(key)) {
                Ok(data) => return self.check_times(data.claims, now_s),
                Err(e) if matches!(e.kind(), jsonwebtoken::errors::ErrorKind::InvalidSignature) => {}
                Err(e) => return Err(refused(e)),
            }
        }
        Err(refusal)
    }

    /// The keys that may have signed a token of `tid` and `kind` naming `kid`: those
    /// with that `kid`, or else those without any; and whether the `kid` (if any) was
    /// one of the tenant's.
    fn candidates(&self, tid: &str, kind: TokenKind, kid: Option<&str>) -> (Vec<&TrustedKey>, bool) {
        let trusted = || self.keys.iter().filter(|k| k.kind == kind && k.tenants.allows(tid));
        let named: Vec<&TrustedKey> = match kid {
            Some(kid) => trusted().filter(|k| k.kid.as_deref() == Some(kid)).collect(),
            None => Vec::new(),
        };
        if !named.is_empty() {
            return (named, true);
        }
        (trusted().filter(|k| k.kid.is_none()).collect(), kid.is_none())
    }

    fn check_times(&self, payload: serde_json::Value, now_s: u64) -> Result<Verified, AuthError> {
        let times: Times = serde_json::from_value(payload.clone()).map_err(|_| AuthError::Claims("bad times"))?;
        let time = |v: Option<serde_json::Value>, name| match v {
            None => Ok(None),
            Some(v) => v.as_u64().map(Some).ok_or(AuthError::Claims(name)),
        };
        let exp =
            time(times.exp, "exp must be a whole number of seconds")?.ok_or(AuthError::Claims("exp is required"))?;
        // Refused at `exp` itself, as before leeway existed, then `leeway_s` later.
        if exp.saturating_add(self.leeway_s) <= now_s {
            return Err(AuthError::Expired);
        }
        let nbf = time(times.nbf, "nbf must be a whole number of seconds")?;
        if nbf.is_some_and(|nbf| nbf > now_s.saturating_add(self.leeway_s)) {
            return Err(AuthError::NotYetValid);
        }
        let iat = time(times.iat, "iat must be a whole number of seconds")?;
        if iat.is_some_and(|iat| iat > now_s.saturating_add(self.leeway_s)) {
            return Err(AuthError::NotYetValid);
        }
        Ok(Verified { payload, iat })
    }
}

/// What the library checks: the signature with the pinned algorithm, `iss` and `aud`
/// when the key names them. The times are checked by [`KeySet::check_times`], against
/// the caller's clock.
fn validation(key: &TrustedKey) -> Validation {
    let mut v = Validation::new(key.alg);
    v.validate_exp = false;
    v.validate_nbf = false;
    v.leeway = 0;
    let mut required: Vec<&str> = Vec::new();
    match &key.iss {
        Some(iss) => {
            v.set_issuer(&[iss]);
            required.push("iss");
        }
        None => v.iss = None,
    }
    if key.aud.is_empty() {
        v.validate_aud = false;
    } else {
        v.set_audience(&key.aud);
        required.push("aud");
    }
    v.set_required_spec_claims(&required);
    v
}

fn refused(e: jsonwebtoken::errors::Error) -> AuthError {
    use jsonwebtoken::errors::ErrorKind as K;
    match e.kind() {
        K::InvalidIssuer => AuthError::Issuer,
        K::InvalidAudience => AuthError::Audience,
        K::MissingRequiredClaim(c) if c == "iss" => AuthError::Issuer,
        K::MissingRequiredClaim(c) if c == "aud" => AuthError::Audience,
        K::InvalidAlgorithm | K::InvalidAlgorithmName | K::MissingAlgorithm => AuthError::Algorithm,
        K::InvalidSignature | K::InvalidEcdsaKey | K::InvalidRsaKey(_) | K::Crypto(_) => AuthError::Signature,
        _ => AuthError::Malformed,
    }
}

fn decode_json<T: serde::de::DeserializeOwned>(part: &str) -> Option<T> {
    URL_SAFE_NO_PAD.decode(part).ok().and_then(|b| serde_json::from_slice(&b).ok())
}

#[cfg(test)]
mod tests {
    use super::*;
    use jsonwebtoken::{EncodingKey, Header as JwtHeader};
    use serde_json::json;

    /// A time within the test tokens' life.
    const NOW: u64 = 1_900_000_000;

    fn hs(kid: Option<&str>, secret: &str, tenants: Tenants) -> TrustedKey {
        TrustedKey {
            kid: kid.map(Into::into),
            tenants,
            ..TrustedKey::shared_secret(secret.as_bytes(), TokenKind::Device)
        }
    }

    fn only(t: &str) -> Tenants {
        Tenants::Only([t.to_string()].into())
    }

    fn sign(kid: Option<&str>, secret: &str, claims: serde_json::Value) -> String {
        let mut h = JwtHeader::new(Algorithm::HS256);
        h.kid = kid.map(Into::into);
        jsonwebtoken::encode(&h, &claims, &EncodingKey::from_secret(secret.as_bytes())).unwrap()
    }

    fn claims(tid: &str) -> serde_json::Value {
        json!({"tid": tid, "sub": "u", "dev": "d", "plat": "web", "exp": 2_000_000_000u64, "iat": 1_000})
    }

    #[test]
    fn a_tenants_key_verifies_only_its_tenants_tokens() {
        let set = KeySet::new(vec![hs(Some("a1"), "secret-of-tenant-a", only("a"))], 0);
        let t = sign(Some("a1"), "secret-of-tenant-a", claims("a"));
        assert_eq!(set.verify_at(&t, TokenKind::Device, NOW).unwrap().iat, Some(1_000));
        // The same key, claiming another tenant: no key is trusted for it.
        let b = sign(Some("a1"), "secret-of-tenant-a", claims("b"));
        assert_eq!(set.verify_at(&b, TokenKind::Device, NOW).unwrap_err(), AuthError::UnknownKey);
        // Nor is a device key a service key.
        assert_eq!(
            set.verify_at(&t, TokenKind::Service, NOW).unwrap_err(),
            AuthError::WrongKind("a device token is not a service token")
        );
    }

    #[test]
    fn kids_pick_keys_and_keys_without_kid_take_the_rest() {
        let set = KeySet::new(
            vec![hs(Some("k1"), "first-secret-0123", Tenants::All), hs(Some("k2"), "second-secret-012", Tenants::All)],
            0,
        );
        for (kid, secret) in [("k1", "first-secret-0123"), ("k2", "second-secret-012")] {
            assert!(set.verify_at(&sign(Some(kid), secret, claims("a")), TokenKind::Device, NOW).is_ok());
        }
        let swapped = sign(Some("k1"), "second-secret-012", claims("a"));
        assert_eq!(set.verify_at(&swapped, TokenKind::Device, NOW).unwrap_err(), AuthError::Signature);
        assert_eq!(
            set.verify_at(&sign(None, "first-secret-0123", claims("a")), TokenKind::Device, NOW).unwrap_err(),
            AuthError::UnknownKey
        );
        let shared = KeySet::new(vec![hs(None, "shared-secret-0123", Tenants::All)], 0);
        // A kid nobody has, signed by another key: unknown, not merely a bad signature.
        let unknown = sign(Some("k9"), "ninth-secret-01234", claims("a"));
        assert_eq!(shared.verify_at(&unknown, TokenKind::Device, NOW).unwrap_err(), AuthError::UnknownKey);
        assert!(shared
            .verify_at(&sign(Some("any"), "shared-secret-0123", claims("a")), TokenKind::Device, NOW)
            .is_ok());
    }

    #[test]
    fn issuer_audience_and_leeway_are_checked() {
        let key = TrustedKey {
            iss: Some("https://idp".into()),
            aud: vec!["herald".into()],
            ..hs(None, "s-0123456789abcdef", Tenants::All)
        };
        let set = KeySet::new(vec![key], 30);
        let mut c = claims("a");
        c["iss"] = json!("https://idp");
        c["aud"] = json!(["other", "herald"]);
        assert!(set.verify_at(&sign(None, "s-0123456789abcdef", c.clone()), TokenKind::Device, NOW).is_ok());
        let mut wrong = c.clone();
        wrong["iss"] = json!("https://evil");
        assert_eq!(
            set.verify_at(&sign(None, "s-0123456789abcdef", wrong), TokenKind::Device, NOW).unwrap_err(),
            AuthError::Issuer
        );
        let mut no_aud = c.clone();
        no_aud.as_object_mut().unwrap().remove("aud");
        assert_eq!(
            set.verify_at(&sign(None, "s-0123456789abcdef", no_aud), TokenKind::Device, NOW).unwrap_err(),
            AuthError::Audience
        );
        let t = sign(None, "s-0123456789abcdef", c.clone());
        assert!(set.verify_at(&t, TokenKind::Device, 2_000_000_029).is_ok(), "within the leeway");
        assert_eq!(set.verify_at(&t, TokenKind::Device, 2_000_000_030).unwrap_err(), AuthError::Expired);
        let mut early = c;
        early["nbf"] = json!(1_000_100);
        let t = sign(None, "s-0123456789abcdef", early);
        assert_eq!(set.verify_at(&t, TokenKind::Device, 1_000_000).unwrap_err(), AuthError::NotYetValid);
        assert!(set.verify_at(&t, TokenKind::Device, 1_000_070).is_ok());
    }

    #[test]
    fn none_and_unpinned_algorithms_are_refused() {
        let set = KeySet::shared_secret(b"shared-secret-0123", TokenKind::Device);
        let t = sign(None, "shared-secret-0123", claims("a"));
        let payload = t.split('.').nth(1).unwrap();
        for alg in ["none", "None", "HS384", "RS256", "hs256", ""] {
            let h = URL_SAFE_NO_PAD.encode(format!(r#"{{"alg":"{alg}"}}"#));
            assert_eq!(
                set.verify_at(&format!("{h}.{payload}.x"), TokenKind::Device, NOW).unwrap_err(),
                AuthError::Algorithm,
                "{alg}"
            );
        }
    }
}
