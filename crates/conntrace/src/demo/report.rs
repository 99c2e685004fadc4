//! A demo phase's summary and the whole demo result, as serialized by
//! `--json` (see SCHEMA.md).

use serde::Serialize;

use super::load::{Load, PhaseRun};
use crate::row::{RequestRow, connections};
use crate::stats::{Distribution, ms, percentile, ratio, round3};
use crate::telemetry::TelemetryReport;

/// Pool hits and misses of one batch index over a phase.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct BatchIndexStats {
    /// 0-based batch index within a fan-out.
    pub(crate) index: usize,
    /// Calls made with this index.
    pub(crate) calls: usize,
    /// Calls that found no idle connection (`new_connection + waited_for_busy`).
    pub(crate) misses: usize,
    /// Calls served at once by an idle pooled connection.
    pub(crate) hits: usize,
    /// Misses served by a new connection (they waited for its DNS/TCP/TLS).
    pub(crate) new_connection: usize,
    /// Misses served by a connection that was busy or being set up by
    /// another call when they started (their own connect did not serve them;
    /// its connection may serve later calls from the idle pool).
    pub(crate) waited_for_busy: usize,
    /// `misses / (misses + hits)`.
    pub(crate) miss_ratio: f64,
    /// Median call time, ms.
    pub(crate) p50_ms: Option<f64>,
    /// 99th percentile call time, ms.
    pub(crate) p99_ms: Option<f64>,
}

/// One phase's summary.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct PhaseSummary {
    /// `small-pool` or `right-pool`.
    pub(crate) name: &'static str,
    /// The URL the phase's calls went to: the service through the phase's
    /// own delay-proxy port, so each phase is its own host (`server.port`)
    /// in the metrics and the pool advice.
    pub(crate) url: String,
    /// The client's idle-pool size per host.
    pub(crate) pool_max_idle_per_host: usize,
    /// Fan-outs (user requests) run.
    pub(crate) fanouts: usize,
    /// Batch calls made.
    pub(crate) calls: usize,
    /// Batch calls that failed.
    pub(crate) failed_calls: usize,
    /// Calls that found no idle connection when they started.
    pub(crate) pool_misses: usize,
    /// Calls served at once by an idle pooled connection.
    pub(crate) pool_hits: usize,
    /// Misses served by a new connection (library: `reused = false`).
    pub(crate) misses_new_connection: usize,
    /// Misses served by a connection another call had in use or was
    /// setting up (library: `reused = true` with `wait > 0` or a miss reason).
    pub(crate) misses_waited_for_busy: usize,
    /// `pool_misses / (pool_misses + pool_hits)`.
    pub(crate) miss_ratio: f64,
    /// Fan-outs with at least one missing batch.
    pub(crate) fanouts_with_miss: usize,
    /// `fanouts_with_miss / fanouts`.
    pub(crate) fanout_miss_ratio: f64,
    /// Distinct connections that served the calls.
    pub(crate) connections_used: usize,
    /// Of those, connections opened during the measured part (the others
    /// were opened during the warm-up and kept in the idle pool).
    pub(crate) connections_used_opened_measured: usize,
    /// Of those, connections whose TLS handshake resumed a session.
    pub(crate) tls_resumed_connections: usize,
    /// TCP connections the server accepted during the phase: every connect
    /// a miss started, including those that landed unused in the pool and
    /// were closed because the idle pool was full.
    pub(crate) connections_opened: u64,
    /// Per batch index: who found no idle connection.
    pub(crate) batches: Vec<BatchIndexStats>,
    /// Fan-out latency (slowest batch of each fan-out), ms.
    pub(crate) fanout_ms: Option<Distribution>,
    /// Single batch call latency, ms.
    pub(crate) call_ms: Option<Distribution>,
    /// Calls that were pool hits, ms.
    pub(crate) call_hit_ms: Option<Distribution>,
    /// Calls that were pool misses, ms.
    pub(crate) call_miss_ms: Option<Distribution>,
    /// Mean setup time of the connections set up during the measurement
    /// that served calls, ms (`null` when none was set up).
    pub(crate) connection_setup_mean_ms: Option<f64>,
    /// Sum of the setup times of the connections set up during the
    /// measurement that served calls, ms.
    pub(crate) handshake_ms: f64,
    /// Sum of the calls' total times, ms.
    pub(crate) request_ms: f64,
    /// `handshake_ms / request_ms`.
    pub(crate) handshake_share: f64,
    /// Sum of the time calls waited for a connection (new or busy), ms.
    pub(crate) connection_wait_ms: f64,
    /// `connection_wait_ms / request_ms`.
    pub(crate) connection_wait_share: f64,
    /// Most calls in flight at once to the phase's host over the whole phase
    /// (warm-up included), as the library counts it: the number its pool
    /// advice states.
    pub(crate) in_flight_peak: usize,
    /// Mean calls in flight (Little's law: `request_ms / wall_ms`).
    pub(crate) in_flight_mean: f64,
    /// Phase wall time, ms.
    pub(crate) wall_ms: f64,
    /// The library's pool-size advice for the service (Little's law; the
    /// line it also logs), `null` when the pool was large enough.
    pub(crate) advice: Option<String>,
    /// Fan-out tail math (incident 2).
    pub(crate) tail: Option<TailMath>,
}

