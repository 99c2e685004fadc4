//! The text output of `conntrace lab`: tables of what the spans say, the
//! findings, the fix.

use super::report::{LabReport, TextTable};
use super::view::{ConnectionView, RequestView, RunView};
use crate::table::{fmt_bool, fmt_ms, new_table};

/// Prints `report` and its tables to stdout.
pub(crate) fn print(report: &LabReport, tables: &[TextTable]) {
    println!("conntrace lab {}: {}", report.scenario, report.description);
    for t in tables {
        println!();
        println!("{}", t.title);
        let mut table = new_table(&t.header, t.header.len());
        for i in &t.right {
            if let Some(col) = table.column_mut(*i) {
                col.set_cell_alignment(comfy_table::CellAlignment::Right);
            }
        }
        for row in &t.rows {
            table.add_row(row.clone());
        }
        println!("{table}");
    }
    println!();
    println!("what the telemetry shows:");
    for f in &report.findings {
        println!("  - {f}");
    }
    if let Some(fix) = &report.fix {
        println!("fix: {fix}");
    }
    match &report.not_reproduced_because {
        None => println!("reproduced: yes"),
        Some(why) => println!("reproduced: no ({why})"),
    }
    let t = &report.telemetry;
    match (t.sink, &t.error) {
        ("file", None) => println!(
            "traces: {} span(s) written to {}",
            t.spans_written.unwrap_or(0),
            t.traces_file.as_deref().unwrap_or("")
        ),
        ("otlp", None) => println!(
            "traces: exported to {}",
            t.otlp_endpoint.as_deref().unwrap_or("")
        ),
        _ => {}
    }
}

/// A per-request table of `run`: pool outcome and, for requests that set up
/// a connection, its phases.
pub(crate) fn requests_table(title: impl Into<String>, run: &RunView) -> TextTable {
    TextTable {
        title: title.into(),
        header: vec![
            "#",
            "start ms",
            "total ms",
            "result",
            "reused",
            "miss reason",
            "conn",
            "setup ms",
            "dns ms",
            "tcp ms",
            "tls ms",
            "what the connect shows",
        ],
        right: vec![0, 1, 2, 6, 7, 8, 9, 10],
        rows: run
            .requests
            .iter()
            .map(|r| {
                request_row(
                    r,
                    run.connections.iter().find(|c| c.trigger == Some(r.index)),
                )
            })
            .collect(),
    }
}

fn request_row(r: &RequestView, setup: Option<&ConnectionView>) -> Vec<String> {
    let result = match (&r.error_type, r.status) {
        (Some(e), _) => e.clone(),
        (None, Some(s)) => s.to_string(),
        (None, None) => "-".to_owned(),
    };
    let conn = r
        .connection_id
        .or_else(|| setup.and_then(|c| c.id))
        .map_or("-".to_owned(), |id| format!("#{id}"));
    let mut row = vec![
        r.index.to_string(),
        fmt_ms(Some(r.start_ms)),
        fmt_ms(Some(r.total_ms)),
        result,
        fmt_bool(r.reused).to_owned(),
        r.miss_reason.clone().unwrap_or_else(|| "-".to_owned()),
        conn,
    ];
    match setup {
        Some(c) => {
            row.push(fmt_ms(Some(c.total_ms)));
            row.push(fmt_ms(c.dns.as_ref().map(|d| d.ms)));
            row.push(fmt_ms(c.tcp.as_ref().map(|t| t.ms)));
            row.push(fmt_ms(c.tls.as_ref().map(|t| t.ms)));
            row.push(notes(c));
        }
        None => row.extend(["-", "-", "-", "-", "-"].map(str::to_owned)),
    }
    row
}

