//! `POST /v1/messages`: the durable send over HTTP.
//!
//! The gateway validates, appends the request to its conversation's ingress stream
//! and waits for the worker's answer, which comes only after COMMIT. Without an answer
//! in time it says `unavailable`: the client resends with the same `cmid` and gets the
//! first commit back with `dup: true`.

use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::Json;
use fred::prelude::*;
use herald_shared::auth::is_valid_ident;
use herald_shared::error::ErrorCode;
use herald_shared::keys::shard_of;
use herald_shared::protocol::{IngressEntry, SendOutcome, SendResult, MAX_CMID_LEN};
use serde::Deserialize;
use serde_json::value::RawValue;

use crate::auth::Caller;
use crate::error::{parse_json, ApiError, ApiResult};
use crate::notices::Waiter;
use crate::AppState;

#[derive(Deserialize)]
struct SendRequest {
    cmid: String,
    conv: String,
    body: Box<RawValue>,
}

/// Checks a send and turns it into an ingress entry (shared with the WebSocket `send`).
pub fn validate_send(state: &AppState, cmid: &str, conv: &str, body: &RawValue) -> ApiResult<()> {
    check_send(cmid, conv, body, state.cfg.gateway.max_body_bytes)
}

/// [`validate_send`] with the body limit given.
pub fn check_send(cmid: &str, conv: &str, body: &RawValue, max_body_bytes: usize) -> ApiResult<()> {
    if cmid.is_empty() || cmid.chars().count() > MAX_CMID_LEN {
        return Err(ApiError::bad_request(format!("cmid must be 1..{MAX_CMID_LEN} characters")));
    }
    if !is_valid_ident(conv) {
        return Err(ApiError::bad_request("conv must be 1..64 printable ASCII characters"));
    }
    if body.get().len() > max_body_bytes {
        return Err(ApiError::new(
            ErrorCode::TooLarge,
            format!("body is {} bytes serialized; the limit is {max_body_bytes}", body.get().len()),
        ));
    }
    Ok(())
}

/// Appends to the ingress stream and waits for the committed answer.
pub async fn submit(
    state: &AppState,
    c: &herald_shared::auth::Claims,
    cmid: String,
    conv: String,
    body: String,
) -> ApiResult<SendResult> {
    let waiter = enqueue(state, c, cmid, conv, body).await?;
    wait_committed(state, waiter).await
}

/// Appends the send to its ingress stream. Sends of one session are enqueued in the
/// order they arrived, which is the order their `seq` follows.
pub async fn enqueue(
    state: &AppState,
    c: &herald_shared::auth::Claims,
    cmid: String,
    conv: String,
    body: String,
) -> ApiResult<Waiter> {
    let waiter = state.waiters.register();
    let shard = shard_of(&c.tid, &conv, state.cfg.ingress.shards);
    let entry = IngressEntry {
        tenant: c.tid.clone(),
        user: c.sub.clone(),
        device: c.dev.clone(),
        cmid,
        conv,
        body,
        node: state.cfg.node_id.clone(),
        rid: waiter.rid,
    };
    // No MAXLEN: an entry leaves the stream only when a worker has committed it (XDEL
    // after XACK), so a long worker outage cannot trim away accepted sends.
    let _: String = state.redis.xadd(state.keys.ingress(shard), false, None, "*", entry.to_fields()).await?;
    Ok(waiter)
}

/// Waits for the worker's answer, which comes only after COMMIT.
pub async fn wait_committed(state: &AppState, waiter: Waiter) -> ApiResult<SendResult> {
    match wait_outcome(state, waiter).await? {
        SendOutcome::Ok(r) => Ok(r),
        _ => Err(ApiError::new(ErrorCode::Internal, "unexpected answer")),
    }
}

/// Waits for the worker's answer to any ingress request.
pub async fn wait_outcome(state: &AppState, mut waiter: Waiter) -> ApiResult<SendOutcome> {
    let timeout = Duration::from_millis(state.cfg.gateway.send_timeout_ms);
    match tokio::time::timeout(timeout, &mut waiter.rx).await {
        Ok(Ok(SendOutcome::Err { code, message })) => Err(ApiError::new(code, message)),
        Ok(Ok(outcome)) => Ok(outcome),
        Ok(Err(_)) | Err(_) => {
            metrics::counter!("herald_send_timeouts_total").increment(1);
            Err(ApiError::new(ErrorCode::Unavailable, "not confirmed in time; retry (sends with the same cmid)"))
        }
    }
}

