//! Scenario `idle-expired`: the client's pool idle timeout (set through the
//! instrumented builder, so the library knows it) is shorter than the gap
//! between two requests, so the pool drops the idle connection and the
//! second request pays for a new one: `miss_reason = idle_expired`.

use std::time::Duration;

use reqwest_conntrace::{ConnTrace, semconv};
use tracing::Instrument as _;

use super::net::{self, Body};
use super::report::Outcome;
use super::runner::Lab;
use super::text::{describe, miss_fix, requests_table};

/// The lab host name.
const HOST: &str = "idle-expired.lab.test";
/// The client's pool idle timeout.
const IDLE_TIMEOUT: Duration = Duration::from_millis(300);
/// The gap between the first and the second request.
const GAP: Duration = Duration::from_millis(600);
/// The run's name.
const RUN: &str = "gap longer than the pool idle timeout";

/// Runs the scenario.
pub(super) async fn run(lab: &mut Lab) -> anyhow::Result<Outcome> {
    let pki = net::pki(HOST)?;
    let server = net::start(net::https_server(&pki)).await?;
    let url = format!("https://{HOST}:{}/", server.addr().port());
    let trace = ConnTrace::new();
    let client =
        net::build(net::loopback_client(&trace, &pki, HOST).pool_idle_timeout(Some(IDLE_TIMEOUT)))?;
    let span = lab.run_span(RUN);
    async {
        net::fetch(&client, &url, None, Body::Read).await;
        tokio::time::sleep(GAP).await;
        net::fetch_in_turn(&client, &url, 2, None).await;
    }
    .instrument(span.clone())
    .await;
    drop(span);

    let mut run = lab.spans().await.run(RUN);
    run.counters
        .insert("server_accepted".into(), server.accepted_connections());
    let second = run.requests.get(1);
    let reproduced = match second {
        Some(r)
            if r.reused == Some(false)
                && r.miss_reason.as_deref() == Some(semconv::MISS_REASON_IDLE_EXPIRED) =>
        {
            Ok(())
        }
        Some(r) => Err(format!(
            "request 2 has reused = {:?}, miss_reason = {:?}",
            r.reused, r.miss_reason
        )),
        None => Err("request 2 has no span".to_owned()),
    };
    let findings = vec![
        format!("request 1: {}", describe(&run, 1)),
        format!(
            "request 2, sent {} ms later, past the client's pool idle timeout of {} ms: {}",
            GAP.as_millis(),
            IDLE_TIMEOUT.as_millis(),
            describe(&run, 2)
        ),
        format!(
            "request 3, {} ms after it: {}",
            net::BETWEEN_REQUESTS.as_millis(),
            describe(&run, 3)
        ),
        format!(
            "the server accepted {} connection(s) for {} request(s)",
            server.accepted_connections(),
            run.requests.len()
        ),
    ];
    Ok(Outcome {
        config: serde_json::json!({
            "pool_idle_timeout_ms": IDLE_TIMEOUT.as_millis() as u64,
            "gap_ms": GAP.as_millis() as u64,
            "url": url,
        }),
        tables: vec![requests_table(format!("run: {RUN}"), &run)],
        runs: vec![run],
        findings,
        fix: miss_fix(semconv::MISS_REASON_IDLE_EXPIRED).map(str::to_owned),
        reproduced,
    })
}
