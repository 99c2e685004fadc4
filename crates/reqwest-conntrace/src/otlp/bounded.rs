//! Exports that never outlive their deadline, whatever the collector does.
//!
//! The SDK's batch span processor and periodic metric reader run each
//! export to completion on their own threads, and the metric reader's
//! flush waits for it without a limit; an exporter stuck in a TCP connect to
//! a blackholed collector (Linux retransmits the SYN for about 127 s) or
//! on a collector that never answers then holds flush, shutdown and the
//! process exit. Here every export is raced against a deadline:
//! `start + timeout + DEADLINE_SLACK`, or earlier once a flush or shutdown
//! set a cut-off for the whole pipeline. The race's timer and the
//! exporters' I/O run on the pipeline's own runtime ([`ExportRuntime`]),
//! so neither depends on the application's runtime being alive or free.
//!
//! The same wrappers count what was delivered and what was lost
//! ([`ExportStats`]); [`CountingProcessor`] bounds the span queue itself so
//! that every span dropped for a full queue is counted.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::{OTelSdkError, OTelSdkResult};
use opentelemetry_sdk::metrics::Temporality;
use opentelemetry_sdk::metrics::data::ResourceMetrics;
use opentelemetry_sdk::metrics::exporter::PushMetricExporter;
use opentelemetry_sdk::trace::{Span, SpanData, SpanExporter, SpanProcessor};
use tokio::runtime::Handle;
use tokio::sync::Notify;

use super::stats::{ExportFailure, ExportStats, FailureKind, Signal};

/// How long past the export timeout an export may run before the deadline
/// cuts it: room for the exporter's own timeout to fire first, so its
/// error (which says what happened) is the one reported.
pub(crate) const DEADLINE_SLACK: Duration = Duration::from_millis(250);

/// A current-thread tokio runtime on its own thread (`otlp-export`), for
/// the exporters' connections and the export deadlines.
#[derive(Debug)]
pub(crate) struct ExportRuntime {
    handle: Handle,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl ExportRuntime {
    /// Starts the thread.
    pub(crate) fn start() -> std::io::Result<Self> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let handle = runtime.handle().clone();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        std::thread::Builder::new()
            .name("otlp-export".to_owned())
            .spawn(move || {
                let _ = runtime.block_on(stopped);
                // Never wait for blocking work (a DNS lookup) at exit.
                runtime.shutdown_background();
            })?;
        Ok(Self {
            handle,
            stop: Some(stop),
        })
    }

    /// The runtime's handle.
    pub(crate) fn handle(&self) -> &Handle {
        &self.handle
    }

    /// Stops the thread; exports still running are cancelled.
    pub(crate) fn stop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

impl Drop for ExportRuntime {
    fn drop(&mut self) {
        self.stop();
    }
}

/// State shared by the exporters, the span processor and the guard.
#[derive(Debug)]
pub(crate) struct Shared {
    /// The export timeout the user configured.
    timeout: Duration,
    /// Where the pipeline's exports run.
    handle: Handle,
    /// When set, no export runs past this instant (flush or shutdown).
    cutoff: Mutex<Option<Instant>>,
    /// Wakes exports in flight when the cut-off changes.
    cutoff_changed: Notify,
    /// The span queue's capacity.
    max_queue: u64,
    /// Spans accepted into the queue and not yet taken by an export.
    queued: AtomicU64,
    spans_ended: AtomicU64,
    spans_exported: AtomicU64,
    spans_failed: AtomicU64,
    spans_dropped: AtomicU64,
    metric_exports: AtomicU64,
    metric_exports_failed: AtomicU64,
    /// Exports running now.
    in_flight: AtomicU64,
    /// Set once shutdown counted what was left: later exports (after the
    /// deadline) no longer count, their spans are already counted dropped.
    closed: std::sync::atomic::AtomicBool,
    /// The latest failure worth reporting, and when it happened.
    last_failure: Mutex<Option<(ExportFailure, Instant)>>,
}

impl Shared {
    pub(crate) fn new(timeout: Duration, handle: Handle, max_queue: usize) -> Self {
        Self {
            timeout,
            handle,
            cutoff: Mutex::new(None),
            cutoff_changed: Notify::new(),
            max_queue: max_queue as u64,
            queued: AtomicU64::new(0),
            spans_ended: AtomicU64::new(0),
            spans_exported: AtomicU64::new(0),
            spans_failed: AtomicU64::new(0),
            spans_dropped: AtomicU64::new(0),
            metric_exports: AtomicU64::new(0),
            metric_exports_failed: AtomicU64::new(0),
            in_flight: AtomicU64::new(0),
            closed: std::sync::atomic::AtomicBool::new(false),
            last_failure: Mutex::new(None),
        }
    }

