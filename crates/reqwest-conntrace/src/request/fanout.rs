//! The fan-out helper (incident 2): run batch futures concurrently under a
//! parent span and say, on the parent, which batches paid for new
//! connections and which one was the slowest.

use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use pin_project_lite::pin_project;
use tracing::Instrument;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use crate::semconv;

/// What the requests of one batch went through.
#[derive(Debug, Default)]
pub(crate) struct BatchStats {
    inner: Mutex<BatchTotals>,
}

#[derive(Debug, Default, Clone)]
struct BatchTotals {
    requests: u64,
    /// Requests not served by a connection that was ready before they
    /// started (`http.connection.reused = false`).
    new_connections: u64,
    wait: Duration,
    started: Option<Instant>,
    ended: Option<Instant>,
}

impl BatchStats {
    fn totals(&self) -> MutexGuard<'_, BatchTotals> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A request of this batch was attributed to its connection.
    pub(crate) fn record(&self, reused: bool, wait: Duration) {
        let mut t = self.totals();
        t.requests += 1;
        if !reused {
            t.new_connections += 1;
        }
        t.wait += wait;
    }
}

thread_local! {
    static CURRENT: RefCell<Option<Arc<BatchStats>>> = const { RefCell::new(None) };
}

/// The batch being polled on this thread, if any (captured by the middleware
/// when a request starts).
pub(crate) fn current() -> Option<Arc<BatchStats>> {
    CURRENT.try_with(|c| c.borrow().clone()).ok().flatten()
}

pin_project! {
    /// One batch: polls the batch future with its stats set as current.
    struct Batch<F> {
        #[pin]
        inner: F,
        stats: Arc<BatchStats>,
    }
}

impl<F: Future> Future for Batch<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.project();
        {
            let mut t = this.stats.totals();
            if t.started.is_none() {
                t.started = Some(Instant::now());
            }
        }
        let previous = CURRENT
            .try_with(|c| c.borrow_mut().replace(this.stats.clone()))
            .ok()
            .flatten();
        let polled = this.inner.poll(cx);
        let _ = CURRENT.try_with(|c| *c.borrow_mut() = previous);
        if polled.is_ready() {
            this.stats.totals().ended = Some(Instant::now());
        }
        polled
    }
}

/// Runs `batches` concurrently (like `futures::future::join_all`) and
/// returns their outputs in order.
///
/// Span shape: an `INFO` span named `fan_out` (child of the current span)
/// with one `batch` child span per batch (attribute
/// `http.fan_out.batch.index`, from 0); requests made inside a batch (through
/// [`ConnTraceMiddleware`](crate::ConnTraceMiddleware)) are children of
/// their batch span. When all batches are done:
/// - each batch span gets `http.fan_out.batch.requests`,
///   `http.fan_out.batch.new_connection` (bool: a request of the batch was
///   not served by a connection ready before it started, i.e. the batch paid
///   for a new connection, its own or a concurrent one) and
///   `http.connection.wait_time` (s, summed over its requests);
/// - the `fan_out` span gets `http.fan_out.batches`,
///   `http.fan_out.batches_with_new_connection`, `http.fan_out.wait_time.total`
///   and `.max` (s, per batch), `http.fan_out.slowest_batch.index` and
///   `.duration` (s).
///
/// Requests only count toward a batch when they are started inside the
/// batch future's own poll (not in a task it spawns). Callers of plain
/// `join_all` still get per-request attribution; only these totals are
/// missing.
///
/// ```no_run
/// # async fn run(client: reqwest_middleware::ClientWithMiddleware) {
/// let ids: Vec<Vec<u32>> = (0..5).map(|b| (b * 100..b * 100 + 100).collect()).collect();
/// let responses = reqwest_conntrace::fan_out(ids.iter().map(|batch| {
///     let client = client.clone();
///     let url = format!("https://b.internal/items?from={}&count={}", batch[0], batch.len());
///     async move { client.get(url).send().await }
/// }))
/// .await;
/// # }
/// ```
pub async fn fan_out<I, F>(batches: I) -> Vec<F::Output>
where
    I: IntoIterator<Item = F>,
    F: Future,
{
    let parent = tracing::info_span!(target: "reqwest_conntrace", "fan_out");
    let mut stats = Vec::new();
    let futures: Vec<_> = batches
        .into_iter()
        .enumerate()
        .map(|(index, inner)| {
            let batch_stats = Arc::new(BatchStats::default());
            stats.push(batch_stats.clone());
            let span = tracing::info_span!(
                target: "reqwest_conntrace",
                parent: &parent,
                "batch",
                http.fan_out.batch.index = index as i64,
            );
            Batch {
                inner,
                stats: batch_stats,
            }
            .instrument(span)
        })
        .collect();
    let spans: Vec<tracing::Span> = futures.iter().map(|f| f.span().clone()).collect();
    let outputs = futures_util::future::join_all(futures)
        .instrument(parent.clone())
        .await;

    let mut with_new = 0i64;
    let mut wait_total = Duration::ZERO;
    let mut wait_max = Duration::ZERO;
    let mut slowest: Option<(usize, Duration)> = None;
    for (index, (s, span)) in stats.iter().zip(&spans).enumerate() {
        let t = s.totals().clone();
        let paid = t.new_connections > 0;
        span.set_attribute(semconv::FAN_OUT_BATCH_REQUESTS, t.requests as i64);
        span.set_attribute(semconv::FAN_OUT_BATCH_NEW_CONNECTION, paid);
        span.set_attribute(semconv::HTTP_CONNECTION_WAIT_TIME, t.wait.as_secs_f64());
        with_new += i64::from(paid);
        wait_total += t.wait;
        wait_max = wait_max.max(t.wait);
        let took = match (t.started, t.ended) {
            (Some(a), Some(b)) => b.saturating_duration_since(a),
            _ => Duration::ZERO,
        };
        if slowest.is_none_or(|(_, d)| took > d) {
            slowest = Some((index, took));
        }
    }
    parent.set_attribute(semconv::FAN_OUT_BATCHES, stats.len() as i64);
    parent.set_attribute(semconv::FAN_OUT_BATCHES_WITH_NEW_CONNECTION, with_new);
    parent.set_attribute(semconv::FAN_OUT_WAIT_TIME_TOTAL, wait_total.as_secs_f64());
    parent.set_attribute(semconv::FAN_OUT_WAIT_TIME_MAX, wait_max.as_secs_f64());
    if let Some((index, took)) = slowest {
        parent.set_attribute(semconv::FAN_OUT_SLOWEST_BATCH_INDEX, index as i64);
        parent.set_attribute(semconv::FAN_OUT_SLOWEST_BATCH_DURATION, took.as_secs_f64());
    }
    outputs
}
