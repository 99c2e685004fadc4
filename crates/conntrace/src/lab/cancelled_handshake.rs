//! Scenario `cancelled-handshake`: a server far enough away (a delaying
//! proxy) that the TLS handshake outlasts a request's timeout. The request
//! fails with `error.type = timeout`; its abandoned connect ends its setup
//! span and the unfinished `tls.handshake` with `error.type = cancelled`
//! (the library sees the connect dropped, not why), and the next request is
//! a miss: nothing reached the pool. With a connect timeout instead, the
//! setup span says `timeout` itself.

use std::time::Duration;

use anyhow::Context as _;
use conntrace_lab::{DelayProxy, TestPki};
use reqwest_conntrace::{ConnTrace, InstrumentedClientBuilder, semconv};
use tracing::Instrument as _;

use super::net::{self, Body};
use super::report::Outcome;
use super::runner::Lab;
use super::text::{describe, requests_table};
use super::view::RunView;

/// The lab host name.
const HOST: &str = "slow-handshake.lab.test";
/// The run with a request timeout.
const RUN_REQUEST: &str = "request timeout mid-handshake";
/// The run with a connect timeout.
const RUN_CONNECT: &str = "connect timeout mid-handshake";
/// Generous timeout of the request after the cancelled one.
const NEXT_TIMEOUT: Duration = Duration::from_secs(10);

fn builder(trace: &ConnTrace, pki: &TestPki) -> InstrumentedClientBuilder {
    net::loopback_client(trace, pki, HOST)
}

/// Whether the first connect of `run` ended with `error_type` in
/// `tls.handshake` and its request with `timeout`.
fn cancelled_in_tls(run: &RunView, setup_error: &str) -> Result<(), String> {
    let (Some(r), Some(c)) = (run.requests.first(), run.connections.first()) else {
        return Err(format!("{}: no request or setup span", run.name));
    };
    if r.error_type.as_deref() == Some(semconv::ERROR_TYPE_TIMEOUT)
        && c.error_type.as_deref() == Some(setup_error)
        && c.failed_phase.as_deref() == Some(semconv::TLS_HANDSHAKE_SPAN)
    {
        Ok(())
    } else {
        Err(format!(
            "{}: request error.type {:?}, setup error.type {:?} in {:?} (expected timeout, {setup_error} in tls.handshake)",
            run.name, r.error_type, c.error_type, c.failed_phase
        ))
    }
}

/// Runs the scenario.
pub(super) async fn run(lab: &mut Lab) -> anyhow::Result<Outcome> {
    let rtt = lab.rtt();
    // The ClientHello reaches the server 1.5 RTT after the connect (the
    // proxy charges the TCP handshake's RTT there) and its answer is back at
    // 2 RTT: 1.25 RTT is mid-handshake.
    let cut = rtt * 5 / 4;
    let pki = net::pki(HOST)?;
    let server = net::start(net::https_server(&pki)).await?;
    let proxy = DelayProxy::start(server.addr(), rtt / 2)
        .await
        .context("cannot start the delay proxy")?;
    let url = format!("https://{HOST}:{}/", proxy.addr().port());

    let trace = ConnTrace::new();
    let client = net::build(builder(&trace, &pki))?;
    let span = lab.run_span(RUN_REQUEST);
    async {
        net::fetch(&client, &url, Some(cut), Body::Read).await;
        net::fetch(&client, &url, Some(NEXT_TIMEOUT), Body::Read).await;
    }
    .instrument(span.clone())
    .await;
    drop(span);
    let proxied_first = proxy.connections();
    let handshakes_first = server.tls_handshakes();

    let trace = ConnTrace::new();
    let client = net::build(builder(&trace, &pki).connect_timeout(cut))?;
    let span = lab.run_span(RUN_CONNECT);
    net::fetch(&client, &url, None, Body::Read)
        .instrument(span.clone())
        .await;
    drop(span);

    let spans = lab.spans().await;
    let mut by_request = spans.run(RUN_REQUEST);
    by_request
        .counters
        .insert("proxy_connections".into(), proxied_first);
    by_request
        .counters
        .insert("server_tls_handshakes".into(), handshakes_first);
    let mut by_connect = spans.run(RUN_CONNECT);
    by_connect.counters.insert(
        "proxy_connections".into(),
        proxy.connections() - proxied_first,
    );
    by_connect.counters.insert(
        "server_tls_handshakes".into(),
        server.tls_handshakes() - handshakes_first,
    );

    let next_missed = by_request
        .requests
        .get(1)
        .is_some_and(|r| r.reused == Some(false) && r.status.is_some());
    let reproduced = cancelled_in_tls(&by_request, semconv::ERROR_TYPE_CANCELLED)
        .and_then(|()| {
            if next_missed {
                Ok(())
            } else {
                Err("request 2 was not a miss with a response".to_owned())
            }
        })
        .and_then(|()| cancelled_in_tls(&by_connect, semconv::ERROR_TYPE_TIMEOUT));
    let mut findings = vec![format!(
        "a server {} ms away (delay proxy): a full TLS 1.3 handshake needs ~2 RTT here ({} ms); the timeouts are {} ms",
        rtt.as_millis(),
        (rtt * 2).as_millis(),
        cut.as_millis()
    )];
    findings.push(format!(
        "request timeout, request 1: {}",
        describe(&by_request, 1)
    ));
    if let Some(c) = by_request.connections.first() {
        findings.push(format!(
            "its setup span ended after {:.1} ms with outcome {}: tcp.connect had finished ({:.1} ms), tls.handshake was {:.1} ms in and never got the server's answer",
            c.total_ms,
            c.outcome,
            c.tcp.as_ref().map_or(0.0, |t| t.ms),
            c.tls.as_ref().map_or(0.0, |t| t.ms)
        ));
    }
    findings.push(format!(
        "request 2 (timeout {} s): {}: the abandoned connection never reached the pool",
        NEXT_TIMEOUT.as_secs(),
        describe(&by_request, 2)
    ));
    findings.push(format!(
        "connect timeout, request 1: {}",
        describe(&by_connect, 1)
    ));
    findings.push(format!(
        "the server completed {} TLS handshake(s) for {} connection(s) the proxy saw",
        server.tls_handshakes(),
        proxy.connections()
    ));
    Ok(Outcome {
        config: serde_json::json!({
            "rtt_ms": rtt.as_millis() as u64,
            "timeout_ms": cut.as_millis() as u64,
            "url": url,
        }),
        tables: vec![
            requests_table(format!("run: {RUN_REQUEST}"), &by_request),
            requests_table(format!("run: {RUN_CONNECT}"), &by_connect),
        ],
        runs: vec![by_request, by_connect],
        findings,
        fix: Some(
            "a timeout shorter than a new connection's setup (TCP + TLS round trips to this server) fails every request that needs one: set the connect and request timeouts above the handshake time, and keep connections pooled so most requests need none".to_owned(),
        ),
        reproduced,
    })
}
