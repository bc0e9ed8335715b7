//! `[auth]`: whose keys sign which tenants' tokens, and how tokens are revoked
//! (docs/operations.md, "Identity").

use super::table::{section, GATEWAY};
use super::Problems;

section! {
    /// `[auth]`: key sets beyond `jwt_secret` and `service_secret`, and revocation.
    pub struct AuthConfig in "auth", read by GATEWAY;
    {
        /// JSON file of the issuers each tenant trusts (docs/operations.md): per-tenant HS256 keys, JWKS files and URLs, `iss`, `aud`; with or instead of `jwt_secret`.
        pub trust_file: String = "",
        /// Clock leeway of token times (`exp`, `nbf`, `iat`), seconds.
        pub leeway_s: u64 = "5",
        /// How often the trust file, its JWKS files and URLs are read again, seconds; a failed read keeps the last good keys.
        pub jwks_refresh_s: u64 = "300",
        /// The longest lifetime of tokens issued, seconds: how long a user's or device's `not_before` (revocation) is kept.
        pub max_token_lifetime_s: u64 = "86400",
    }
}

impl AuthConfig {
    /// The trust file's path, if one is set.
    pub fn trust_file(&self) -> Option<std::path::PathBuf> {
        (!self.trust_file.is_empty()).then(|| self.trust_file.clone().into())
    }

    pub(super) fn validate(&self, bad: &mut Problems) {
        if self.leeway_s > 300 {
            bad.push("auth.leeway_s", "must be at most 300 (a leeway is for clock skew, not for expiry)");
        }
        if !(1..=86_400).contains(&self.jwks_refresh_s) {
            bad.push("auth.jwks_refresh_s", "must be 1..=86400");
        }
        if !(60..=31_536_000).contains(&self.max_token_lifetime_s) {
            bad.push("auth.max_token_lifetime_s", "must be 60..=31536000");
        }
        if let Some(path) = self.trust_file() {
            if let Err(e) = crate::identity::TrustFile::read(&path) {
                bad.push("auth.trust_file", &e.to_string());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{env, SECRET};
    use super::super::{load, Role};

    #[test]
    fn a_trust_file_stands_in_for_jwt_secret_and_must_read() {
        let dir = std::env::temp_dir().join(format!("herald-auth-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let trust = dir.join("trust.json");
        std::fs::write(&trust, r#"{"issuers":[{"tenants":["acme"],"jwks":{"keys":[]}}]}"#).unwrap();
        let path = trust.to_str().unwrap();
        // The gateway needs one of them; the worker checks no tokens.
        let err = load(Role::Gateway, &[], &env(&[])).unwrap_err().to_string();
        assert!(err.contains("jwt_secret: required unless auth.trust_file is set"), "{err}");
        assert!(load(Role::Gateway, &[], &env(&[("HERALD_AUTH__TRUST_FILE", path)])).is_ok());
        assert!(load(Role::Worker, &[], &env(&[])).is_ok());
        let missing = dir.join("missing.json");
        let e =
            env(&[SECRET, ("HERALD_AUTH__TRUST_FILE", missing.to_str().unwrap()), ("HERALD_AUTH__LEEWAY_S", "900")]);
        let err = load(Role::Gateway, &[], &e).unwrap_err().to_string();
        assert!(err.contains("auth.trust_file: cannot read"), "{err}");
        assert!(err.contains("auth.leeway_s"), "{err}");
        std::fs::remove_dir_all(dir).unwrap();
    }
}
