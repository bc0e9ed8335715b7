//! `GET /v1/ws`: authentication (at the upgrade, or by the first frame), admission and
//! session start.
//!
//! A bad token still gets its upgrade, closed at once with 4001, so browsers (which
//! cannot read a refused handshake's status) can tell why. A browser cannot set a
//! header on a WebSocket either, so a client may leave the token out of the upgrade and
//! send it as the first frame (`auth`), within `gateway.handshake_timeout_ms`.

use std::future::Future;
use std::net::IpAddr;
use std::time::Duration;

use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::extract::{FromRequestParts, State};
use axum::http::request::Parts;
use axum::response::Response;
use futures::FutureExt;
use herald_shared::auth::Claims;
use herald_shared::error::ErrorCode;
use herald_shared::keys::DeviceKey;
use herald_shared::protocol::{ClientFrame, CloseCode, ErrorFrame, ServerFrame, SUBPROTOCOL};
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use crate::api::auth::token_of;
use crate::identity::DeviceRefusal;
use crate::limits::{ConnectionPermit, ConnectionRefused};
use crate::session::presence::draw_epoch;
use crate::session::{Admission, Features, Session};
use crate::state::AppState;

/// The raw request parts, for reading the token ourselves.
pub struct RawParts(Parts);

impl<S: Send + Sync> FromRequestParts<S> for RawParts {
    type Rejection = std::convert::Infallible;
    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        Ok(RawParts(parts.clone()))
    }
}

/// Why a session is not started: what the client is told before the close.
struct Refusal {
    error: Option<ErrorFrame>,
    code: CloseCode,
    reason: String,
}

impl Refusal {
    fn unauthorized(reason: String) -> Refusal {
        Refusal { error: None, code: CloseCode::Unauthorized, reason }
    }

    /// A refused token: 4001. Revocations that could not be read: 1013, try again.
    fn of(e: DeviceRefusal) -> Refusal {
        match e {
            DeviceRefusal::Token(e) => Refusal::unauthorized(e.to_string()),
            DeviceRefusal::Unavailable(e) => {
                let error = ErrorFrame::new(ErrorCode::Unavailable, e.to_string());
                Refusal { error: Some(error), code: CloseCode::TryAgainLater, reason: "unavailable; retry".into() }
            }
        }
    }

    /// Accepted only to say why, then closed (browsers cannot read a refused handshake).
    async fn tell(self, mut socket: WebSocket) {
        if let Some(f) = self.error {
            let _ = socket.send(Message::Text(ServerFrame::from(f).to_json().into())).await;
        }
        close_now(socket, self.code, self.reason).await
    }
}

