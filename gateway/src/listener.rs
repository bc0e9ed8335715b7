//! The public listener: HTTP/1.1 with a deadline on every request head (slowloris
//! protection, `gateway.handshake_timeout_ms`), the socket peer's address for per-IP
//! limits, upgrades for WebSockets, optional TLS ([`crate::tls`], its handshake under
//! the same deadline), and a graceful stop.
//!
//! `axum::serve` sets no hyper timer, so a client that never finishes its request
//! headers would hold a connection (and a task) forever; this loop sets one.

use std::net::SocketAddr;
use std::time::Duration;

use axum::extract::ConnectInfo;
use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower_service::Service;

use crate::tls::ListenerTls;

/// Serves `app` until `cancel`, then lets requests in progress finish. Each request
/// carries `ConnectInfo<SocketAddr>` of its connection's peer.
pub async fn serve(
    listener: TcpListener,
    tls: Option<ListenerTls>,
    app: Router,
    header_timeout: Duration,
    cancel: CancellationToken,
) {
    let connections = TaskTracker::new();
    loop {
        let (stream, peer) = tokio::select! {
            _ = cancel.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        let (app, stop, tls) = (app.clone(), cancel.clone(), tls.clone());
        connections.spawn(async move {
            let Some(stream) = crate::tls::accept(tls.as_ref(), stream, header_timeout).await else { return };
            let service = hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                let mut req = req.map(axum::body::Body::new);
                req.extensions_mut().insert(ConnectInfo(peer));
                let mut app = app.clone();
                async move { app.call(req).await }
            });
            let mut builder = hyper::server::conn::http1::Builder::new();
            // The timer starts when hyper waits for a request head (a new connection or
            // an idle keep-alive one) and stops once the head is complete.
            builder.timer(TokioTimer::new()).header_read_timeout(header_timeout);
            let conn = builder.serve_connection(TokioIo::new(stream), service).with_upgrades();
            tokio::pin!(conn);
            tokio::select! {
                result = conn.as_mut() => {
                    if let Err(e) = result {
                        tracing::debug!(error = %e, peer = %peer, "connection ended");
                    }
                }
                _ = stop.cancelled() => {
                    conn.as_mut().graceful_shutdown();
                    let _ = conn.await;
                }
            }
        });
    }
    connections.close();
    connections.wait().await;
}

/// The peer address the listener recorded, if the request came through it.
pub fn peer_of(parts: &axum::http::request::Parts) -> Option<SocketAddr> {
    parts.extensions.get::<ConnectInfo<SocketAddr>>().map(|c| c.0)
}
