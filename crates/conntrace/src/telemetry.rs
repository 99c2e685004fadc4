//! Where spans and metrics go: an OTLP collector when
//! `OTEL_EXPORTER_OTLP_ENDPOINT` (or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) is
//! set, else OTLP JSON files when the command asks for one (traces at the
//! given path, metrics beside it as `<stem>.metrics.json`), else nowhere.
//! Both go through `reqwest_conntrace::otlp::init_with_exporters`, the same
//! pipeline as `otlp::init_from_env`; the `ConnTrace` handle must be built
//! after [`Telemetry::init`] (it takes the global meter provider).
//!
//! Differences from `init_from_env`, both only when the variable is unset:
//! the export timeout defaults to [`DEFAULT_EXPORT_TIMEOUT`] instead of the
//! SDK's 10 s (`OTEL_EXPORTER_OTLP_TIMEOUT` /
//! `OTEL_EXPORTER_OTLP_TRACES_TIMEOUT` / `..._METRICS_TIMEOUT`, milliseconds,
//! still win), and the
//! resource's `service.name` is `conntrace` instead of `unknown_service`
//! (`OTEL_SERVICE_NAME` / `OTEL_RESOURCE_ATTRIBUTES` still win).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use opentelemetry_otlp::{MetricExporter, SpanExporter};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{SpanData, SpanExporter as SdkSpanExporter};
use reqwest_conntrace::otlp::{self, OtlpError, OtlpGuard};
use serde::Serialize;

use crate::export::{MemoryExporter, MetricStore, OutputFile, SpanStore};

/// Export timeout used when no `OTEL_EXPORTER_OTLP_*TIMEOUT` is set.
pub(crate) const DEFAULT_EXPORT_TIMEOUT: Duration = Duration::from_secs(3);

/// Metric export interval when `OTEL_METRIC_EXPORT_INTERVAL` is unset: 5 s.
pub(crate) const METRIC_EXPORT_INTERVAL: Duration = Duration::from_secs(5);

/// The service name used when the environment names none.
const SERVICE_NAME: &str = "conntrace";

/// The configured OTLP endpoint, if any.
pub(crate) fn otlp_endpoint() -> Option<String> {
    [
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        "OTEL_EXPORTER_OTLP_ENDPOINT",
    ]
    .iter()
    .filter_map(|k| std::env::var(k).ok())
    .find(|v| !v.trim().is_empty())
}

/// The endpoint variables the OTLP exporters read.
const ENDPOINT_VARIABLES: [&str; 3] = [
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
];

/// Checks every set OTLP endpoint variable: an `http://` or `https://` URL
/// with a host. (The exporter would otherwise take `not-a-url` for a host
/// name and complain about https.)
///
/// # Errors
/// One line naming the variable and its value.
fn check_endpoints() -> anyhow::Result<()> {
    for (key, value) in set_variables(&ENDPOINT_VARIABLES) {
        check_endpoint(key, &value)?;
    }
    Ok(())
}

/// The variables among `keys` set to a non-blank value, with that value.
fn set_variables<'a>(keys: &'a [&'a str]) -> impl Iterator<Item = (&'a str, String)> + 'a {
    keys.iter().filter_map(|key| {
        let value = std::env::var(key).ok()?;
        (!value.trim().is_empty()).then_some((*key, value))
    })
}

/// Checks the OTLP variables a run reads: the endpoints
/// ([`check_endpoints`]) and the millisecond values
/// ([`check_milliseconds`]).
///
/// # Errors
/// One line naming the first bad variable and its value.
pub(crate) fn check_otlp_variables() -> anyhow::Result<()> {
    check_endpoints()?;
    check_milliseconds()
}

/// The OTLP variables in milliseconds (OpenTelemetry's environment
/// variable specification: a non-negative integer).
const MILLISECOND_VARIABLES: [&str; 4] = [
    "OTEL_EXPORTER_OTLP_TIMEOUT",
    "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT",
    "OTEL_EXPORTER_OTLP_METRICS_TIMEOUT",
    "OTEL_METRIC_EXPORT_INTERVAL",
];

/// Checks every set OTLP millisecond variable (timeouts, the metric export
/// interval): a value that is not a whole number of milliseconds would be
/// ignored silently by the exporters.
///
/// # Errors
/// One line naming the variable and its value.
fn check_milliseconds() -> anyhow::Result<()> {
    for (key, value) in set_variables(&MILLISECOND_VARIABLES) {
        if value.trim().parse::<u64>().is_err() {
            anyhow::bail!("{key} {value:?} is not a whole number of milliseconds (e.g. 3000)");
        }
    }
    Ok(())
}

