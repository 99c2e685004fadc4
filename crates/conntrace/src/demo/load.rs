//! One demo phase's load: fan-outs of concurrent batch calls started at a
//! steady rate, each user request under a `user_request` span running its
//! batches with `reqwest_conntrace::fan_out` (a `fan_out` span with one
//! `batch` span per call), so a trace viewer shows which batches paid for
//! new connections from the `fan_out` span's attributes alone.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use indicatif::ProgressBar;
use reqwest_middleware::ClientWithMiddleware;
use tokio::task::JoinSet;
use tokio::time::MissedTickBehavior;
use tracing::Instrument as _;
use tracing::field::Empty;
use url::Url;

use crate::capture;
use crate::row::RequestRow;
use crate::stats::ms;

/// The shape of the load.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Load {
    /// Fan-outs (user requests) started per second.
    pub(crate) rate: f64,
    /// Concurrent batch calls per fan-out.
    pub(crate) batches: usize,
    /// Length of the measured part of a phase.
    pub(crate) duration: Duration,
    /// Length of the warm-up before it (fan-outs traced, not counted).
    pub(crate) warmup: Duration,
}

impl Load {
    /// Measured fan-outs in one phase.
    pub(crate) fn fanouts(&self) -> usize {
        ((self.rate * self.duration.as_secs_f64()).round() as usize).max(1)
    }

    /// Warm-up fan-outs in one phase.
    pub(crate) fn warmup_fanouts(&self) -> usize {
        (self.rate * self.warmup.as_secs_f64()).round() as usize
    }
}

/// One batch call of one fan-out.
#[derive(Debug, Clone)]
pub(crate) struct BatchCall {
    /// 0-based fan-out number within the phase.
    pub(crate) fanout: usize,
    /// 0-based batch index within the fan-out.
    pub(crate) batch: usize,
    /// The call's request row.
    pub(crate) row: RequestRow,
}

/// One fan-out: its latency is that of its slowest batch.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Fanout {
    /// 0-based fan-out number.
    pub(crate) index: usize,
    /// Fan-out start to the end of its last batch call, ms.
    pub(crate) latency_ms: f64,
    /// Batch calls that found no idle connection.
    pub(crate) misses: usize,
}

/// Everything the measured part of a phase produced.
#[derive(Debug, Default)]
pub(crate) struct PhaseRun {
    /// Every measured batch call, by fan-out then batch index.
    pub(crate) calls: Vec<BatchCall>,
    /// Every measured fan-out, in order.
    pub(crate) fanouts: Vec<Fanout>,
    /// Most requests in flight at once to the phase's host: the library's
    /// number (`ConnTrace::peak_in_flight`, the one its pool advice uses),
    /// set by the caller after the phase.
    pub(crate) in_flight_peak: usize,
    /// Start of the first measured fan-out to the end of the last one.
    pub(crate) wall: Duration,
    /// Connections the server had accepted when the measurement started.
    pub(crate) accepted_at_start: u64,
    /// When the measurement started (after the warm-up).
    pub(crate) measure_start: Option<Instant>,
}

/// Counters shared by the calls of a phase.
#[derive(Debug, Default)]
struct Shared {
    /// Calls finished (for the progress message).
    calls: AtomicUsize,
    /// Of those, pool misses (for the progress message).
    misses: AtomicUsize,
}

/// Where a phase runs: the client, the URL and the server's connection counter.
pub(crate) struct Target {
    /// The phase's instrumented client.
    pub(crate) client: Arc<ClientWithMiddleware>,
    /// The URL every batch call gets.
    pub(crate) url: Arc<Url>,
    /// Reads the server's accepted-connection counter.
    pub(crate) accepted: Box<dyn Fn() -> u64 + Send + Sync>,
}

