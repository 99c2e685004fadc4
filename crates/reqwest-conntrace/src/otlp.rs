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
//! every span and event from the HTTP/gRPC/TLS stack's crates and every
//! bridged `log` record (see [`tracing_layer`]).
//!
//! Set-up paths:
//! - no `tracing` subscriber yet: [`init_from_env`];
//! - the application has its own subscriber: [`init_providers_from_env`],
//!   then add [`OtlpGuard::tracing_layer`] to the subscriber;
//! - the application has its own OpenTelemetry SDK set-up: [`tracing_layer`]
//!   with its tracer provider, and
//!   [`ConnTraceBuilder`](crate::ConnTraceBuilder)'s `tracer_provider` /
//!   `meter_provider`; or [`pipeline`] / [`pipeline_to`] /
//!   [`pipeline_from_env`], which install nothing.
//!
//! The collector failing never holds the application: flush and shutdown
//! return within the export timeout plus [`SHUTDOWN_MARGIN`] whatever the
//! collector does, the span queue is bounded, and what was delivered and
//! lost is counted ([`OtlpGuard::stats`]).

mod bounded;
mod stats;

pub use stats::{ExportFailure, ExportStats, FailureKind, Signal};

use std::sync::Arc;
use std::time::{Duration, Instant};

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{
    MetricExporter, Protocol, SpanExporter, WithExportConfig, WithTonicConfig,
};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::metrics::exporter::PushMetricExporter;
use opentelemetry_sdk::metrics::{PeriodicReader, SdkMeterProvider};
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, BatchSpanProcessor, SdkTracerProvider, SpanExporter as SdkSpanExporter,
};
use tracing_subscriber::filter::{FilterExt as _, LevelFilter, Targets, filter_fn};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

use bounded::{
    BoundedMetricExporter, BoundedSpanExporter, CountingProcessor, DEADLINE_SLACK, ExportRuntime,
    Shared,
};

/// How long flush and shutdown may take beyond the export timeout: the
/// per-export slack (250 ms past the timeout) plus 250 ms for the SDK's
/// threads to hand results back. Flush and shutdown return within
/// `export timeout + SHUTDOWN_MARGIN` whatever the collector does.
pub const SHUTDOWN_MARGIN: Duration = Duration::from_millis(500);

/// Export timeout when neither the options nor the environment set one:
/// 10 s (OTLP exporter specification's default for `OTEL_EXPORTER_OTLP_TIMEOUT`).
pub const DEFAULT_EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// Span queue capacity when `OTEL_BSP_MAX_QUEUE_SIZE` is unset: 2048 (the
/// OpenTelemetry SDK specification's default).
pub const DEFAULT_MAX_QUEUE_SIZE: usize = 2048;

/// Why the pipeline could not be set up or flushed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OtlpError {
    /// `OTEL_EXPORTER_OTLP_PROTOCOL` holds a value other than `grpc` or
    /// `http/protobuf`.
    #[error("unsupported OTEL_EXPORTER_OTLP_PROTOCOL {0:?}: use grpc or http/protobuf")]
    UnsupportedProtocol(String),
    /// The exporter could not be built (e.g. an invalid endpoint URL), or
    /// the pipeline's export thread could not start.
    #[error("OTLP exporter: {0}")]
    Exporter(String),
    /// A global `tracing` subscriber was already installed: use
    /// [`init_providers_from_env`] and add [`OtlpGuard::tracing_layer`] to
    /// your subscriber instead.
    #[error(
        "a global tracing subscriber is already installed: use otlp::init_providers_from_env and add guard.tracing_layer() to your subscriber"
    )]
    SubscriberAlreadySet,
    /// A [`ConnTrace`](crate::ConnTrace) was built with the global meter
    /// provider before this pipeline installed its own: its metrics would
    /// go nowhere. Build the handle after the pipeline, or give it the
    /// guard's provider with
    /// [`ConnTraceBuilder::meter_provider`](crate::ConnTraceBuilder::meter_provider).
    #[error(
        "{0} ConnTrace handle(s) were built before the OTLP pipeline and would export no metrics: build ConnTrace after otlp::init_* (or pass .meter_provider(guard.meter_provider()))"
    )]
    BuiltBeforePipeline(usize),
    /// Spans or metrics could not be delivered: `detail` says what happened
    /// and how long was waited (see [`ExportFailure`]); `collector` is the
    /// endpoint when the pipeline built its exporters itself.
    #[error(
        "could not export to the OTLP collector{}: {detail}",
        .collector.as_deref().map(|c| format!(" at {c}")).unwrap_or_default()
    )]
    Export {
        /// The collector's endpoint, when known.
        collector: Option<String>,
        /// What happened, on one line.
        detail: String,
    },
}