/// Checks one endpoint value; see [`check_endpoints`].
fn check_endpoint(key: &str, value: &str) -> anyhow::Result<()> {
    let valid = url::Url::parse(value.trim()).is_ok_and(|u| {
        matches!(u.scheme(), "http" | "https") && u.host_str().is_some_and(|h| !h.is_empty())
    });
    if !valid {
        anyhow::bail!("{key} {value:?} is not an http:// URL (e.g. http://localhost:4317)");
    }
    // This build's exporters have no TLS: say so here rather than let the
    // exporter suggest cargo features the user cannot enable.
    if value.trim().starts_with("https://") {
        anyhow::bail!(
            "{key} {value:?}: https endpoints are not supported by this build; export to a local collector over http:// (e.g. http://localhost:4317, see docker-compose.yml) and let it forward over TLS"
        );
    }
    Ok(())
}

/// Whether the environment variable `key` is set to a non-empty value.
fn env_set(key: &str) -> bool {
    std::env::var_os(key).is_some_and(|v| !v.is_empty())
}

/// The active span pipeline of a command run.
#[derive(Debug)]
pub(crate) struct Telemetry {
    /// The installed pipeline; `None` when spans go nowhere.
    guard: Option<OtlpGuard>,
    /// The OTLP endpoint, when exporting over OTLP.
    endpoint: Option<String>,
    /// The traces file (checked writable at the start) and the spans to
    /// write into it.
    file: Option<(OutputFile, SpanStore)>,
    /// The metrics file beside it and the metrics to write into it.
    metrics_file: Option<(OutputFile, MetricStore)>,
    /// Every exported span, kept in memory for the command to read back
    /// (`conntrace lab` prints its conclusions from them).
    capture: Option<SpanStore>,
    /// The first failure of an intermediate flush (or of an export of
    /// received spans), reported at the end.
    flush_error: Option<String>,
    /// Spans other processes exported, taken in with
    /// [`add_received`](Self::add_received).
    received: ReceivedDelivery,
}

/// What became of the spans taken in from other processes (added to the
/// pipeline's own counts in [`Delivery`]).
#[derive(Debug, Default, Clone, Copy)]
struct ReceivedDelivery {
    /// Spans taken in while a sink was set up.
    ended: u64,
    /// Of those, spans the sink accepted.
    exported: u64,
    /// Of those, spans in exports to the collector that failed.
    failed: u64,
}

/// What became of the spans, for output.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct TelemetryReport {
    /// `otlp`, `file` or `none`.
    pub(crate) sink: &'static str,
    /// The OTLP endpoint (sink `otlp`).
    pub(crate) otlp_endpoint: Option<String>,
    /// Absolute path of the traces file (sink `file`).
    pub(crate) traces_file: Option<String>,
    /// Spans written to the file (sink `file`).
    pub(crate) spans_written: Option<usize>,
    /// Absolute path of the OTLP JSON metrics file (sink `file`).
    pub(crate) metrics_file: Option<String>,
    /// What the pipeline delivered and lost (sinks `otlp` and `file`).
    pub(crate) delivery: Option<Delivery>,
    /// Why the export or the file write failed, or what was lost; `null`
    /// on success.
    pub(crate) error: Option<String>,
}

/// Counts of what reached the sink and what was lost (`otlp::ExportStats`).
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Delivery {
    /// Spans handed to the pipeline (with those taken in from child
    /// processes, [`Telemetry::add_received`]).
    pub(crate) spans_ended: u64,
    /// Spans the sink accepted.
    pub(crate) spans_exported: u64,
    /// Spans in exports the collector did not accept in time.
    pub(crate) spans_failed: u64,
    /// Spans never sent (queue full, or still queued at the shutdown deadline).
    pub(crate) spans_dropped: u64,
    /// Metric exports accepted.
    pub(crate) metric_exports: u64,
    /// Metric exports that failed.
    pub(crate) metric_exports_failed: u64,
    /// Seconds the final flush and shutdown took.
    pub(crate) shutdown_seconds: f64,
}