/// Appends a read receipt to the conversation's ingress stream (after its sends).
pub async fn enqueue_read(
    state: &AppState,
    c: &herald_shared::auth::Claims,
    conv: String,
    seq: u64,
) -> ApiResult<Waiter> {
    if !is_valid_ident(&conv) {
        return Err(ApiError::bad_request("conv must be 1..64 printable ASCII characters"));
    }
    let waiter = state.waiters.register();
    let shard = shard_of(&c.tid, &conv, state.cfg.ingress.shards);
    let entry = herald_shared::protocol::ReadEntry {
        tenant: c.tid.clone(),
        user: c.sub.clone(),
        device: c.dev.clone(),
        conv,
        seq,
        node: state.cfg.node_id.clone(),
        rid: waiter.rid,
    };
    let _: String = state.redis.xadd(state.keys.ingress(shard), false, None, "*", entry.to_fields()).await?;
    Ok(waiter)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ReadRequest {
    seq: u64,
}

/// `POST /v1/conversations/{id}/read` `{"seq": N}`: the HTTP `read`.
pub async fn read(
    State(state): State<AppState>,
    Caller(c): Caller,
    axum::extract::Path(conv): axum::extract::Path<String>,
    body: Bytes,
) -> ApiResult<Json<serde_json::Value>> {
    let req: ReadRequest = parse_json(&body)?;
    let waiter = enqueue_read(&state, &c, conv, req.seq).await?;
    match wait_outcome(&state, waiter).await? {
        SendOutcome::Read { conv, read_seq } => Ok(Json(serde_json::json!({"conv": conv, "read_seq": read_seq}))),
        _ => Err(ApiError::new(ErrorCode::Internal, "unexpected answer")),
    }
}

pub async fn send(State(state): State<AppState>, Caller(c): Caller, body: Bytes) -> ApiResult<Json<SendResult>> {
    let started = std::time::Instant::now();
    let req: SendRequest = parse_json(&body)?;
    validate_send(&state, &req.cmid, &req.conv, &req.body)?;
    if let Err(wait) = state.limits.http_send(&herald_shared::keys::DeviceKey::of(&c)) {
        metrics::counter!("herald_rate_limited_total", "what" => "send").increment(1);
        return Err(ApiError::rate_limited(wait));
    }
    if let Err(wait) = state.limits.tenant_send(&c.tid) {
        metrics::counter!("herald_rate_limited_total", "what" => "tenant_send").increment(1);
        return Err(ApiError::rate_limited(wait));
    }
    let result = submit(&state, &c, req.cmid, req.conv, req.body.get().to_owned()).await?;
    metrics::histogram!("herald_send_ack_seconds", "transport" => "http").record(started.elapsed().as_secs_f64());
    Ok(Json(result))
}

/// Property tests of the send and read bodies: any JSON parses or is refused with
/// `bad_request`, never a panic; `PROPTEST_CASES=100000` runs them longer.
#[cfg(test)]
mod proptests {
    use super::*;
    use crate::body_strategies::{fields_of, json_value};
    use proptest::prelude::*;
    use serde_json::Value;

    fn is_u64(v: &Value) -> bool {
        v.as_u64().is_some() && !v.is_f64()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn arbitrary_bytes_are_refused_as_bad_request(bytes in proptest::collection::vec(any::<u8>(), 0..128)) {
            for r in [parse_json::<SendRequest>(&bytes).err(), parse_json::<ReadRequest>(&bytes).err()].into_iter().flatten() {
                prop_assert_eq!(r.code, ErrorCode::BadRequest);
            }
        }

        #[test]
        fn send_bodies_parse_exactly_when_well_typed(v in fields_of(&["cmid", "conv", "body", "extra"])) {
            let o = v.as_object().unwrap();
            let ok = o.get("cmid").is_some_and(Value::is_string)
                && o.get("conv").is_some_and(Value::is_string)
                && o.contains_key("body");
            match parse_json::<SendRequest>(v.to_string().as_bytes()) {
                Ok(req) => {
                    prop_assert!(ok, "accepted {v}");
                    prop_assert_eq!(req.body.get(), o["body"].to_string());
                    // Validation refuses or accepts without panicking, with a protocol code.
                    if let Err(e) = check_send(&req.cmid, &req.conv, &req.body, 64) {
                        prop_assert!(matches!(e.code, ErrorCode::BadRequest | ErrorCode::TooLarge));
                    }
                }
                Err(e) => {
                    prop_assert!(!ok, "refused {v}: {}", e.message);
                    prop_assert_eq!(e.code, ErrorCode::BadRequest);
                }
            }
        }

        #[test]
        fn check_send_enforces_its_limits(cmid in ".{0,70}", conv in ".{0,70}", body in json_value(), max in 1usize..200) {
            let raw = RawValue::from_string(body.to_string()).unwrap();
            let cmid_ok = !cmid.is_empty() && cmid.chars().count() <= MAX_CMID_LEN;
            let conv_ok = is_valid_ident(&conv);
            match check_send(&cmid, &conv, &raw, max) {
                Ok(()) => prop_assert!(cmid_ok && conv_ok && raw.get().len() <= max),
                Err(e) if e.code == ErrorCode::TooLarge => prop_assert!(cmid_ok && conv_ok && raw.get().len() > max),
                Err(e) => {
                    prop_assert_eq!(e.code, ErrorCode::BadRequest);
                    prop_assert!(!cmid_ok || !conv_ok);
                }
            }
        }

        #[test]
        fn read_bodies_parse_exactly_when_well_typed(v in fields_of(&["seq", "extra"])) {
            let o = v.as_object().unwrap();
            let ok = o.len() == 1 && o.get("seq").is_some_and(is_u64);
            match parse_json::<ReadRequest>(v.to_string().as_bytes()) {
                Ok(req) => {
                    prop_assert!(ok, "accepted {v}");
                    prop_assert_eq!(Some(req.seq), o["seq"].as_u64());
                }
                Err(e) => {
                    prop_assert!(!ok, "refused {v}: {}", e.message);
                    prop_assert_eq!(e.code, ErrorCode::BadRequest);
                }
            }
        }
    }
}
