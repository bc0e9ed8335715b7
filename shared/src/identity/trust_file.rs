//! The trust file (`auth.trust_file`): which keys sign whose tokens. JSON:
//!
//! ```json
//! {"issuers": [
//!   {"tenants": ["acme"], "iss": "https://acme.example/oauth2", "aud": ["herald"],
//!    "jwks_url": "https://acme.example/oauth2/v1/keys"},
//!   {"tenants": ["globex"], "jwks_file": "globex.jwks.json"},
//!   {"tenants": ["globex"], "tokens": "service", "jwks": {"keys": [{"kty": "oct", "kid": "s1", "k": "..."}]}}
//! ]}
//! ```
//!
//! Each issuer names its tenants (`["*"]`: every tenant), the kind of token it signs
//! (`device`, the default, or `service`), optionally the `iss` and `aud` its tokens
//! must carry, and exactly one source of keys: a JWKS inline (`jwks`), in a file
//! (`jwks_file`, relative to the trust file) or at a URL (`jwks_url`, fetched by the
//! gateway). Unknown fields are refused, so a misspelt field is not silently ignored.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::jwk::{keys_of_jwks, JwkError};
use super::key_set::{Tenants, TokenKind, TrustedKey};
use crate::auth::is_valid_tenant;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Document {
    issuers: Vec<IssuerEntry>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct IssuerEntry {
    tenants: Vec<String>,
    #[serde(default = "device")]
    tokens: TokenKind,
    iss: Option<String>,
    #[serde(default)]
    aud: Vec<String>,
    jwks: Option<serde_json::Value>,
    jwks_file: Option<PathBuf>,
    jwks_url: Option<String>,
}

fn device() -> TokenKind {
    TokenKind::Device
}

/// Where an issuer's keys come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeySource {
    /// Inline, or a file read with the trust file.
    Local(Vec<u8>),
    /// Fetched over HTTPS by the gateway, refreshed in the background.
    Url(String),
}

/// One issuer of the trust file, its keys not parsed yet (a URL's are fetched).
#[derive(Clone, Debug)]
pub struct Issuer {
    pub tenants: Tenants,
    pub kind: TokenKind,
    pub iss: Option<String>,
    pub aud: Vec<String>,
    pub source: KeySource,
}

impl Issuer {
    /// The keys of a JWKS document of this issuer.
    pub fn keys(&self, jwks: &[u8]) -> Result<Vec<TrustedKey>, JwkError> {
        keys_of_jwks(jwks, &self.tenants, self.kind, self.iss.as_deref(), &self.aud)
    }
}

/// The trust file read, with the JWKS files it names.
#[derive(Clone, Debug)]
pub struct TrustFile {
    pub issuers: Vec<Issuer>,
}

#[derive(Debug, thiserror::Error)]
pub enum TrustFileError {
    #[error("cannot read {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{path}: {why}")]
    Invalid { path: PathBuf, why: String },
}

/// Largest trust or JWKS file read: a few keys take a few KiB.
const MAX_FILE_BYTES: u64 = 1 << 20;

impl TrustFile {
    /// Reads the trust file and the JWKS files it names, and checks every local key
    /// (a URL's keys are checked when fetched).
    pub fn read(path: &Path) -> Result<TrustFile, TrustFileError> {
        let text = read_bounded(path)?;
        let invalid = |why: String| TrustFileError::Invalid { path: path.to_owned(), why };
        let doc: Document = serde_json::from_slice(&text).map_err(|e| invalid(e.to_string()))?;
        let dir = path.parent().unwrap_or(Path::new("."));
        let mut issuers = Vec::with_capacity(doc.issuers.len());
        for (i, e) in doc.issuers.into_iter().enumerate() {
            let at = |why: String| invalid(format!("issuers[{i}]: {why}"));
            let tenants = tenants(&e.tenants).map_err(at)?;
            let source = match (e.jwks, e.jwks_file, e.jwks_url) {
                (Some(inline), None, None) => KeySource::Local(inline.to_string().into_bytes()),
                (None, Some(file), None) => KeySource::Local(read_bounded(&dir.join(file))?),
                (None, None, Some(url)) if url.starts_with("https://") || url.starts_with("http://") => {
                    KeySource::Url(url)
                }
                (None, None, Some(_)) => return Err(at("jwks_url must be an http(s) URL".into())),
                _ => return Err(at("exactly one of jwks, jwks_file and jwks_url is required".into())),
            };
            if e.iss.as_deref() == Some("") || e.aud.iter().any(String::is_empty) {
                return Err(at("iss and aud may not be empty strings".into()));
            }
            let issuer = Issuer { tenants, kind: e.tokens, iss: e.iss, aud: e.aud, source };
            if let KeySource::Local(jwks) = &issuer.source {
                issuer.keys(jwks).map_err(|e| at(e.to_string()))?;
            }
            issuers.push(issuer);
        }
        Ok(TrustFile { issuers })
    }
}