impl Telemetry {
    /// Sets the pipeline up: OTLP when an endpoint is configured, else the
    /// file `traces_out` when given, else nothing. `quiet`: no log lines on
    /// stderr (the library's pool advice among them) unless `RUST_LOG` is set.
    ///
    /// # Errors
    /// When an OTLP endpoint variable is not an http(s) URL or a
    /// millisecond variable not a whole number, the exporter
    /// cannot be built or a tracing subscriber exists.
    pub(crate) fn init(traces_out: Option<PathBuf>, quiet: bool) -> anyhow::Result<Self> {
        if let Some(endpoint) = otlp_endpoint() {
            check_otlp_variables()?;
            let (spans, metrics) = otlp_exporters()
                .with_context(|| format!("cannot set up OTLP export to {endpoint}"))?;
            let guard = otlp::init_with_exporters(spans, Some(metrics), pipeline_options(quiet))?;
            return Ok(Self {
                guard: Some(guard),
                endpoint: Some(endpoint),
                file: None,
                metrics_file: None,
                capture: None,
                flush_error: None,
                received: ReceivedDelivery::default(),
            });
        }
        if let Some(path) = traces_out {
            let (traces, metrics) = output_files(&path)?;
            let store = SpanStore::default();
            let metric_store = MetricStore::default();
            let guard = otlp::init_with_exporters(
                MemoryExporter::new(store.clone()),
                Some(metric_store.clone()),
                pipeline_options(quiet),
            )?;
            return Ok(Self {
                guard: Some(guard),
                endpoint: None,
                file: Some((traces, store)),
                metrics_file: Some((metrics, metric_store)),
                capture: None,
                flush_error: None,
                received: ReceivedDelivery::default(),
            });
        }
        Ok(Self {
            guard: None,
            endpoint: None,
            file: None,
            metrics_file: None,
            capture: None,
            flush_error: None,
            received: ReceivedDelivery::default(),
        })
    }

    /// Like [`init`](Self::init), and every span is also kept in memory,
    /// readable with [`captured_spans`](Self::captured_spans) (even when
    /// spans go nowhere else).
    ///
    /// # Errors
    /// As [`init`](Self::init).
    pub(crate) fn init_capturing(traces_out: Option<PathBuf>, quiet: bool) -> anyhow::Result<Self> {
        let store = SpanStore::default();
        let memory = MemoryExporter::new(store.clone());
        if let Some(endpoint) = otlp_endpoint() {
            check_otlp_variables()?;
            let (spans, metrics) = otlp_exporters()
                .with_context(|| format!("cannot set up OTLP export to {endpoint}"))?;
            let tee = Tee {
                memory,
                otlp: Some(spans),
            };
            let guard = otlp::init_with_exporters(tee, Some(metrics), pipeline_options(quiet))?;
            return Ok(Self {
                guard: Some(guard),
                endpoint: Some(endpoint),
                file: None,
                metrics_file: None,
                capture: Some(store),
                flush_error: None,
                received: ReceivedDelivery::default(),
            });
        }
        let tee = Tee { memory, otlp: None };
        let (guard, file, metrics_file) = match traces_out {
            Some(path) => {
                let (traces, metrics) = output_files(&path)?;
                let metric_store = MetricStore::default();
                let guard = otlp::init_with_exporters(
                    tee,
                    Some(metric_store.clone()),
                    pipeline_options(quiet),
                )?;
                (
                    guard,
                    Some((traces, store.clone())),
                    Some((metrics, metric_store)),
                )
            }
            None => (
                otlp::init_with_exporters::<_, MetricStore>(tee, None, pipeline_options(quiet))?,
                None,
                None,
            ),
        };
        Ok(Self {
            guard: Some(guard),
            endpoint: None,
            file,
            metrics_file,
            capture: Some(store),
            flush_error: None,
            received: ReceivedDelivery::default(),
        })
    }

    /// Exports every span ended so far and returns all spans captured since
    /// the start (empty unless set up with [`init_capturing`](Self::init_capturing)).
    /// A failed export to the collector is remembered for
    /// [`finish`](Self::finish); the captured spans are complete regardless.
    pub(crate) fn captured_spans(&mut self) -> Vec<conntrace_lab::ReceivedSpan> {
        if let Some(guard) = &self.guard {
            // The flush blocks until the exporters are done.
            let flushed = tokio::task::block_in_place(|| guard.flush());
            if let Err(e) = flushed
                && self.flush_error.is_none()
            {
                self.flush_error = Some(match e {
                    OtlpError::Export { detail, .. } => crate::error::export_failure(&detail),
                    other => other.to_string(),
                });
            }
        }
        self.capture
            .as_ref()
            .map(SpanStore::received)
            .unwrap_or_default()
    }