/// Longest a flush waits for connection spans still ending
/// ([`wait_for_pending_spans`](crate::wait_for_pending_spans)).
const PENDING_SPANS_WAIT: Duration = Duration::from_secs(2);

/// Keeps the pipeline alive; flushes and shuts the tracer and meter
/// providers down when dropped (errors are then ignored: call
/// [`shutdown`](Self::shutdown) to see them).
///
/// Flush and shutdown are bounded: each returns within the export timeout
/// plus [`SHUTDOWN_MARGIN`], whatever the collector does (unreachable,
/// refusing, accepting and never answering, answering errors). What was
/// delivered and lost is counted: [`stats`](Self::stats).
#[derive(Debug)]
pub struct OtlpGuard {
    provider: Option<SdkTracerProvider>,
    meter_provider: Option<SdkMeterProvider>,
    shared: Arc<Shared>,
    runtime: ExportRuntime,
    closed: bool,
    /// The collector's endpoint, when the pipeline built its exporters.
    collector: Option<String>,
}

impl OtlpGuard {
    /// The tracer provider, e.g. for [`ConnTraceBuilder::tracer_provider`](crate::ConnTraceBuilder::tracer_provider).
    pub fn tracer_provider(&self) -> Option<&SdkTracerProvider> {
        self.provider.as_ref()
    }

    /// The meter provider, when metrics are exported (e.g. for
    /// [`ConnTraceBuilder::meter_provider`](crate::ConnTraceBuilder::meter_provider)).
    pub fn meter_provider(&self) -> Option<&SdkMeterProvider> {
        self.meter_provider.as_ref()
    }

    /// The `tracing` layer that sends request spans to this pipeline (see
    /// [`tracing_layer`]), for an application that installs its own
    /// subscriber. A no-op layer once the guard is shut down.
    pub fn tracing_layer<S>(&self) -> Option<impl Layer<S> + Send + Sync + 'static>
    where
        S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a> + Send + Sync,
    {
        self.provider.as_ref().map(tracing_layer)
    }

    /// The counts of spans and metric exports delivered and lost so far.
    pub fn stats(&self) -> ExportStats {
        self.shared.stats()
    }

    /// The collector's endpoint, when the pipeline built its exporters
    /// ([`pipeline_to`], the `*_from_env` functions with gRPC).
    pub fn collector(&self) -> Option<&str> {
        self.collector.as_deref()
    }

    /// The export timeout the deadlines derive from.
    pub fn export_timeout(&self) -> Duration {
        self.shared.timeout()
    }

    /// Exports every span ended so far and the current metric values,
    /// after waiting (at most 2 s) for connection spans still waiting for
    /// the kernel's answer ([`wait_for_pending_spans`](crate::wait_for_pending_spans)).
    /// Returns within that wait plus the export timeout plus
    /// [`SHUTDOWN_MARGIN`].
    ///
    /// # Errors
    /// [`OtlpError::Export`] when the collector did not take them, or
    /// anything was lost while the flush ran.
    pub fn flush(&self) -> Result<(), OtlpError> {
        // Connection spans still waiting for the kernel's answer end first.
        crate::wait_for_pending_spans(PENDING_SPANS_WAIT);
        let span_provider = self.provider.clone();
        let meter_provider = self.meter_provider.clone();
        self.bounded(
            move || span_provider.map_or(Ok(()), |p| p.force_flush()),
            move || meter_provider.map_or(Ok(()), |m| m.force_flush()),
            false,
        )
    }

