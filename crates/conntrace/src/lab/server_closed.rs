//! Scenario `server-closed`: the server closes idle connections after 200 ms
//! (its keep-alive timeout) while the client would keep them 90 s. The
//! pooled connection is gone when the next request comes: it is a miss
//! with `miss_reason = closed_by_peer` (or, racing the close, fails on the
//! reused connection). Then the fix: a client idle timeout under the
//! server's, so the client closes first (`idle_expired`, no race).

use std::time::Duration;

use conntrace_lab::TestServer;
use reqwest_conntrace::{ConnTrace, semconv};
use tracing::Instrument as _;

use super::net::{self, Body};
use super::report::Outcome;
use super::runner::Lab;
use super::text::{describe, miss_fix, requests_table};
use super::view::RunView;

/// The lab host name.
const HOST: &str = "server-closed.lab.test";
/// The server's keep-alive (idle) timeout.
const SERVER_IDLE: Duration = Duration::from_millis(200);
/// The client's pool idle timeout in the first run (reqwest's default).
const CLIENT_IDLE: Duration = Duration::from_secs(90);
/// The client's pool idle timeout in the second run: under the server's.
const CLIENT_IDLE_FIXED: Duration = Duration::from_millis(100);
/// The gap between the two requests of a run.
const GAP: Duration = Duration::from_millis(600);
/// The first run's name.
const RUN_STALE: &str = "client idle timeout 90 s, server 200 ms";
/// The second run's name.
const RUN_FIXED: &str = "client idle timeout 100 ms, server 200 ms";

/// Two requests `GAP` apart on a new client with pool idle timeout `idle`;
/// returns the server's closed-connection count just before the second.
async fn two_requests(
    lab: &Lab,
    run: &str,
    server: &TestServer,
    pki: &conntrace_lab::TestPki,
    idle: Duration,
) -> anyhow::Result<u64> {
    let url = format!("https://{HOST}:{}/", server.addr().port());
    let trace = ConnTrace::new();
    let client = net::build(net::loopback_client(&trace, pki, HOST).pool_idle_timeout(Some(idle)))?;
    let span = lab.run_span(run);
    let closed = async {
        net::fetch(&client, &url, None, Body::Read).await;
        tokio::time::sleep(GAP).await;
        let closed = server.closed_connections();
        net::fetch(&client, &url, None, Body::Read).await;
        closed
    }
    .instrument(span.clone())
    .await;
    drop(span);
    Ok(closed)
}

/// Runs the scenario.
pub(super) async fn run(lab: &mut Lab) -> anyhow::Result<Outcome> {
    let pki = net::pki(HOST)?;
    let server = net::start(net::https_server(&pki).idle_timeout(Some(SERVER_IDLE))).await?;
    let closed_stale = two_requests(lab, RUN_STALE, &server, &pki, CLIENT_IDLE).await?;
    Lab::connects_done().await;
    let accepted_stale = server.accepted_connections();
    let closed_fixed = two_requests(lab, RUN_FIXED, &server, &pki, CLIENT_IDLE_FIXED).await?;
    let spans = lab.spans().await;
    let mut stale = spans.run(RUN_STALE);
    stale
        .counters
        .insert("server_accepted".into(), accepted_stale);
    stale
        .counters
        .insert("server_closed_before_request_2".into(), closed_stale);
    let mut fixed = spans.run(RUN_FIXED);
    fixed.counters.insert(
        "server_accepted".into(),
        server.accepted_connections() - accepted_stale,
    );
    fixed.counters.insert(
        "server_closed_before_request_2".into(),
        closed_fixed.saturating_sub(closed_stale),
    );

    let reproduced = verdict(&stale);
    let mut findings = vec![format!("request 1: {}", describe(&stale, 1))];
    findings.push(format!(
        "the server closed {closed_stale} idle connection(s) after its {} ms keep-alive timeout (its own count) before request 2, sent {} ms later",
        SERVER_IDLE.as_millis(),
        GAP.as_millis()
    ));
    let second = stale.requests.get(1);
    findings.push(match second {
        Some(r) if r.error_type.is_some() => format!(
            "request 2: {}: it raced the server's close on the pooled connection",
            describe(&stale, 2)
        ),
        Some(r) if r.miss_reason.as_deref() == Some(semconv::MISS_REASON_CLOSED_BY_PEER) => {
            format!(
                "request 2: {}: the pooled connection had been closed by the server",
                describe(&stale, 2)
            )
        }
        _ => format!(
            "request 2: {} (expected closed_by_peer: the server had closed the pooled connection)",
            describe(&stale, 2)
        ),
    });
    findings.push(format!(
        "with the client's pool idle timeout at {} ms, under the server's {} ms, request 2: {}: the client drops the connection first, so no request can race the server's close",
        CLIENT_IDLE_FIXED.as_millis(),
        SERVER_IDLE.as_millis(),
        describe(&fixed, 2)
    ));
    Ok(Outcome {
        config: serde_json::json!({
            "server_keep_alive_timeout_ms": SERVER_IDLE.as_millis() as u64,
            "client_pool_idle_timeout_ms": CLIENT_IDLE.as_millis() as u64,
            "fixed_client_pool_idle_timeout_ms": CLIENT_IDLE_FIXED.as_millis() as u64,
            "gap_ms": GAP.as_millis() as u64,
        }),
        tables: vec![
            requests_table(format!("run: {RUN_STALE}"), &stale),
            requests_table(format!("run: {RUN_FIXED}"), &fixed),
        ],
        runs: vec![stale, fixed],
        findings,
        fix: miss_fix(semconv::MISS_REASON_CLOSED_BY_PEER).map(str::to_owned),
        reproduced,
    })
}

/// The stale run shows the server's close: request 2 is a miss with
/// `closed_by_peer`, or failed.
fn verdict(stale: &RunView) -> Result<(), String> {
    match stale.requests.get(1) {
        Some(r) if r.error_type.is_some() => Ok(()),
        Some(r)
            if r.reused == Some(false)
                && r.miss_reason.as_deref() == Some(semconv::MISS_REASON_CLOSED_BY_PEER) =>
        {
            Ok(())
        }
        Some(r) => Err(format!(
            "request 2 has reused = {:?}, miss_reason = {:?}, expected a miss with closed_by_peer",
            r.reused, r.miss_reason
        )),
        None => Err("request 2 has no span".to_owned()),
    }
}