    /// Takes spans another process exported (`conntrace lab env-proxy`'s
    /// `conntrace probe` children, received by the scenario's own OTLP
    /// receiver) into this run's outputs, their ids unchanged (their trees
    /// and links stay whole): the traces file and the in-memory capture
    /// (the `--html` page) hold them after the spans collected so far, and
    /// with an OTLP endpoint they are exported to the collector now, under
    /// this pipeline's resource. They count in the report as this
    /// process's spans do (`spans_written`, `delivery`); a failed export
    /// is reported by [`finish`](Self::finish). Without a sink (no file,
    /// no endpoint, no capture) they go nowhere, as this process's spans do.
    pub(crate) async fn add_received(&mut self, spans: &[conntrace_lab::ReceivedSpan]) {
        let batch: Vec<SpanData> = spans.iter().filter_map(crate::relay::span_data).collect();
        if batch.is_empty() {
            return;
        }
        let n = batch.len() as u64;
        // With a capture, the file writes the capture's spans: one store.
        let file = self
            .file
            .as_ref()
            .map(|(_, store)| store)
            .filter(|store| !self.capture.as_ref().is_some_and(|c| c.same_as(store)));
        for store in self.capture.iter().chain(file) {
            store.extend(batch.iter().cloned());
        }
        if self.guard.is_none() {
            return;
        }
        self.received.ended += n;
        if self.endpoint.is_none() {
            // The file takes them all.
            self.received.exported += n;
            return;
        }
        match export_received(batch).await {
            Ok(()) => self.received.exported += n,
            Err(detail) => {
                self.received.failed += n;
                self.flush_error.get_or_insert(detail);
            }
        }
    }

    /// Takes the last metrics collection another process exported
    /// (`conntrace lab env-proxy`'s `conntrace probe` children, received by
    /// the scenario's OTLP receiver when this run has no collector) into the
    /// metrics file beside the traces file, after this process's own. With
    /// a collector the children export their metrics to it themselves; with
    /// no file they go nowhere, as this process's metrics do.
    pub(crate) fn add_received_metrics(
        &self,
        request: opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest,
    ) {
        if let Some((_, store)) = &self.metrics_file {
            store.add_received(request);
        }
    }

    /// Flushes and shuts the pipeline down, then writes the traces file.
    pub(crate) async fn finish(self) -> TelemetryReport {
        let mut report = TelemetryReport {
            sink: match (&self.endpoint, &self.file) {
                (Some(_), _) => "otlp",
                (None, Some(_)) => "file",
                (None, None) => "none",
            },
            otlp_endpoint: self.endpoint.clone(),
            traces_file: self.file.as_ref().map(|(f, _)| absolute(f.path())),
            spans_written: None,
            metrics_file: self.metrics_file.as_ref().map(|(f, _)| absolute(f.path())),
            delivery: None,
            error: None,
        };
        let Some(mut guard) = self.guard else {
            return report;
        };
        // Flushing blocks (at most the export timeout + otlp::SHUTDOWN_MARGIN);
        // keep it off the runtime's workers.
        let started = std::time::Instant::now();
        let flushed = tokio::task::spawn_blocking(move || {
            let closed = guard.close();
            (closed, guard.stats())
        })
        .await;
        let (final_error, stats) = match flushed {
            Ok((Ok(()), stats)) => (None, Some(stats)),
            Ok((Err(OtlpError::Export { detail, .. }), stats)) => {
                (Some(crate::error::export_failure(&detail)), Some(stats))
            }
            Ok((Err(other), stats)) => (Some(other.to_string()), Some(stats)),
            Err(join) => (Some(format!("the flush task failed: {join}")), None),
        };
        if let Some(stats) = &stats {
            let received = self.received;
            report.delivery = Some(Delivery {
                spans_ended: stats.spans_ended + received.ended,
                spans_exported: stats.spans_exported + received.exported,
                spans_failed: stats.spans_failed + received.failed,
                spans_dropped: stats.spans_dropped,
                metric_exports: stats.metric_exports,
                metric_exports_failed: stats.metric_exports_failed,
                shutdown_seconds: started.elapsed().as_secs_f64(),
            });
        }
        // An earlier failure explains the losses better than the last
        // export's (which may have been cut before it ran).
        let final_error = final_error.or_else(|| {
            stats
                .as_ref()
                .filter(|s| s.has_losses())
                .and_then(|s| s.last_failure.as_ref().map(ToString::to_string))
        });
        // The first failure says most: once an intermediate flush failed,
        // the final one only reports a generic "Failed to flush".
        let flush_error = self.flush_error.clone().or(final_error);
        let mut losses = stats
            .as_ref()
            .filter(|s| s.has_losses())
            .map(|s| format!(" ({})", s.summary()))
            .unwrap_or_default();
        if self.received.failed > 0 {
            losses.push_str(&format!(
                " ({} span(s) taken in from child processes not delivered)",
                self.received.failed
            ));
        }
        if let Some(detail) = flush_error {
            report.error = Some(match &self.endpoint {
                Some(endpoint) => crate::error::one_line(&format!(
                    "could not export spans and metrics to the OTLP collector at {endpoint}: {detail}{losses}"
                )),
                None => crate::error::one_line(&format!("could not flush spans: {detail}{losses}")),
            });
        }
        if let Some((mut file, store)) = self.file {
            match store.write_json(&mut file) {
                Ok(n) => report.spans_written = Some(n),
                Err(e) => report.error = Some(crate::error::anyhow_line(&e)),
            }
        }
        if let Some((mut file, store)) = self.metrics_file
            && let Err(e) = store.write_json(&mut file)
        {
            report.error = Some(crate::error::anyhow_line(&e));
        }
        report
    }
}

