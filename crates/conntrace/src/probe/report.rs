//! The probe's results: per-mode totals and the fresh/reuse comparison, as
//! serialized by `--json` (see SCHEMA.md).

use std::time::Duration;

use serde::Serialize;
use url::Url;

use super::{Mode, ProbeArgs};
use crate::row::{RequestRow, connections};
use crate::stats::{Distribution, ms, ratio, round3};
use crate::telemetry::TelemetryReport;

/// Totals of one mode.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct ModeTotals {
    /// Requests sent.
    pub(crate) requests: usize,
    /// Requests that got their whole response (any status).
    pub(crate) succeeded: usize,
    /// Requests that failed: without a response, or after its headers
    /// ([`failed_after_response`](Self::failed_after_response)).
    pub(crate) failed: usize,
    /// Of the failed requests, those that got the response headers first
    /// (a status): the body cut by the server (FIN or RST) or timed out,
    /// or plain HTTP answered by a TLS port. A connection served them, so
    /// they count as pool hits or misses too.
    pub(crate) failed_after_response: usize,
    /// Idle hits: requests served at once by an idle pooled connection
    /// (no miss reason, no wait). With [`pool_misses`](Self::pool_misses),
    /// counted over the requests that got a response on a connection:
    /// `pool_hits + pool_misses = succeeded + failed_after_response`.
    pub(crate) pool_hits: usize,
    /// Requests that found no idle connection (they have a miss reason):
    /// those that waited for a new connection and those that waited for a
    /// busy one (see [`pool_hits`](Self::pool_hits)).
    pub(crate) pool_misses: usize,
    /// Of the misses, those served by a connection another request was
    /// using or setting up (`reused = true` with a wait or a miss reason).
    pub(crate) misses_waited_for_busy: usize,
    /// Failed requests without a response that had missed the pool first:
    /// they triggered a connect (refused, rejected, or they gave up on
    /// it). Not in [`pool_misses`](Self::pool_misses); the library's
    /// `http.client.pool.misses` counts them with their `error.type`, so
    /// its series without `error.type` are `pool_misses`, and with it
    /// this.
    pub(crate) failed_misses: usize,
    /// Distinct connections that served the requests (all opened in this mode).
    pub(crate) new_connections: usize,
    /// Connections the mode's requests opened, used or not: every miss
    /// starts a connect, and one whose request a freed connection served
    /// first lands unused in the pool (or is closed by a full one). A
    /// connect that failed (refused, TLS rejected, abandoned) opened none
    /// (as `http.client.connections.opened` counts).
    pub(crate) connections_opened: u64,
    /// Of those, connections whose TLS handshake resumed a session.
    pub(crate) tls_resumed_connections: usize,
    /// Of those, connections whose connect fell back to a later resolved
    /// address (an earlier one failed, timed out or lost Happy Eyeballs).
    pub(crate) address_fallbacks: usize,
    /// Wall-clock time of the whole mode.
    pub(crate) wall_ms: f64,
    /// Sum of the requests' total times.
    pub(crate) sum_request_ms: f64,
    /// Request total time distribution (`null` when no request ran).
    pub(crate) request_ms: Option<Distribution>,
    /// Sum of the new connections' setup times (DNS + TCP + TLS).
    pub(crate) connection_setup_ms: f64,
    /// Sum of their DNS phases.
    pub(crate) dns_ms: f64,
    /// Sum of their TCP phases.
    pub(crate) tcp_ms: f64,
    /// Sum of their TLS phases.
    pub(crate) tls_ms: f64,
    /// `connection_setup_ms / sum_request_ms`: the share of request time
    /// spent setting up connections (0..1).
    pub(crate) handshake_share: f64,
}

impl ModeTotals {
    /// Totals of `rows`, run in `wall`.
    pub(crate) fn new(rows: &[RequestRow], wall: Duration) -> Self {
        let conns = connections(rows);
        let sum = |f: fn(&crate::row::SetupCost) -> Duration| -> f64 {
            round3(conns.values().map(|c| ms(f(c))).sum())
        };
        let setup = sum(|c| c.total);
        let totals: Vec<f64> = rows.iter().map(|r| r.total_ms).collect();
        let sum_request = round3(totals.iter().sum());
        ModeTotals {
            requests: rows.len(),
            succeeded: rows.iter().filter(|r| !r.failed()).count(),
            failed: rows.iter().filter(|r| r.failed()).count(),
            failed_after_response: rows
                .iter()
                .filter(|r| r.failed() && r.status.is_some())
                .count(),
            pool_hits: rows.iter().filter(|r| r.pool_miss() == Some(false)).count(),
            pool_misses: rows.iter().filter(|r| r.pool_miss() == Some(true)).count(),
            misses_waited_for_busy: rows
                .iter()
                .filter(|r| r.pool_outcome() == Some("waited_for_busy"))
                .count(),
            failed_misses: rows
                .iter()
                .filter(|r| r.failed() && r.status.is_none() && r.connects > 0)
                .count(),
            new_connections: conns.len(),
            connections_opened: rows
                .iter()
                .map(|r| u64::from(r.connects.saturating_sub(r.failed_connects)))
                .sum(),
            tls_resumed_connections: conns
                .values()
                .filter(|c| c.tls_resumed == Some(true))
                .count(),
            address_fallbacks: conns.values().filter(|c| c.address_fallback).count(),
            wall_ms: ms(wall),
            sum_request_ms: sum_request,
            request_ms: Distribution::of(&totals),
            connection_setup_ms: setup,
            dns_ms: sum(|c| c.dns.unwrap_or_default()),
            tcp_ms: sum(|c| c.tcp),
            tls_ms: sum(|c| c.tls.unwrap_or_default()),
            handshake_share: ratio(setup, sum_request),
        }
    }
}

