//! Scenario `dead-first-address`: a name resolving to a dead address first
//! (a listener on 127.0.0.2 whose full accept queue drops every SYN) and a
//! working one second (127.0.0.1, same port), with a 1 s connect timeout.
//! hyper-util gives each address of a family an equal share of the connect
//! timeout, so every new connection waits out half of it on the dead
//! address before it connects to the second: the setup span shows the
//! fallback, `address_index` 1 and `tcp.address_skipped` `timed_out`.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use anyhow::Context as _;
use conntrace_lab::FullBacklogListener;
use reqwest_conntrace::{ConnTrace, semconv};
use tracing::Instrument as _;

use super::net::{self, Body};
use super::report::Outcome;
use super::runner::Lab;
use super::text::{describe, requests_table};
use crate::resolve::PinnedResolver;

/// The lab host name.
const HOST: &str = "dead-first.lab.test";
/// The dead address (all of 127/8 is local on Linux).
const DEAD: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);
/// The client's connect timeout.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// The run's name.
const RUN: &str = "dead address first";

/// Runs the scenario.
pub(super) async fn run(lab: &mut Lab) -> anyhow::Result<Outcome> {
    let pki = net::pki(HOST)?;
    let (server, dead) = net::same_port(
        || async {
            let server = net::start(net::https_server(&pki)).await?;
            let port = server.addr().port();
            Ok((server, port))
        },
        |port| async move {
            FullBacklogListener::start(SocketAddr::from((DEAD, port)))
                .await
                .with_context(|| format!("cannot fill a listener's accept queue on {DEAD}:{port}"))
        },
    )
    .await?;
    let port = server.addr().port();
    let url = format!("https://{HOST}:{port}/");
    let trace = ConnTrace::new();
    let client = net::build(
        net::client(&trace, &pki)
            .dns_resolver(PinnedResolver::single(
                HOST,
                &[IpAddr::V4(DEAD), IpAddr::V4(Ipv4Addr::LOCALHOST)],
            ))
            .connect_timeout(CONNECT_TIMEOUT),
    )?;
    let span = lab.run_span(RUN);
    net::fetch(&client, &url, None, Body::Read)
        .instrument(span.clone())
        .await;
    drop(span);

    let mut run = lab.spans().await.run(RUN);
    run.counters
        .insert("server_accepted".into(), server.accepted_connections());
    run.counters
        .insert("dead_accepted".into(), dead.accepted_after_release());
    let share = CONNECT_TIMEOUT / 2;
    let setup = run.connections.first();
    let tcp = setup.and_then(|c| c.tcp.as_ref());
    let dead_text = DEAD.to_string();
    let reproduced = match (setup, tcp) {
        (Some(c), Some(t)) => {
            let skipped_dead = t.skipped.iter().any(|s| {
                s.address.as_deref() == Some(dead_text.as_str())
                    && s.outcome.as_deref() == Some(semconv::ADDRESS_OUTCOME_TIMED_OUT)
            });
            let near_share =
                t.ms >= share.as_secs_f64() * 900.0 && t.ms <= share.as_secs_f64() * 1000.0 + 300.0;
            if c.address_fallback && t.address_index == Some(1) && skipped_dead && near_share {
                Ok(())
            } else {
                Err(format!(
                    "fallback {}, address_index {:?}, {dead_text} skipped as timed_out: {skipped_dead}, tcp.connect {:.1} ms (expected ~{} ms)",
                    c.address_fallback,
                    t.address_index,
                    t.ms,
                    share.as_millis()
                ))
            }
        }
        _ => Err("no tcp.connect span".to_owned()),
    };
    let mut findings = vec![format!("request 1: {}", describe(&run, 1))];
    if let Some(t) = tcp {
        findings.push(format!(
            "tcp.connect took {:.1} ms: connect order {} (http.connection.addresses); connected to {} (address_index {}, address_fallback {})",
            t.ms,
            t.addresses.join(", "),
            t.peer_address.as_deref().unwrap_or("?"),
            t.address_index.map_or("?".to_owned(), |i| i.to_string()),
            t.address_fallback.unwrap_or(false)
        ));
        for s in &t.skipped {
            findings.push(format!(
                "tcp.address_skipped: {} {} at +{:.1} ms: hyper-util gives each of the {} addresses an equal share of the {} ms connect timeout ({} ms), and the dead one used all of it",
                s.address.as_deref().unwrap_or("?"),
                s.outcome.as_deref().unwrap_or("?"),
                s.at_ms,
                t.addresses.len(),
                CONNECT_TIMEOUT.as_millis(),
                share.as_millis()
            ));
        }
    }
    findings.push(format!(
        "the dead address accepted {} connection(s), the live one {}: every new connection to this host pays ~{} ms; without a connect timeout the dead address would hold each connect until the kernel gives up on its SYN retries (about 2 min with tcp_syn_retries = 6)",
        dead.accepted_after_release(),
        server.accepted_connections(),
        share.as_millis()
    ));
    Ok(Outcome {
        config: serde_json::json!({
            "addresses": [DEAD.to_string(), Ipv4Addr::LOCALHOST.to_string()],
            "connect_timeout_ms": CONNECT_TIMEOUT.as_millis() as u64,
            "url": url,
        }),
        tables: vec![requests_table(format!("run: {RUN}"), &run)],
        runs: vec![run],
        findings,
        fix: Some(
            "take the dead address out of DNS; until then keep a connect timeout (each address gets an equal share of it) and keep connections pooled so few requests pay the wait".to_owned(),
        ),
        reproduced,
    })
}