/// Runs one phase named `phase` against `target`: warm-up fan-outs first
/// (traced with `demo.warmup = true`, not counted), then the measured ones.
pub(crate) async fn run_phase(
    target: Target,
    phase: &'static str,
    pool: usize,
    load: Load,
    progress: ProgressBar,
) -> PhaseRun {
    let shared = Arc::new(Shared::default());
    let warmup = load.warmup_fanouts();
    let count = warmup + load.fanouts();
    let mut ticks = tokio::time::interval(Duration::from_secs_f64(1.0 / load.rate));
    ticks.set_missed_tick_behavior(MissedTickBehavior::Burst);
    let mut tasks = JoinSet::new();
    let mut start = Instant::now();
    let mut accepted_at_start = (target.accepted)();
    for index in 0..count {
        ticks.tick().await;
        let is_warmup = index < warmup;
        if index == warmup {
            start = Instant::now();
            accepted_at_start = (target.accepted)();
        }
        let span = tracing::info_span!(
            target: "conntrace",
            "user_request",
            otel.name = "user_request",
            demo.phase = phase,
            demo.pool_max_idle_per_host = pool,
            demo.fanout.index = index,
            demo.warmup = is_warmup,
            demo.batches = load.batches,
            demo.pool_misses = Empty,
            demo.latency_ms = Empty,
        );
        let fut = fanout(
            target.client.clone(),
            target.url.clone(),
            phase,
            index,
            load.batches,
            shared.clone(),
            progress.clone(),
        );
        tasks.spawn(fut.instrument(span));
    }
    let mut run = PhaseRun {
        accepted_at_start,
        measure_start: Some(start),
        ..PhaseRun::default()
    };
    while let Some(joined) = tasks.join_next().await {
        if let Ok((fanout, calls)) = joined
            && fanout.index >= warmup
        {
            run.fanouts.push(fanout);
            run.calls.extend(calls);
        }
    }
    run.wall = start.elapsed();
    run.fanouts.sort_by_key(|f| f.index);
    run.calls.sort_by_key(|c| (c.fanout, c.batch));
    run
}

/// One fan-out: `batches` concurrent calls, waited for together (through
/// the library's `fan_out`, which records per batch whether it paid for a
/// new connection).
async fn fanout(
    client: Arc<ClientWithMiddleware>,
    url: Arc<Url>,
    phase: &'static str,
    index: usize,
    batches: usize,
    shared: Arc<Shared>,
    progress: ProgressBar,
) -> (Fanout, Vec<BatchCall>) {
    let start = Instant::now();
    let calls = reqwest_conntrace::fan_out((0..batches).map(|batch| {
        let client = client.clone();
        let url = url.clone();
        async move { (batch, capture::get(&client, &url).await) }
    }))
    .await;
    let latency_ms = ms(start.elapsed());
    // The miss reasons the spans record (after the fan-out's latency was
    // taken: it never waits for them).
    let mut rows = Vec::with_capacity(calls.len());
    for (batch, mut outcome) in calls {
        capture::settle_reports(&mut outcome).await;
        let row = RequestRow::new(index * batches + batch + 1, phase, start, &outcome);
        rows.push(BatchCall {
            fanout: index,
            batch,
            row,
        });
    }
    let calls = rows;
    let misses = calls
        .iter()
        .filter(|c| c.row.pool_miss() == Some(true))
        .count();
    let span = tracing::Span::current();
    span.record("demo.pool_misses", misses);
    span.record("demo.latency_ms", latency_ms);
    let total_calls = shared.calls.fetch_add(batches, Ordering::Relaxed) + batches;
    let total_misses = shared.misses.fetch_add(misses, Ordering::Relaxed) + misses;
    progress.set_message(format!(
        "pool misses {total_misses}/{total_calls} ({:.0} %)",
        total_misses as f64 * 100.0 / total_calls.max(1) as f64
    ));
    progress.inc(1);
    (
        Fanout {
            index,
            latency_ms,
            misses,
        },
        calls,
    )
}
