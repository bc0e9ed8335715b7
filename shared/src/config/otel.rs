//! `[otel]`: OpenTelemetry traces of sends, exported over OTLP/HTTP; off unless an
//! endpoint is set.

use reqwest::header::{HeaderName, HeaderValue};

use super::table::{section, BOTH};
use super::{Problems, Role, Secret};

/// The path OTLP/HTTP collectors take traces on, appended to `otel.endpoint`.
pub const TRACES_PATH: &str = "/v1/traces";

section! {
    /// `[otel]`: where and how much the gateway and the worker trace (docs/operations.md, "Traces").
    pub struct OtelConfig in "otel", read by BOTH;
    {
        /// OTLP/HTTP base URL of a trace collector, such as `http://collector:4318`; empty, tracing is off.
        ///
        /// Spans are POSTed as protobuf to `<endpoint>/v1/traces`.
        pub endpoint: String = "",
        /// Share of sends traced, 0.0 to 1.0; a send whose `traceparent` says sampled is traced regardless.
        ///
        /// A send whose `traceparent` says not sampled is not traced either: the caller's
        /// decision stands, as W3C Trace Context asks.
        pub sample_ratio: f64 = "1.0",
        /// The spans' `service.name`; empty, `herald-gateway` or `herald-worker`.
        pub service_name: String = "",
        /// Headers of every export, `name=value` comma-separated (a collector's API key).
        ///
        /// A secret: never logged. Values cannot contain commas.
        pub headers: Secret = "",
        /// Longest wait for the collector's answer to one export; past it that batch of spans is dropped.
        pub timeout_ms: u64 = "10000",
        /// How often finished spans are exported, in batches.
        pub batch_delay_ms: u64 = "5000",
    }
}

impl OtelConfig {
    /// Whether spans are recorded and exported at all.
    pub fn enabled(&self) -> bool {
        !self.endpoint.is_empty()
    }

    /// The URL spans are POSTed to: the endpoint with [`TRACES_PATH`]; `None` when off.
    pub fn traces_url(&self) -> Option<String> {
        self.enabled().then(|| format!("{}{TRACES_PATH}", self.endpoint.trim_end_matches('/')))
    }

    /// The spans' `service.name`.
    pub fn service_name_of(&self, role: Role) -> String {
        if self.service_name.is_empty() {
            format!("herald-{}", role.name())
        } else {
            self.service_name.clone()
        }
    }

    /// `otel.headers` as (name, value). Errors name the header, never its value.
    pub fn header_pairs(&self) -> Result<Vec<(String, String)>, String> {
        let mut out = Vec::new();
        for part in self.headers.0.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let Some((name, value)) = part.split_once('=') else {
                return Err("expected name=value, comma-separated (values are not shown)".into());
            };
            let (name, value) = (name.trim(), value.trim());
            if HeaderName::from_bytes(name.as_bytes()).is_err() {
                return Err(format!("{name:?} is not an HTTP header name"));
            }
            if value.is_empty() || HeaderValue::from_str(value).is_err() {
                return Err(format!("the value of {name:?} is empty or not a valid HTTP header value"));
            }
            out.push((name.to_ascii_lowercase(), value.to_owned()));
        }
        Ok(out)
    }

    pub(super) fn validate(&self, bad: &mut Problems) {
        if let Err(e) = endpoint(&self.endpoint) {
            bad.push("otel.endpoint", &e);
        }
        if !(0.0..=1.0).contains(&self.sample_ratio) {
            bad.push("otel.sample_ratio", "must be 0.0..=1.0 (the share of sends traced)");
        }
        if self.service_name.len() > 128 || self.service_name.contains(char::is_control) {
            bad.push("otel.service_name", "at most 128 characters, no control characters");
        }
        if let Err(e) = self.header_pairs() {
            bad.push("otel.headers", &e);
        }
        if !(100..=60_000).contains(&self.timeout_ms) {
            bad.push("otel.timeout_ms", "must be 100..=60000");
        }
        if !(10..=60_000).contains(&self.batch_delay_ms) {
            bad.push("otel.batch_delay_ms", "must be 10..=60000");
        }
    }
}

