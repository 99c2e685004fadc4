//! The demo's human-readable output: per-batch misses, the phase
//! comparison table and the conclusion.

use comfy_table::Table;

use super::report::{DemoReport, PhaseSummary};
use crate::stats::Distribution;
use crate::table::{fmt_ms, fmt_pct, new_table};

/// `p50 / p99` of a distribution.
fn p50_p99(d: Option<&Distribution>) -> String {
    format!(
        "{} / {}",
        fmt_ms(d.map(|d| d.p50)),
        fmt_ms(d.map(|d| d.p99))
    )
}

/// Renders one comparison cell of a phase.
type RowFn = Box<dyn Fn(&PhaseSummary) -> String>;

/// The comparison table's rows: label, definition (printed in the legend
/// under the table) and the cell of one phase.
fn rows() -> Vec<(&'static str, &'static str, RowFn)> {
    vec![
        (
            "pool_max_idle_per_host",
            "the phase's idle-pool limit per host (reqwest's ClientBuilder setting)",
            Box::new(|p| p.pool_max_idle_per_host.to_string()),
        ),
        (
            "fan-outs / batch calls",
            "user requests made in the measured part / the concurrent batch calls they made",
            Box::new(|p| format!("{} / {}", p.fanouts, p.calls)),
        ),
        (
            "pool-miss ratio (misses)",
            "calls that found no idle pooled connection when they started / all calls; misses = new conn. + waited for busy",
            Box::new(|p| format!("{} ({})", fmt_pct(p.miss_ratio), p.pool_misses)),
        ),
        (
            "misses: new conn. / waited for busy",
            "misses that were the first call on a newly opened connection / misses served by a connection another call was using (it freed up first); every miss starts one connect of its own, which hyper-util races against a busy connection freeing up",
            Box::new(|p| format!("{} / {}", p.misses_new_connection, p.misses_waited_for_busy)),
        ),
        (
            "fan-outs with a miss",
            "user requests with at least one batch call that missed",
            Box::new(|p| fmt_pct(p.fanout_miss_ratio)),
        ),
        (
            "connections opened (server)",
            "TCP connections the demo's server accepted during the measured part: the connects the misses started, used or not",
            Box::new(|p| p.connections_opened.to_string()),
        ),
        (
            "connections used (TLS resumed)",
            "distinct connections that served at least one call, warm-up ones included; in brackets those whose TLS handshake resumed a session",
            Box::new(|p| format!("{} ({})", p.connections_used, p.tls_resumed_connections)),
        ),
        (
            "calls in flight: peak / mean",
            "most batch calls running at once / their mean number (total call time / wall time, Little's law)",
            Box::new(|p| format!("{} / {:.1}", p.in_flight_peak, p.in_flight_mean)),
        ),
        (
            "fan-out ms: p50 / p99",
            "a user request's latency: its slowest batch call",
            Box::new(|p| p50_p99(p.fanout_ms.as_ref())),
        ),
        (
            "single call ms: p50 / p99",
            "one batch call's latency, every call",
            Box::new(|p| p50_p99(p.call_ms.as_ref())),
        ),
        (
            "call on pool hit ms: p50 / p99",
            "one batch call's latency, idle hits only",
            Box::new(|p| p50_p99(p.call_hit_ms.as_ref())),
        ),
        (
            "call on pool miss ms: p50 / p99",
            "one batch call's latency, misses only",
            Box::new(|p| p50_p99(p.call_miss_ms.as_ref())),
        ),
        (
            "connection setup, mean ms",
            "DNS + TCP + TLS of the connections opened in the measured part that served calls",
            Box::new(|p| fmt_ms(p.connection_setup_mean_ms)),
        ),
        (
            "share of time: wait for conn. / setup",
            "of the calls' total time: time spent waiting for a connection (new or busy) / time the connections they used spent being set up",
            Box::new(|p| {
                format!(
                    "{} / {}",
                    fmt_pct(p.connection_wait_share),
                    fmt_pct(p.handshake_share)
                )
            }),
        ),
        (
            "failed calls",
            "calls that got no response",
            Box::new(|p| p.failed_calls.to_string()),
        ),
    ]
}

/// The side-by-side comparison of the phases.
fn comparison(phases: &[PhaseSummary]) -> Table {
    let mut header = vec!["".to_owned()];
    header.extend(phases.iter().map(|p| p.name.to_owned()));
    let header_refs: Vec<&str> = header.iter().map(String::as_str).collect();
    let mut table = new_table(&header_refs, 1);
    for (label, _, f) in rows() {
        let mut row = vec![label.to_owned()];
        row.extend(phases.iter().map(&f));
        table.add_row(row);
    }
    table
}

/// The per-batch table's cell, defined in the legend.
const PER_BATCH_CELL: (&str, &str) = (
    "per batch: misses / calls (new conn. + waited) ratio",
    "for one batch index over all fan-outs: calls that found no idle connection, all calls, the two kinds of miss (see below), misses / calls",
);

