//! TLS on the public listener (`gateway.tls_cert_file`, `gateway.tls_key_file`), for
//! deployments without an ingress or load balancer to terminate it: clients then reach
//! `https://` and `wss://` on `listen`. Off by default.
//!
//! The handshake runs inside the connection's task, under the same deadline as a
//! request head (`gateway.handshake_timeout_ms`): a client that opens a connection and
//! never finishes the handshake must not hold it, or its task, for longer.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use herald_shared::tls::TlsError;
use tokio::net::TcpStream;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;
use tokio_util::either::Either;

/// A connection of the public listener: plain TCP, or TLS over it.
pub type Connection = Either<TcpStream, Box<TlsStream<TcpStream>>>;

/// The listener's certificate and key, loaded once at start.
#[derive(Clone)]
pub struct ListenerTls {
    acceptor: TlsAcceptor,
}

impl std::fmt::Debug for ListenerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ListenerTls")
    }
}

impl ListenerTls {
    /// Reads a PEM certificate chain and its private key.
    pub fn from_files(cert_file: &Path, key_file: &Path) -> Result<ListenerTls, TlsError> {
        let config = herald_shared::tls::server_config(cert_file, key_file)?;
        Ok(ListenerTls { acceptor: TlsAcceptor::from(Arc::new(config)) })
    }
}

/// `stream` as the listener serves it: as is without TLS, else after a handshake that
/// must finish within `deadline`. `None` when the handshake failed or timed out (the
/// connection is dropped; a client's mistake, logged at debug).
pub async fn accept(tls: Option<&ListenerTls>, stream: TcpStream, deadline: Duration) -> Option<Connection> {
    let Some(tls) = tls else { return Some(Either::Left(stream)) };
    let peer = stream.peer_addr().ok();
    match tokio::time::timeout(deadline, tls.acceptor.accept(stream)).await {
        Ok(Ok(s)) => Some(Either::Right(Box::new(s))),
        Ok(Err(e)) => {
            tracing::debug!(error = %e, ?peer, "TLS handshake failed");
            None
        }
        Err(_) => {
            tracing::debug!(?peer, "TLS handshake not finished within the handshake timeout");
            None
        }
    }
}
