//! Herald's Rust client library, used by the load-test and the end-to-end tests, and
//! the reference for clients in other languages (docs/protocol.md).
//!
//! # Layout
//! - [`tls`]: whom to trust for `https://` and `wss://` gateways.
//! - [`http`]: the HTTP API of one device.
//! - [`ws`]: one WebSocket session with typed frames.
//! - [`device`]: a device as an app runs it: reconnects, acks, drops repeats, shows
//!   each conversation in `seq` order, fills gaps with `sync`.

pub mod device;
pub mod http;
pub mod tls;
pub mod ws;

use herald_shared::auth::{sign, Claims, Platform};
use herald_shared::ids::now_ms;

pub use http::{ClientError, HttpClient};
pub use tls::Tls;
pub use ws::{WsClient, WsEvent};

/// Mints a token for a device, valid for a day.
pub fn token(secret: &str, tenant: &str, user: &str, device: &str, plat: Platform) -> String {
    let claims = Claims {
        tid: tenant.into(),
        sub: user.into(),
        dev: device.into(),
        plat,
        exp: now_ms() / 1000 + 86_400,
        iat: Some(now_ms() / 1000),
    };
    sign(&claims, secret.as_bytes())
}
