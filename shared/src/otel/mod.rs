//! Traces of sends (OpenTelemetry), exported over OTLP/HTTP when `otel.endpoint` is set
//! and off by default (docs/operations.md, "Traces").
//!
//! A sampled send is one trace: the gateway's `herald.send`, the worker's
//! `herald.commit` and `herald.fanout`, and `herald.push` when a recipient is pushed.
//! The context goes from the gateway to the worker inside the send's ingress entry
//! ([`TraceParent`], only for sampled sends), and from an HTTP client to the gateway in
//! a W3C `traceparent` header.
//!
//! # Layout
//! - [`propagation`]: `traceparent`, read and written.
//! - [`span`]: the [`Tracer`] and [`HeraldSpan`] facade, span names and attributes.
//! - `export`: the sampler, batch processor and OTLP/HTTP exporter ([`Tracing`]).

mod export;
pub mod propagation;
pub mod span;

pub use export::{Tracing, TracingError};
pub use opentelemetry::trace::SpanKind;
pub use propagation::TraceParent;
pub use span::{attr, HeraldSpan, Tracer};
