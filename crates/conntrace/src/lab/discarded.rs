//! Scenario `discarded`: an HTTP/1.1 response dropped before its body was
//! read cannot go back to the pool (hyper closes the connection), so the
//! next request pays for a new one: `miss_reason = discarded`. Read to the
//! end, the next request reuses the connection.

use reqwest_conntrace::{ConnTrace, semconv};
use tracing::Instrument as _;

use super::net::{self, Body};
use super::report::Outcome;
use super::runner::Lab;
use super::text::{describe, miss_fix, requests_table};

/// The lab host name.
const HOST: &str = "discarded.lab.test";
/// Body size: far more than hyper reads along with the headers.
const BODY_BYTES: usize = 256 * 1024;
/// The run's name.
const RUN: &str = "body dropped unread, then read";

/// Runs the scenario.
pub(super) async fn run(lab: &mut Lab) -> anyhow::Result<Outcome> {
    let pki = net::pki(HOST)?;
    let server = net::start(net::https_server(&pki)).await?;
    let url = format!("https://{HOST}:{}/bytes/{BODY_BYTES}", server.addr().port());
    let trace = ConnTrace::new();
    let client = net::build(net::loopback_client(&trace, &pki, HOST))?;
    let span = lab.run_span(RUN);
    async {
        net::fetch(&client, &url, None, Body::Drop).await;
        net::fetch_in_turn(&client, &url, 2, None).await;
    }
    .instrument(span.clone())
    .await;
    drop(span);

    let mut run = lab.spans().await.run(RUN);
    run.counters
        .insert("server_accepted".into(), server.accepted_connections());
    let reqs = &run.requests;
    let reproduced = match (reqs.get(1), reqs.get(2)) {
        (Some(r2), Some(r3))
            if r2.reused == Some(false)
                && r2.miss_reason.as_deref() == Some(semconv::MISS_REASON_DISCARDED)
                && r3.reused == Some(true)
                && r3.miss_reason.is_none() =>
        {
            Ok(())
        }
        (Some(r2), Some(r3)) => Err(format!(
            "request 2: reused {:?}, miss_reason {:?}; request 3: reused {:?}, miss_reason {:?}",
            r2.reused, r2.miss_reason, r3.reused, r3.miss_reason
        )),
        _ => Err("fewer than 3 request spans".to_owned()),
    };
    let read = |i: usize| {
        reqs.get(i)
            .and_then(|r| r.body_bytes)
            .map_or("?".to_owned(), |b| b.to_string())
    };
    let findings = vec![
        format!(
            "request 1, body dropped after {} of {BODY_BYTES} bytes (http.response.body.size): {}",
            read(0),
            describe(&run, 1)
        ),
        format!(
            "request 2, body read to the end ({} bytes): {}",
            read(1),
            describe(&run, 2)
        ),
        format!(
            "request 3: {}: the connection whose body was read went back to the pool",
            describe(&run, 3)
        ),
        format!(
            "the server accepted {} connection(s) for {} request(s)",
            server.accepted_connections(),
            reqs.len()
        ),
    ];
    Ok(Outcome {
        config: serde_json::json!({ "body_bytes": BODY_BYTES, "url": url }),
        tables: vec![requests_table(format!("run: {RUN}"), &run)],
        runs: vec![run],
        findings,
        fix: miss_fix(semconv::MISS_REASON_DISCARDED).map(str::to_owned),
        reproduced,
    })
}
