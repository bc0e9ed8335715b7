//! One JSON Web Key (RFC 7517) made a [`TrustedKey`]: its algorithm is pinned, from
//! the key's `alg` or, when absent, from its type and curve, so a token naming another
//! algorithm is refused whatever its signature.

use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, Jwk, JwkSet, KeyAlgorithm, PublicKeyUse};
use jsonwebtoken::{Algorithm, DecodingKey};

use super::key_set::{Tenants, TokenKind, TrustedKey};

/// Keys read from one JWKS at most: an IdP publishes a handful; more is a mistake or
/// an attack on memory, and the set is refused (the last good one is kept).
pub const MAX_KEYS_PER_SET: usize = 64;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum JwkError {
    #[error("not a JWKS document (a JSON object with a `keys` array): {0}")]
    NotJwks(String),
    #[error("more than {MAX_KEYS_PER_SET} keys")]
    TooMany,
    #[error("key {kid:?}: {why}")]
    BadKey { kid: Option<String>, why: String },
}

/// The signing keys of a JWKS document, bound to `tenants` and `kind`. Keys marked for
/// encryption (`"use": "enc"`) are skipped; any other unusable key refuses the set, so
/// a typo does not silently leave a tenant without its key.
pub fn keys_of_jwks(
    json: &[u8],
    tenants: &Tenants,
    kind: TokenKind,
    iss: Option<&str>,
    aud: &[String],
) -> Result<Vec<TrustedKey>, JwkError> {
    let set: JwkSet = serde_json::from_slice(json).map_err(|e| JwkError::NotJwks(e.to_string()))?;
    if set.keys.len() > MAX_KEYS_PER_SET {
        return Err(JwkError::TooMany);
    }
    let mut keys = Vec::with_capacity(set.keys.len());
    for jwk in &set.keys {
        if matches!(jwk.common.public_key_use, Some(PublicKeyUse::Encryption)) {
            continue;
        }
        let kid = jwk.common.key_id.clone();
        let bad = |why: String| JwkError::BadKey { kid: kid.clone(), why };
        let alg = pinned_algorithm(jwk).map_err(|w| bad(w.into()))?;
        if let AlgorithmParameters::OctetKey(oct) = &jwk.algorithm {
            // A guessable HMAC key would let anyone mint tokens.
            let len = base64::Engine::decode(&base64::engine::general_purpose::URL_SAFE_NO_PAD, &oct.value)
                .map_err(|_| bad("`k` is not base64url".into()))?
                .len();
            if len < 16 {
                return Err(bad("an HMAC key must be at least 16 bytes".into()));
            }
        }
        let key = DecodingKey::from_jwk(jwk).map_err(|e| bad(e.to_string()))?;
        keys.push(TrustedKey {
            kid,
            alg,
            key,
            tenants: tenants.clone(),
            kind,
            iss: iss.map(str::to_owned),
            aud: aud.to_vec(),
        });
    }
    Ok(keys)
}

