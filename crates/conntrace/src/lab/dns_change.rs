//! Scenario `dns-change`: the lab name moves from 127.0.0.1 to 127.0.0.2
//! (a DNS change, a failover) while the client holds a pooled connection
//! to the old address. New connections go to the new address; requests on
//! the pooled one still go to the old, and say so:
//! `http.connection.dns_stale = true`.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};

use anyhow::Context as _;
use reqwest::dns::{Addrs, Name, Resolve, Resolving};
use reqwest_conntrace::ConnTrace;
use tracing::Instrument as _;

use super::net::{self, Body};
use super::report::Outcome;
use super::runner::Lab;
use super::text::requests_table;
use super::view::RunView;

/// The lab host name.
const HOST: &str = "dns-change.lab.test";
/// The address before the change.
const OLD: Ipv4Addr = Ipv4Addr::LOCALHOST;
/// The address after the change.
const NEW: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);
/// The run's name.
const RUN: &str = "the name moves to another address under a pooled connection";

/// Answers every name with one address, which the scenario changes.
#[derive(Debug, Clone)]
struct MovingResolver(Arc<Mutex<IpAddr>>);

impl Resolve for MovingResolver {
    fn resolve(&self, _name: Name) -> Resolving {
        let ip = *self.0.lock().unwrap_or_else(|e| e.into_inner());
        // Port 0: hyper-util puts the URL's port in.
        let addrs: Addrs = Box::new(std::iter::once(SocketAddr::new(ip, 0)));
        Box::pin(std::future::ready(Ok(addrs)))
    }
}

/// Runs the scenario.
pub(super) async fn run(lab: &mut Lab) -> anyhow::Result<Outcome> {
    let pki = net::pki(HOST)?;
    let (old, new) = net::same_port(
        || async {
            let server = net::start(net::https_server(&pki)).await?;
            let port = server.addr().port();
            Ok((server, port))
        },
        |port| {
            let builder = net::https_server(&pki).bind(SocketAddr::from((NEW, port)));
            async move {
                builder
                    .start()
                    .await
                    .with_context(|| format!("cannot start the lab server on {NEW}:{port}"))
            }
        },
    )
    .await?;
    let url = format!("https://{HOST}:{}/delay/100", old.addr().port());
    let answer = Arc::new(Mutex::new(IpAddr::V4(OLD)));
    let trace = ConnTrace::new();
    let client =
        net::build(net::client(&trace, &pki).dns_resolver(MovingResolver(answer.clone())))?;
    let span = lab.run_span(RUN);
    async {
        net::fetch(&client, &url, None, Body::Read).await;
        // The lab's gap between sequential requests: hyper puts the
        // connection back into the pool after the response (without it the
        // next request can find it missing: a release_race miss).
        tokio::time::sleep(net::BETWEEN_REQUESTS).await;
        *answer.lock().unwrap_or_else(|e| e.into_inner()) = IpAddr::V4(NEW);
        // Two at once: one reuses the pooled connection, the other connects
        // and gets the new answer.
        futures::future::join(
            net::fetch(&client, &url, None, Body::Read),
            net::fetch(&client, &url, None, Body::Read),
        )
        .await;
        net::fetch(&client, &url, None, Body::Read).await;
    }
    .instrument(span.clone())
    .await;
    drop(span);
    let mut run = lab.spans().await.run(RUN);
    run.counters
        .insert("old_address_requests".into(), old.request_count() as u64);
    run.counters
        .insert("new_address_requests".into(), new.request_count() as u64);
    let reproduced = verdict(&run);
    let flagged = run
        .requests
        .iter()
        .filter(|r| r.dns_stale == Some(true))
        .count();
    let findings = vec![
        format!(
            "after the change the old address ({OLD}) answered {} requests and the new one ({NEW}) {} (the servers' own counts)",
            old.request_count().saturating_sub(1),
            new.request_count()
        ),
        format!(
            "{flagged} request(s) went out on the pooled connection to {OLD} after DNS gave {NEW}: http.connection.dns_stale = true"
        ),
    ];
    Ok(Outcome {
        config: serde_json::json!({ "old_address": OLD.to_string(), "new_address": NEW.to_string() }),
        tables: vec![requests_table(format!("run: {RUN}"), &run)],
        runs: vec![run],
        findings,
        fix: Some(
            "a pooled connection outlives a DNS change: bound its life (pool_idle_timeout, or a new client after a failover) if clients must follow DNS".to_owned(),
        ),
        reproduced,
    })
}

/// After the change, requests to the old address are flagged, at least one;
/// requests to the new one are not.
fn verdict(run: &RunView) -> Result<(), String> {
    let mut flagged = 0;
    for r in run.requests.iter().skip(1) {
        match (r.peer_address.as_deref(), r.dns_stale) {
            (Some(p), Some(true)) if p == OLD.to_string() => flagged += 1,
            (Some(p), None) if p == NEW.to_string() => {}
            (peer, stale) => {
                return Err(format!(
                    "request {}: peer {peer:?}, dns_stale {stale:?}; expected the old address flagged, the new one not",
                    r.index
                ));
            }
        }
    }
    if flagged == 0 {
        return Err("no request on the old connection after the change".to_owned());
    }
    Ok(())
}
