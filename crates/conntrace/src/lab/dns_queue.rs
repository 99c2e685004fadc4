//! Scenario `dns-queue`: name lookups run `getaddrinfo` on tokio's blocking
//! pool; when that pool is saturated (here: a runtime with one blocking
//! thread, held by a sleeping `spawn_blocking` task) the lookup waits for a
//! thread. The `dns.lookup` span shows it: its `dns.lookup_began` event
//! comes long after the span's start. With a connect timeout shorter than
//! the wait, the request fails with `error.type = timeout`, and the setup
//! span says the connect died in `dns.lookup`.

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use anyhow::Context as _;
use conntrace_lab::{HttpVersions, TestServer};
use reqwest_conntrace::{AddressOrder, ConnTrace, semconv};
use tracing::Instrument as _;

use super::net::{self, Body};
use super::report::Outcome;
use super::runner::Lab;
use super::text::{describe, requests_table};

/// The name looked up through the system resolver.
const HOST: &str = "localhost";
/// How long the blocking task holds the only blocking thread.
const BLOCKED: Duration = Duration::from_millis(800);
/// The connect timeout of the second run: shorter than the queueing.
const CONNECT_TIMEOUT: Duration = Duration::from_millis(300);
/// The run without a connect timeout.
const RUN_QUEUED: &str = "lookup queued behind a busy blocking pool";
/// The run with the short connect timeout.
const RUN_TIMEOUT: &str = "connect timeout shorter than the queueing";

/// Both runs on a runtime whose blocking pool has one thread.
fn on_small_runtime(
    url: String,
    queued: tracing::Span,
    timeout: tracing::Span,
) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .max_blocking_threads(1)
        .enable_all()
        .build()
        .context("cannot start the small runtime")?;
    let result = runtime.block_on(async move {
        let trace = ConnTrace::new();
        for (span, connect_timeout) in [(queued, None), (timeout, Some(CONNECT_TIMEOUT))] {
            // No dns_resolver: the library's SystemResolver (getaddrinfo on
            // the blocking pool), which records when the lookup began.
            let mut builder = trace
                .instrument_client(reqwest::Client::builder())
                .address_order(AddressOrder::Ipv4First);
            if let Some(t) = connect_timeout {
                builder = builder.connect_timeout(t);
            }
            let client = net::build(builder)?;
            let blocker = tokio::task::spawn_blocking(|| std::thread::sleep(BLOCKED));
            // Let the blocker take the only blocking thread first.
            tokio::time::sleep(Duration::from_millis(20)).await;
            net::fetch(&client, &url, None, Body::Read)
                .instrument(span)
                .await;
            blocker.await.context("the blocking task failed")?;
        }
        anyhow::Ok(())
    });
    runtime.shutdown_timeout(Duration::from_secs(2));
    result
}

/// Runs the scenario.
pub(super) async fn run(lab: &mut Lab) -> anyhow::Result<Outcome> {
    let server = TestServer::builder()
        .http_versions(HttpVersions::Http1Only)
        .bind((IpAddr::V4(Ipv4Addr::LOCALHOST), 0).into())
        .start()
        .await
        .context("cannot start the lab server")?;
    let url = format!("http://{HOST}:{}/", server.addr().port());
    let queued = lab.run_span(RUN_QUEUED);
    let timeout = lab.run_span(RUN_TIMEOUT);
    let (tx, rx) = tokio::sync::oneshot::channel();
    let thread_url = url.clone();
    std::thread::Builder::new()
        .name("conntrace-lab-small-runtime".into())
        .spawn(move || {
            let _ = tx.send(on_small_runtime(thread_url, queued, timeout));
        })
        .context("cannot start the small runtime's thread")?;
    rx.await.context("the small runtime's thread died")??;

    let spans = lab.spans().await;
    let mut queued = spans.run(RUN_QUEUED);
    let mut timed_out = spans.run(RUN_TIMEOUT);
    queued
        .counters
        .insert("server_accepted".into(), server.accepted_connections());
    timed_out.counters.insert("server_accepted".into(), 0);

    let q_dns = queued.connections.first().and_then(|c| c.dns.as_ref());
    let t_setup = timed_out.connections.first();
    let t_request = timed_out.requests.first();
    let blocked_ms = BLOCKED.as_secs_f64() * 1e3;
    let reproduced = match (q_dns, t_setup, t_request) {
        (Some(d), Some(c), Some(r)) => {
            let queued_enough = d.queued_ms.is_some_and(|q| q >= blocked_ms * 0.5);
            let timeout = Some(semconv::ERROR_TYPE_TIMEOUT);
            if !queued_enough {
                Err(format!(
                    "dns.lookup_began came {:?} ms after the lookup was asked",
                    d.queued_ms
                ))
            } else if r.error_type.as_deref() != timeout
                || c.error_type.as_deref() != timeout
                || c.failed_phase.as_deref() != Some(semconv::DNS_LOOKUP_SPAN)
            {
                Err(format!(
                    "with the short connect timeout: request error.type {:?}, setup error.type {:?} in {:?}",
                    r.error_type, c.error_type, c.failed_phase
                ))
            } else {
                Ok(())
            }
        }
        _ => Err("missing request, setup or dns.lookup spans".to_owned()),
    };
    let mut findings = vec![format!("run 1, request 1: {}", describe(&queued, 1))];
    if let Some(d) = q_dns {
        let q = d.queued_ms.unwrap_or(0.0);
        findings.push(format!(
            "dns.lookup took {:.1} ms, of which {q:.1} ms queueing: dns.lookup_began came {q:.1} ms after the lookup was asked, because the runtime's only blocking thread was busy (a {} ms spawn_blocking task); getaddrinfo itself took {:.1} ms",
            d.ms,
            BLOCKED.as_millis(),
            d.ms - q
        ));
    }
    findings.push(format!(
        "run 2, with a {} ms connect timeout: request 1: {}",
        CONNECT_TIMEOUT.as_millis(),
        describe(&timed_out, 1)
    ));
    if let Some(c) = t_setup {
        findings.push(format!(
            "the setup span ended after {:.1} ms with error.type {} (outcome {}); the failing phase is {} and no tcp.connect started: the time went to waiting for a resolver thread, not to the network",
            c.total_ms,
            c.error_type.as_deref().unwrap_or("none"),
            c.outcome,
            c.failed_phase.as_deref().unwrap_or("none")
        ));
    }
    Ok(Outcome {
        config: serde_json::json!({
            "max_blocking_threads": 1,
            "blocking_task_ms": BLOCKED.as_millis() as u64,
            "connect_timeout_ms": CONNECT_TIMEOUT.as_millis() as u64,
            "url": url,
        }),
        tables: vec![
            requests_table(format!("run: {RUN_QUEUED}"), &queued),
            requests_table(format!("run: {RUN_TIMEOUT}"), &timed_out),
        ],
        runs: vec![queued, timed_out],
        findings,
        fix: Some(
            "keep long blocking work off tokio's blocking pool (or raise max_blocking_threads), or resolve names with an async resolver (reqwest's dns_resolver, wrapped by the instrumented builder), so lookups do not queue behind it".to_owned(),
        ),
        reproduced,
    })
}
