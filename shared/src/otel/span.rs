//! The spans Herald records, behind a small facade: a [`Tracer`] that is nothing when
//! tracing is off, and a [`HeraldSpan`] that is nothing when its trace is not sampled.
//! Every call on either then costs a branch and nothing else (no allocation, no clock
//! read), so the send path pays nothing for tracing that is off.
//!
//! The span names and attribute keys are here, so that every process names them alike
//! (docs/operations.md, "Traces", lists them). No attribute ever holds a message body,
//! a token or a push token.

use std::time::SystemTime;

use opentelemetry::trace::{Link, Span as _, SpanBuilder, SpanKind, Status, TraceContextExt as _};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::trace::{SdkTracer, Span};

use super::TraceParent;

/// The gateway's span of a send, from the request or frame accepted to its answer.
pub const SEND: &str = "herald.send";
/// The worker's span of a send's commit (its transaction, shared with the batch).
pub const COMMIT: &str = "herald.commit";
/// The worker's span of a committed message's fan-out into the devices' pending sets.
pub const FANOUT: &str = "herald.fanout";
/// The worker's span of a push notification's webhook call.
pub const PUSH: &str = "herald.push";

/// Attribute keys.
pub mod attr {
    /// `http`, `ws` or `server`: how the send came.
    pub const TRANSPORT: &str = "herald.transport";
    pub const TENANT: &str = "herald.tenant";
    pub const CONV: &str = "herald.conv";
    pub const CMID: &str = "herald.cmid";
    /// `ok`, `dup` (a repeat answered with the first commit) or the error code.
    pub const RESULT: &str = "herald.result";
    pub const SEQ: &str = "herald.seq";
    /// The message id, as a decimal string (ids pass 2^53).
    pub const MSG_ID: &str = "herald.msg_id";
    /// Sends committed in the same transaction.
    pub const BATCH_SIZE: &str = "herald.batch_size";
    /// Devices the message was added to the pending sets of.
    pub const DEVICES: &str = "herald.devices";
    /// Messages fanned out together.
    pub const FANOUT_MESSAGES: &str = "herald.fanout_messages";
    /// Messages a push notification stands for (collapsed per conversation).
    pub const PUSH_MESSAGES: &str = "herald.push_messages";
    /// The webhook attempt, 1 first.
    pub const ATTEMPT: &str = "herald.attempt";
}

/// What starts spans: the process's tracer, or nothing when tracing is off.
#[derive(Clone, Debug, Default)]
pub struct Tracer(Option<SdkTracer>);

impl Tracer {
    /// Tracing off: every span is [`HeraldSpan::none`].
    pub fn off() -> Tracer {
        Tracer(None)
    }

    pub(super) fn new(tracer: SdkTracer) -> Tracer {
        Tracer(Some(tracer))
    }

    /// Whether tracing is on in this process.
    pub fn is_on(&self) -> bool {
        self.0.is_some()
    }

    /// Starts span `name`, a child of `parent`, or the root of a new trace without one
    /// (sampled at `otel.sample_ratio`; a parent's decision is followed).
    pub fn start(&self, name: &'static str, kind: SpanKind, parent: Option<TraceParent>) -> HeraldSpan {
        self.start_at(name, kind, parent, &[], None)
    }

    /// [`Tracer::start`] with links to other traces' spans (work done for several
    /// sends at once) and a start time of the past (`None`: now).
    pub fn start_at(
        &self,
        name: &'static str,
        kind: SpanKind,
        parent: Option<TraceParent>,
        links: &[TraceParent],
        at: Option<SystemTime>,
    ) -> HeraldSpan {
        let Some(tracer) = &self.0 else { return HeraldSpan::none() };
        let mut builder = SpanBuilder::from_name(name).with_kind(kind);
        if let Some(at) = at {
            builder = builder.with_start_time(at);
        }
        if !links.is_empty() {
            builder = builder.with_links(links.iter().map(|l| Link::with_context(l.remote())).collect());
        }
        let parent = match parent {
            Some(p) => Context::new().with_remote_span_context(p.remote()),
            None => Context::new(),
        };
        let span = builder.start_with_context(tracer, &parent);
        HeraldSpan(span.is_recording().then(|| Box::new(span)))
    }
}

/// One span being recorded, or nothing (tracing off, or its trace not sampled). Ends
/// when dropped, if not before. Boxed: nothing is one word in the futures that hold it.
#[derive(Debug, Default)]
pub struct HeraldSpan(Option<Box<Span>>);

impl HeraldSpan {
    /// A span that records nothing.
    pub fn none() -> HeraldSpan {
        HeraldSpan(None)
    }

    /// Whether this span records (attributes set on one that does not are dropped).
    pub fn is_recording(&self) -> bool {
        self.0.is_some()
    }

    /// Its context, to pass on as the parent of the next span; `None` when it records
    /// nothing (nothing is passed on for a send that is not traced).
    pub fn context(&self) -> Option<TraceParent> {
        self.0.as_ref().and_then(|s| TraceParent::of(s.span_context()))
    }

    /// Sets a text attribute.
    pub fn set_str(&mut self, key: &'static str, value: &str) {
        if let Some(span) = &mut self.0 {
            span.set_attribute(KeyValue::new(key, value.to_owned()));
        }
    }

    /// Sets a number attribute (saturated at `i64::MAX`).
    pub fn set_u64(&mut self, key: &'static str, value: u64) {
        if let Some(span) = &mut self.0 {
            span.set_attribute(KeyValue::new(key, i64::try_from(value).unwrap_or(i64::MAX)));
        }
    }

    /// The outcome: `herald.result` is `result`, and the span's status is OK.
    pub fn succeed(&mut self, result: &str) {
        self.set_str(attr::RESULT, result);
        if let Some(span) = &mut self.0 {
            span.set_status(Status::Ok);
        }
    }

    /// The outcome: `herald.result` is the error code, and the span's status is an
    /// error described by the code alone (messages may quote what a client sent).
    pub fn fail(&mut self, code: &str) {
        self.set_str(attr::RESULT, code);
        if let Some(span) = &mut self.0 {
            span.set_status(Status::error(code.to_owned()));
        }
    }

    /// Ends the span now.
    pub fn end(self) {
        if let Some(mut span) = self.0 {
            span.end();
        }
    }
}
