//! Scenario `new-client`: a new `reqwest::Client` per request, all built
//! from one `ConnTrace` handle. Each client starts with an empty pool and an
//! empty TLS session cache: every request after the first is a miss with
//! `miss_reason = new_client` (the first is `cold`), each with a full TLS
//! handshake. Then the same requests on one shared client.

use conntrace_lab::{TestPki, TestServer};
use reqwest_conntrace::{ConnTrace, semconv};
use tracing::Instrument as _;

use super::net::{self, Body};
use super::report::Outcome;
use super::runner::Lab;
use super::text::{mean, miss_fix, requests_table};
use super::view::RunView;

/// The lab host name.
const HOST: &str = "new-client.lab.test";
/// The first run's name.
const RUN_NEW: &str = "a new client per request";
/// The second run's name.
const RUN_SHARED: &str = "one shared client";

fn builder(trace: &ConnTrace, pki: &TestPki) -> reqwest_conntrace::InstrumentedClientBuilder {
    net::loopback_client(trace, pki, HOST)
}

/// Server counters: accepted, full and resumed TLS handshakes.
fn counters(server: &TestServer) -> [u64; 3] {
    [
        server.accepted_connections(),
        server.tls_handshakes(),
        server.tls_resumed_handshakes(),
    ]
}

fn record(run: &mut RunView, before: [u64; 3], after: [u64; 3]) {
    for (i, name) in [
        "server_accepted",
        "server_tls_handshakes",
        "server_tls_resumed",
    ]
    .into_iter()
    .enumerate()
    {
        run.counters
            .insert(name.into(), after[i].saturating_sub(before[i]));
    }
}

/// Runs the scenario.
pub(super) async fn run(lab: &mut Lab) -> anyhow::Result<Outcome> {
    let n = lab.requests();
    let pki = net::pki(HOST)?;
    let server = net::start(net::https_server(&pki)).await?;
    let url = format!("https://{HOST}:{}/", server.addr().port());

    // One handle, a client per request.
    let trace = ConnTrace::new();
    let start = counters(&server);
    let span = lab.run_span(RUN_NEW);
    async {
        for _ in 0..n {
            let client = net::build(builder(&trace, &pki))?;
            net::fetch(&client, &url, None, Body::Read).await;
        }
        anyhow::Ok(())
    }
    .instrument(span.clone())
    .await?;
    drop(span);
    Lab::connects_done().await;
    let middle = counters(&server);

    // The fixed program: its own handle, one client.
    let shared_trace = ConnTrace::new();
    let client = net::build(builder(&shared_trace, &pki))?;
    let span = lab.run_span(RUN_SHARED);
    net::fetch_in_turn(&client, &url, n, None)
        .instrument(span.clone())
        .await;
    drop(span);
    Lab::connects_done().await;
    let end = counters(&server);

    let spans = lab.spans().await;
    let mut per_request = spans.run(RUN_NEW);
    record(&mut per_request, start, middle);
    let mut shared = spans.run(RUN_SHARED);
    record(&mut shared, middle, end);

    let count = |run: &RunView, reason: &str| {
        run.requests
            .iter()
            .filter(|r| r.miss_reason.as_deref() == Some(reason))
            .count()
    };
    let full = per_request
        .connections
        .iter()
        .filter(|c| c.tls.as_ref().and_then(|t| t.resumed) == Some(false))
        .count();
    let new_client = count(&per_request, semconv::MISS_REASON_NEW_CLIENT);
    let cold = count(&per_request, semconv::MISS_REASON_COLD);
    let hits = shared
        .requests
        .iter()
        .filter(|r| r.reused == Some(true) && r.miss_reason.is_none())
        .count();
    // The signal itself must be there: at least one new_client miss, and a
    // shared client that reused its connection.
    let reproduced = if new_client == 0 {
        Err(format!(
            "no request missed with new_client ({} request span(s))",
            per_request.requests.len()
        ))
    } else if per_request.requests.len() != n {
        Err(format!(
            "{} request spans for {n} requests",
            per_request.requests.len()
        ))
    } else if per_request
        .requests
        .first()
        .and_then(|r| r.miss_reason.as_deref())
        != Some(semconv::MISS_REASON_COLD)
        || new_client != n - 1
    {
        Err(format!(
            "miss reasons: {cold} cold, {new_client} new_client; expected 1 cold then new_client"
        ))
    } else if full != n {
        Err(format!(
            "{full} of {n} handshakes were full (tls.resumed = false)"
        ))
    } else if shared.connections.len() != 1 || hits != n - 1 {
        Err(format!(
            "the shared client opened {} connection(s) and had {hits} idle hit(s) of {n}",
            shared.connections.len()
        ))
    } else {
        Ok(())
    };
    let per_ms = mean(per_request.requests.iter().map(|r| r.total_ms));
    let shared_ms = mean(shared.requests.iter().map(|r| r.total_ms));
    let handshake_ms = mean(
        per_request
            .connections
            .iter()
            .filter_map(|c| c.tls.as_ref().map(|t| t.ms)),
    );
    let findings = vec![
        format!(
            "a new client per request: {n} request(s), {} new connection(s), miss reasons {cold} cold + {new_client} new_client",
            per_request.connections.len()
        ),
        format!(
            "{full} of {} TLS handshakes were full (tls.resumed = false: each new client has an empty session cache; the server counted {} handshake(s), {} resumed), {handshake_ms:.1} ms each on average",
            per_request.connections.len(),
            per_request
                .counters
                .get("server_tls_handshakes")
                .unwrap_or(&0),
            per_request.counters.get("server_tls_resumed").unwrap_or(&0)
        ),
        format!(
            "one shared client: {} new connection(s), {hits} pool hit(s) of {n}; {shared_ms:.1} ms per request against {per_ms:.1} ms with a client per request",
            shared.connections.len()
        ),
    ];
    Ok(Outcome {
        config: serde_json::json!({ "requests": n, "url": url }),
        tables: vec![
            requests_table(format!("run: {RUN_NEW}"), &per_request),
            requests_table(format!("run: {RUN_SHARED}"), &shared),
        ],
        runs: vec![per_request, shared],
        findings,
        fix: miss_fix(semconv::MISS_REASON_NEW_CLIENT).map(str::to_owned),
        reproduced,
    })
}