pub async fn upgrade(State(state): State<AppState>, RawParts(parts): RawParts, ws: WebSocketUpgrade) -> Response {
    // Explicit buffer sizes: tungstenite's defaults hold 128 KiB + 128 KiB per connection.
    // Reads: a 512-byte buffer, which every session holds for its life, idle or not (it
    // was 4 KiB, then 1 KiB: docs/benchmarks.md, idle session memory); client frames are
    // mostly acks and short sends, and a longer one is read in 512-byte steps into a
    // buffer of its size. The
    // hard message cap is above twice the protocol's frame limit, so an oversized frame
    // is answered with `too_large`, not cut. Writes: the buffer takes the
    // largest frame the gateway writes (a full history page), so none is dropped for size;
    // frames fed to it go to the socket once they pass `gateway.write_batch_bytes` (added
    // to the bound, so it still holds) or at the session's flush.
    // `herald.v1` is echoed when offered; a client offering none (or only others) still
    // gets its session, without a subprotocol, as before the version was named.
    let g = &state.cfg.gateway;
    let hard_cap = ((g.max_body_bytes * 2 + 4096) * 2).max(1 << 20);
    let ws = ws
        .protocols([SUBPROTOCOL])
        .read_buffer_size(512)
        .write_buffer_size(g.write_batch_bytes)
        .max_write_buffer_size(g.largest_frame_bytes() * 2 + g.write_batch_bytes)
        .max_message_size(hard_cap)
        .max_frame_size(hard_cap);
    let tracker = state.session_tasks.clone();
    let peer = crate::listener::peer_of(&parts).map(|a| a.ip());
    let ip = crate::client_ip::client_ip(&g.trusted_proxies, peer, &parts.headers);
    let features = Features::of_query(parts.uri.query());
    let Some(token) = token_of(&parts) else {
        // The token comes as the first frame; nothing is charged until it is valid.
        let sessions = tracker.clone();
        return ws.on_upgrade(move |socket| {
            tracker.track_future(authenticate_then_serve(state, ip, features, sessions, socket))
        });
    };
    let admitted = match state.sessions.identity.device(token).await {
        Ok(claims) => admit(&state, ip, &claims).await.map(|admitted| (claims, admitted)),
        Err(e) => Err(Refusal::of(e)),
    };
    match admitted {
        Ok((claims, admitted)) => {
            ws.on_upgrade(move |socket| in_own_task(&tracker, serve(state, ip, claims, admitted, features, socket)))
        }
        Err(refusal) => ws.on_upgrade(move |socket| tracker.track_future(refusal.tell(socket))),
    }
}

/// Runs a session in a task of its own (tracked by the node's `sessions`), and lets the
/// task that started it end at once. Awaited where it starts, the session's future
/// would sit in one task beside that future's own states: axum's upgrade (the
/// WebSocket's construction) and, for a token in the first frame, its check and the
/// admission. That was 8.2 KB per idle session authenticated by its first frame where
/// the session alone takes 2.6 KB (heaptrack; docs/benchmarks.md, "Idle session
/// memory").
fn in_own_task(sessions: &TaskTracker, session: impl Future<Output = ()> + Send + 'static) -> std::future::Ready<()> {
    sessions.spawn(session);
    std::future::ready(())
}

/// A session opened without a token: its first frame must be `auth` with a valid one;
/// once it is admitted, the session runs in a task of its own ([`in_own_task`]).
async fn authenticate_then_serve(
    state: AppState,
    ip: Option<IpAddr>,
    features: Features,
    sessions: TaskTracker,
    mut socket: WebSocket,
) {
    let deadline = Duration::from_millis(state.cfg.gateway.handshake_timeout_ms);
    let claims = match tokio::time::timeout(deadline, first_frame_token(&mut socket)).await {
        Ok(Ok(token)) => state.sessions.identity.device(&token).await.map_err(Refusal::of),
        Ok(Err(reason)) => Err(Refusal::unauthorized(reason)),
        Err(_) => Err(Refusal::unauthorized("missing token: no auth frame in time".into())),
    };
    let admitted = match claims {
        Ok(claims) => admit(&state, ip, &claims).await.map(|admitted| (claims, admitted)),
        Err(refusal) => Err(refusal),
    };
    match admitted {
        Ok((claims, admitted)) => {
            sessions.spawn(serve(state, ip, claims, admitted, features, socket));
        }
        Err(refusal) => refusal.tell(socket).await,
    }
}

/// The token of the first frame, which must be `auth`; control frames before it are
/// skipped.
async fn first_frame_token(socket: &mut WebSocket) -> Result<String, String> {
    loop {
        return match socket.recv().await {
            Some(Ok(Message::Text(t))) => match ClientFrame::parse(t.as_str()) {
                Ok(ClientFrame::Auth(f)) => Ok(f.token),
                Ok(other) => Err(format!("missing token: the first frame must be auth, not {}", other.kind())),
                Err(_) => Err("missing token: the first frame must be a valid auth frame".into()),
            },
            Some(Ok(Message::Ping(_) | Message::Pong(_))) => continue,
            Some(Ok(Message::Binary(_))) => Err("missing token: the first frame must be an auth text frame".into()),
            Some(Ok(Message::Close(_)) | Err(_)) | None => Err("closed before the auth frame".into()),
        };
    }
}