/// Sends every span batch to memory and, when configured, to the OTLP
/// collector.
#[derive(Debug)]
struct Tee {
    /// The in-memory copy.
    memory: MemoryExporter,
    /// The collector, when an endpoint is set.
    otlp: Option<SpanExporter>,
}

impl SdkSpanExporter for Tee {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        match &self.otlp {
            Some(otlp) => {
                self.memory.export(batch.clone()).await?;
                otlp.export(batch).await
            }
            None => self.memory.export(batch).await,
        }
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        match &self.otlp {
            Some(otlp) => otlp.shutdown_with_timeout(timeout),
            None => Ok(()),
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        match &self.otlp {
            Some(otlp) => otlp.force_flush(),
            None => Ok(()),
        }
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.memory.set_resource(resource);
        if let Some(otlp) = &mut self.otlp {
            otlp.set_resource(resource);
        }
    }
}

/// The pipeline's options: the export timeout (flush and shutdown end by
/// it plus `otlp::SHUTDOWN_MARGIN`), [`resource`], [`metric_interval`],
/// and for a quiet run no log lines on stderr unless `RUST_LOG` asks for
/// them.
fn pipeline_options(quiet: bool) -> otlp::PipelineOptions {
    let timeout = export_timeout(otlp::Signal::Traces).max(export_timeout(otlp::Signal::Metrics));
    otlp::PipelineOptions::default()
        .export_timeout(Some(timeout))
        .resource(resource())
        .metric_interval(metric_interval())
        .default_log_level(if quiet { "off" } else { "warn" })
}

/// How often metrics are exported during a run: `OTEL_METRIC_EXPORT_INTERVAL`
/// when set (the SDK reads it), else [`METRIC_EXPORT_INTERVAL`], so a
/// dashboard fills while a demo or lab runs (the SDK's 60 s default would
/// export a half-minute demo once, at its end).
fn metric_interval() -> Option<Duration> {
    (!env_set("OTEL_METRIC_EXPORT_INTERVAL")).then_some(METRIC_EXPORT_INTERVAL)
}

/// `path` made absolute, for output.
fn absolute(path: &std::path::Path) -> String {
    std::path::absolute(path)
        .unwrap_or_else(|_| path.to_path_buf())
        .display()
        .to_string()
}

/// The traces file at `traces` and the metrics file beside it, both checked
/// writable now, before the run.
///
/// # Errors
/// `cannot write traces file ...` (or metrics file) and why.
fn output_files(traces: &std::path::Path) -> anyhow::Result<(OutputFile, OutputFile)> {
    let file = OutputFile::create(traces, "traces")?;
    let metrics = OutputFile::create(&metrics_path_beside(traces), "metrics")?;
    Ok((file, metrics))
}