/// The notable facts of a connect, in a few words.
pub(crate) fn notes(c: &ConnectionView) -> String {
    let mut notes = Vec::new();
    if let Some(e) = &c.error_type {
        notes.push(format!(
            "{e} in {}",
            c.failed_phase.as_deref().unwrap_or("setup")
        ));
    } else if c.outcome != reqwest_conntrace::semconv::SETUP_OUTCOME_USED {
        let id = c.id.map_or("?".to_owned(), |id| format!("#{id}"));
        notes.push(format!("own connect {id} {}", c.outcome));
    }
    if let Some(q) = c
        .dns
        .as_ref()
        .and_then(|d| d.queued_ms)
        .filter(|q| *q >= 1.0)
    {
        notes.push(format!("DNS queued {q:.0} ms"));
    }
    if c.proxied {
        notes.push("proxied".to_owned());
    }
    for p in &c.proxy_connect {
        notes.push(format!("CONNECT {:.1} ms", p.ms));
    }
    if let Some(t) = &c.tcp {
        for s in &t.skipped {
            notes.push(format!(
                "skipped {} ({})",
                s.address.as_deref().unwrap_or("?"),
                s.outcome.as_deref().unwrap_or("?")
            ));
        }
        if let Some(n) = t.syn_retransmits.filter(|n| *n > 0) {
            notes.push(format!("{n} SYN retransmit(s)"));
        }
        if let Some(k) = t.kernel.retransmits.filter(|k| *k > 0) {
            notes.push(format!("kernel retransmits {k}"));
        }
        if c.address_fallback || t.address_fallback == Some(true) {
            notes.push(format!(
                "fallback to {}",
                t.peer_address.as_deref().unwrap_or("?")
            ));
        }
    }
    if let Some(tls) = &c.tls {
        let version = tls.version.as_deref().unwrap_or("?");
        match tls.resumed {
            Some(true) => notes.push(format!("TLS {version} resumed")),
            Some(false) => notes.push(format!("TLS {version} full")),
            None => {}
        }
    }
    if notes.is_empty() {
        "-".to_owned()
    } else {
        notes.join("; ")
    }
}

/// What request `index` (1-based) of `run` got, in words, e.g. `miss
/// (miss_reason idle_expired): new connection #5 set up in 3.1 ms; 4.0 ms in
/// all`.
pub(crate) fn describe(run: &RunView, index: usize) -> String {
    let Some(r) = index.checked_sub(1).and_then(|i| run.requests.get(i)) else {
        return "no request span".to_owned();
    };
    let setup = run.connections.iter().find(|c| c.trigger == Some(r.index));
    let conn = r
        .connection_id
        .map_or("?".to_owned(), |id| format!("#{id}"));
    let reason = r.miss_reason.as_deref().unwrap_or("none");
    // The innermost cause of the error chain, e.g. `connection closed
    // before message completed`.
    let cause = r
        .error
        .as_deref()
        .and_then(|m| m.rsplit(": ").next())
        .map_or(String::new(), |c| format!(" ({c})"));
    let what = match (&r.error_type, r.reused) {
        (Some(e), _) => match setup {
            Some(c) => format!(
                "failed with error.type {e}{cause}; its connect ended with error.type {} in {}",
                c.error_type.as_deref().unwrap_or("none"),
                c.failed_phase.as_deref().unwrap_or("setup")
            ),
            None => format!("failed with error.type {e}{cause}, without a connect of its own"),
        },
        (None, Some(true)) if r.miss_reason.is_none() => match r.idle_ms {
            Some(idle) => format!("pool hit on connection {conn} (idle {idle:.1} ms)"),
            None => format!("pool hit on connection {conn}"),
        },
        (None, Some(true)) => format!(
            "waited {:.1} ms for busy connection {conn} (miss_reason {reason})",
            r.wait_ms.unwrap_or(0.0)
        ),
        (None, Some(false)) => match setup {
            Some(c) => format!(
                "miss (miss_reason {reason}): new connection {conn} set up in {:.1} ms",
                c.total_ms
            ),
            None => format!("miss (miss_reason {reason}) on connection {conn}"),
        },
        (None, None) => "no pool attribution on the span".to_owned(),
    };
    format!("{what}; {:.1} ms in all", r.total_ms)
}

/// One line per request of `run` whose miss names a previous connection:
/// what it got ([`describe`]) and how that connection ended, e.g.
/// `request 6: ...; the previous connection 1 had carried 5 requests and
/// ended with connection_close`.
pub(crate) fn previous_connection_lines(run: &RunView) -> Vec<String> {
    run.requests
        .iter()
        .filter_map(|r| {
            let previous = r.previous_id?;
            Some(format!(
                "request {}: {}; the previous connection {previous} had carried {} requests and ended with {}",
                r.index,
                describe(run, r.index),
                r.previous_request_count.unwrap_or_default(),
                r.previous_end.as_deref().unwrap_or("?"),
            ))
        })
        .collect()
}

/// The fix the library documents for a `miss_reason` value.
pub(crate) fn miss_fix(reason: &str) -> Option<&'static str> {
    reqwest_conntrace::MissReason::ALL
        .into_iter()
        .find(|m| m.as_str() == reason)
        .map(reqwest_conntrace::MissReason::fix)
}

/// Mean of `values`, 0 when empty.
pub(crate) fn mean(values: impl IntoIterator<Item = f64>) -> f64 {
    let (sum, n) = values
        .into_iter()
        .fold((0.0, 0usize), |(s, n), v| (s + v, n + 1));
    if n == 0 { 0.0 } else { sum / n as f64 }
}
