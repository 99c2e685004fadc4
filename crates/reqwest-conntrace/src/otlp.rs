//! OTLP pipeline set-up from the standard `OTEL_*` environment variables
//! (feature `otlp`).
//!
//! [`init_from_env`] installs, process-wide:
//! - an OpenTelemetry tracer provider with a batch span processor and an
//!   OTLP exporter. Read by the SDK and exporter: `OTEL_EXPORTER_OTLP_ENDPOINT`
//!   / `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` (default `http://localhost:4317`
//!   for gRPC, `http://localhost:4318` for HTTP), `OTEL_EXPORTER_OTLP_TIMEOUT`,
//!   `OTEL_EXPORTER_OTLP_HEADERS`, `OTEL_SERVICE_NAME`,
//!   `OTEL_RESOURCE_ATTRIBUTES`, `OTEL_TRACES_SAMPLER` and
//!   `OTEL_TRACES_SAMPLER_ARG` (that sampler decides every span but the
//!   connection setups, which [`KeepConnectionSetups`](crate::KeepConnectionSetups)
//!   always keeps: a setup whose request is not sampled becomes the root of
//!   its own trace, linked to the request). Read here: `OTEL_EXPORTER_OTLP_PROTOCOL` /
//!   `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`: `grpc` (default) or
//!   `http/protobuf` (OTLP exporter spec, OpenTelemetry specification 1.x;
//!   for `http/protobuf` the `ring` rustls provider is installed process-wide
//!   unless one already is, as the exporter's HTTP client needs one);
//! - an OpenTelemetry meter provider with a periodic reader and an OTLP
//!   metric exporter (cumulative temporality, what Prometheus expects),
//!   installed as the global meter provider, so a [`ConnTrace`](crate::ConnTrace)
//!   built afterwards records its metrics there. Read by the SDK and
//!   exporter: `OTEL_EXPORTER_OTLP_METRICS_ENDPOINT` (or the generic
//!   endpoint), `OTEL_METRIC_EXPORT_INTERVAL` (ms, default 60000); read
//!   here: `OTEL_EXPORTER_OTLP_METRICS_PROTOCOL` (or the generic protocol);
//! - the W3C trace-context propagator;
//! - a `tracing` subscriber: the `tracing-opentelemetry` layer (request
//!   spans) plus a stderr log layer filtered by `RUST_LOG` (default `warn`).
//!
//! The exporter's own traffic is never instrumented: it uses its own client
//! (not wrapped by this crate), and the `tracing-opentelemetry` layer drops
//! every span from the HTTP/gRPC stack's crates (`h2`, `hyper`,
//! `hyper_util`, `tonic`, `tower`, `reqwest`, `opentelemetry*`).

use std::time::Duration;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{MetricExporter, Protocol, SpanExporter, WithExportConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::metrics::exporter::PushMetricExporter;
use opentelemetry_sdk::metrics::{PeriodicReader, SdkMeterProvider};
use opentelemetry_sdk::trace::{SdkTracerProvider, SpanExporter as SdkSpanExporter};
use tracing_subscriber::filter::{LevelFilter, Targets};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

/// Why the pipeline could not be set up or flushed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OtlpError {
    /// `OTEL_EXPORTER_OTLP_PROTOCOL` holds a value other than `grpc` or
    /// `http/protobuf`.
    #[error("unsupported OTEL_EXPORTER_OTLP_PROTOCOL {0:?}: use grpc or http/protobuf")]
    UnsupportedProtocol(String),
    /// The exporter could not be built (e.g. an invalid endpoint URL).
    #[error("OTLP exporter: {0}")]
    Exporter(String),
    /// A global `tracing` subscriber was already installed.
    #[error("a global tracing subscriber is already installed")]
    SubscriberAlreadySet,
    /// Spans could not be delivered (collector down or unreachable).
    #[error("could not export to the OTLP collector: {0}")]
    Export(String),
}

/// Longest a flush waits for connection spans still ending
/// ([`wait_for_pending_spans`](crate::wait_for_pending_spans)).
const PENDING_SPANS_WAIT: Duration = Duration::from_secs(2);

/// Keeps the pipeline alive; flushes and shuts the tracer and meter
/// providers down when dropped (errors are then ignored: call
/// [`shutdown`](Self::shutdown) to see them).
#[derive(Debug)]
pub struct OtlpGuard {
    provider: Option<SdkTracerProvider>,
    meter_provider: Option<SdkMeterProvider>,
}

impl OtlpGuard {
    /// The tracer provider, e.g. for [`ConnTraceBuilder::tracer_provider`](crate::ConnTraceBuilder::tracer_provider).
    ///
    /// # Panics
    /// Never: the provider is present until the guard is consumed.
    pub fn tracer_provider(&self) -> Option<&SdkTracerProvider> {
        self.provider.as_ref()
    }

    /// The meter provider, when metrics are exported (e.g. for
    /// [`ConnTraceBuilder::meter_provider`](crate::ConnTraceBuilder::meter_provider)).
    pub fn meter_provider(&self) -> Option<&SdkMeterProvider> {
        self.meter_provider.as_ref()
    }