/// Misses per batch index, one column per phase.
fn per_batch(phases: &[PhaseSummary]) -> Table {
    let mut header = vec!["batch".to_owned()];
    header.extend(
        phases
            .iter()
            .map(|p| format!("{}: misses / calls (new conn. + waited)", p.name)),
    );
    let header_refs: Vec<&str> = header.iter().map(String::as_str).collect();
    let mut table = new_table(&header_refs, 0);
    let n = phases.iter().map(|p| p.batches.len()).max().unwrap_or(0);
    for i in 0..n {
        let mut row = vec![i.to_string()];
        for p in phases {
            row.push(p.batches.get(i).map_or_else(String::new, |b| {
                format!(
                    "{} / {} ({} + {}) {}",
                    b.misses,
                    b.calls,
                    b.new_connection,
                    b.waited_for_busy,
                    fmt_pct(b.miss_ratio)
                )
            }));
        }
        table.add_row(row);
    }
    table
}

/// How the server's connections, the misses and the connections used add
/// up for one phase (the figures of the comparison table).
fn reconciliation(p: &PhaseSummary) -> Vec<String> {
    let misses = p.misses_new_connection + p.misses_waited_for_busy;
    let opened = usize::try_from(p.connections_opened).unwrap_or(usize::MAX);
    let used_new = p.connections_used_opened_measured;
    let mut lines = Vec::new();
    let boundary = match opened.cmp(&misses) {
        std::cmp::Ordering::Equal => String::new(),
        std::cmp::Ordering::Greater => format!(
            " + {} started by calls outside the measured part (warm-up stragglers)",
            opened - misses
        ),
        std::cmp::Ordering::Less => format!(
            " - {} whose connect never reached the server (abandoned once a busy connection freed up) or began in the warm-up",
            misses - opened
        ),
    };
    lines.push(format!(
        "connections opened (server) {opened} = {} new conn. + {} waited for busy{boundary}: one connect per miss",
        p.misses_new_connection, p.misses_waited_for_busy
    ));
    if opened > 0 {
        lines.push(format!(
        "of those {opened}: {used_new} served calls ({} as the first call of a new connection, {} went to the idle pool first and served later calls), {} served none (a busy connection freed up for the miss that started it, and the idle pool, {} per host, was full: closed unused, or still idle at the end)",
        p.misses_new_connection.min(used_new),
        used_new.saturating_sub(p.misses_new_connection),
        p.connections_served_none(),
        p.pool_max_idle_per_host
    ));
    }
    lines.push(format!(
        "connections used {} = {used_new} opened in the measured part + {} kept from the warm-up",
        p.connections_used,
        p.connections_used.saturating_sub(used_new)
    ));
    lines
}

/// Prints `report` to stdout.
pub(crate) fn print(report: &DemoReport) {
    let c = &report.config;
    println!(
        "conntrace demo: incident 2, a fan-out whose idle pool is smaller than its in-flight concurrency"
    );
    println!(
        "  service: HTTP/1.1 over TLS, {} ms per response, behind a {} ms RTT loopback delay proxy with one port per phase (each phase its own host in the metrics and advice): {}",
        c.server_delay_ms,
        c.rtt_ms,
        report
            .phases
            .iter()
            .map(|p| format!("{} {}", p.name, p.url))
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!(
        "  load: {} user requests/s, each a fan-out of {} concurrent batch calls; {} s measured per phase after {} s of warm-up",
        c.rate_per_s, c.batches, c.duration_s, c.warmup_s
    );
    println!();
    println!("which batches found no idle connection (pool misses per batch index):");
    println!("{}", per_batch(&report.phases));
    println!();
    println!("{}", comparison(&report.phases));
    println!("legend:");
    println!("  {}: {}", PER_BATCH_CELL.0, PER_BATCH_CELL.1);
    for (label, definition, _) in rows() {
        println!("  {label}: {definition}");
    }
    println!();
    for p in &report.phases {
        println!(
            "{} ({}, pool_max_idle_per_host {}): miss ratio {:.0} % (measured part), peak in flight {} (whole phase)",
            p.name,
            p.url,
            p.pool_max_idle_per_host,
            p.miss_ratio * 100.0,
            p.in_flight_peak
        );
        for line in reconciliation(p) {
            println!("  {line}");
        }
        match &p.advice {
            Some(a) => println!("  advice: {a}"),
            None => println!("  advice: none (the idle pool covers the peak in flight)"),
        }
        if let Some(t) = &p.tail {
            println!(
                "  tail math: fan-out p99 {:.1} ms vs single-call p99 {:.1} ms; with {} parallel calls the fan-out's p99 sits at the single call's p{:.1} = {:.1} ms (0.99^(1/{}) = {:.4})",
                t.fanout_p99_ms,
                t.call_p99_ms,
                t.batches,
                t.quantile * 100.0,
                t.predicted_fanout_p99_ms,
                t.batches,
                t.quantile
            );
        }
    }
    println!();
    println!("conclusion: {}", report.conclusion);
    println!();
    println!(
        "note: the delay proxy charges the TCP handshake's round trip to the first bytes sent, \
         so on loopback it shows up in the tls phase, not in tcp."
    );
    let t = &report.telemetry;
    match (t.sink, &t.error) {
        ("file", None) => println!(
            "traces: {} span(s) written to {} (OTLP JSON; one trace per user request: user_request > fan_out > batch > GET > http.connection_setup > dns/tcp/tls); metrics: {}",
            t.spans_written.unwrap_or(0),
            report.traces_file.as_deref().unwrap_or(""),
            t.metrics_file.as_deref().unwrap_or("")
        ),
        ("otlp", None) => println!(
            "traces and metrics: exported to {} (one trace per user request: user_request > fan_out > batch > GET > http.connection_setup)",
            t.otlp_endpoint.as_deref().unwrap_or("")
        ),
        _ => {}
    }
}
