//! `POST /v1/messages` (the durable send over HTTP),
//! `POST /v1/conversations/{id}/read` (the HTTP read receipt) and
//! `GET /v1/messages/{id}/status` (a message's state per recipient, for its sender).
//!
//! The gateway validates, appends the request to its conversation's ingress stream
//! and waits for the worker's answer, which comes only after COMMIT (see
//! [`crate::ingress`]).

use axum::body::Bytes;
use axum::extract::State;
use axum::Json;
use herald_shared::db::TextColumns;
use herald_shared::error::ErrorCode;
use herald_shared::keys::DeviceKey;
use herald_shared::protocol::{SendOutcome, SendResult};
use serde::Deserialize;
use serde_json::value::RawValue;
use sqlx::Row;

use crate::api::auth::Caller;
use crate::error::{parse_json, ApiError, ApiResult};
use crate::send_span::{CallerTrace, SendSpan};
use crate::state::AppState;

#[derive(Deserialize)]
struct SendRequest {
    cmid: String,
    conv: String,
    body: Box<RawValue>,
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
    state.limits.http_request(&DeviceKey::of(&c), "read").map_err(ApiError::rate_limited)?;
    let waiter = state.ingress.enqueue_read(&c, conv, req.seq)?;
    match state.ingress.outcome(waiter).await? {
        SendOutcome::Read { conv, read_seq } => Ok(Json(serde_json::json!({"conv": conv, "read_seq": read_seq}))),
        _ => Err(ApiError::new(ErrorCode::Internal, "unexpected answer")),
    }
}

/// `POST /v1/messages`; a valid `traceparent` header makes its trace the send's.
pub async fn send(
    State(state): State<AppState>,
    Caller(c): Caller,
    CallerTrace(parent): CallerTrace,
    body: Bytes,
) -> ApiResult<Json<SendResult>> {
    let started = std::time::Instant::now();
    metrics::counter!("herald_sends_received_total", "transport" => "http").increment(1);
    let mut span = SendSpan::start(&state.ingress.tracer, "http", &c.tid, parent);
    let answer = async {
        let req: SendRequest = parse_json(&body)?;
        span.describe(&req.conv, &req.cmid);
        state.ingress.validate_send(&req.cmid, &req.conv, &req.body)?;
        if let Err(wait) = state.limits.http_send(&DeviceKey::of(&c)) {
            metrics::counter!("herald_rate_limited_total", "what" => "send").increment(1);
            return Err(ApiError::rate_limited(wait));
        }
        if let Err(wait) = state.limits.tenant_send(&c.tid) {
            metrics::counter!("herald_rate_limited_total", "what" => "tenant_send").increment(1);
            return Err(ApiError::rate_limited(wait));
        }
        state.ingress.send(&c, req.cmid, req.conv, req.body, span.context()).await
    }
    .await;
    span.finish(&answer);
    let result = answer?;
    metrics::histogram!("herald_send_ack_seconds", "transport" => "http").record(started.elapsed().as_secs_f64());
    Ok(Json(result))
}

/// Property tests of the send and read bodies: any JSON parses or is refused with
/// `bad_request`, never a panic; `PROPTEST_CASES=100000` runs them longer.
/// `GET /v1/messages/{id}/status`: how far one of the caller's messages got, per
/// recipient. Only its sender may ask; another tenant's id is unknown (404).
pub async fn status(
    State(state): State<AppState>,
    Caller(c): Caller,
    axum::extract::Path(id): axum::extract::Path<String>,
) -> ApiResult<Json<serde_json::Value>> {
    let id: herald_shared::ids::MsgId =
        id.parse().map_err(|_| ApiError::bad_request("the id must be a message id (decimal string)"))?;
    let row = sqlx::query("SELECT conv_id, seq, sender_id FROM messages WHERE id = ? AND tenant_id = ?")
        .bind(id.0)
        .bind(&c.tid)
        .fetch_optional(&state.db)
        .await?;
    let Some(row) = row else { return Err(ApiError::not_found()) };
    let (conv, seq, sender): (String, u64, String) = (row.text(0)?, row.try_get(1)?, row.text(2)?);
    if sender != c.sub {
        return Err(ApiError::new(ErrorCode::Forbidden, "only the sender may read a message's status"));
    }
    let members = crate::status::positions(&state.db, &c.tid, &conv).await?;
    let counts = crate::status::status_of(&members, &sender, seq);
    let recipients = crate::status::recipients(&members, &sender, seq);
    Ok(Json(serde_json::json!({
        "id": id,
        "conv": conv,
        "seq": seq,
        "of": counts.of,
        "delivered": counts.delivered,
        "read": counts.read,
        "recipients": recipients,
    })))
}

#[cfg(test)]
mod proptests {
    use super::*;
    use crate::api::body_strategies::{fields_of, json_value};
    use crate::ingress::check_send;
    use herald_shared::auth::is_valid_ident;
    use herald_shared::protocol::MAX_CMID_LEN;
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
