//! Scenario `stalled-connection`: an HTTP/2 connection whose peer stops
//! answering after its first request. The next requests time out on it:
//! their spans name the connection (`http.connection.id`), say it stalled
//! (`http.connection.stalled`) with the kernel's evidence (nothing received
//! for `http.connection.tcp.since_last_receive`), instead of a bare timeout.

use std::time::Duration;

use conntrace_lab::HttpVersions;
use reqwest_conntrace::ConnTrace;
use tracing::Instrument as _;

use super::net::{self, Body};
use super::report::Outcome;
use super::runner::Lab;
use super::text::{describe, requests_table};
use super::view::RunView;

/// The lab host name.
const HOST: &str = "stalled.lab.test";
/// The per-request timeout of the stalled requests.
const TIMEOUT: Duration = Duration::from_millis(300);
/// The run's name.
const RUN: &str = "HTTP/2 peer stops answering after one request";

/// Runs the scenario.
pub(super) async fn run(lab: &mut Lab) -> anyhow::Result<Outcome> {
    let pki = net::pki(HOST)?;
    let server = net::start(
        net::https_server(&pki)
            .http_versions(HttpVersions::Http2Only)
            .stall_after(Some(1)),
    )
    .await?;
    let url = format!("https://{HOST}:{}/", server.addr().port());
    let trace = ConnTrace::new();
    let client = net::build(net::loopback_client(&trace, &pki, HOST))?;
    let span = lab.run_span(RUN);
    async {
        net::fetch(&client, &url, None, Body::Read).await;
        for _ in 0..2 {
            net::fetch(&client, &url, Some(TIMEOUT), Body::Read).await;
        }
    }
    .instrument(span.clone())
    .await;
    drop(span);
    let mut run = lab.spans().await.run(RUN);
    run.counters
        .insert("server_accepted".into(), server.accepted_connections());
    run.counters
        .insert("server_requests".into(), server.request_count() as u64);
    let reproduced = verdict(&run);
    let mut findings = vec![format!(
        "the server received {} requests on {} connection(s) and answered the first only",
        server.request_count(),
        server.accepted_connections()
    )];
    for r in run.requests.iter().skip(1) {
        findings.push(format!(
            "request {}: {}; it failed on connection {}, {}; the kernel shows nothing received on it for {} ms",
            r.index,
            describe(&run, r.index),
            r.connection_id
                .map_or_else(|| "(unknown)".to_owned(), |id| format!("#{id}")),
            if r.stalled == Some(true) {
                "marked stalled"
            } else {
                "not marked stalled"
            },
            r.since_last_receive_ms
                .map_or_else(|| "?".to_owned(), |ms| format!("{ms:.0}")),
        ));
    }
    Ok(Outcome {
        config: serde_json::json!({ "request_timeout_ms": TIMEOUT.as_millis() as u64 }),
        tables: vec![requests_table(format!("run: {RUN}"), &run)],
        runs: vec![run],
        findings,
        fix: Some(
            "the connection, not the pool, is the problem: look at the server (or the path) behind the connection named; an HTTP/2 keep-alive ping (http2_keep_alive_interval) lets hyper detect a dead peer and drop the connection"
                .to_owned(),
        ),
        reproduced,
    })
}

/// Requests 2 and 3 timed out on request 1's connection, marked stalled.
fn verdict(run: &RunView) -> Result<(), String> {
    let first = run
        .requests
        .first()
        .and_then(|r| r.connection_id)
        .ok_or("request 1 has no connection")?;
    for r in run.requests.iter().skip(1) {
        if r.error_type.as_deref() != Some(reqwest_conntrace::semconv::ERROR_TYPE_TIMEOUT)
            || r.connection_id != Some(first)
            || r.stalled != Some(true)
        {
            return Err(format!(
                "request {}: error {:?}, connection {:?}, stalled {:?}; expected a timeout on connection {first}, stalled",
                r.index, r.error_type, r.connection_id, r.stalled
            ));
        }
    }
    if run.requests.len() < 3 {
        return Err("fewer than 3 request spans".to_owned());
    }
    Ok(())
}
