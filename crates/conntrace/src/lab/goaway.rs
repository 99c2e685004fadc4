//! Scenario `goaway`: an HTTP/2 server sends GOAWAY after 3 streams on a
//! connection. The request after each GOAWAY is a miss with `miss_reason =
//! request_limit` and `http.connection.previous.end = goaway`, naming the
//! connection and how many requests it carried (a constant count is the
//! server's stream limit), never `all_busy`.

use conntrace_lab::HttpVersions;
use reqwest_conntrace::{ConnTrace, semconv};
use tracing::Instrument as _;

use super::net;
use super::report::Outcome;
use super::runner::Lab;
use super::text::{previous_connection_lines, requests_table};
use super::view::RunView;

/// The lab host name.
const HOST: &str = "goaway.lab.test";
/// Streams per connection before the server's GOAWAY.
const LIMIT: u64 = 3;
/// Requests sent.
const REQUESTS: usize = 7;
/// The run's name.
const RUN: &str = "HTTP/2 server sends GOAWAY after 3 streams";

/// Runs the scenario.
pub(super) async fn run(lab: &mut Lab) -> anyhow::Result<Outcome> {
    let pki = net::pki(HOST)?;
    let server = net::start(
        net::https_server(&pki)
            .http_versions(HttpVersions::Http2Only)
            .max_requests_per_connection(Some(LIMIT)),
    )
    .await?;
    let url = format!("https://{HOST}:{}/", server.addr().port());
    let trace = ConnTrace::new();
    let client = net::build(net::loopback_client(&trace, &pki, HOST))?;
    let span = lab.run_span(RUN);
    net::fetch_in_turn(&client, &url, REQUESTS, None)
        .instrument(span.clone())
        .await;
    drop(span);
    let mut run = lab.spans().await.run(RUN);
    run.counters
        .insert("server_accepted".into(), server.accepted_connections());
    let reproduced = verdict(&run);
    let mut findings = vec![format!(
        "the server accepted {} HTTP/2 connections for {REQUESTS} requests, sending GOAWAY after {LIMIT} streams (its own count)",
        server.accepted_connections()
    )];
    findings.extend(previous_connection_lines(&run));
    Ok(Outcome {
        config: serde_json::json!({
            "server_streams_per_connection": LIMIT,
            "requests": REQUESTS,
        }),
        tables: vec![requests_table(format!("run: {RUN}"), &run)],
        runs: vec![run],
        findings,
        fix: Some(format!(
            "the previous connections all ended with their {LIMIT}th response (GOAWAY): a server request limit, not an idle close; raise the server's per-connection limit (nginx keepalive_requests); no client setting helps"
        )),
        reproduced,
    })
}

/// Every request that opened a new connection after the first is
/// `request_limit` with `previous.end = goaway`, naming the connection of
/// the request before it; none is `all_busy`.
fn verdict(run: &RunView) -> Result<(), String> {
    let mut seen = 0;
    for pair in run.requests.windows(2) {
        let (before, r) = (&pair[0], &pair[1]);
        if r.miss_reason.as_deref() == Some(semconv::MISS_REASON_ALL_BUSY) {
            return Err(format!("request {} is all_busy", r.index));
        }
        if r.request_count != Some(1) {
            continue;
        }
        seen += 1;
        let ok = r.miss_reason.as_deref() == Some(semconv::MISS_REASON_REQUEST_LIMIT)
            && r.previous_end.as_deref() == Some(semconv::CONNECTION_END_GOAWAY)
            && r.previous_id.is_some()
            && r.previous_id == before.connection_id;
        if !ok {
            return Err(format!(
                "request {}: miss_reason {:?}, previous connection {:?} ended {:?}; expected request_limit, goaway, connection {:?}",
                r.index, r.miss_reason, r.previous_id, r.previous_end, before.connection_id
            ));
        }
    }
    if seen == 0 {
        return Err("no request opened a new connection after a GOAWAY".to_owned());
    }
    Ok(())
}