    /// Flushes and shuts the pipeline down, after waiting (at most 2 s,
    /// usually microseconds) for spans still waiting on the kernel's answer
    /// ([`wait_for_pending_spans`](crate::wait_for_pending_spans)); then
    /// returns within the export timeout plus [`SHUTDOWN_MARGIN`]. Spans still queued when that
    /// deadline passes are counted as dropped. [`stats`](Self::stats) then
    /// holds the final counts. Calling it again does nothing.
    ///
    /// # Errors
    /// [`OtlpError::Export`] when anything was lost during the pipeline's
    /// life (a span, or a metric export failed), naming the last failure;
    /// [`stats`](Self::stats) has the counts.
    pub fn close(&mut self) -> Result<(), OtlpError> {
        if self.closed {
            return Ok(());
        }
        self.closed = true;
        // Connection spans (and request spans whose miss reason waits on the
        // kernel's answer) end first, so none is lost to the shutdown.
        crate::wait_for_pending_spans(PENDING_SPANS_WAIT);
        let wait = self.shared.timeout() + DEADLINE_SLACK;
        let span_provider = self.provider.clone();
        let meter_provider = self.meter_provider.clone();
        let result = self.bounded(
            move || span_provider.map_or(Ok(()), |p| p.shutdown_with_timeout(wait)),
            move || meter_provider.map_or(Ok(()), |m| m.shutdown_with_timeout(wait)),
            true,
        );
        self.runtime.stop();
        result
    }

    /// [`close`](Self::close), consuming the guard.
    ///
    /// # Errors
    /// As [`close`](Self::close).
    pub fn shutdown(mut self) -> Result<(), OtlpError> {
        self.close()
    }

    /// Runs the span and metric operations side by side, each on its own
    /// thread, with every export cut off at the deadline; waits at most
    /// the timeout plus [`SHUTDOWN_MARGIN`].
    fn bounded(
        &self,
        spans: impl FnOnce() -> opentelemetry_sdk::error::OTelSdkResult + Send + 'static,
        metrics: impl FnOnce() -> opentelemetry_sdk::error::OTelSdkResult + Send + 'static,
        closing: bool,
    ) -> Result<(), OtlpError> {
        let start = Instant::now();
        let timeout = self.shared.timeout();
        let limit = start + timeout + SHUTDOWN_MARGIN;
        // Shutdown answers for the pipeline's whole life, flush for itself.
        let before = if closing {
            ExportStats::default()
        } else {
            self.shared.stats()
        };
        self.shared
            .set_cutoff(Some(start + timeout + DEADLINE_SLACK));
        let (tx, rx) = std::sync::mpsc::channel();
        let tx2 = tx.clone();
        let spawned = [
            std::thread::Builder::new()
                .name("otlp-flush-spans".to_owned())
                .spawn(move || {
                    let _ = tx.send(spans());
                }),
            std::thread::Builder::new()
                .name("otlp-flush-metrics".to_owned())
                .spawn(move || {
                    let _ = tx2.send(metrics());
                }),
        ];
        let mut first_error = None;
        let mut pending = spawned.iter().filter(|s| s.is_ok()).count();
        while pending > 0 {
            let left = limit.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    first_error.get_or_insert(e.to_string());
                }
                Err(_) => {
                    first_error.get_or_insert(format!(
                        "not finished within {:.1} s",
                        (timeout + SHUTDOWN_MARGIN).as_secs_f64()
                    ));
                    break;
                }
            }
            pending -= 1;
        }
        if closing {
            // Let exports cut off at the deadline count their spans.
            while self.shared.in_flight() > 0 && Instant::now() < limit {
                std::thread::sleep(Duration::from_millis(5));
            }
            self.shared.drop_queued();
        } else {
            self.shared.set_cutoff(None);
        }
        // The SDK reports only its last export's result: losses earlier in
        // the run (or a batch cut before it ran) count as failures too.
        let after = self.shared.stats();
        if after.spans_lost() > before.spans_lost()
            || after.metric_exports_failed > before.metric_exports_failed
        {
            first_error.get_or_insert_with(|| after.summary());
        }
        match first_error {
            None => Ok(()),
            Some(sdk) => Err(OtlpError::Export {
                collector: self.collector.clone(),
                detail: self
                    .shared
                    .stats()
                    .last_failure
                    .map_or(sdk, |f| f.to_string()),
            }),
        }
    }
}