fn tenants(list: &[String]) -> Result<Tenants, String> {
    if list.iter().any(|t| t == "*") {
        return if list.len() == 1 { Ok(Tenants::All) } else { Err("\"*\" stands alone in tenants".into()) };
    }
    if list.is_empty() {
        return Err("tenants is empty".into());
    }
    if let Some(bad) = list.iter().find(|t| !is_valid_tenant(t)) {
        return Err(format!("tenant {bad:?} does not match [a-z0-9_-]{{1,32}}"));
    }
    Ok(Tenants::Only(list.iter().cloned().collect::<HashSet<_>>()))
}

fn read_bounded(path: &Path) -> Result<Vec<u8>, TrustFileError> {
    let read = |source| TrustFileError::Read { path: path.to_owned(), source };
    let len = std::fs::metadata(path).map_err(read)?.len();
    if len > MAX_FILE_BYTES {
        return Err(TrustFileError::Invalid { path: path.to_owned(), why: "larger than 1 MiB".into() });
    }
    std::fs::read(path).map_err(read)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("herald-trust-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn issuers_read_with_their_files_and_urls() {
        let d = dir("ok");
        write(&d, "b.jwks.json", r#"{"keys":[{"kty":"oct","kid":"b1","k":"MDEyMzQ1Njc4OWFiY2RlZg"}]}"#);
        let path = write(
            &d,
            "trust.json",
            r#"{"issuers":[
                {"tenants":["a"],"iss":"https://idp","aud":["herald"],"jwks_url":"https://idp/keys"},
                {"tenants":["b"],"tokens":"service","jwks_file":"b.jwks.json"},
                {"tenants":["*"],"jwks":{"keys":[]}}
            ]}"#,
        );
        let t = TrustFile::read(&path).unwrap();
        assert_eq!(t.issuers.len(), 3);
        assert_eq!(t.issuers[0].source, KeySource::Url("https://idp/keys".into()));
        assert_eq!(t.issuers[1].kind, TokenKind::Service);
        assert_eq!(t.issuers[2].tenants, Tenants::All);
    }

    #[test]
    fn mistakes_are_refused_naming_the_issuer() {
        let d = dir("bad");
        for (text, needle) in [
            (r#"{"issuers":[{"tenants":["a"]}]}"#, "exactly one of"),
            (r#"{"issuers":[{"tenants":["A"],"jwks":{"keys":[]}}]}"#, "does not match"),
            (r#"{"issuers":[{"tenants":["*","a"],"jwks":{"keys":[]}}]}"#, "stands alone"),
            (r#"{"issuers":[{"tenants":["a"],"jwks_url":"ftp://x"}]}"#, "http(s)"),
            (r#"{"issuers":[{"tenants":["a"],"jwks":{"keys":[]},"audience":"x"}]}"#, "unknown field"),
            (r#"{"issuers":[{"tenants":["a"],"jwks":{"keys":[{"kty":"oct","k":"c2hvcnQ"}]}}]}"#, "at least 16 bytes"),
        ] {
            let err = TrustFile::read(&write(&d, "t.json", text)).unwrap_err().to_string();
            assert!(err.contains(needle), "{text}: {err}");
        }
        assert!(matches!(TrustFile::read(&d.join("missing.json")), Err(TrustFileError::Read { .. })));
    }
}