/// Why a fan-out's p99 is worse than one call's: with `k` parallel calls
/// the fan-out is as slow as its slowest call, so its p99 sits at the
/// single call's `0.99^(1/k)` quantile (p99.8 for k = 5).
#[derive(Debug, Clone, Serialize)]
pub(crate) struct TailMath {
    /// Parallel calls per fan-out (`k`).
    pub(crate) batches: usize,
    /// `0.99^(1/k)`, the single-call quantile the fan-out p99 looks at.
    pub(crate) quantile: f64,
    /// Single-call latency at that quantile, ms (the prediction).
    pub(crate) predicted_fanout_p99_ms: f64,
    /// Observed fan-out p99, ms.
    pub(crate) fanout_p99_ms: f64,
    /// Single-call p99, ms.
    pub(crate) call_p99_ms: f64,
}

impl TailMath {
    /// The tail math of `k` parallel calls whose latencies are `calls` (ms)
    /// and whose fan-outs took `fanouts` (ms); `None` without data.
    pub(crate) fn of(k: usize, calls: &[f64], fanouts: &[f64]) -> Option<Self> {
        let mut sorted: Vec<f64> = calls.iter().copied().filter(|v| v.is_finite()).collect();
        sorted.sort_by(f64::total_cmp);
        let mut fan: Vec<f64> = fanouts.iter().copied().filter(|v| v.is_finite()).collect();
        fan.sort_by(f64::total_cmp);
        let quantile = 0.99f64.powf(1.0 / k.max(1) as f64);
        Some(Self {
            batches: k,
            quantile: (quantile * 10_000.0).round() / 10_000.0,
            predicted_fanout_p99_ms: percentile(&sorted, quantile)?,
            fanout_p99_ms: percentile(&fan, 0.99)?,
            call_p99_ms: percentile(&sorted, 0.99)?,
        })
    }
}

/// Calls of `rows` by pool outcome.
fn count(rows: &[&RequestRow], outcome: &str) -> usize {
    rows.iter()
        .filter(|r| r.pool_outcome() == Some(outcome))
        .count()
}

impl PhaseSummary {
    /// Connections the server accepted in the measured part that served no
    /// call: [`connections_opened`](Self::connections_opened) less
    /// [`connections_used_opened_measured`](Self::connections_used_opened_measured)
    /// (a connect whose miss was served by a busy connection freeing up,
    /// closed unused by a full idle pool or still idle at the end).
    pub(crate) fn connections_served_none(&self) -> u64 {
        self.connections_opened
            .saturating_sub(self.connections_used_opened_measured as u64)
    }

    /// Summarizes `run`.
    pub(crate) fn new(
        name: &'static str,
        url: String,
        pool: usize,
        load: &Load,
        run: &PhaseRun,
        connections_opened: u64,
        advice: Option<String>,
    ) -> Self {
        let rows: Vec<&RequestRow> = run.calls.iter().map(|c| &c.row).collect();
        let conns = connections(rows.iter().copied());
        let totals: Vec<f64> = rows.iter().map(|r| r.total_ms).collect();
        let pick = |miss: bool| -> Vec<f64> {
            rows.iter()
                .filter(|r| r.pool_miss() == Some(miss))
                .map(|r| r.total_ms)
                .collect()
        };
        let hits = pick(false);
        let misses = pick(true);
        // Setup cost of the connections set up during the measurement.
        let measured_setups: Vec<f64> = conns
            .values()
            .filter(|c| run.measure_start.is_none_or(|m| c.started >= m))
            .map(|c| ms(c.total))
            .collect();
        let handshake = round3(measured_setups.iter().sum());
        let request = round3(totals.iter().sum());
        let wait = round3(rows.iter().filter_map(|r| r.wait_ms).sum());
        let wall = ms(run.wall);
        let batches = (0..load.batches)
            .map(|index| {
                let of_index: Vec<&RequestRow> = run
                    .calls
                    .iter()
                    .filter(|c| c.batch == index)
                    .map(|c| &c.row)
                    .collect();
                let hits = count(&of_index, "idle_hit");
                let new_connection = count(&of_index, "new_connection");
                let waited_for_busy = count(&of_index, "waited_for_busy");
                let misses = new_connection + waited_for_busy;
                let dist =
                    Distribution::of(&of_index.iter().map(|r| r.total_ms).collect::<Vec<_>>());
                BatchIndexStats {
                    index,
                    calls: of_index.len(),
                    misses,
                    hits,
                    new_connection,
                    waited_for_busy,
                    miss_ratio: ratio(misses as f64, (misses + hits) as f64),
                    p50_ms: dist.as_ref().map(|d| d.p50),
                    p99_ms: dist.as_ref().map(|d| d.p99),
                }
            })
            .collect();
        let fanouts_with_miss = run.fanouts.iter().filter(|f| f.misses > 0).count();
        PhaseSummary {
            name,
            url,
            pool_max_idle_per_host: pool,
            fanouts: run.fanouts.len(),
            calls: run.calls.len(),
            failed_calls: rows.iter().filter(|r| r.failed()).count(),
            pool_misses: misses.len(),
            pool_hits: hits.len(),
            misses_new_connection: count(&rows, "new_connection"),
            misses_waited_for_busy: count(&rows, "waited_for_busy"),
            miss_ratio: ratio(misses.len() as f64, (misses.len() + hits.len()) as f64),
            fanouts_with_miss,
            fanout_miss_ratio: ratio(fanouts_with_miss as f64, run.fanouts.len() as f64),
            connections_used: conns.len(),
            connections_used_opened_measured: measured_setups.len(),
            tls_resumed_connections: conns
                .values()
                .filter(|c| c.tls_resumed == Some(true))
                .count(),
            connections_opened,
            batches,
            fanout_ms: Distribution::of(
                &run.fanouts.iter().map(|f| f.latency_ms).collect::<Vec<_>>(),
            ),
            call_ms: Distribution::of(&totals),
            call_hit_ms: Distribution::of(&hits),
            call_miss_ms: Distribution::of(&misses),
            connection_setup_mean_ms: (!measured_setups.is_empty())
                .then(|| round3(handshake / measured_setups.len() as f64)),
            handshake_ms: handshake,
            request_ms: request,
            handshake_share: ratio(handshake, request),
            connection_wait_ms: wait,
            connection_wait_share: ratio(wait, request),
            in_flight_peak: run.in_flight_peak,
            in_flight_mean: if wall > 0.0 {
                (request / wall * 100.0).round() / 100.0
            } else {
                0.0
            },
            wall_ms: wall,
            advice,
            tail: TailMath::of(
                load.batches,
                &totals,
                &run.fanouts.iter().map(|f| f.latency_ms).collect::<Vec<_>>(),
            ),
        }
    }
}

