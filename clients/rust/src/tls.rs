//! Whom the client trusts for `https://` and `wss://` gateways: the system's roots, or
//! only the CAs of one PEM file (a private CA, a test's). One [`Tls`] serves both the
//! HTTP API ([`Tls::http`]) and WebSocket sessions ([`crate::WsClient::connect_with`]).

use std::path::Path;
use std::sync::{Arc, OnceLock};

use herald_shared::tls::{ClientTls, TlsError};

/// rustls client settings, cheap to clone.
#[derive(Clone)]
pub struct Tls(Arc<rustls::ClientConfig>);

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Tls")
    }
}

impl Tls {
    /// The system's roots, read once per process (a load-test opens thousands of
    /// sessions).
    pub fn system() -> Tls {
        static SYSTEM: OnceLock<Tls> = OnceLock::new();
        SYSTEM
            .get_or_init(|| {
                let config = ClientTls::default().config().expect("ring supports the default TLS versions");
                Tls(Arc::new(config))
            })
            .clone()
    }

    /// Trusts the CAs of `ca_file` only; `None`, the system's roots.
    pub fn trusting(ca_file: Option<&Path>) -> Result<Tls, TlsError> {
        match ca_file {
            None => Ok(Tls::system()),
            Some(path) => Ok(Tls(Arc::new(ClientTls::trusting(Some(path.to_owned())).config()?))),
        }
    }

    /// A `reqwest` client builder that trusts what this does.
    pub fn http(&self) -> reqwest::ClientBuilder {
        reqwest::Client::builder().use_preconfigured_tls((*self.0).clone())
    }

    pub(crate) fn connector(&self) -> tokio_tungstenite::Connector {
        tokio_tungstenite::Connector::Rustls(self.0.clone())
    }
}
