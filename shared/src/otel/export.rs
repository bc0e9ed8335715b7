//! The pipeline behind the tracer: a parent-based ratio sampler, a batch span processor
//! on the tokio runtime, and the OTLP/HTTP exporter (protobuf, `POST
//! <otel.endpoint>/v1/traces`) over reqwest and rustls, counted in metrics.

use std::time::Duration;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry::KeyValue;
use opentelemetry_otlp::{Protocol, WithExportConfig as _, WithHttpConfig as _};
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::runtime::Tokio;
use opentelemetry_sdk::trace::span_processor_with_async_runtime::BatchSpanProcessor;
use opentelemetry_sdk::trace::{BatchConfigBuilder, Sampler, SdkTracerProvider, SpanData, SpanExporter};
use opentelemetry_sdk::Resource;

use super::Tracer;
use crate::config::{OtelConfig, Role};

/// Finished spans waiting for export at most; past it new ones are dropped (and
/// counted), so a collector that is down costs bounded memory.
const QUEUE: usize = 4_096;
/// Spans in one export request at most.
const BATCH: usize = 512;

/// Why tracing could not start.
#[derive(Debug, thiserror::Error)]
pub enum TracingError {
    #[error("otel: cannot build the HTTP client: {0}")]
    Client(#[from] reqwest::Error),
    #[error("otel: cannot build the OTLP exporter: {0}")]
    Exporter(#[from] opentelemetry_otlp::ExporterBuildError),
    #[error("otel.headers: {0}")]
    Headers(String),
}

/// The process's trace pipeline, while tracing is on.
#[derive(Debug)]
pub struct Tracing {
    provider: SdkTracerProvider,
    tracer: Tracer,
    /// Bounds the flush at shutdown.
    timeout: Duration,
    /// [`Tracing::shutdown`] ran.
    stopped: bool,
}

impl Tracing {
    /// Starts the pipeline when `otel.endpoint` is set (`None`: tracing is off, and
    /// nothing is built). Runs its batch processor on the current tokio runtime.
    pub fn start(cfg: &OtelConfig, role: Role, node_id: &str) -> Result<Option<Tracing>, TracingError> {
        let Some(url) = cfg.traces_url() else { return Ok(None) };
        let timeout = Duration::from_millis(cfg.timeout_ms);
        let headers = cfg.header_pairs().map_err(TracingError::Headers)?.into_iter().collect();
        // The workspace's reqwest: rustls with the system's roots.
        let client = reqwest::Client::builder().timeout(timeout).build()?;
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(Protocol::HttpBinary)
            .with_endpoint(url)
            .with_timeout(timeout)
            .with_headers(headers)
            .with_http_client(client)
            .build()?;
        let batches = BatchConfigBuilder::default()
            .with_max_queue_size(QUEUE)
            .with_max_export_batch_size(BATCH)
            .with_scheduled_delay(Duration::from_millis(cfg.batch_delay_ms))
            .with_max_export_timeout(timeout)
            .build();
        let processor = BatchSpanProcessor::builder(Counted(exporter), Tokio).with_batch_config(batches).build();
        let resource = Resource::builder()
            .with_service_name(cfg.service_name_of(role))
            .with_attributes([
                KeyValue::new("service.instance.id", node_id.to_owned()),
                KeyValue::new("service.version", env!("CARGO_PKG_VERSION")),
            ])
            .build();
        let provider = SdkTracerProvider::builder()
            .with_span_processor(processor)
            .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(cfg.sample_ratio))))
            .with_resource(resource)
            .build();
        let tracer = Tracer::new(provider.tracer("herald"));
        Ok(Some(Tracing { provider, tracer, timeout, stopped: false }))
    }

    /// Where the process's spans start.
    pub fn tracer(&self) -> Tracer {
        self.tracer.clone()
    }

    /// Exports the spans still queued and stops the pipeline, within the export
    /// timeout and a margin.
    pub async fn shutdown(mut self) {
        self.stopped = true;
        let provider = self.provider.clone();
        // The SDK waits for its processor by blocking; the processor runs on this runtime.
        let flushed = tokio::task::spawn_blocking(move || provider.shutdown());
        match tokio::time::timeout(self.timeout + Duration::from_secs(1), flushed).await {
            Ok(Ok(Ok(()))) => tracing::debug!("spans flushed"),
            Ok(Ok(Err(e))) => tracing::warn!(error = %e, "spans not flushed at shutdown"),
            Ok(Err(e)) => tracing::warn!(error = %e, "spans not flushed at shutdown"),
            Err(_) => tracing::warn!("spans not flushed within the export timeout at shutdown"),
        }
    }
}

impl Drop for Tracing {
    /// Dropped without [`Tracing::shutdown`] (the process failed after starting it): the
    /// pipeline stops on a thread of its own, not waited for, since the SDK's stop
    /// blocks until the processor on the runtime answers.
    fn drop(&mut self) {
        if !self.stopped {
            let provider = self.provider.clone();
            std::thread::spawn(move || provider.shutdown());
        }
    }
}

/// The OTLP exporter, its exports counted (`herald_otel_spans_exported_total`,
/// `herald_otel_export_failures_total`) and failures logged.
#[derive(Debug)]
struct Counted(opentelemetry_otlp::SpanExporter);

impl SpanExporter for Counted {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let spans = batch.len() as u64;
        let result = self.0.export(batch).await;
        match &result {
            Ok(()) => metrics::counter!("herald_otel_spans_exported_total").increment(spans),
            Err(e) => {
                metrics::counter!("herald_otel_export_failures_total").increment(1);
                tracing::warn!(error = %e, spans, "spans not exported to the collector (otel.endpoint)");
            }
        }
        result
    }

    fn shutdown_with_timeout(&mut self, timeout: Duration) -> OTelSdkResult {
        self.0.shutdown_with_timeout(timeout)
    }

    fn force_flush(&mut self) -> OTelSdkResult {
        self.0.force_flush()
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.0.set_resource(resource);
    }
}
