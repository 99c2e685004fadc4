//! The probe's human-readable output: a table per mode, totals, speedup.

use super::report::{ModeReport, ProbeReport};
use crate::row::RequestRow;
use crate::table::{fmt_bool, fmt_ms, fmt_pct, new_table};

/// Prints `report` to stdout.
pub(crate) fn print(report: &ProbeReport) {
    let order = match report.address_order {
        "keep" => String::new(),
        other => format!(", address order {other}"),
    };
    let pinned = if report.resolve.is_empty() {
        String::new()
    } else {
        format!(", --resolve {}", report.resolve.join(" "))
    };
    println!(
        "conntrace probe {}: {} request(s) per mode, concurrency {}, HTTP {}{order}{pinned}",
        report.url, report.requests_per_mode, report.concurrency, report.http
    );
    for mode in &report.modes {
        println!();
        print_mode(mode);
    }
    if let Some(c) = &report.comparison {
        println!();
        println!(
            "speedup: fresh {:.1} ms / reuse {:.1} ms = {:.2}x; connections opened: {} vs {}",
            c.fresh_wall_ms, c.reuse_wall_ms, c.speedup, c.fresh_connections, c.reuse_connections
        );
        println!(
            "handshake share of request time: {} with a connection per request, {} with reuse",
            fmt_pct(c.fresh_handshake_share),
            fmt_pct(c.reuse_handshake_share)
        );
    }
    let t = &report.telemetry;
    match (t.sink, &t.error) {
        ("file", None) => println!(
            "\ntraces: {} span(s) written to {}",
            t.spans_written.unwrap_or(0),
            t.traces_file.as_deref().unwrap_or("")
        ),
        ("otlp", None) => println!(
            "\ntraces: exported to {}",
            t.otlp_endpoint.as_deref().unwrap_or("")
        ),
        _ => {}
    }
}

/// The `dns` cell: `-` on a hit, `skip` when no lookup ran.
fn dns_cell(r: &RequestRow) -> String {
    match (r.reused, r.dns_skipped) {
        (Some(false), Some(why)) => format!("skip ({why})"),
        _ => fmt_ms(r.dns_ms),
    }
}

/// The `status` cell: the status, or the `error.type` when no response
/// arrived; a request that failed after its headers shows both, `200,
/// then incomplete_body` (`200, then failed` when the type is the status).
fn status_cell(r: &RequestRow) -> String {
    match (r.status, &r.error_type) {
        (Some(s), Some(t)) if r.failed() && *t != s.to_string() => format!("{s}, then {t}"),
        (Some(s), _) if r.failed() => format!("{s}, then failed"),
        (Some(s), _) => s.to_string(),
        (None, Some(t)) => t.clone(),
        (None, None) => "error".to_owned(),
    }
}

/// Prints one mode's table and totals.
fn print_mode(mode: &ModeReport) {
    let what = match mode.mode {
        "fresh" => "a new connection per request (pool_max_idle_per_host = 0)".to_owned(),
        _ => match mode.pool_max_idle_per_host {
            Some(k) => format!("connections reused from the pool (pool_max_idle_per_host = {k})"),
            None => "connections reused from the pool".to_owned(),
        },
    };
    println!("mode {}: {what}", mode.mode);
    let mut table = new_table(
        &[
            "#", "dns ms", "tcp ms", "tls ms", "wait ms", "ttfb ms", "total ms", "reused", "miss",
            "conn", "TLS", "resumed", "status",
        ],
        1,
    );
    for r in &mode.requests {
        table.add_row(vec![
            // A redirect hop: the request's number and its resend count.
            if r.resend_count > 0 {
                format!("{} +{}", r.index, r.resend_count)
            } else {
                r.index.to_string()
            },
            dns_cell(r),
            fmt_ms(r.tcp_ms),
            fmt_ms(r.tls_ms),
            fmt_ms(r.wait_ms),
            fmt_ms(r.ttfb_ms),
            fmt_ms(Some(r.total_ms)),
            fmt_bool(r.reused).to_owned(),
            r.miss_reason.unwrap_or("-").to_owned(),
            r.connection_id.map_or("-".to_owned(), |c| format!("#{c}")),
            r.tls_version.unwrap_or("-").to_owned(),
            fmt_bool(r.tls_resumed).to_owned(),
            status_cell(r),
        ]);
    }
    println!("{table}");
    let t = &mode.totals;
    let (p50, p99) = t
        .request_ms
        .as_ref()
        .map_or((None, None), |d| (Some(d.p50), Some(d.p99)));
    // Connects that lost hyper-util's race to a freed connection.
    let unused = t
        .connections_opened
        .saturating_sub(t.new_connections as u64);
    println!(
        "totals: {} request(s), {} failed{}; {} new connection(s){} ({} TLS resumed); {} idle pool hit(s), {} miss(es){}",
        t.requests,
        t.failed,
        if t.failed_after_response > 0 {
            format!(
                " ({} after the response headers: counted as pool hits or misses)",
                t.failed_after_response
            )
        } else {
            String::new()
        },
        t.new_connections,
        if unused > 0 {
            format!(
                " served them, of {} opened ({unused} served none: their request got a freed connection first)",
                t.connections_opened
            )
        } else {
            String::new()
        },
        t.tls_resumed_connections,
        t.pool_hits,
        t.pool_misses,
        if t.misses_waited_for_busy > 0 {
            format!(
                " ({} waited for a busy connection)",
                t.misses_waited_for_busy
            )
        } else {
            String::new()
        }
    );
    if t.failed_misses > 0 {
        println!(
            "        {} failed request(s) had missed the pool first (a connect of their own, then no response): not in the misses above; http.client.pool.misses counts them with error.type",
            t.failed_misses
        );
    }
    if t.address_fallbacks > 0 {
        println!(
            "        {} of {} new connection(s) fell back to a later resolved address (the first failed, timed out or lost Happy Eyeballs): see --address-order",
            t.address_fallbacks, t.new_connections
        );
    }
    println!(
        "        wall {:.1} ms; per request p50 {} ms, p99 {} ms; connection setup {:.1} ms (dns {:.1}, tcp {:.1}, tls {:.1}) = {} of request time",
        t.wall_ms,
        fmt_ms(p50),
        fmt_ms(p99),
        t.connection_setup_ms,
        t.dns_ms,
        t.tcp_ms,
        t.tls_ms,
        fmt_pct(t.handshake_share)
    );
}
