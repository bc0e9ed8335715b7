//! `[redis]`: how Redis connections are secured (`rediss://`, `rediss-cluster://`).

use std::path::PathBuf;

use super::table::{section, BOTH};
use super::Problems;
use crate::tls::{self, ClientTls};

section! {
    /// `[redis]`: TLS settings of Redis connections; the URL (`redis_url`) turns TLS on.
    pub struct RedisConfig in "redis", read by BOTH;
    {
        /// PEM file of the CAs that sign Redis's certificate, trusted instead of the system's roots; empty, the system's roots.
        pub tls_ca_file: String = "",
        /// PEM file of a client certificate chain, for a Redis that asks for one (`tls-auth-clients yes`); with `redis.tls_key_file`.
        pub tls_cert_file: String = "",
        /// PEM file of the private key of `redis.tls_cert_file`.
        pub tls_key_file: String = "",
    }
}

fn path(v: &str) -> Option<PathBuf> {
    (!v.is_empty()).then(|| PathBuf::from(v))
}

impl RedisConfig {
    /// The client TLS settings these keys describe.
    pub fn tls(&self) -> ClientTls {
        let identity = path(&self.tls_cert_file).zip(path(&self.tls_key_file));
        ClientTls { ca_file: path(&self.tls_ca_file), identity }
    }

    /// Reads every file named, so a bad one fails the start, not the first reconnect.
    pub(super) fn validate(&self, redis_url: &str, bad: &mut Problems) {
        let named = [&self.tls_ca_file, &self.tls_cert_file, &self.tls_key_file];
        if named.iter().all(|v| v.is_empty()) {
            return;
        }
        if !crate::redis::uses_tls(redis_url) {
            let keys = "redis.tls_ca_file, redis.tls_cert_file and redis.tls_key_file";
            bad.push("redis_url", &format!("{keys} need a TLS URL: rediss:// or rediss-cluster://"));
        }
        let before = bad.0.len();
        if let Some(p) = path(&self.tls_ca_file) {
            if let Err(e) = tls::certificates(&p) {
                bad.push("redis.tls_ca_file", &e.to_string());
            }
        }
        match (path(&self.tls_cert_file), path(&self.tls_key_file)) {
            (Some(cert), Some(key)) => {
                if let Err(e) = tls::certificates(&cert) {
                    bad.push("redis.tls_cert_file", &e.to_string());
                }
                if let Err(e) = tls::private_key(&key) {
                    bad.push("redis.tls_key_file", &e.to_string());
                }
            }
            (Some(_), None) => bad.push("redis.tls_key_file", "required with redis.tls_cert_file"),
            (None, Some(_)) => bad.push("redis.tls_cert_file", "required with redis.tls_key_file"),
            (None, None) => {}
        }
        if bad.0.len() == before {
            // Every file reads; what is left is whether they fit (a key of another
            // certificate, a CA file of no CA).
            if let Err(e) = self.tls().config() {
                bad.push("redis.tls_cert_file", &e.to_string());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{env, SECRET};
    use super::super::{load, Role};

    #[test]
    fn tls_files_need_a_tls_url_and_must_be_readable() {
        let e = env(&[
            SECRET,
            ("HERALD_REDIS__TLS_CA_FILE", "/nonexistent/redis-ca.pem"),
            ("HERALD_REDIS__TLS_CERT_FILE", "/nonexistent/redis-client.pem"),
        ]);
        let err = load(Role::Worker, &[], &e).unwrap_err().to_string();
        assert!(err.contains("redis_url: redis.tls_ca_file"), "{err}");
        assert!(err.contains("redis.tls_ca_file: cannot read /nonexistent/redis-ca.pem"), "{err}");
        assert!(err.contains("redis.tls_key_file: required with redis.tls_cert_file"), "{err}");
    }

    #[test]
    fn tls_urls_are_accepted_without_files() {
        for url in ["rediss://redis.example:6380/0", "rediss-cluster://h1:6380,h2:6380"] {
            let (cfg, _) = load(Role::Gateway, &[], &env(&[SECRET, ("HERALD_REDIS_URL", url)])).unwrap();
            assert_eq!(cfg.redis.tls(), crate::tls::ClientTls::default());
        }
    }
}