    /// The export timeout.
    pub(crate) fn timeout(&self) -> Duration {
        self.timeout
    }

    /// From now on no export runs past `at` (`None`: lift the cut-off).
    pub(crate) fn set_cutoff(&self, at: Option<Instant>) {
        if let Ok(mut c) = self.cutoff.lock() {
            *c = at;
        }
        self.cutoff_changed.notify_waiters();
    }

    fn deadline(&self, own: Instant) -> Instant {
        match self.cutoff.lock().ok().and_then(|c| *c) {
            Some(cut) => cut.min(own),
            None => own,
        }
    }

    /// Exports running now.
    pub(crate) fn in_flight(&self) -> u64 {
        self.in_flight.load(Ordering::Acquire)
    }

    /// Counts a span the queue has no room for, or reserves its place.
    fn admit_span(&self) -> bool {
        self.spans_ended.fetch_add(1, Ordering::Relaxed);
        let admitted = self
            .queued
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |q| {
                (q < self.max_queue).then_some(q + 1)
            })
            .is_ok();
        if !admitted {
            self.spans_dropped.fetch_add(1, Ordering::Relaxed);
        }
        admitted
    }

    /// Spans still queued at the end count as dropped.
    pub(crate) fn drop_queued(&self) {
        self.closed.store(true, Ordering::Release);
        let left = self.queued.swap(0, Ordering::AcqRel);
        self.spans_dropped.fetch_add(left, Ordering::Relaxed);
    }

    /// Counts one export's outcome (`spans`: the batch size; 0 for metrics).
    fn count(&self, signal: Signal, spans: u64, ok: bool) {
        if self.closed.load(Ordering::Acquire) {
            return;
        }
        let (counter, n) = match (signal, ok) {
            (Signal::Traces, true) => (&self.spans_exported, spans),
            (Signal::Traces, false) => (&self.spans_failed, spans),
            (Signal::Metrics, true) => (&self.metric_exports, 1),
            (Signal::Metrics, false) => (&self.metric_exports_failed, 1),
        };
        counter.fetch_add(n, Ordering::Relaxed);
    }

    /// The counts so far.
    pub(crate) fn stats(&self) -> ExportStats {
        ExportStats {
            spans_ended: self.spans_ended.load(Ordering::Relaxed),
            spans_exported: self.spans_exported.load(Ordering::Relaxed),
            spans_failed: self.spans_failed.load(Ordering::Relaxed),
            spans_dropped: self.spans_dropped.load(Ordering::Relaxed),
            metric_exports: self.metric_exports.load(Ordering::Relaxed),
            metric_exports_failed: self.metric_exports_failed.load(Ordering::Relaxed),
            last_failure: self
                .last_failure
                .lock()
                .ok()
                .and_then(|f| f.as_ref().map(|(f, _)| f.clone())),
        }
    }

