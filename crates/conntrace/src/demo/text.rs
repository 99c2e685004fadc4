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

/// The side-by-side comparison of the phases.
fn comparison(phases: &[PhaseSummary]) -> Table {
    let mut header = vec!["".to_owned()];
    header.extend(phases.iter().map(|p| p.name.to_owned()));
    let header_refs: Vec<&str> = header.iter().map(String::as_str).collect();
    let mut table = new_table(&header_refs, 1);
    let rows: Vec<(&str, RowFn)> = vec![
        (
            "pool_max_idle_per_host",
            Box::new(|p| p.pool_max_idle_per_host.to_string()),
        ),
        (
            "fan-outs / batch calls",
            Box::new(|p| format!("{} / {}", p.fanouts, p.calls)),
        ),
        (
            "pool-miss ratio (misses)",
            Box::new(|p| format!("{} ({})", fmt_pct(p.miss_ratio), p.pool_misses)),
        ),
        (
            "misses: new conn. / waited for busy",
            Box::new(|p| format!("{} / {}", p.misses_new_connection, p.misses_waited_for_busy)),
        ),
        (
            "fan-outs with a miss",
            Box::new(|p| fmt_pct(p.fanout_miss_ratio)),
        ),
        (
            "connections opened (server)",
            Box::new(|p| p.connections_opened.to_string()),
        ),
        (
            "connections used (TLS resumed)",
            Box::new(|p| format!("{} ({})", p.connections_used, p.tls_resumed_connections)),
        ),
        (
            "calls in flight: peak / mean",
            Box::new(|p| format!("{} / {:.1}", p.in_flight_peak, p.in_flight_mean)),
        ),
        (
            "fan-out ms: p50 / p99",
            Box::new(|p| p50_p99(p.fanout_ms.as_ref())),
        ),
        (
            "single call ms: p50 / p99",
            Box::new(|p| p50_p99(p.call_ms.as_ref())),
        ),
        (
            "call on pool hit ms: p50 / p99",
            Box::new(|p| p50_p99(p.call_hit_ms.as_ref())),
        ),
        (
            "call on pool miss ms: p50 / p99",
            Box::new(|p| p50_p99(p.call_miss_ms.as_ref())),
        ),
        (
            "connection setup, mean ms",
            Box::new(|p| fmt_ms(p.connection_setup_mean_ms)),
        ),
        (
            "share of time: wait for conn. / setup",
            Box::new(|p| {
                format!(
                    "{} / {}",
                    fmt_pct(p.connection_wait_share),
                    fmt_pct(p.handshake_share)
                )
            }),
        ),
        ("failed calls", Box::new(|p| p.failed_calls.to_string())),
    ];
    for (label, f) in rows {
        let mut row = vec![label.to_owned()];
        row.extend(phases.iter().map(&f));
        table.add_row(row);
    }
    table
}

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
