//! Scenario `ipv6-blackhole` (incident 4): a name resolving to `::1`, where
//! a listener's full accept queue drops every SYN, and to `127.0.0.1` on the
//! same port, where the server works; 8 parallel fetches on a new client.
//! With the resolver's order (IPv6 first) every connect waits on IPv6 until
//! hyper-util's Happy Eyeballs starts IPv4 300 ms later; with
//! `--address-order ipv4-first` every connect is immediate.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use anyhow::Context as _;
use conntrace_lab::{FullBacklogListener, TestPki};
use futures::future::join_all;
use reqwest_conntrace::{AddressOrder, ConnTrace, semconv};
use tracing::Instrument as _;

use super::net::{self, Body};
use super::report::Outcome;
use super::runner::Lab;
use super::text::{mean, requests_table};
use super::view::RunView;
use crate::resolve::PinnedResolver;

/// The lab host name.
const HOST: &str = "dual-stack.lab.test";
/// The run with the resolver's order.
const RUN_KEEP: &str = "resolver order, IPv6 first";
/// The run with IPv4 first.
const RUN_V4: &str = "address order ipv4-first";

/// `n` parallel fetches on a new client (own handle) with `order`.
async fn fetch_parallel(
    lab: &Lab,
    run: &str,
    pki: &TestPki,
    url: &str,
    order: AddressOrder,
    n: usize,
) -> anyhow::Result<()> {
    let trace = ConnTrace::new();
    let client = net::build(
        net::client(&trace, pki)
            .dns_resolver(PinnedResolver::single(
                HOST,
                &[
                    IpAddr::V6(Ipv6Addr::LOCALHOST),
                    IpAddr::V4(Ipv4Addr::LOCALHOST),
                ],
            ))
            .address_order(order),
    )?;
    let span = lab.run_span(run);
    join_all((0..n).map(|_| net::fetch(&client, url, None, Body::Read)))
        .instrument(span.clone())
        .await;
    drop(span);
    Ok(())
}

/// Connect-time summary of a run: (fallbacks, IPv6 skipped as outraced, mean, max).
fn connects(run: &RunView) -> (usize, usize, f64, f64) {
    let tcp: Vec<_> = run
        .connections
        .iter()
        .filter_map(|c| c.tcp.as_ref())
        .collect();
    let fallbacks = run
        .connections
        .iter()
        .filter(|c| c.address_fallback)
        .count();
    let outraced = tcp
        .iter()
        .filter(|t| {
            t.skipped.iter().any(|s| {
                s.address.as_deref() == Some("::1")
                    && s.outcome.as_deref() == Some(semconv::ADDRESS_OUTCOME_OUTRACED)
            })
        })
        .count();
    let max = tcp.iter().map(|t| t.ms).fold(0.0, f64::max);
    (fallbacks, outraced, mean(tcp.iter().map(|t| t.ms)), max)
}