/// Empty (off), or an http(s) base URL without the signal's path.
fn endpoint(url: &str) -> Result<(), String> {
    if url.is_empty() {
        return Ok(());
    }
    let scheme = url.starts_with("http://") || url.starts_with("https://");
    if !scheme || url.contains(char::is_whitespace) || !reqwest::Url::parse(url).is_ok_and(|u| u.has_host()) {
        return Err(format!("expected an http:// or https:// URL of a collector, got {url:?}"));
    }
    if url.trim_end_matches('/').ends_with(TRACES_PATH) {
        return Err(format!("give the collector's base URL; {TRACES_PATH} is appended to it"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::testing::{env, SECRET};
    use super::super::{load, Role};
    use super::OtelConfig;

    fn otel(pairs: &[(&str, &str)]) -> Result<OtelConfig, String> {
        let mut all = vec![SECRET];
        all.extend_from_slice(pairs);
        load(Role::Gateway, &[], &env(&all)).map(|(cfg, _)| cfg.otel).map_err(|e| e.to_string())
    }

    #[test]
    fn tracing_is_off_by_default() {
        let cfg = otel(&[]).unwrap();
        assert!(!cfg.enabled());
        assert_eq!(cfg.traces_url(), None);
        assert_eq!(cfg.sample_ratio, 1.0);
        assert_eq!(cfg.service_name_of(Role::Worker), "herald-worker");
    }

    #[test]
    fn an_endpoint_turns_it_on_and_traces_go_to_its_path() {
        let cfg = otel(&[
            ("HERALD_OTEL__ENDPOINT", "http://collector:4318/"),
            ("HERALD_OTEL__SAMPLE_RATIO", "0.25"),
            ("HERALD_OTEL__SERVICE_NAME", "chat-edge"),
        ])
        .unwrap();
        assert!(cfg.enabled());
        assert_eq!(cfg.traces_url().as_deref(), Some("http://collector:4318/v1/traces"));
        assert_eq!(cfg.sample_ratio, 0.25);
        assert_eq!(cfg.service_name_of(Role::Gateway), "chat-edge");
    }

    #[test]
    fn bad_values_are_refused_with_their_key() {
        for (var, value, expected) in [
            ("HERALD_OTEL__SAMPLE_RATIO", "1.5", "otel.sample_ratio: must be 0.0..=1.0"),
            ("HERALD_OTEL__SAMPLE_RATIO", "-0.1", "otel.sample_ratio: must be 0.0..=1.0"),
            ("HERALD_OTEL__SAMPLE_RATIO", "half", "expected a number"),
            ("HERALD_OTEL__SAMPLE_RATIO", "NaN", "expected a number"),
            ("HERALD_OTEL__ENDPOINT", "collector:4318", "otel.endpoint: expected an http:// or https:// URL"),
            ("HERALD_OTEL__ENDPOINT", "http://c:4318/v1/traces", "otel.endpoint: give the collector's base URL"),
            ("HERALD_OTEL__TIMEOUT_MS", "0", "otel.timeout_ms: must be 100..=60000"),
            ("HERALD_OTEL__BATCH_DELAY_MS", "1", "otel.batch_delay_ms: must be 10..=60000"),
            ("HERALD_OTEL__HEADERS", "no-equals-sign", "otel.headers: expected name=value"),
            ("HERALD_OTEL__HEADERS", "bad name=x", "otel.headers: \"bad name\" is not an HTTP header name"),
        ] {
            let err = otel(&[(var, value)]).unwrap_err();
            assert!(err.contains(expected), "{var}={value}: {err}");
        }
    }

    #[test]
    fn headers_are_parsed_and_their_values_never_shown() {
        let cfg = otel(&[("HERALD_OTEL__HEADERS", "X-Api-Key=s3cr3t-value, x-tenant = t1")]).unwrap();
        assert_eq!(
            cfg.header_pairs().unwrap(),
            vec![("x-api-key".into(), "s3cr3t-value".into()), ("x-tenant".into(), "t1".into())]
        );
        assert!(!format!("{cfg:?}").contains("s3cr3t"), "the headers are a secret");
        let err = otel(&[("HERALD_OTEL__HEADERS", "x-api-key=s3cr3t\nvalue")]).unwrap_err();
        assert!(err.contains("otel.headers") && !err.contains("s3cr3t"), "{err}");
    }
}
