//! `POST /v1/server/messages`: a service sends as one of its tenant's users (a bot is
//! a user that is a member).
//!
//! The send takes the device sends' durable path: the ingress stream, the worker's
//! membership check and commit, and an answer only after COMMIT. The idempotency key
//! is the message's `cmid`, so a repeat gets the first commit back with `dup: true`;
//! the sender device is `service:<name>`.

use axum::body::Bytes;
use axum::extract::State;
use axum::Json;
use herald_shared::auth::{is_valid_ident, Claims, Platform};
use herald_shared::keys::DeviceKey;
use herald_shared::protocol::{SendResult, MAX_CMID_LEN};
use herald_shared::service_token::Scope;
use serde::Deserialize;
use serde_json::value::RawValue;

use super::Service;
use crate::error::{parse_json, ApiError, ApiResult};
use crate::send_span::{CallerTrace, SendSpan};
use crate::state::AppState;

/// A message a service sends as a member (docs/protocol.md section 7.2).
#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ServerSendRequest {
    /// The conversation's id.
    conv: String,
    /// The user the message is sent as.
    #[serde(rename = "as")]
    sender: String,
    /// Any JSON value, stored and delivered verbatim.
    body: Box<RawValue>,
    /// 1..64 characters: the message's cmid; a repeat answers the first commit, `dup: true`.
    idempotency_key: String,
}

/// The identity the send travels under: the `as` user on the service's own device.
fn sender_claims(service: &Service, sender: String) -> Claims {
    let s = &service.0;
    Claims { tid: s.tid.clone(), sub: sender, dev: s.sender_device(), plat: Platform::Server, exp: s.exp, iat: None }
}

/// `POST /v1/server/messages`; a valid `traceparent` header makes its trace the send's.
pub async fn send(
    State(state): State<AppState>,
    service: Service,
    CallerTrace(parent): CallerTrace,
    body: Bytes,
) -> ApiResult<Json<SendResult>> {
    let started = std::time::Instant::now();
    metrics::counter!("herald_sends_received_total", "transport" => "server").increment(1);
    let mut span = SendSpan::start(&state.ingress.tracer, "server", &service.0.tid, parent);
    let answer = async {
        service.require(Scope::MessagesSend)?;
        let req: ServerSendRequest = parse_json(&body)?;
        span.describe(&req.conv, &req.idempotency_key);
        if !is_valid_ident(&req.sender) {
            return Err(ApiError::bad_request("as must be a user id (1..64 printable ASCII characters)"));
        }
        let key_len = req.idempotency_key.chars().count();
        if !(1..=MAX_CMID_LEN).contains(&key_len) {
            return Err(ApiError::bad_request(format!("idempotency_key must be 1..{MAX_CMID_LEN} characters")));
        }
        state.ingress.validate_send(&req.idempotency_key, &req.conv, &req.body)?;
        let claims = sender_claims(&service, req.sender);
        if let Err(wait) = state.limits.http_send(&DeviceKey::of(&claims)) {
            metrics::counter!("herald_rate_limited_total", "what" => "send").increment(1);
            return Err(ApiError::rate_limited(wait));
        }
        if let Err(wait) = state.limits.tenant_send(&claims.tid) {
            metrics::counter!("herald_rate_limited_total", "what" => "tenant_send").increment(1);
            return Err(ApiError::rate_limited(wait));
        }
        let waiter = state.ingress.enqueue_send(&claims, req.idempotency_key, req.conv, req.body, span.context())?;
        state.ingress.committed(waiter, "server").await
    }
    .await;
    span.finish(&answer);
    let result = answer?;
    metrics::histogram!("herald_send_ack_seconds", "transport" => "server").record(started.elapsed().as_secs_f64());
    Ok(Json(result))
}

/// Any JSON parses or is refused with `bad_request`, never a panic;
/// `PROPTEST_CASES=100000` runs it longer.
#[cfg(test)]
mod proptests {
    use super::*;
    use crate::api::body_strategies::fields_of;
    use herald_shared::error::ErrorCode;
    use proptest::prelude::*;
    use serde_json::Value;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn server_send_bodies_parse_exactly_when_well_typed(
            v in fields_of(&["conv", "as", "body", "idempotency_key", "cmid"]),
        ) {
            let o = v.as_object().unwrap();
            let ok = ["conv", "as", "idempotency_key"].iter().all(|f| o.get(*f).is_some_and(Value::is_string))
                && o.contains_key("body")
                && !o.contains_key("cmid");
            match parse_json::<ServerSendRequest>(v.to_string().as_bytes()) {
                Ok(req) => {
                    prop_assert!(ok, "accepted {v}");
                    prop_assert_eq!(req.body.get(), o["body"].to_string());
                    prop_assert_eq!(Some(req.sender.as_str()), o["as"].as_str());
                }
                Err(e) => {
                    prop_assert!(!ok, "refused {v}: {}", e.message);
                    prop_assert_eq!(e.code, ErrorCode::BadRequest);
                }
            }
        }
    }
}
