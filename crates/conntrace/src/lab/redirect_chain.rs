//! Scenario `redirect-chain`: one GET that the servers on 127.0.0.1 to
//! 127.0.0.5 redirect (302) from each to the next. Every hop is a physical
//! request of its own (HTTP client semantic conventions): its own span with
//! `http.request.resend_count`, its own host, and, in the first run, its own
//! new connection whose setup span names that host. The second run of the
//! same chain finds every hop's connection idle in the pool: five hits on
//! the five connections of the first run.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use conntrace_lab::{HttpVersions, TestServer};
use reqwest_conntrace::ConnTrace;
use tracing::Instrument as _;

use super::net::{self, Body};
use super::report::Outcome;
use super::runner::Lab;
use super::text::requests_table;
use super::view::RunView;

/// Hosts in the chain: 127.0.0.1 to 127.0.0.HOPS.
const HOPS: u8 = 5;
/// The first run's name.
const RUN_COLD: &str = "first run: every hop on a new connection";
/// The second run's name.
const RUN_WARM: &str = "second run: the same chain again";

/// Loopback address number `k` (1-based).
fn host(k: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 0, 0, k))
}

/// The chain's first URL: `/redirect/<next host:port>/redirect/...` down to
/// the last server, which answers 200.
fn chain_url(servers: &[TestServer]) -> String {
    let mut path = String::new();
    for s in servers.iter().skip(1) {
        path.push_str(&format!("redirect/{}/", s.addr()));
    }
    format!("http://{}/{path}", servers[0].addr())
}

/// Runs the scenario.
pub(super) async fn run(lab: &mut Lab) -> anyhow::Result<Outcome> {
    let mut servers = Vec::new();
    for k in 1..=HOPS {
        servers.push(
            net::start(
                TestServer::builder()
                    .bind(SocketAddr::new(host(k), 0))
                    .http_versions(HttpVersions::Http1Only),
            )
            .await?,
        );
    }
    let url = chain_url(&servers);
    let trace = ConnTrace::new();
    let client = net::build(trace.instrument_client(reqwest::Client::builder()))?;

    let span = lab.run_span(RUN_COLD);
    net::fetch(&client, &url, None, Body::Read)
        .instrument(span.clone())
        .await;
    drop(span);
    Lab::connects_done().await;
    let accepted_cold: Vec<u64> = servers.iter().map(|s| s.accepted_connections()).collect();
    tokio::time::sleep(net::BETWEEN_REQUESTS).await;
    let span = lab.run_span(RUN_WARM);
    net::fetch(&client, &url, None, Body::Read)
        .instrument(span.clone())
        .await;
    drop(span);

    let spans = lab.spans().await;
    let mut cold = spans.run(RUN_COLD);
    let mut warm = spans.run(RUN_WARM);
    let mut warm_new = 0;
    for (k, s) in servers.iter().enumerate() {
        let n = k + 1;
        let accepted = s.accepted_connections();
        cold.counters
            .insert(format!("host_{n}_server_accepted"), accepted_cold[k]);
        warm.counters.insert(
            format!("host_{n}_server_accepted"),
            accepted - accepted_cold[k],
        );
        warm_new += accepted - accepted_cold[k];
        // The server's request index of the second run's request: 2 when
        // it came on the first run's connection.
        if let Some(last) = s.requests().last() {
            warm.counters.insert(
                format!("host_{n}_server_connection_requests"),
                last.request_index,
            );
        }
    }
    let accepted: u64 = accepted_cold.iter().sum();
    cold.counters.insert("server_accepted".into(), accepted);
    warm.counters.insert("server_accepted".into(), warm_new);

    let reproduced = verdict(&cold, &warm);
    let hits = warm
        .requests
        .iter()
        .filter(|r| r.reused == Some(true) && r.miss_reason.is_none())
        .count();
    let findings = vec![
        format!(
            "one GET, {} request span(s) (one per hop, http.request.resend_count 0 to {}), {} new connection(s), each setup span naming its hop's host; the servers accepted {accepted} connection(s)",
            cold.requests.len(),
            cold.requests.len().saturating_sub(1),
            cold.connections.len(),
        ),
        format!(
            "the same chain again: {hits} of {} hop(s) were idle pool hits on the first run's connections; the servers accepted {warm_new} new connection(s)",
            warm.requests.len()
        ),
    ];
    Ok(Outcome {
        config: serde_json::json!({
            "hops": HOPS,
            "url": url,
        }),
        tables: vec![
            requests_table(format!("run: {RUN_COLD}"), &cold),
            requests_table(format!("run: {RUN_WARM}"), &warm),
        ],
        runs: vec![cold, warm],
        findings,
        fix: None,
        reproduced,
    })
}

/// The spans show one physical request per hop: in the first run each hop
/// on its own host, a miss that set up its own connection to that host
/// (used by it); in the second run each hop an idle hit on the connection
/// the first run opened to the same host.
fn verdict(cold: &RunView, warm: &RunView) -> Result<(), String> {
    let hops = usize::from(HOPS);
    for run in [cold, warm] {
        if run.requests.len() != hops {
            return Err(format!(
                "{}: {} request span(s) for a {hops}-hop chain",
                run.name,
                run.requests.len()
            ));
        }
    }
    for (k, (first, second)) in cold.requests.iter().zip(&warm.requests).enumerate() {
        let expected = host(k as u8 + 1).to_string();
        for r in [first, second] {
            if r.server_address.as_deref() != Some(expected.as_str()) || r.resend_count != k as i64
            {
                return Err(format!(
                    "hop {}: server.address {:?}, resend_count {} (expected {expected}, {k})",
                    k + 1,
                    r.server_address,
                    r.resend_count
                ));
            }
        }
        let setup = cold
            .connections
            .iter()
            .find(|c| c.id.is_some() && c.id == first.connection_id);
        match setup {
            Some(c)
                if first.reused == Some(false)
                    && c.trigger == Some(k + 1)
                    && c.server_address.as_deref() == Some(expected.as_str())
                    && c.outcome == reqwest_conntrace::semconv::SETUP_OUTCOME_USED => {}
            _ => {
                return Err(format!(
                    "hop {} of the first run: reused = {:?}, connection {:?} not set up by it for {expected}",
                    k + 1,
                    first.reused,
                    first.connection_id
                ));
            }
        }
        if second.reused != Some(true)
            || second.miss_reason.is_some()
            || second.connection_id != first.connection_id
        {
            return Err(format!(
                "hop {} of the second run: reused = {:?}, miss_reason = {:?}, connection {:?} (expected an idle hit on {:?})",
                k + 1,
                second.reused,
                second.miss_reason,
                second.connection_id,
                first.connection_id
            ));
        }
    }
    Ok(())
}
