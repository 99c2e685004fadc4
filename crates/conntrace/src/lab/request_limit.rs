//! Scenario `request-limit`: the server ends each connection after 5
//! requests with `Connection: close` (like nginx `keepalive_requests 5`).
//! Every 6th request is a miss with `miss_reason = request_limit`, naming
//! the connection that carried the 5 (`http.connection.previous.*`): the
//! fix is on the server, not in the client's pool.

use conntrace_lab::ConnectionEnd;
use reqwest_conntrace::{ConnTrace, semconv};
use tracing::Instrument as _;

use super::net;
use super::report::Outcome;
use super::runner::Lab;
use super::text::{miss_fix, previous_connection_lines, requests_table};
use super::view::RunView;

/// The lab host name.
const HOST: &str = "request-limit.lab.test";
/// The server's requests per connection.
const LIMIT: u64 = 5;
/// Requests sent: two limits crossed.
const REQUESTS: usize = 11;
/// The run's name.
const RUN: &str = "server closes each connection after 5 requests";

/// Runs the scenario.
pub(super) async fn run(lab: &mut Lab) -> anyhow::Result<Outcome> {
    let pki = net::pki(HOST)?;
    let server =
        net::start(net::https_server(&pki).max_requests_per_connection(Some(LIMIT))).await?;
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
    let at_limit = server
        .connections()
        .iter()
        .filter(|c| c.end == Some(ConnectionEnd::RequestLimit))
        .count() as u64;
    run.counters
        .insert("server_closed_at_limit".into(), at_limit);
    let reproduced = verdict(&run);
    let mut findings = vec![format!(
        "the server accepted {} connections for {REQUESTS} requests and closed {at_limit} at its limit of {LIMIT} (its own count)",
        server.accepted_connections()
    )];
    findings.extend(previous_connection_lines(&run));
    Ok(Outcome {
        config: serde_json::json!({
            "server_keepalive_requests": LIMIT,
            "requests": REQUESTS,
        }),
        tables: vec![requests_table(format!("run: {RUN}"), &run)],
        runs: vec![run],
        findings,
        fix: miss_fix(semconv::MISS_REASON_REQUEST_LIMIT).map(str::to_owned),
        reproduced,
    })
}

/// Requests 6 and 11 are `request_limit` misses naming the connection of
/// the request before them, which carried `LIMIT` requests.
fn verdict(run: &RunView) -> Result<(), String> {
    for at in [LIMIT as usize + 1, 2 * LIMIT as usize + 1] {
        let (Some(before), Some(r)) = (run.requests.get(at - 2), run.requests.get(at - 1)) else {
            return Err(format!("request {at} has no span"));
        };
        let ok = r.miss_reason.as_deref() == Some(semconv::MISS_REASON_REQUEST_LIMIT)
            && r.previous_id.is_some()
            && r.previous_id == before.connection_id
            && r.previous_request_count == Some(LIMIT as i64)
            && r.previous_end.as_deref() == Some(semconv::CONNECTION_END_CONNECTION_CLOSE);
        if !ok {
            return Err(format!(
                "request {at}: miss_reason {:?}, previous connection {:?} ({:?} requests, ended {:?}); expected request_limit naming connection {:?} with {LIMIT}",
                r.miss_reason,
                r.previous_id,
                r.previous_request_count,
                r.previous_end,
                before.connection_id
            ));
        }
    }
    Ok(())
}