/// `<dir>/<stem>.metrics.json` beside the traces file `<dir>/<stem>.json`.
pub(crate) fn metrics_path_beside(traces: &std::path::Path) -> PathBuf {
    let stem = traces
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "conntrace".to_owned());
    traces.with_file_name(format!("{stem}.metrics.json"))
}

/// The resource from `OTEL_SERVICE_NAME` / `OTEL_RESOURCE_ATTRIBUTES`, with
/// `service.name` = `conntrace` when they name no service.
fn resource() -> Resource {
    let from_env = Resource::builder().build();
    let named = from_env
        .get(&opentelemetry::Key::from_static_str("service.name"))
        .is_some_and(|v| !v.as_str().starts_with("unknown_service"));
    if named {
        from_env
    } else {
        Resource::builder().with_service_name(SERVICE_NAME).build()
    }
}

/// The export timeout for `signal`: the environment's, else
/// [`DEFAULT_EXPORT_TIMEOUT`].
fn export_timeout(signal: otlp::Signal) -> Duration {
    otlp::export_timeout_from_env(signal).unwrap_or(DEFAULT_EXPORT_TIMEOUT)
}

/// How long past the export timeout an export of received spans may run
/// before it is given up (room for the exporter's own timeout to fire
/// first, with its more telling error).
const RECEIVED_EXPORT_SLACK: Duration = Duration::from_millis(250);

/// Exports `batch` (spans received from another process) to the collector
/// the environment names, as [`otlp_exporters`] would (its protocol, its
/// timeout), under the pipeline's [`resource`]; gives up after the export
/// timeout plus [`RECEIVED_EXPORT_SLACK`].
///
/// # Errors
/// Why the exporter could not be built or the export failed, one line.
async fn export_received(batch: Vec<SpanData>) -> Result<(), String> {
    let timeout = export_timeout(otlp::Signal::Traces);
    let mut exporter = otlp::span_exporter_with_timeout(timeout).map_err(|e| e.to_string())?;
    exporter.set_resource(&resource());
    // The http/protobuf exporter's client blocks: run it off the runtime's
    // workers (a blocking-pool thread still has the runtime's timers and
    // I/O, which the gRPC exporter uses).
    let exported = tokio::task::spawn_blocking(move || {
        let result = futures::executor::block_on(tokio::time::timeout(
            timeout + RECEIVED_EXPORT_SLACK,
            exporter.export(batch),
        ));
        let _ = exporter.shutdown_with_timeout(timeout);
        result
    })
    .await;
    match exported {
        Ok(Ok(Ok(()))) => Ok(()),
        Ok(Ok(Err(e))) => Err(crate::error::export_failure(&e.to_string())),
        Ok(Err(_elapsed)) => Err(format!(
            "no answer from the collector within {:.1} s",
            timeout.as_secs_f64()
        )),
        Err(join) => Err(format!("the export task failed: {join}")),
    }
}

/// The OTLP span and metric exporters the environment describes, with the
/// shorter default timeout (on the TCP connect as well as on each export).
fn otlp_exporters() -> anyhow::Result<(SpanExporter, MetricExporter)> {
    let spans = otlp::span_exporter_with_timeout(export_timeout(otlp::Signal::Traces))
        .context("invalid OTLP exporter settings")?;
    let metrics = otlp::metric_exporter_with_timeout(export_timeout(otlp::Signal::Metrics))
        .context("invalid OTLP metric exporter settings")?;
    Ok((spans, metrics))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_must_be_http_urls_with_a_host() {
        let key = "OTEL_EXPORTER_OTLP_ENDPOINT";
        for ok in ["http://localhost:4317", "http://[::1]:4317"] {
            assert!(check_endpoint(key, ok).is_ok(), "{ok}");
        }
        let https = check_endpoint(key, "https://collector.example:4318/")
            .map_err(|e| e.to_string())
            .expect_err("no TLS in this build");
        assert!(
            https.contains("https endpoints are not supported"),
            "{https}"
        );
        for bad in [
            "not-a-url",
            "localhost:4317",
            "grpc://x:4317",
            "http://",
            "file:///tmp/x",
        ] {
            let err = check_endpoint(key, bad).map_err(|e| e.to_string());
            assert_eq!(
                err,
                Err(format!(
                    "{key} {bad:?} is not an http:// URL (e.g. http://localhost:4317)"
                )),
                "{bad}"
            );
        }
    }
}
