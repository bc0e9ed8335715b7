//! The node's key set: `jwt_secret` and `service_secret` (every tenant's, when set)
//! and the trust file's issuers, with their JWKS files and URLs. Read before the
//! gateway serves, then again every `auth.jwks_refresh_s`, so keys rotate without a
//! restart. A read that fails keeps the last good keys of what failed (the trust file,
//! or one URL), counted in `herald_auth_key_refreshes_total{outcome="failed"}`.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use herald_shared::config::Config;
use herald_shared::identity::{Issuer, KeySet, KeySource, TokenKind, TrustFile, TrustedKey};
use tokio_util::sync::CancellationToken;

use super::Identity;

/// How long one JWKS URL may take to answer.
const FETCH_TIMEOUT: Duration = Duration::from_secs(5);
/// Largest JWKS document taken from a URL.
const MAX_JWKS_BYTES: usize = 256 * 1024;
/// How soon a URL whose keys were never fetched is tried again.
const RETRY_MISSING: Duration = Duration::from_secs(5);
/// Tokens naming unknown keys read the keys again early, at most this often (anyone
/// can send such tokens).
const EARLY_AT_MOST_EVERY: Duration = Duration::from_secs(30);

#[derive(Clone, Debug)]
pub struct KeyRefresher {
    identity: Arc<Identity>,
    shared: Vec<TrustedKey>,
    trust_file: Option<PathBuf>,
    leeway_s: u64,
    every: Duration,
    http: reqwest::Client,
    /// The last good trust file, and the last good keys of each URL.
    last: Arc<tokio::sync::Mutex<Last>>,
}

#[derive(Debug, Default)]
struct Last {
    trust: Option<TrustFile>,
    urls: HashMap<String, Vec<TrustedKey>>,
}

impl KeyRefresher {
    /// The shared secrets of the configuration, as keys for every tenant.
    pub fn new(cfg: &Config, identity: Arc<Identity>) -> KeyRefresher {
        let mut shared = Vec::new();
        if !cfg.jwt_secret.0.is_empty() {
            shared.push(TrustedKey::shared_secret(cfg.jwt_secret.0.as_bytes(), TokenKind::Device));
        }
        if !cfg.service_secret.0.is_empty() {
            shared.push(TrustedKey::shared_secret(cfg.service_secret.0.as_bytes(), TokenKind::Service));
        }
        let http = reqwest::Client::builder()
            .timeout(FETCH_TIMEOUT)
            .redirect(reqwest::redirect::Policy::limited(3))
            .build()
            .expect("the HTTP client of JWKS URLs builds");
        KeyRefresher {
            identity,
            shared,
            trust_file: cfg.auth.trust_file(),
            leeway_s: cfg.auth.leeway_s,
            every: Duration::from_secs(cfg.auth.jwks_refresh_s),
            http,
            last: Arc::default(),
        }
    }

    /// Reads everything once and installs the key set. True when every source read.
    pub async fn refresh(&self) -> bool {
        let mut last = self.last.lock().await;
        let mut complete = true;
        if let Some(path) = &self.trust_file {
            match TrustFile::read(path) {
                Ok(t) => last.trust = Some(t),
                Err(e) => {
                    complete = false;
                    tracing::warn!(error = %e, "trust file not read; the last good one stays");
                }
            }
        }
        let mut keys = self.shared.clone();
        let issuers: Vec<Issuer> = last.trust.as_ref().map(|t| t.issuers.clone()).unwrap_or_default();
        for issuer in &issuers {
            match &issuer.source {
                // Checked when the file was read.
                KeySource::Local(jwks) => keys.extend(issuer.keys(jwks).unwrap_or_default()),
                KeySource::Url(url) => match self.fetch(issuer, url).await {
                    Ok(fetched) => {
                        keys.extend(fetched.iter().cloned());
                        last.urls.insert(url.clone(), fetched);
                    }
                    Err(e) => {
                        complete = false;
                        tracing::warn!(url = %url, error = %e, "JWKS not fetched; its last good keys stay");
                        keys.extend(last.urls.get(url).into_iter().flatten().cloned());
                    }
                },
            }
        }
        metrics::gauge!("herald_auth_keys").set(keys.len() as f64);
        let outcome = if complete { "ok" } else { "failed" };
        metrics::counter!("herald_auth_key_refreshes_total", "outcome" => outcome).increment(1);
        self.identity.replace(KeySet::new(keys, self.leeway_s));
        complete
    }

    async fn fetch(&self, issuer: &Issuer, url: &str) -> Result<Vec<TrustedKey>, String> {
        let mut resp = self.http.get(url).send().await.map_err(|e| e.to_string())?;
        if !resp.status().is_success() {
            return Err(format!("answered {}", resp.status()));
        }
        let mut body = Vec::new();
        while let Some(chunk) = resp.chunk().await.map_err(|e| e.to_string())? {
            if body.len() + chunk.len() > MAX_JWKS_BYTES {
                return Err(format!("larger than {MAX_JWKS_BYTES} bytes"));
            }
            body.extend_from_slice(&chunk);
        }
        issuer.keys(&body).map_err(|e| e.to_string())
    }

    /// Reads the keys again every `auth.jwks_refresh_s` (sooner while a source has
    /// never been read), until `cancel`.
    pub async fn run(self, cancel: CancellationToken) {
        if self.trust_file.is_none() {
            // Only the shared secrets: nothing to read again.
            return cancel.cancelled().await;
        }
        let mut complete = true;
        let mut last = tokio::time::Instant::now();
        let mut last_early: Option<tokio::time::Instant> = None;
        loop {
            let wait = if complete { self.every } else { self.every.min(RETRY_MISSING) };
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep_until(last + wait) => {}
                _ = self.identity.unknown_key.notified() => {
                    if last_early.is_some_and(|at| at.elapsed() < EARLY_AT_MOST_EVERY) {
                        continue;
                    }
                    last_early = Some(tokio::time::Instant::now());
                    tracing::info!("a token named an unknown key; reading the keys again");
                }
            }
            complete = self.refresh().await;
            last = tokio::time::Instant::now();
        }
    }
}
