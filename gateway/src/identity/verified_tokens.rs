//! Device tokens already verified, for the HTTP API: an app or server that calls it
//! again and again with one token pays its signature check once (an HMAC or an RSA
//! verification, a base64 decode and three JSON parses: 8 % of a gateway's CPU at
//! saturation when every send came over HTTP), not on every request.
//!
//! A hit is the same token string, byte for byte, verified under the same key set:
//! each key set has a cache of its own (`Identity` keeps them together), so a new key
//! set, one without a removed key, starts with none and a token of that key is refused
//! at once. Its expiry is checked again at every hit, with the key set's
//! leeway; `nbf` and `iat` need no second check, since they held when it was verified
//! and the clock only moves on. Revocations are not cached here: they are checked at
//! every request, after this (their own cache, `revocations.rs`).
//!
//! Bounded: when full, the cache is emptied (sessions verify their token once and do
//! not use it, so a login storm does not fill it).

use std::collections::HashMap;
use std::sync::Mutex;

use herald_shared::auth::Claims;

/// Most tokens kept (each about the size of its token and claims, a few hundred bytes).
const MAX_TOKENS: usize = 4_096;

#[derive(Debug, Default)]
pub struct VerifiedTokens {
    tokens: Mutex<HashMap<String, Entry>>,
}

#[derive(Debug)]
struct Entry {
    claims: Claims,
    /// Refused from this second on (`exp` plus the leeway).
    refused_from_s: u64,
}

impl VerifiedTokens {
    /// The claims of `token` if it was verified under the current key set and has not
    /// expired at `now_s`; an expired one is forgotten.
    pub fn get(&self, token: &str, now_s: u64) -> Option<Claims> {
        let mut tokens = self.tokens.lock().expect("verified tokens");
        let entry = tokens.get(token)?;
        if entry.refused_from_s <= now_s {
            tokens.remove(token);
            return None;
        }
        Some(entry.claims.clone())
    }

    /// Remembers a token just verified, refused from `exp + leeway_s`.
    pub fn insert(&self, token: &str, claims: &Claims, leeway_s: u64) {
        let mut tokens = self.tokens.lock().expect("verified tokens");
        if tokens.len() >= MAX_TOKENS {
            tokens.clear();
        }
        let refused_from_s = claims.exp.saturating_add(leeway_s);
        tokens.insert(token.to_owned(), Entry { claims: claims.clone(), refused_from_s });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use herald_shared::auth::Platform;

    fn claims(exp: u64) -> Claims {
        Claims { tid: "t".into(), sub: "u".into(), dev: "d".into(), plat: Platform::Web, exp, iat: Some(1) }
    }

    #[test]
    fn a_token_is_found_until_its_expiry_and_leeway_pass() {
        let cache = VerifiedTokens::default();
        cache.insert("a.b.c", &claims(100), 5);
        assert_eq!(cache.get("a.b.c", 104).map(|c| c.exp), Some(100));
        assert_eq!(cache.get("a.b.c", 104).map(|c| c.sub), Some("u".to_owned()));
        assert!(cache.get("a.b.c", 105).is_none(), "refused at exp + leeway, as the key set refuses it");
        assert!(cache.get("a.b.c", 1).is_none(), "an expired token is forgotten, not kept for later");
    }

    #[test]
    fn only_the_same_token_string_hits() {
        let cache = VerifiedTokens::default();
        cache.insert("a.b.c", &claims(100), 0);
        assert!(cache.get("a.b.C", 1).is_none());
        assert!(cache.get("a.b.c ", 1).is_none());
        assert!(cache.get("a.b.c", 1).is_some());
    }

    #[test]
    fn a_full_cache_starts_again_instead_of_growing() {
        let cache = VerifiedTokens::default();
        for i in 0..MAX_TOKENS {
            cache.insert(&format!("t{i}"), &claims(100), 0);
        }
        cache.insert("last", &claims(100), 0);
        assert!(cache.get("t0", 1).is_none());
        assert!(cache.get("last", 1).is_some());
        assert_eq!(cache.tokens.lock().unwrap().len(), 1);
    }
}