    /// Exports every span ended so far and the current metric values,
    /// after waiting (at most 2 s) for connection spans still waiting for
    /// the kernel's answer ([`wait_for_pending_spans`](crate::wait_for_pending_spans)).
    ///
    /// # Errors
    /// [`OtlpError::Export`] when the collector did not take them.
    pub fn flush(&self) -> Result<(), OtlpError> {
        // Connection spans still waiting for the kernel's answer end first.
        crate::wait_for_pending_spans(PENDING_SPANS_WAIT);
        let spans = match &self.provider {
            Some(p) => p
                .force_flush()
                .map_err(|e| OtlpError::Export(e.to_string())),
            None => Ok(()),
        };
        let metrics = match &self.meter_provider {
            Some(m) => m
                .force_flush()
                .map_err(|e| OtlpError::Export(e.to_string())),
            None => Ok(()),
        };
        spans.and(metrics)
    }

    /// Flushes and shuts the pipeline down.
    ///
    /// # Errors
    /// [`OtlpError::Export`] when the last spans or metrics could not be
    /// delivered.
    pub fn shutdown(mut self) -> Result<(), OtlpError> {
        let flushed = self.flush();
        self.close();
        flushed
    }

    fn close(&mut self) {
        if let Some(p) = self.provider.take() {
            let _ = p.shutdown_with_timeout(Duration::from_secs(5));
        }
        if let Some(m) = self.meter_provider.take() {
            let _ = m.shutdown_with_timeout(Duration::from_secs(5));
        }
    }
}

impl Drop for OtlpGuard {
    fn drop(&mut self) {
        let _ = self.flush();
        self.close();
    }
}

/// The protocol named by `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL` or
/// `OTEL_EXPORTER_OTLP_PROTOCOL`; `grpc` when neither is set.
///
/// # Errors
/// [`OtlpError::UnsupportedProtocol`] for any other value.
pub fn protocol_from_env() -> Result<Protocol, OtlpError> {
    signal_protocol_from_env("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
}

/// The protocol named by `signal_key` or `OTEL_EXPORTER_OTLP_PROTOCOL`;
/// `grpc` when neither is set.
fn signal_protocol_from_env(signal_key: &str) -> Result<Protocol, OtlpError> {
    let value = std::env::var(signal_key)
        .or_else(|_| std::env::var("OTEL_EXPORTER_OTLP_PROTOCOL"))
        .unwrap_or_else(|_| "grpc".to_owned());
    match value.trim() {
        "grpc" | "" => Ok(Protocol::Grpc),
        "http/protobuf" => Ok(Protocol::HttpBinary),
        other => Err(OtlpError::UnsupportedProtocol(other.to_owned())),
    }
}

/// The protocol for metrics: `OTEL_EXPORTER_OTLP_METRICS_PROTOCOL` or
/// `OTEL_EXPORTER_OTLP_PROTOCOL`; `grpc` when neither is set.
///
/// # Errors
/// [`OtlpError::UnsupportedProtocol`] for any other value.
pub fn metrics_protocol_from_env() -> Result<Protocol, OtlpError> {
    signal_protocol_from_env("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL")
}

fn install_ring_for_http_exporter() {
    // The exporter's own (uninstrumented) reqwest client needs a
    // process-wide rustls provider when reqwest is built without one;
    // install ring unless the application installed another.
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

/// Builds the OTLP metric exporter the environment describes (cumulative
/// temporality).
///
/// # Errors
/// As [`metrics_protocol_from_env`], or [`OtlpError::Exporter`].
pub fn metric_exporter_from_env() -> Result<MetricExporter, OtlpError> {
    let built = match metrics_protocol_from_env()? {
        Protocol::Grpc => MetricExporter::builder().with_tonic().build(),
        _ => {
            install_ring_for_http_exporter();
            MetricExporter::builder()
                .with_http()
                .with_protocol(Protocol::HttpBinary)
                .build()
        }
    };
    built.map_err(|e| OtlpError::Exporter(e.to_string()))
}

/// Builds the OTLP span exporter the environment describes.
///
/// # Errors
/// As [`protocol_from_env`], or [`OtlpError::Exporter`].
pub fn span_exporter_from_env() -> Result<SpanExporter, OtlpError> {
    let built = match protocol_from_env()? {
        Protocol::Grpc => SpanExporter::builder().with_tonic().build(),
        _ => {
            install_ring_for_http_exporter();
            SpanExporter::builder()
                .with_http()
                .with_protocol(Protocol::HttpBinary)
                .build()
        }
    };
    built.map_err(|e| OtlpError::Exporter(e.to_string()))
}

/// Sets up the whole pipeline from the environment; see the module docs.
/// Must be called inside a tokio runtime (the gRPC exporter needs one).
///
/// # Errors
/// [`OtlpError`] when the protocol or endpoint is invalid or a global
/// subscriber exists.
pub fn init_from_env() -> Result<OtlpGuard, OtlpError> {
    init_with_exporters(
        span_exporter_from_env()?,
        Some(metric_exporter_from_env()?),
        PipelineOptions::default(),
    )
}

/// As [`init_from_env`] but with any span exporter (an in-memory one in
/// tests, a file writer in `conntrace demo`).
///
/// # Errors
/// [`OtlpError::SubscriberAlreadySet`].
pub fn init_with_exporter<E: SdkSpanExporter + 'static>(
    exporter: E,
) -> Result<OtlpGuard, OtlpError> {
    init_with_exporters::<E, MetricExporter>(exporter, None, PipelineOptions::default())
}

/// Options of [`init_with_exporters`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct PipelineOptions {
    resource: Resource,
    metric_interval: Option<Duration>,
    default_log_level: String,
}