/// One mode's requests and totals.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct ModeReport {
    /// `fresh` or `reuse`.
    pub(crate) mode: &'static str,
    /// The client's `pool_max_idle_per_host` (`null`: reqwest's default, unlimited).
    pub(crate) pool_max_idle_per_host: Option<usize>,
    /// One entry per request, in request order.
    pub(crate) requests: Vec<RequestRow>,
    /// Totals.
    pub(crate) totals: ModeTotals,
}

impl ModeReport {
    /// The report of `mode`'s `rows`, run in `wall`.
    pub(crate) fn new(
        mode: Mode,
        pool_max_idle_per_host: Option<usize>,
        rows: Vec<RequestRow>,
        wall: Duration,
    ) -> Self {
        let totals = ModeTotals::new(&rows, wall);
        ModeReport {
            mode: mode.as_str(),
            pool_max_idle_per_host,
            requests: rows,
            totals,
        }
    }
}

/// Fresh versus reuse.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Comparison {
    /// Fresh wall time / reuse wall time (>1: reuse was faster).
    pub(crate) speedup: f64,
    /// Fresh mode's wall time.
    pub(crate) fresh_wall_ms: f64,
    /// Reuse mode's wall time.
    pub(crate) reuse_wall_ms: f64,
    /// Fresh mode's handshake share.
    pub(crate) fresh_handshake_share: f64,
    /// Reuse mode's handshake share.
    pub(crate) reuse_handshake_share: f64,
    /// Connections opened in fresh mode (`connections_opened`).
    pub(crate) fresh_connections: u64,
    /// Connections opened in reuse mode (`connections_opened`).
    pub(crate) reuse_connections: u64,
}

/// The whole probe result (`--json`).
#[derive(Debug, Clone, Serialize)]
pub(crate) struct ProbeReport {
    /// Schema id: `conntrace.probe/v1`.
    pub(crate) schema: &'static str,
    /// conntrace version.
    pub(crate) conntrace_version: &'static str,
    /// The probed URL (credentials and signed query values redacted).
    pub(crate) url: String,
    /// Requests per mode.
    pub(crate) requests_per_mode: u32,
    /// Requests per wave.
    pub(crate) concurrency: u32,
    /// `auto`, `http1` or `http2`.
    pub(crate) http: &'static str,
    /// Per-request timeout, seconds.
    pub(crate) timeout_s: f64,
    /// `--resolve` entries applied.
    pub(crate) resolve: Vec<String>,
    /// `--address-order`: `keep`, `ipv4-first` or `ipv6-first`.
    pub(crate) address_order: &'static str,
    /// The modes run, in order.
    pub(crate) modes: Vec<ModeReport>,
    /// Present when both modes ran.
    pub(crate) comparison: Option<Comparison>,
    /// Requests sent over all modes.
    pub(crate) total_requests: usize,
    /// Requests that failed over all modes (with or without a response).
    pub(crate) failed_requests: usize,
    /// Where the spans went.
    pub(crate) telemetry: TelemetryReport,
}

impl ProbeReport {
    /// Assembles the report.
    pub(crate) fn new(
        url: &Url,
        args: &ProbeArgs,
        modes: Vec<ModeReport>,
        telemetry: TelemetryReport,
    ) -> Self {
        let find = |name: &str| modes.iter().find(|m| m.mode == name).map(|m| &m.totals);
        let comparison = match (find("fresh"), find("reuse")) {
            (Some(f), Some(r)) => Some(Comparison {
                speedup: if r.wall_ms > 0.0 {
                    (f.wall_ms / r.wall_ms * 100.0).round() / 100.0
                } else {
                    0.0
                },
                fresh_wall_ms: f.wall_ms,
                reuse_wall_ms: r.wall_ms,
                fresh_handshake_share: f.handshake_share,
                reuse_handshake_share: r.handshake_share,
                fresh_connections: f.connections_opened,
                reuse_connections: r.connections_opened,
            }),
            _ => None,
        };
        ProbeReport {
            schema: "conntrace.probe/v1",
            conntrace_version: env!("CARGO_PKG_VERSION"),
            url: reqwest_conntrace::redact_url(url),
            requests_per_mode: args.requests,
            concurrency: args.concurrency,
            http: args.client.http_policy().as_str(),
            timeout_s: args.client.timeout.as_secs_f64(),
            resolve: args
                .client
                .resolve
                .iter()
                .filter(|e| e.matches(url))
                .map(ToString::to_string)
                .collect(),
            address_order: args.client.address_order.as_str(),
            total_requests: modes.iter().map(|m| m.totals.requests).sum(),
            failed_requests: modes.iter().map(|m| m.totals.failed).sum(),
            modes,
            comparison,
            telemetry,
        }
    }
}