/// The demo's settings.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct DemoConfig {
    /// Emulated round-trip time, ms.
    pub(crate) rtt_ms: u64,
    /// Server time per response, ms.
    pub(crate) server_delay_ms: u64,
    /// Fan-outs (user requests) per second.
    pub(crate) rate_per_s: f64,
    /// Concurrent batch calls per fan-out.
    pub(crate) batches: usize,
    /// Measured seconds per phase.
    pub(crate) duration_s: f64,
    /// Warm-up seconds before each phase's measurement (not counted).
    pub(crate) warmup_s: f64,
    /// Idle-pool size of the first phase.
    pub(crate) small_pool: usize,
    /// Idle-pool size of the second phase.
    pub(crate) right_pool: usize,
    /// The first phase's URL (see `urls`).
    pub(crate) url: String,
    /// The URL of each phase, in order: the same service behind two delay
    /// proxies, one port per phase, so each phase is its own host in the
    /// metrics and the pool advice.
    pub(crate) urls: Vec<String>,
}

/// Small pool versus right-sized pool.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct DemoComparison {
    /// Fan-out p99 of the small pool / of the right-sized pool.
    pub(crate) fanout_p99_ratio: Option<f64>,
    /// Fan-out p50 of the small pool / of the right-sized pool.
    pub(crate) fanout_p50_ratio: Option<f64>,
    /// Single-call p50 of the small pool / of the right-sized pool.
    pub(crate) call_p50_ratio: Option<f64>,
}

impl DemoComparison {
    /// Compares the two phases.
    pub(crate) fn new(small: &PhaseSummary, right: &PhaseSummary) -> Self {
        let r = |a: Option<f64>, b: Option<f64>| match (a, b) {
            (Some(a), Some(b)) if b > 0.0 => Some((a / b * 100.0).round() / 100.0),
            _ => None,
        };
        let f = |p: &PhaseSummary| p.fanout_ms.clone();
        let c = |p: &PhaseSummary| p.call_ms.clone();
        DemoComparison {
            fanout_p99_ratio: r(f(small).map(|d| d.p99), f(right).map(|d| d.p99)),
            fanout_p50_ratio: r(f(small).map(|d| d.p50), f(right).map(|d| d.p50)),
            call_p50_ratio: r(c(small).map(|d| d.p50), c(right).map(|d| d.p50)),
        }
    }
}

/// The whole demo result (`--json`).
#[derive(Debug, Clone, Serialize)]
pub(crate) struct DemoReport {
    /// Schema id: `conntrace.demo/v1`.
    pub(crate) schema: &'static str,
    /// conntrace version.
    pub(crate) conntrace_version: &'static str,
    /// Settings.
    pub(crate) config: DemoConfig,
    /// The phases, in order: small pool, then right-sized pool.
    pub(crate) phases: Vec<PhaseSummary>,
    /// Small versus right-sized pool.
    pub(crate) comparison: Option<DemoComparison>,
    /// The conclusion paragraph.
    pub(crate) conclusion: String,
    /// Absolute path of the OTLP JSON traces file (`null` when exporting over OTLP).
    pub(crate) traces_file: Option<String>,
    /// Where the spans went.
    pub(crate) telemetry: TelemetryReport,
}