impl Drop for OtlpGuard {
    fn drop(&mut self) {
        let _ = self.close();
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

/// The export timeout the environment sets for `signal`:
/// `OTEL_EXPORTER_OTLP_TRACES_TIMEOUT` (or `..._METRICS_TIMEOUT`), else
/// `OTEL_EXPORTER_OTLP_TIMEOUT`, in milliseconds; `None` when neither is set
/// to a number.
pub fn export_timeout_from_env(signal: Signal) -> Option<Duration> {
    let signal_key = match signal {
        Signal::Traces => "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT",
        Signal::Metrics => "OTEL_EXPORTER_OTLP_METRICS_TIMEOUT",
    };
    [signal_key, "OTEL_EXPORTER_OTLP_TIMEOUT"]
        .iter()
        .find_map(|k| std::env::var(k).ok()?.trim().parse::<u64>().ok())
        .map(Duration::from_millis)
}

/// The gRPC channel to the collector the environment names
/// (`signal_key`, else `OTEL_EXPORTER_OTLP_ENDPOINT`, else
/// `http://localhost:4317`), with `timeout` on the TCP connect as well as
/// on each request (the exporter's own channel has no connect timeout, so a
/// blackholed collector held each export for the kernel's SYN retries,
/// about 127 s on Linux). Connects lazily, on the current tokio runtime.
fn grpc_channel(
    signal_key: &str,
    timeout: Duration,
) -> Result<tonic::transport::Channel, OtlpError> {
    let endpoint = [signal_key, "OTEL_EXPORTER_OTLP_ENDPOINT"]
        .iter()
        .filter_map(|k| std::env::var(k).ok())
        .find(|v| !v.trim().is_empty())
        .unwrap_or_else(|| "http://localhost:4317".to_owned());
    grpc_channel_to(&endpoint, timeout)
}

/// The gRPC channel to `endpoint`; see [`grpc_channel`].
fn grpc_channel_to(
    endpoint: &str,
    timeout: Duration,
) -> Result<tonic::transport::Channel, OtlpError> {
    let endpoint = endpoint.trim().to_owned();
    if endpoint.starts_with("https://") {
        return Err(OtlpError::Exporter(format!(
            "{endpoint}: this build's OTLP exporter has no TLS; export over http:// to a local collector that forwards over TLS"
        )));
    }
    let built = tonic::transport::Endpoint::from_shared(endpoint.clone())
        .map_err(|e| OtlpError::Exporter(format!("invalid endpoint {endpoint:?}: {e}")))?;
    Ok(built
        .connect_timeout(timeout)
        .timeout(timeout)
        .connect_lazy())
}

/// Builds the OTLP metric exporter the environment describes (cumulative
/// temporality), with the environment's export timeout or
/// [`DEFAULT_EXPORT_TIMEOUT`].
///
/// # Errors
/// As [`metrics_protocol_from_env`], or [`OtlpError::Exporter`].
pub fn metric_exporter_from_env() -> Result<MetricExporter, OtlpError> {
    metric_exporter_with_timeout(
        export_timeout_from_env(Signal::Metrics).unwrap_or(DEFAULT_EXPORT_TIMEOUT),
    )
}

/// As [`metric_exporter_from_env`] with `timeout` for connect and export
/// (gRPC: on the TCP connect and each request; HTTP: the whole request).
/// Call it inside a tokio runtime when the protocol is gRPC.
///
/// # Errors
/// As [`metric_exporter_from_env`].
pub fn metric_exporter_with_timeout(timeout: Duration) -> Result<MetricExporter, OtlpError> {
    let built = match metrics_protocol_from_env()? {
        Protocol::Grpc => MetricExporter::builder()
            .with_tonic()
            .with_channel(grpc_channel(
                "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
                timeout,
            )?)
            .with_timeout(timeout)
            .build(),
        _ => {
            install_ring_for_http_exporter();
            MetricExporter::builder()
                .with_http()
                .with_protocol(Protocol::HttpBinary)
                .with_timeout(timeout)
                .build()
        }
    };
    built.map_err(|e| OtlpError::Exporter(e.to_string()))
}

/// Builds the OTLP span exporter the environment describes, with the
/// environment's export timeout or [`DEFAULT_EXPORT_TIMEOUT`].
///
/// # Errors
/// As [`protocol_from_env`], or [`OtlpError::Exporter`].
pub fn span_exporter_from_env() -> Result<SpanExporter, OtlpError> {
    span_exporter_with_timeout(
        export_timeout_from_env(Signal::Traces).unwrap_or(DEFAULT_EXPORT_TIMEOUT),
    )
}

/// As [`span_exporter_from_env`] with `timeout` for connect and export.
/// Call it inside a tokio runtime when the protocol is gRPC.
///
/// # Errors
/// As [`span_exporter_from_env`].
pub fn span_exporter_with_timeout(timeout: Duration) -> Result<SpanExporter, OtlpError> {
    let built = match protocol_from_env()? {
        Protocol::Grpc => SpanExporter::builder()
            .with_tonic()
            .with_channel(grpc_channel("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", timeout)?)
            .with_timeout(timeout)
            .build(),
        _ => {
            install_ring_for_http_exporter();
            SpanExporter::builder()
                .with_http()
                .with_protocol(Protocol::HttpBinary)
                .with_timeout(timeout)
                .build()
        }
    };
    built.map_err(|e| OtlpError::Exporter(e.to_string()))
}

/// Path 1, no subscriber yet: sets up the whole pipeline from the
/// environment and installs it process-wide; see the module docs. Needs no
/// tokio runtime (the exporters run on the pipeline's own thread).
///
/// # Errors
/// [`OtlpError`] when the protocol or endpoint is invalid, a global
/// subscriber exists ([`OtlpError::SubscriberAlreadySet`]) or a
/// [`ConnTrace`](crate::ConnTrace) was built first
/// ([`OtlpError::BuiltBeforePipeline`]).
pub fn init_from_env() -> Result<OtlpGuard, OtlpError> {
    init_from_env_with(PipelineOptions::default())
}

/// As [`init_from_env`], set up as `options` say.
///
/// # Errors
/// As [`init_from_env`].
pub fn init_from_env_with(options: PipelineOptions) -> Result<OtlpGuard, OtlpError> {
    let guard = pipeline_from_env(options.clone())?;
    install(guard, options, true)
}

/// Path 2, the application already has a `tracing` subscriber: sets up the
/// pipeline from the environment and installs the tracer provider, meter
/// provider (so [`ConnTrace::new`](crate::ConnTrace::new) records metrics
/// there) and W3C propagator process-wide, but no subscriber. Add
/// [`OtlpGuard::tracing_layer`] to your subscriber:
///
/// ```no_run
/// use tracing_subscriber::layer::SubscriberExt as _;
/// use tracing_subscriber::util::SubscriberInitExt as _;
/// # fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let guard = reqwest_conntrace::otlp::init_providers_from_env(Default::default())?;
/// tracing_subscriber::registry()
///     .with(tracing_subscriber::fmt::layer())
///     .with(guard.tracing_layer())
///     .init();
/// let conntrace = reqwest_conntrace::ConnTrace::new();
/// # Ok(()) }
/// ```
///
/// # Errors
/// As [`init_from_env`], except that an existing subscriber is fine.
pub fn init_providers_from_env(options: PipelineOptions) -> Result<OtlpGuard, OtlpError> {
    let guard = pipeline_from_env(options.clone())?;
    install(guard, options, false)
}

/// Builds the pipeline from the environment without installing anything.
///
/// # Errors
/// As [`init_from_env`].
pub fn pipeline_from_env(options: PipelineOptions) -> Result<OtlpGuard, OtlpError> {
    let runtime = ExportRuntime::start().map_err(|e| OtlpError::Exporter(e.to_string()))?;
    let (spans, metrics) = {
        // The gRPC channels' connections live on the pipeline's runtime.
        let _entered = runtime.handle().enter();
        let span_timeout = options
            .export_timeout
            .or_else(|| export_timeout_from_env(Signal::Traces))
            .unwrap_or(DEFAULT_EXPORT_TIMEOUT);
        let metric_timeout = options
            .export_timeout
            .or_else(|| export_timeout_from_env(Signal::Metrics))
            .unwrap_or(DEFAULT_EXPORT_TIMEOUT);
        (
            span_exporter_with_timeout(span_timeout)?,
            metric_exporter_with_timeout(metric_timeout)?,
        )
    };
    let mut guard = build(runtime, spans, Some(metrics), &options);
    guard.collector = traces_endpoint_from_env();
    Ok(guard)
}

/// The traces endpoint the environment names (signal variable, then the
/// generic one), if any.
fn traces_endpoint_from_env() -> Option<String> {
    [
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        "OTEL_EXPORTER_OTLP_ENDPOINT",
    ]
    .iter()
    .filter_map(|k| std::env::var(k).ok())
    .map(|v| v.trim().to_owned())
    .find(|v| !v.is_empty())
}

/// Path 3 with an explicit collector: the pipeline exporting spans and
/// metrics over OTLP/gRPC to `endpoint` (`http://host:port`), with the
/// options' export timeout on connect and export; installs nothing.
///
/// # Errors
/// [`OtlpError::Exporter`] for an invalid or `https` endpoint, or when the
/// export thread cannot start.
pub fn pipeline_to(endpoint: &str, options: PipelineOptions) -> Result<OtlpGuard, OtlpError> {
    let runtime = ExportRuntime::start().map_err(|e| OtlpError::Exporter(e.to_string()))?;
    let timeout = options.export_timeout.unwrap_or(DEFAULT_EXPORT_TIMEOUT);
    let (spans, metrics) = {
        let _entered = runtime.handle().enter();
        let spans = SpanExporter::builder()
            .with_tonic()
            .with_channel(grpc_channel_to(endpoint, timeout)?)
            .with_timeout(timeout)
            .build()
            .map_err(|e| OtlpError::Exporter(e.to_string()))?;
        let metrics = MetricExporter::builder()
            .with_tonic()
            .with_channel(grpc_channel_to(endpoint, timeout)?)
            .with_timeout(timeout)
            .build()
            .map_err(|e| OtlpError::Exporter(e.to_string()))?;
        (spans, metrics)
    };
    let mut guard = build(runtime, spans, Some(metrics), &options);
    guard.collector = Some(endpoint.trim().to_owned());
    Ok(guard)
}

/// As [`init_from_env`] but with any span exporter (an in-memory one in
/// tests, a file writer in `conntrace demo`).
///
/// # Errors
/// [`OtlpError::SubscriberAlreadySet`], [`OtlpError::BuiltBeforePipeline`].
pub fn init_with_exporter<E: SdkSpanExporter + 'static>(
    exporter: E,
) -> Result<OtlpGuard, OtlpError> {
    init_with_exporters::<E, MetricExporter>(exporter, None, PipelineOptions::default())
}

/// Options of the pipeline set-up functions.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct PipelineOptions {
    resource: Resource,
    metric_interval: Option<Duration>,
    default_log_level: String,
    export_timeout: Option<Duration>,
    max_queue_size: Option<usize>,
}

