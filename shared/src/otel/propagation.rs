//! W3C Trace Context: the `traceparent` an HTTP send may carry, and the form a sampled
//! send's context takes through the ingress streams to the worker.
//!
//! Only `traceparent` is read; `tracestate` is neither read nor passed on. A header
//! that is not a valid `traceparent` is ignored (the send starts a trace of its own),
//! never refused: tracing must not change what a send answers.

use std::fmt;

use opentelemetry::trace::{SpanContext, SpanId, TraceFlags, TraceId, TraceState};

/// The HTTP request header of an incoming context.
pub const HEADER: &str = "traceparent";

/// A span's place in a trace, as `traceparent` carries it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TraceParent {
    pub trace_id: TraceId,
    /// The span the next one is a child of.
    pub span_id: SpanId,
    /// The caller recorded its part of the trace (flag `01`).
    pub sampled: bool,
}

impl TraceParent {
    /// Reads a `traceparent` value: `00-<32 hex trace id>-<16 hex span id>-<2 hex
    /// flags>`, lower-case, neither id all zeros. A later version is read by the same
    /// four fields (and may have more after a dash); version `ff` is invalid. `None` when
    /// the value is not valid.
    pub fn parse(value: &str) -> Option<TraceParent> {
        let value = value.trim_matches([' ', '\t']);
        let mut fields = value.split('-');
        let (version, trace, span, flags) = (fields.next()?, fields.next()?, fields.next()?, fields.next()?);
        let more = fields.next().is_some();
        let hex = |s: &str, len: usize| s.len() == len && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
        if !hex(version, 2) || version == "ff" || (version == "00" && more) {
            return None;
        }
        if !hex(trace, 32) || !hex(span, 16) || !hex(flags, 2) {
            return None;
        }
        let trace_id = TraceId::from_hex(trace).ok().filter(|t| *t != TraceId::INVALID)?;
        let span_id = SpanId::from_hex(span).ok().filter(|s| *s != SpanId::INVALID)?;
        let flags = u8::from_str_radix(flags, 16).ok()?;
        Some(TraceParent { trace_id, span_id, sampled: flags & 1 == 1 })
    }

    /// The context of `span`, when it is a valid one.
    pub fn of(span: &SpanContext) -> Option<TraceParent> {
        span.is_valid().then(|| TraceParent {
            trace_id: span.trace_id(),
            span_id: span.span_id(),
            sampled: span.is_sampled(),
        })
    }

    /// The context as a parent from another process.
    pub fn remote(&self) -> SpanContext {
        let flags = if self.sampled { TraceFlags::SAMPLED } else { TraceFlags::default() };
        SpanContext::new(self.trace_id, self.span_id, flags, true, TraceState::NONE)
    }
}

/// The `traceparent` value (version `00`).
impl fmt::Display for TraceParent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "00-{:032x}-{:016x}-{:02x}", self.trace_id, self.span_id, u8::from(self.sampled))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const VALID: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_valid_header_is_read_and_written_back_the_same() {
        let p = TraceParent::parse(VALID).expect("valid");
        assert_eq!(format!("{:032x}", p.trace_id), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(format!("{:016x}", p.span_id), "00f067aa0ba902b7");
        assert!(p.sampled);
        assert_eq!(p.to_string(), VALID);
        assert_eq!(TraceParent::parse(&format!(" {VALID}\t")), Some(p), "optional white space around it");
        let unsampled = TraceParent::parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00").unwrap();
        assert!(!unsampled.sampled);
        let remote = p.remote();
        assert!(remote.is_remote() && remote.is_sampled() && remote.is_valid());
        assert_eq!(TraceParent::of(&remote), Some(p));
    }

    #[test]
    fn a_later_version_is_read_by_its_first_four_fields() {
        let future = "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-03-whatever";
        let p = TraceParent::parse(future).expect("a later version");
        assert!(p.sampled, "flag bit 0; other bits are ignored");
        assert_eq!(p.to_string(), VALID, "passed on as version 00");
    }

    /// An invalid header is no error: the send starts a trace of its own.
    #[test]
    fn invalid_headers_are_ignored() {
        for bad in [
            "",
            "garbage",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-1",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902g7-01",
            "0-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00_4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7_01",
        ] {
            assert_eq!(TraceParent::parse(bad), None, "{bad:?}");
        }
    }
}
