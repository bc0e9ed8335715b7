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
    // The hard message cap is generous; the session answers frames over the protocol's
    // limit with `too_large` instead of dropping the connection.
    // Above twice the protocol's frame limit, so an oversized frame is answered, not cut.
    let hard_cap = ((state.cfg.gateway.max_body_bytes * 2 + 4096) * 2).max(1 << 20);
    let ws = ws
        .read_buffer_size(4 * 1024)
        .write_buffer_size(0)
        .max_write_buffer_size(1 << 20)
        .max_message_size(hard_cap)
        .max_frame_size(hard_cap);
    let claims = token_of(&parts)
        .ok_or("missing token".to_string())
        .and_then(|t| verify(&t, state.cfg.jwt_secret.0.as_bytes()).map_err(|e| e.to_string()));
    let tracker = state.session_tasks.clone();
    if let Err(wait) = crate::limits::take(&state.limits.admission, 1) {
        // A login storm: refuse politely, with a jittered hint, so retries spread out.
        metrics::counter!("herald_rate_limited_total", "what" => "connect").increment(1);
        let retry = crate::limits::jittered(wait).as_millis() as u64;
        return ws.on_upgrade(move |mut socket| {
            tracker.track_future(async move {
                let f = ErrorFrame::new(ErrorCode::RateLimited, "too many connections; retry later").retry_after(retry);
                let _ = socket.send(Message::Text(ServerFrame::from(f).to_json().into())).await;
                close_now(socket, CloseCode::TryAgainLater, "retry later".into()).await
            })
        });
    }
    match claims {
        Err(reason) => {
            ws.on_upgrade(move |socket| tracker.track_future(close_now(socket, CloseCode::Unauthorized, reason)))
        }
        Ok(claims) => {
            let ip = crate::listener::peer_of(&parts).map(|a| a.ip());
            let permit = match state.limits.connections.admit(ip, &claims.tid, &claims.sub, &claims.dev) {
                Ok(p) => p,
                Err(which) => {
                    let (what, message) = match which {
                        ConnectionRefused::User => ("connections_user", "too many connections for this user"),
                        ConnectionRefused::Ip => ("connections_ip", "too many connections from this address"),
                    };
                    metrics::counter!("herald_rate_limited_total", "what" => what).increment(1);
                    // Nothing frees up by itself: a long, jittered hint.
                    let retry = crate::limits::jittered(Duration::from_secs(5)).as_millis() as u64;
                    return ws.on_upgrade(move |mut socket| {
                        tracker.track_future(async move {
                            let f = ErrorFrame::new(ErrorCode::RateLimited, message).retry_after(retry);
                            let _ = socket.send(Message::Text(ServerFrame::from(f).to_json().into())).await;
                            close_now(socket, CloseCode::Policy, message.into()).await
                        })
                    });
                }
            };
            if let Err(e) = state.devices.register(&claims).await {
                return ws.on_upgrade(move |socket| {
                    tracker.track_future(close_now(socket, CloseCode::InternalError, e.message))
                });
            }
            ws.on_upgrade(move |socket| {
                tracker.track_future(async move {
                    // The slot is held for the whole session and given back when it ends.
                    let _permit = permit;
                    Session::run(state.sessions.clone(), claims, socket).await
                })
            })
        }
    }
}

pub async fn close_now(mut socket: WebSocket, code: CloseCode, reason: String) {
    let frame = CloseFrame { code: code.code(), reason: reason.chars().take(120).collect::<String>().into() };
    let _ = tokio::time::timeout(Duration::from_secs(2), socket.send(Message::Close(Some(frame)))).await;
}