/// What admission gives a session: its connection slot, and what its start needs
/// (its device's watermark when the registration read or wrote it, its epoch).
struct Admitted {
    permit: ConnectionPermit,
    admission: Admission,
}

/// The checks after a valid token: the node's admission budget (a login storm), the
/// user's and the address's connection limits, the device's registration.
async fn admit(state: &AppState, ip: Option<IpAddr>, claims: &Claims) -> Result<Admitted, Refusal> {
    if let Err(wait) = crate::limits::take(&state.limits.admission, 1) {
        // A login storm: refuse politely, with a jittered hint, so retries spread out.
        metrics::counter!("herald_rate_limited_total", "what" => "connect").increment(1);
        let retry = crate::limits::jittered(wait).as_millis() as u64;
        let f = ErrorFrame::new(ErrorCode::RateLimited, "too many connections; retry later").retry_after(retry);
        return Err(Refusal { error: Some(f), code: CloseCode::TryAgainLater, reason: "retry later".into() });
    }
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
            return Err(Refusal { error: Some(f), code: CloseCode::Policy, reason: message.into() });
        }
    };
    // The session's place among its device's sessions, before anything slow: a later
    // session of the device, on any gateway, draws a higher one.
    let redis = state.sessions.redis.next();
    let epoch = match draw_epoch(redis, &state.sessions.keys, &DeviceKey::of(claims)).await {
        Ok(epoch) => epoch,
        Err(e) => {
            tracing::warn!(error = %e, "session epoch not drawn");
            let reason = "dependency unavailable".to_owned();
            return Err(Refusal { error: None, code: CloseCode::InternalError, reason });
        }
    };
    match state.devices.register(claims).await {
        Ok(watermark) => Ok(Admitted { permit, admission: Admission { watermark, epoch } }),
        Err(e) => Err(Refusal { error: None, code: CloseCode::InternalError, reason: e.message }),
    }
}

/// The session with the connection's slot. Neither an `async fn` nor an `async` block:
/// either would keep a second copy of what it awaits (the socket, the session) in the
/// session's task.
fn serve(
    state: AppState,
    ip: Option<IpAddr>,
    claims: Claims,
    admitted: Admitted,
    features: Features,
    socket: WebSocket,
) -> impl Future<Output = ()> {
    let Admitted { permit, admission } = admitted;
    // The client's address in every line the session logs.
    let span = tracing::debug_span!("client", ip = ip.map(tracing::field::display));
    // The slot is held for the whole session and given back when it ends.
    Session::run(state.sessions.clone(), claims, admission, socket, features)
        .instrument(span)
        .map(move |()| drop(permit))
}

pub async fn close_now(mut socket: WebSocket, code: CloseCode, reason: String) {
    let frame = CloseFrame { code: code.code(), reason: reason.chars().take(120).collect::<String>().into() };
    let _ = tokio::time::timeout(Duration::from_secs(2), socket.send(Message::Close(Some(frame)))).await;
}

#[cfg(test)]
mod tests {
    use super::Features;

    #[test]
    fn features_are_asked_for_by_the_features_list_only() {
        let of = Features::of_query;
        assert!(of(Some("features=delivered")).delivered);
        let f = of(Some("access_token=x&features=typing,delivered"));
        assert_eq!(f, Features { delivered: true, typing: true, presence: false });
        assert_eq!(of(Some("features=typing%2Cpresence")), Features { delivered: false, typing: true, presence: true });
        assert_eq!(of(None), Features::default());
        assert_eq!(of(Some("access_token=x")), Features::default());
        assert_eq!(of(Some("features=deliveredx,typings")), Features::default());
        assert_eq!(of(Some("delivered=1&typing=1")), Features::default());
    }
}
