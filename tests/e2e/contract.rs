//! The metrics contract: what the library exports, checked from both ends
//! (the SDK's output in `metrics.rs`, the Prometheus/Grafana files in
//! `deploy.rs`). The contract itself is the library's own table,
//! [`semconv::METRICS`](reqwest_conntrace::semconv::METRICS): names,
//! units, instruments and attribute keys, next to the name constants.

/// How an OTel instrument kind arrives in Prometheus.
pub(crate) use reqwest_conntrace::semconv::Instrument as Kind;
/// The OTLP metrics the library exports: the one list that `metrics.rs`
/// checks the exported metrics against and `deploy.rs` checks the
/// Prometheus rules and the Grafana dashboard against.
pub(crate) use reqwest_conntrace::semconv::METRICS as OTEL_METRICS;
/// One metric the library exports over OTLP.
pub(crate) use reqwest_conntrace::semconv::Metric as OtelMetric;
