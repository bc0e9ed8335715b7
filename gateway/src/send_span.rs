//! The gateway's span of a send, `herald.send` (`otel.*`): from the request or frame
//! accepted to its answer, with the tenant, conversation, cmid and outcome; never the
//! body or a token. The span's context goes into the send's ingress entry, so the
//! worker's spans join its trace. With tracing off, or the send not sampled, it records
//! nothing and costs a branch per call.

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::HeaderMap;
use herald_shared::error::ErrorCode;
use herald_shared::otel::propagation::HEADER;
use herald_shared::otel::span::SEND;
use herald_shared::otel::{attr, HeraldSpan, SpanKind, TraceParent, Tracer};
use herald_shared::protocol::SendResult;

use crate::error::ApiResult;

/// The context an HTTP client passed in its `traceparent` header; `None` when there is
/// none or it is not valid (the send then starts a trace of its own, never an error).
/// An extractor that reads that one header, so a send does not copy the request's
/// header map for it.
#[derive(Debug)]
pub struct CallerTrace(pub Option<TraceParent>);

impl<S: Send + Sync> FromRequestParts<S> for CallerTrace {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        Ok(CallerTrace(traceparent(&parts.headers)))
    }
}

fn traceparent(headers: &HeaderMap) -> Option<TraceParent> {
    let mut values = headers.get_all(HEADER).iter();
    let value = values.next()?;
    // Two headers are no context (W3C Trace Context, "traceparent" header).
    if values.next().is_some() {
        return None;
    }
    value.to_str().ok().and_then(TraceParent::parse)
}

/// One send's span.
#[derive(Debug)]
pub struct SendSpan(HeraldSpan);

impl SendSpan {
    /// Starts the span of a send of `tenant` that came by `transport` (`http`, `server`,
    /// `ws`), continuing the caller's trace `parent` when there is one.
    pub fn start(tracer: &Tracer, transport: &'static str, tenant: &str, parent: Option<TraceParent>) -> SendSpan {
        let mut span = tracer.start(SEND, SpanKind::Server, parent);
        span.set_str(attr::TRANSPORT, transport);
        span.set_str(attr::TENANT, tenant);
        SendSpan(span)
    }

    /// The send's conversation and cmid, once read.
    pub fn describe(&mut self, conv: &str, cmid: &str) {
        self.0.set_str(attr::CONV, conv);
        self.0.set_str(attr::CMID, cmid);
    }

    /// What the send's ingress entry carries to the worker: `None` unless traced.
    pub fn context(&self) -> Option<TraceParent> {
        self.0.context()
    }

    /// Ends the span with the send's answer.
    pub fn finish(self, answer: &ApiResult<SendResult>) {
        match answer {
            Ok(r) => self.answered(r),
            Err(e) => self.fail(e.code),
        }
    }

    /// Ends the span with the send committed (or found committed before: `dup`).
    pub fn answered(mut self, r: &SendResult) {
        self.0.set_u64(attr::SEQ, r.seq);
        self.0.set_str(attr::MSG_ID, &r.id.0.to_string());
        self.0.succeed(if r.dup { "dup" } else { "ok" });
    }

    /// Ends the span with the send refused or not confirmed: its error code.
    pub fn fail(mut self, code: ErrorCode) {
        self.0.fail(code.as_str());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    const VALID: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_valid_header_is_the_parent_and_anything_else_is_none() {
        let mut h = HeaderMap::new();
        assert_eq!(traceparent(&h), None);
        h.insert(HEADER, HeaderValue::from_static(VALID));
        assert_eq!(traceparent(&h), TraceParent::parse(VALID));
        h.insert(HEADER, HeaderValue::from_static("00-nonsense"));
        assert_eq!(traceparent(&h), None, "an invalid header starts a new trace, it is no error");
        h.insert(HEADER, HeaderValue::from_static(VALID));
        h.append(HEADER, HeaderValue::from_static(VALID));
        assert_eq!(traceparent(&h), None, "two headers are no context");
    }

    #[test]
    fn with_tracing_off_a_span_records_nothing_and_passes_nothing_on() {
        let mut span = SendSpan::start(&Tracer::off(), "http", "t", TraceParent::parse(VALID));
        span.describe("c", "m1");
        assert_eq!(span.context(), None);
        span.fail(ErrorCode::Unavailable);
    }
}