impl Default for PipelineOptions {
    fn default() -> Self {
        Self {
            resource: Resource::builder().build(),
            metric_interval: None,
            default_log_level: "warn".to_owned(),
        }
    }
}

impl PipelineOptions {
    /// The resource both providers report. Default:
    /// `Resource::builder().build()` (reads `OTEL_SERVICE_NAME` and
    /// `OTEL_RESOURCE_ATTRIBUTES`).
    pub fn resource(mut self, resource: Resource) -> Self {
        self.resource = resource;
        self
    }

    /// How often the periodic reader exports metrics. Default: `None`, i.e.
    /// `OTEL_METRIC_EXPORT_INTERVAL` ms, else the SDK's 60 s.
    pub fn metric_interval(mut self, interval: Option<Duration>) -> Self {
        self.metric_interval = interval;
        self
    }

    /// The stderr log layer's filter when `RUST_LOG` is unset (an
    /// `EnvFilter` directive such as `warn` or `off`; `off` also silences
    /// this crate's pool advice lines). Default: `warn`.
    pub fn default_log_level(mut self, directive: impl Into<String>) -> Self {
        self.default_log_level = directive.into();
        self
    }
}

/// As [`init_from_env`] with any span exporter and, when given, any metric
/// exporter (read by a periodic reader; the meter provider is installed
/// globally), set up as `options` say (resource, metric interval, default
/// log level).
///
/// # Errors
/// [`OtlpError::SubscriberAlreadySet`].
pub fn init_with_exporters<E, M>(
    exporter: E,
    metrics: Option<M>,
    options: PipelineOptions,
) -> Result<OtlpGuard, OtlpError>
where
    E: SdkSpanExporter + 'static,
    M: PushMetricExporter,
{
    let PipelineOptions {
        resource,
        metric_interval,
        default_log_level,
    } = options;
    let meter_provider = metrics.map(|m| {
        SdkMeterProvider::builder()
            .with_resource(resource.clone())
            .with_reader(match metric_interval {
                Some(interval) => PeriodicReader::builder(m).with_interval(interval).build(),
                None => PeriodicReader::builder(m).build(),
            })
            .build()
    });
    let provider = SdkTracerProvider::builder()
        .with_resource(resource)
        .with_sampler(crate::KeepConnectionSetups::from_env())
        .with_batch_exporter(exporter)
        .build();
    opentelemetry::global::set_text_map_propagator(
        opentelemetry_sdk::propagation::TraceContextPropagator::new(),
    );
    let log_filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new(default_log_level.as_str()));
    tracing_subscriber::registry()
        .with(tracing_layer(&provider))
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
                .with_filter(log_filter),
        )
        .try_init()
        .map_err(|_| OtlpError::SubscriberAlreadySet)?;
    opentelemetry::global::set_tracer_provider(provider.clone());
    if let Some(m) = &meter_provider {
        opentelemetry::global::set_meter_provider(m.clone());
    }
    Ok(OtlpGuard {
        provider: Some(provider),
        meter_provider,
    })
}

/// The `tracing-opentelemetry` layer for `provider`, filtered so that spans
/// of the HTTP/gRPC stack itself (the exporter's own traffic) never become
/// OpenTelemetry spans. Use it when composing your own subscriber.
pub fn tracing_layer<S>(provider: &SdkTracerProvider) -> impl Layer<S> + Send + Sync + 'static
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a> + Send + Sync,
{
    let quiet = Targets::new()
        .with_default(LevelFilter::TRACE)
        .with_target("h2", LevelFilter::OFF)
        .with_target("hyper", LevelFilter::OFF)
        .with_target("hyper_util", LevelFilter::OFF)
        .with_target("tonic", LevelFilter::OFF)
        .with_target("tower", LevelFilter::OFF)
        .with_target("reqwest", LevelFilter::OFF)
        // Targets match by prefix: keep this crate and reqwest-tracing.
        .with_target("reqwest_conntrace", LevelFilter::TRACE)
        .with_target("reqwest_tracing", LevelFilter::TRACE)
        .with_target("opentelemetry", LevelFilter::OFF)
        .with_target("opentelemetry_sdk", LevelFilter::OFF)
        .with_target("opentelemetry_otlp", LevelFilter::OFF);
    tracing_opentelemetry::layer()
        .with_tracer(provider.tracer("reqwest-conntrace"))
        .with_filter(quiet)
}