    /// Runs `export` until it finishes or its deadline passes; records a
    /// failure.
    /// The caller counted the export in `in_flight`; it is counted out
    /// here, after its outcome.
    async fn bounded<F>(&self, signal: Signal, spans: u64, export: F) -> OTelSdkResult
    where
        F: Future<Output = OTelSdkResult>,
    {
        if self.closed.load(Ordering::Acquire) {
            // Shut down: the runtime is gone, nothing can be sent.
            self.in_flight.fetch_sub(1, Ordering::AcqRel);
            return Err(OTelSdkError::AlreadyShutdown);
        }
        let start = Instant::now();
        let own = start + self.timeout + DEADLINE_SLACK;
        let mut export = std::pin::pin!(export);
        // Set while the export never got to run (the cut-off had passed).
        let mut cut_before_start = true;
        let result = loop {
            let changed = self.cutoff_changed.notified();
            let mut changed = std::pin::pin!(changed);
            changed.as_mut().enable();
            let deadline = self.deadline(own);
            if Instant::now() >= deadline {
                break Err((OTelSdkError::Timeout(start.elapsed()), true));
            }
            cut_before_start = false;
            tokio::select! {
                biased;
                r = &mut export => break r.map_err(|e| (e, false)),
                () = tokio::time::sleep_until(deadline.into()) => {
                    break Err((OTelSdkError::Timeout(start.elapsed()), true));
                }
                () = &mut changed => {}
            }
        };
        let outcome = match result {
            Ok(()) => Ok(()),
            Err((error, timed_out)) => {
                let failure =
                    ExportFailure::classify(signal, &error.to_string(), timed_out, start.elapsed());
                if let Ok(mut last) = self.last_failure.lock() {
                    // A batch cut by our deadline says less than what the
                    // collector told an export shortly before (refused,
                    // an error status...; the cut export was likely
                    // retrying it): keep that. A batch cut before it ran
                    // says nothing new at all.
                    let keep = match last.as_ref() {
                        Some((previous, at)) => {
                            cut_before_start
                                || (timed_out
                                    && previous.kind != FailureKind::NoAnswer
                                    && at.elapsed() <= 3 * self.timeout)
                        }
                        None => false,
                    };
                    if !keep {
                        *last = Some((failure, Instant::now()));
                    }
                }
                Err(error)
            }
        };
        // Counted before it leaves `in_flight`, which shutdown waits on.
        self.count(signal, spans, outcome.is_ok());
        self.in_flight.fetch_sub(1, Ordering::AcqRel);
        outcome
    }
}

pin_project_lite::pin_project! {
    /// Polls `future` inside the export runtime's context, so timers and
    /// the exporters' retry sleeps use that runtime wherever the SDK's
    /// thread polls it.
    struct InRuntime<F> {
        handle: Handle,
        #[pin]
        future: F,
    }
}

impl<F: Future> Future for InRuntime<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.project();
        let _entered = this.handle.enter();
        this.future.poll(cx)
    }
}

/// A span exporter whose exports end by their deadline, counted.
#[derive(Debug)]
pub(crate) struct BoundedSpanExporter<E> {
    inner: E,
    shared: Arc<Shared>,
}

impl<E> BoundedSpanExporter<E> {
    pub(crate) fn new(inner: E, shared: Arc<Shared>) -> Self {
        Self { inner, shared }
    }
}

impl<E: SpanExporter> SpanExporter for BoundedSpanExporter<E> {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let n = batch.len() as u64;
        self.shared.in_flight.fetch_add(1, Ordering::AcqRel);
        // Out of the queue now: room for new spans.
        let _ = self
            .shared
            .queued
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |q| {
                Some(q.saturating_sub(n))
            });
        let shared = &self.shared;
        InRuntime {
            handle: shared.handle.clone(),
            future: shared.bounded(Signal::Traces, n, self.inner.export(batch)),
        }
        .await
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

/// A metric exporter whose exports end by their deadline, counted.
#[derive(Debug)]
pub(crate) struct BoundedMetricExporter<M> {
    inner: M,
    shared: Arc<Shared>,
}

impl<M> BoundedMetricExporter<M> {
    pub(crate) fn new(inner: M, shared: Arc<Shared>) -> Self {
        Self { inner, shared }
    }
}

impl<M: PushMetricExporter> PushMetricExporter for BoundedMetricExporter<M> {
    async fn export(&self, metrics: &ResourceMetrics) -> OTelSdkResult {
        let shared = &self.shared;
        shared.in_flight.fetch_add(1, Ordering::AcqRel);
        InRuntime {
            handle: shared.handle.clone(),
            future: shared.bounded(Signal::Metrics, 0, self.inner.export(metrics)),
        }
        .await
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn temporality(&self) -> Temporality {
        self.inner.temporality()
    }
}

/// Wraps the batch span processor: counts every ended span and keeps the
/// queue within its capacity itself, so a span that does not fit is
/// counted as dropped (the SDK's own drop count is not readable).
#[derive(Debug)]
pub(crate) struct CountingProcessor<P> {
    inner: P,
    shared: Arc<Shared>,
}

impl<P> CountingProcessor<P> {
    pub(crate) fn new(inner: P, shared: Arc<Shared>) -> Self {
        Self { inner, shared }
    }
}

impl<P: SpanProcessor> SpanProcessor for CountingProcessor<P> {
    fn on_start(&self, span: &mut Span, cx: &opentelemetry::Context) {
        self.inner.on_start(span, cx);
    }

    fn on_end(&self, span: SpanData) {
        if self.shared.admit_span() {
            self.inner.on_end(span);
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}