/// The one algorithm a key verifies: its `alg`, which must fit its type, or the type's
/// usual one (RSA: RS256, P-256: ES256, P-384: ES384, Ed25519: EdDSA, oct: HS256).
fn pinned_algorithm(jwk: &Jwk) -> Result<Algorithm, &'static str> {
    let default = match &jwk.algorithm {
        AlgorithmParameters::RSA(_) => Algorithm::RS256,
        AlgorithmParameters::EllipticCurve(ec) => match ec.curve {
            EllipticCurve::P256 => Algorithm::ES256,
            EllipticCurve::P384 => Algorithm::ES384,
            _ => return Err("unsupported elliptic curve (P-256 and P-384 are)"),
        },
        AlgorithmParameters::OctetKeyPair(okp) if okp.curve == EllipticCurve::Ed25519 => Algorithm::EdDSA,
        AlgorithmParameters::OctetKeyPair(_) => return Err("unsupported OKP curve (Ed25519 is)"),
        AlgorithmParameters::OctetKey(_) => Algorithm::HS256,
    };
    let Some(named) = jwk.common.key_algorithm else {
        return Ok(default);
    };
    let alg = match named {
        KeyAlgorithm::HS256 => Algorithm::HS256,
        KeyAlgorithm::HS384 => Algorithm::HS384,
        KeyAlgorithm::HS512 => Algorithm::HS512,
        KeyAlgorithm::ES256 => Algorithm::ES256,
        KeyAlgorithm::ES384 => Algorithm::ES384,
        KeyAlgorithm::RS256 => Algorithm::RS256,
        KeyAlgorithm::RS384 => Algorithm::RS384,
        KeyAlgorithm::RS512 => Algorithm::RS512,
        KeyAlgorithm::PS256 => Algorithm::PS256,
        KeyAlgorithm::PS384 => Algorithm::PS384,
        KeyAlgorithm::PS512 => Algorithm::PS512,
        KeyAlgorithm::EdDSA => Algorithm::EdDSA,
        _ => return Err("`alg` is not a signature algorithm"),
    };
    let fits = match &jwk.algorithm {
        AlgorithmParameters::RSA(_) => {
            matches!(alg, Algorithm::RS256 | Algorithm::RS384 | Algorithm::RS512)
                || matches!(alg, Algorithm::PS256 | Algorithm::PS384 | Algorithm::PS512)
        }
        AlgorithmParameters::EllipticCurve(_) => alg == default,
        AlgorithmParameters::OctetKeyPair(_) => alg == Algorithm::EdDSA,
        AlgorithmParameters::OctetKey(_) => matches!(alg, Algorithm::HS256 | Algorithm::HS384 | Algorithm::HS512),
    };
    if !fits {
        return Err("`alg` does not fit the key's type");
    }
    Ok(alg)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(json: &str) -> Result<Vec<TrustedKey>, JwkError> {
        keys_of_jwks(json.as_bytes(), &Tenants::All, TokenKind::Device, None, &[])
    }

    #[test]
    fn algorithms_are_pinned_from_alg_or_the_key_type() {
        let set = r#"{"keys":[
            {"kty":"oct","kid":"h","k":"MDEyMzQ1Njc4OWFiY2RlZg"},
            {"kty":"oct","kid":"h5","alg":"HS512","k":"MDEyMzQ1Njc4OWFiY2RlZg"},
            {"kty":"OKP","kid":"e","crv":"Ed25519","x":"11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"},
            {"kty":"oct","kid":"x","use":"enc","k":"MDEyMzQ1Njc4OWFiY2RlZg"}
        ]}"#;
        let k = keys(set).unwrap();
        let algs: Vec<_> = k.iter().map(|k| (k.kid.clone().unwrap(), k.alg)).collect();
        assert_eq!(
            algs,
            vec![("h".into(), Algorithm::HS256), ("h5".into(), Algorithm::HS512), ("e".into(), Algorithm::EdDSA)]
        );
    }

    #[test]
    fn unfit_short_and_malformed_keys_refuse_the_set() {
        let short = r#"{"keys":[{"kty":"oct","kid":"h","k":"c2hvcnQ"}]}"#;
        assert!(matches!(keys(short), Err(JwkError::BadKey { .. })));
        let unfit = r#"{"keys":[{"kty":"oct","kid":"h","alg":"RS256","k":"MDEyMzQ1Njc4OWFiY2RlZg"}]}"#;
        assert!(matches!(keys(unfit), Err(JwkError::BadKey { .. })));
        assert!(matches!(keys(r#"{"nokeys":1}"#), Err(JwkError::NotJwks(_))));
        let many = format!(
            r#"{{"keys":[{}]}}"#,
            vec![r#"{"kty":"oct","k":"MDEyMzQ1Njc4OWFiY2RlZg"}"#; MAX_KEYS_PER_SET + 1].join(",")
        );
        assert_eq!(keys(&many).err(), Some(JwkError::TooMany));
    }
}