impl Default for PipelineOptions {
    fn default() -> Self {
        Self {
            resource: Resource::builder().build(),
            metric_interval: None,
            default_log_level: "warn".to_owned(),
            export_timeout: None,
            max_queue_size: None,
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

    /// The export timeout: exporters built from the environment use it
    /// for connect and export, and every export (retries included), flush
    /// and shutdown is cut at it (plus [`SHUTDOWN_MARGIN`]). Give the
    /// timeout your own exporters use. Default: `None`, i.e.
    /// `OTEL_EXPORTER_OTLP_TRACES_TIMEOUT` / `..._METRICS_TIMEOUT` /
    /// `OTEL_EXPORTER_OTLP_TIMEOUT` ms, else [`DEFAULT_EXPORT_TIMEOUT`] (10 s).
    pub fn export_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.export_timeout = timeout;
        self
    }

    /// How many ended spans wait for export at most; beyond it spans are
    /// dropped and counted ([`ExportStats::spans_dropped`]), so memory
    /// stays bounded while the collector is unreachable. Default: `None`,
    /// i.e. `OTEL_BSP_MAX_QUEUE_SIZE`, else [`DEFAULT_MAX_QUEUE_SIZE`] (2048).
    pub fn max_queue_size(mut self, spans: Option<usize>) -> Self {
        self.max_queue_size = spans;
        self
    }
}

/// As [`init_from_env`] with any span exporter and, when given, any metric
/// exporter (read by a periodic reader; the meter provider is installed
/// globally), set up as `options` say.
///
/// # Errors
/// [`OtlpError::SubscriberAlreadySet`], [`OtlpError::BuiltBeforePipeline`],
/// [`OtlpError::Exporter`] when the export thread cannot start.
pub fn init_with_exporters<E, M>(
    exporter: E,
    metrics: Option<M>,
    options: PipelineOptions,
) -> Result<OtlpGuard, OtlpError>
where
    E: SdkSpanExporter + 'static,
    M: PushMetricExporter,
{
    let guard = pipeline(exporter, metrics, options.clone())?;
    install(guard, options, true)
}

/// Path 3, the application has its own OpenTelemetry set-up, or wants no
/// process-wide state: builds the pipeline around `exporter` (and
/// `metrics`) and installs nothing. Hand the providers to
/// [`ConnTraceBuilder::tracer_provider`](crate::ConnTraceBuilder::tracer_provider)
/// and [`ConnTraceBuilder::meter_provider`](crate::ConnTraceBuilder::meter_provider),
/// and [`OtlpGuard::tracing_layer`] to your subscriber.
///
/// # Errors
/// [`OtlpError::Exporter`] when the export thread cannot start.
pub fn pipeline<E, M>(
    exporter: E,
    metrics: Option<M>,
    options: PipelineOptions,
) -> Result<OtlpGuard, OtlpError>
where
    E: SdkSpanExporter + 'static,
    M: PushMetricExporter,
{
    let runtime = ExportRuntime::start().map_err(|e| OtlpError::Exporter(e.to_string()))?;
    Ok(build(runtime, exporter, metrics, &options))
}

/// The span queue capacity: `OTEL_BSP_MAX_QUEUE_SIZE`, else
/// [`DEFAULT_MAX_QUEUE_SIZE`].
fn max_queue_size() -> usize {
    std::env::var("OTEL_BSP_MAX_QUEUE_SIZE")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .filter(|&n: &usize| n > 0)
        .unwrap_or(DEFAULT_MAX_QUEUE_SIZE)
}

/// The providers around the bounded, counting exporters.
fn build<E, M>(
    runtime: ExportRuntime,
    exporter: E,
    metrics: Option<M>,
    options: &PipelineOptions,
) -> OtlpGuard
where
    E: SdkSpanExporter + 'static,
    M: PushMetricExporter,
{
    let timeout = options
        .export_timeout
        .or_else(|| {
            let spans = export_timeout_from_env(Signal::Traces)?;
            let metrics = export_timeout_from_env(Signal::Metrics)?;
            Some(spans.max(metrics))
        })
        .unwrap_or(DEFAULT_EXPORT_TIMEOUT);
    let max_queue = options
        .max_queue_size
        .filter(|&n| n > 0)
        .unwrap_or_else(max_queue_size);
    let shared = Arc::new(Shared::new(timeout, runtime.handle().clone(), max_queue));
    let meter_provider = metrics.map(|m| {
        let m = BoundedMetricExporter::new(m, shared.clone());
        SdkMeterProvider::builder()
            .with_resource(options.resource.clone())
            .with_reader(match options.metric_interval {
                Some(interval) => PeriodicReader::builder(m).with_interval(interval).build(),
                None => PeriodicReader::builder(m).build(),
            })
            .build()
    });
    let batch = BatchSpanProcessor::builder(BoundedSpanExporter::new(exporter, shared.clone()))
        .with_batch_config(
            BatchConfigBuilder::default()
                .with_max_queue_size(max_queue)
                .with_max_export_batch_size(max_queue.min(512))
                .build(),
        )
        .build();
    let provider = SdkTracerProvider::builder()
        .with_resource(options.resource.clone())
        .with_sampler(crate::KeepConnectionSetups::from_env())
        .with_span_processor(CountingProcessor::new(batch, shared.clone()))
        .build();
    OtlpGuard {
        provider: Some(provider),
        meter_provider,
        shared,
        runtime,
        closed: false,
        collector: None,
    }
}

/// Installs `guard`'s providers (and, with `subscriber`, a `tracing`
/// subscriber) process-wide.
fn install(
    guard: OtlpGuard,
    options: PipelineOptions,
    subscriber: bool,
) -> Result<OtlpGuard, OtlpError> {
    let built_before = crate::handle::handles_on_global_meter();
    if built_before > 0 && guard.meter_provider.is_some() {
        return Err(OtlpError::BuiltBeforePipeline(built_before));
    }
    let Some(provider) = guard.provider.clone() else {
        return Ok(guard);
    };
    if subscriber {
        let log_filter = EnvFilter::try_from_default_env()
            .unwrap_or_else(|_| EnvFilter::new(options.default_log_level.as_str()));
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
    }
    opentelemetry::global::set_text_map_propagator(
        opentelemetry_sdk::propagation::TraceContextPropagator::new(),
    );
    opentelemetry::global::set_tracer_provider(provider);
    if let Some(m) = &guard.meter_provider {
        opentelemetry::global::set_meter_provider(m.clone());
        crate::handle::global_meter_installed();
    }
    Ok(guard)
}

/// The crates whose spans and events never reach the OpenTelemetry layer:
/// the HTTP/gRPC/TLS stack (the exporter's own traffic, and the log records
/// of rustls, hyper and h2) and the OpenTelemetry crates themselves.
const QUIET_TARGETS: [&str; 12] = [
    "h2",
    "hyper",
    "hyper_util",
    "tonic",
    "tower",
    "reqwest",
    "rustls",
    "tokio_rustls",
    "rustls_platform_verifier",
    "opentelemetry",
    "opentelemetry_sdk",
    "opentelemetry_otlp",
];

/// Whether `metadata` is a `log` crate record bridged into `tracing`
/// (`tracing-log`, on with tracing-subscriber's default features): such
/// records carry a `log.target` field.
fn is_log_record(metadata: &tracing::Metadata<'_>) -> bool {
    metadata.fields().field("log.target").is_some() || metadata.target() == "log"
}

/// The `tracing-opentelemetry` layer for `provider`, set up for this crate:
///
/// - spans of the HTTP/gRPC/TLS stack (the exporter's own traffic) never
///   become OpenTelemetry spans, and their events and every `log` record
///   bridged into `tracing` (rustls' ClientHello dumps, hyper's and h2's
///   debug lines) never become events on request spans, whatever features
///   the application's `tracing-subscriber` has;
/// - none of `tracing-opentelemetry`'s default extra attributes:
///   `code.file.path`, `code.line.number`, `code.module.name` (location),
///   `thread.id`, `thread.name` (threads), `busy_ns`, `idle_ns` (inactivity
///   tracking) and `target`.
///
/// Use it when composing your own subscriber.
pub fn tracing_layer<S>(provider: &SdkTracerProvider) -> impl Layer<S> + Send + Sync + 'static
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a> + Send + Sync,
{
    // Targets match by prefix: keep this crate and reqwest-tracing.
    let quiet = QUIET_TARGETS
        .iter()
        .fold(
            Targets::new().with_default(LevelFilter::TRACE),
            |t, target| t.with_target(*target, LevelFilter::OFF),
        )
        .with_target("reqwest_conntrace", LevelFilter::TRACE)
        .with_target("reqwest_tracing", LevelFilter::TRACE);
    tracing_opentelemetry::layer()
        .with_tracer(provider.tracer("reqwest-conntrace"))
        .with_location(false)
        .with_threads(false)
        .with_tracked_inactivity(false)
        .with_target(false)
        .with_filter(quiet.and(filter_fn(|metadata| !is_log_record(metadata))))
}
