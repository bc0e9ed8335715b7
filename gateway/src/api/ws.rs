//! `GET /v1/ws`: authentication at the upgrade, and session start.
//!
//! A bad token still gets its upgrade, closed at once with 4001, so browsers (which
//! cannot read a refused handshake's status) can tell why.

use std::time::Duration;

use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::extract::{FromRequestParts, State};
use axum::http::request::Parts;
use axum::response::Response;
use herald_shared::auth::verify;
use herald_shared::error::ErrorCode;
use herald_shared::protocol::{CloseCode, ErrorFrame, ServerFrame};
use tracing::Instrument;

use crate::api::auth::token_of;
use crate::limits::ConnectionRefused;
use crate::session::Session;
use crate::state::AppState;

/// The raw request parts, for reading the token ourselves.
pub struct RawParts(Parts);

impl<S: Send + Sync> FromRequestParts<S> for RawParts {
    type Rejection = std::convert::Infallible;
    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        Ok(RawParts(parts.clone()))
    }
}

pub async fn upgrade(State(state): State<AppState>, RawParts(parts): RawParts, ws: WebSocketUpgrade) -> Response {
    // Explicit buffer sizes: tungstenite's defaults hold 128 KiB + 128 KiB per connection.
    // Reads: the hard message cap is above twice the protocol's frame limit, so an
    // oversized frame is answered with `too_large`, not cut. Writes: the buffer takes the
    // largest frame the gateway writes (a full history page), so none is dropped for size.
    let g = &state.cfg.gateway;
    let hard_cap = ((g.max_body_bytes * 2 + 4096) * 2).max(1 << 20);
    let ws = ws
        .read_buffer_size(4 * 1024)
        .write_buffer_size(0)
        .max_write_buffer_size(g.largest_frame_bytes() * 2)
        .max_message_size(hard_cap)
        .max_frame_size(hard_cap);
    let claims = token_of(&parts)
        .ok_or("missing token".to_string())
        .and_then(|t| verify(&t, state.cfg.jwt_secret.0.as_bytes()).map_err(|e| e.to_string()));
    let tracker = state.session_tasks.clone();
    // Only a valid token is charged against the node's admission budget: clients with
    // bad tokens cannot use it up for everyone else.
    let claims = match claims {
        Ok(c) => c,
        Err(reason) => {
            return ws
                .on_upgrade(move |socket| tracker.track_future(close_now(socket, CloseCode::Unauthorized, reason)))
        }
    };
    if let Err(wait) = crate::limits::take(&state.limits.admission, 1) {
        // A login storm: refuse politely, with a jittered hint, so retries spread out.
        metrics::counter!("herald_rate_limited_total", "what" => "connect").increment(1);
        let retry = crate::limits::jittered(wait).as_millis() as u64;
        let f = ErrorFrame::new(ErrorCode::RateLimited, "too many connections; retry later").retry_after(retry);
        return refuse(ws, tracker, f, CloseCode::TryAgainLater, "retry later");
    }
    let peer = crate::listener::peer_of(&parts).map(|a| a.ip());
    let ip = crate::client_ip::client_ip(&g.trusted_proxies, peer, &parts.headers);
    let permit = match state.limits.connections.admit(ip, &claims.tid, &claims.sub, &claims.dev) {
        Ok(p) => p,
        Err(which) => {
            let (what, message) = match which {
                ConnectionRefused::User => ("connections_user", "too many connections for this user"),
                ConnectionRefused::Ip => ("connections_ip", "too many connections from this address"),
            };
            metrics::counter!("herald_rate_limited_total", "what" => what).increment(1);
            tracing::debug!(ip = ip.map(tracing::field::display), tenant = %claims.tid, user = %claims.sub, "{message}");
            // Nothing frees up by itself: a long, jittered hint.
            let retry = crate::limits::jittered(Duration::from_secs(5)).as_millis() as u64;
            let f = ErrorFrame::new(ErrorCode::RateLimited, message).retry_after(retry);
            return refuse(ws, tracker, f, CloseCode::Policy, message);
        }
    };
    if let Err(e) = state.devices.register(&claims).await {
        return ws
            .on_upgrade(move |socket| tracker.track_future(close_now(socket, CloseCode::InternalError, e.message)));
    }
    // The client's address in every line the session logs.
    let span = tracing::debug_span!("client", ip = ip.map(tracing::field::display));
    ws.on_upgrade(move |socket| {
        tracker.track_future(
            async move {
                // The slot is held for the whole session and given back when it ends.
                let _permit = permit;
                Session::run(state.sessions.clone(), claims, socket).await
            }
            .instrument(span),
        )
    })
}

/// Accepts the upgrade only to say why the session is refused, then closes it (browsers
/// cannot read a refused handshake).
fn refuse(
    ws: WebSocketUpgrade,
    tracker: tokio_util::task::TaskTracker,
    f: ErrorFrame,
    code: CloseCode,
    reason: &'static str,
) -> Response {
    ws.on_upgrade(move |mut socket| {
        tracker.track_future(async move {
            let _ = socket.send(Message::Text(ServerFrame::from(f).to_json().into())).await;
            close_now(socket, code, reason.into()).await
        })
    })
}

pub async fn close_now(mut socket: WebSocket, code: CloseCode, reason: String) {
    let frame = CloseFrame { code: code.code(), reason: reason.chars().take(120).collect::<String>().into() };
    let _ = tokio::time::timeout(Duration::from_secs(2), socket.send(Message::Close(Some(frame)))).await;
}