/// Runs the scenario.
pub(super) async fn run(lab: &mut Lab) -> anyhow::Result<Outcome> {
    let n = lab.requests();
    let pki = net::pki(HOST)?;
    let (server, blackhole) = net::same_port(
        || async {
            let server = net::start(net::https_server(&pki)).await?;
            let port = server.addr().port();
            Ok((server, port))
        },
        |port| async move {
            FullBacklogListener::start(SocketAddr::from((Ipv6Addr::LOCALHOST, port)))
                .await
                .with_context(|| {
                    format!("cannot fill a listener's accept queue on [::1]:{port} (IPv6 loopback needed)")
                })
        },
    )
    .await?;
    let url = format!("https://{HOST}:{}/", server.addr().port());
    fetch_parallel(lab, RUN_KEEP, &pki, &url, AddressOrder::Keep, n).await?;
    // Connects whose request was served first by another connection finish
    // in the background: count the server's connections once they are done.
    Lab::connects_done().await;
    let accepted_keep = server.accepted_connections();
    fetch_parallel(lab, RUN_V4, &pki, &url, AddressOrder::Ipv4First, n).await?;

    let spans = lab.spans().await;
    let mut keep = spans.run(RUN_KEEP);
    keep.counters
        .insert("server_accepted".into(), accepted_keep);
    keep.counters
        .insert("ipv6_accepted".into(), blackhole.accepted_after_release());
    let mut v4 = spans.run(RUN_V4);
    v4.counters.insert(
        "server_accepted".into(),
        server.accepted_connections() - accepted_keep,
    );
    v4.counters
        .insert("ipv6_accepted".into(), blackhole.accepted_after_release());

    let (k_fallbacks, k_outraced, k_mean, k_max) = connects(&keep);
    let (v_fallbacks, _, v_mean, v_max) = connects(&v4);
    let k_conns = keep.connections.len();
    let v_conns = v4.connections.len();
    let k_fetch = mean(keep.requests.iter().map(|r| r.total_ms));
    let v_fetch = mean(v4.requests.iter().map(|r| r.total_ms));
    let answers = keep
        .connections
        .first()
        .and_then(|c| c.dns.as_ref())
        .map(|d| d.answers.join(", "))
        .unwrap_or_default();
    let v4_order = v4
        .connections
        .first()
        .and_then(|c| c.tcp.as_ref())
        .map(|t| t.addresses.join(", "))
        .unwrap_or_default();
    let v4_first = v4
        .connections
        .iter()
        .filter(|c| c.tcp.as_ref().and_then(|t| t.address_index) == Some(0))
        .count();
    let reproduced = if k_conns == 0 || k_fallbacks != k_conns || k_outraced != k_conns {
        Err(format!(
            "resolver order: {k_fallbacks} fallback(s) and {k_outraced} IPv6 outraced of {k_conns} connects"
        ))
    } else if v_conns == 0 || v_fallbacks != 0 || v4_first != v_conns {
        Err(format!(
            "ipv4-first: {v_fallbacks} fallback(s), {v4_first} of {v_conns} connects on the first address"
        ))
    } else {
        Ok(())
    };
    let findings = vec![
        format!(
            "the resolver answers {answers} (dns.answers); ::1 drops every SYN (a full accept queue), 127.0.0.1 works"
        ),
        format!(
            "resolver order: {n} parallel fetches opened {k_conns} connection(s); {k_fallbacks} of {k_conns} fell back (address_fallback) to 127.0.0.1 with ::1 skipped as outraced on {k_outraced}: tcp.connect {k_mean:.1} ms on average, {k_max:.1} ms at most - hyper-util's 300 ms Happy Eyeballs delay before it tries IPv4; a client without Happy Eyeballs (incident 4's) would wait out SYN retransmits instead (1 s, 3 s, ...)"
        ),
        format!(
            "address order ipv4-first: connect order {v4_order}; {v4_first} of {v_conns} connection(s) connected on the first address, {v_fallbacks} fell back: tcp.connect {v_mean:.1} ms on average, {v_max:.1} ms at most"
        ),
        format!(
            "per fetch: {k_fetch:.1} ms with the resolver's order, {v_fetch:.1} ms with IPv4 first; the IPv6 listener accepted {} connection(s), the IPv4 server {}",
            blackhole.accepted_after_release(),
            server.accepted_connections()
        ),
    ];
    Ok(Outcome {
        config: serde_json::json!({
            "parallel_fetches": n,
            "addresses": ["::1", "127.0.0.1"],
            "url": url,
        }),
        tables: vec![
            requests_table(format!("run: {RUN_KEEP}"), &keep),
            requests_table(format!("run: {RUN_V4}"), &v4),
        ],
        runs: vec![keep, v4],
        findings,
        fix: Some(
            "where the IPv6 path drops SYNs, try IPv4 first (AddressOrder::Ipv4First, conntrace probe --address-order ipv4-first) until it is fixed; IPv6 stays the fallback".to_owned(),
        ),
        reproduced,
    })
}
