//! TLS with rustls and the ring crypto provider, for every hop: client settings for
//! Redis and the client library (whom to trust, which certificate to show), server
//! settings for the gateway's listener.
//!
//! PEM files are read once, when a process starts; a file that is missing, unreadable
//! or holds no usable PEM block is a [`TlsError`] naming it, which configuration
//! validation reports under the key that named the file.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::{ClientConfig, RootCertStore, ServerConfig};

/// Why TLS settings could not be made.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{path}: {problem}")]
    Pem { path: PathBuf, problem: String },
    #[error("{0}")]
    Rustls(#[from] rustls::Error),
}

/// ring: aws-lc-rs, rustls's default, needs cmake and a C toolchain at build time.
fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read { path: path.to_owned(), source })
}

/// Every certificate of a PEM file (at least one).
pub fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = |problem: String| TlsError::Pem { path: path.to_owned(), problem };
    let certs = CertificateDer::pem_slice_iter(&read(path)?)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| pem(format!("not a PEM certificate file: {e}")))?;
    if certs.is_empty() {
        return Err(pem("no `BEGIN CERTIFICATE` block".into()));
    }
    Ok(certs)
}

/// The first private key of a PEM file (PKCS#8, PKCS#1 or SEC1).
pub fn private_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_slice(&read(path)?)
        .map_err(|e| TlsError::Pem { path: path.to_owned(), problem: format!("no PEM private key: {e}") })
}

/// How a client checks servers and identifies itself.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClientTls {
    /// The CAs to trust instead of the system's roots (a private CA, a managed
    /// service's bundle); `None`, the system's roots.
    pub ca_file: Option<PathBuf>,
    /// A client certificate chain and its key, for servers that ask for one.
    pub identity: Option<(PathBuf, PathBuf)>,
}

impl ClientTls {
    /// Trusts the CAs of `ca_file` only, or the system's roots when it is `None`.
    pub fn trusting(ca_file: Option<PathBuf>) -> ClientTls {
        ClientTls { ca_file, identity: None }
    }

    /// rustls client settings; server names are verified against the certificates.
    pub fn config(&self) -> Result<ClientConfig, TlsError> {
        let mut roots = RootCertStore::empty();
        match &self.ca_file {
            Some(path) => {
                for cert in certificates(path)? {
                    roots.add(cert).map_err(|e| TlsError::Pem {
                        path: path.clone(),
                        problem: format!("not a usable CA certificate: {e}"),
                    })?;
                }
            }
            // Unreadable system certificates are skipped: the others still verify.
            None => _ = roots.add_parsable_certificates(rustls_native_certs::load_native_certs().certs),
        }
        let builder = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots);
        Ok(match &self.identity {
            Some((cert, key)) => builder.with_client_auth_cert(certificates(cert)?, private_key(key)?)?,
            None => builder.with_no_client_auth(),
        })
    }
}

/// rustls server settings for one certificate chain and its key (HTTP/1.1 only, as
/// the listener serves).
pub fn server_config(cert_file: &Path, key_file: &Path) -> Result<ServerConfig, TlsError> {
    let mut config = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(certificates(cert_file)?, private_key(key_file)?)?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str, text: &str) -> PathBuf {
        let path = std::env::temp_dir().join(format!("herald-tls-{:08x}-{name}", rand::random::<u32>()));
        std::fs::write(&path, text).unwrap();
        path
    }

    #[test]
    fn missing_and_malformed_files_are_named() {
        let missing = Path::new("/nonexistent/herald-ca.pem");
        let err = certificates(missing).unwrap_err().to_string();
        assert!(err.contains("cannot read /nonexistent/herald-ca.pem"), "{err}");

        let garbage = scratch("garbage.pem", "hello, not a certificate\n");
        let err = certificates(&garbage).unwrap_err().to_string();
        assert!(err.contains("no `BEGIN CERTIFICATE` block") && err.contains(&*garbage.to_string_lossy()), "{err}");
        let err = private_key(&garbage).unwrap_err().to_string();
        assert!(err.contains("no PEM private key"), "{err}");

        let broken = scratch("broken.pem", "-----BEGIN CERTIFICATE-----\n!!!!\n-----END CERTIFICATE-----\n");
        assert!(certificates(&broken).is_err());
        let err = ClientTls::trusting(Some(broken.clone())).config().unwrap_err().to_string();
        assert!(err.contains(&*broken.to_string_lossy()), "{err}");
        for p in [garbage, broken] {
            let _ = std::fs::remove_file(p);
        }
    }

    #[test]
    fn the_system_roots_make_a_client_config() {
        assert!(ClientTls::default().config().is_ok());
    }
}
