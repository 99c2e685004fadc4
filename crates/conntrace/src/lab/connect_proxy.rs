//! Scenario `connect-proxy`: https requests through the lab's HTTP CONNECT
//! proxy (set with the instrumented builder's `proxy`, so the library knows
//! it): one tunnel for all of them, a setup span marked proxied whose peer
//! is the proxy while `server.address` stays the target, and one
//! `proxy.connect` phase for the CONNECT round trip. Then plain-http
//! requests, which the proxy forwards (no tunnel).

use anyhow::Context as _;
use conntrace_lab::{ConnectProxy, HttpVersions, TestServer};
use reqwest_conntrace::ConnTrace;
use tracing::Instrument as _;

use super::net;
use super::report::Outcome;
use super::runner::Lab;
use super::text::{mean, requests_table};

/// The target's name (the proxy resolves it, not the client).
const HOST: &str = "localhost";
/// The https run's name.
const RUN_TUNNEL: &str = "https through a CONNECT tunnel";
/// The plain-http run's name.
const RUN_FORWARD: &str = "plain http forwarded";
/// Plain-http requests.
const FORWARDED: usize = 3;

/// Runs the scenario.
pub(super) async fn run(lab: &mut Lab) -> anyhow::Result<Outcome> {
    let n = lab.requests();
    let pki = net::pki(HOST)?;
    let server = net::start(net::https_server(&pki)).await?;
    let plain = TestServer::builder()
        .http_versions(HttpVersions::Http1Only)
        .start()
        .await
        .context("cannot start the plain lab server")?;
    let proxy = ConnectProxy::start()
        .await
        .context("cannot start the CONNECT proxy")?;
    let url = format!("https://{HOST}:{}/", server.addr().port());
    let plain_url = format!("http://{HOST}:{}/", plain.addr().port());
    let trace = ConnTrace::new();
    let client = net::build(net::client(&trace, &pki).proxy(proxy.url()))?;

    let span = lab.run_span(RUN_TUNNEL);
    net::fetch_in_turn(&client, &url, n, None)
        .instrument(span.clone())
        .await;
    drop(span);
    Lab::connects_done().await;
    let tunnels = proxy.tunnels();
    let proxy_connections = proxy.connections();
    let server_accepted = server.accepted_connections();

    let span = lab.run_span(RUN_FORWARD);
    net::fetch_in_turn(&client, &plain_url, FORWARDED, None)
        .instrument(span.clone())
        .await;
    drop(span);

    let spans = lab.spans().await;
    let mut tunnel = spans.run(RUN_TUNNEL);
    tunnel.counters.insert("proxy_tunnels".into(), tunnels);
    tunnel
        .counters
        .insert("proxy_connections".into(), proxy_connections);
    tunnel
        .counters
        .insert("server_accepted".into(), server_accepted);
    let mut forward = spans.run(RUN_FORWARD);
    forward
        .counters
        .insert("proxy_forwarded".into(), proxy.forwarded_requests());
    forward.counters.insert(
        "proxy_connections".into(),
        proxy.connections() - proxy_connections,
    );
    forward
        .counters
        .insert("server_accepted".into(), plain.accepted_connections());

    let setup = tunnel.connections.first();
    let hits = tunnel
        .requests
        .iter()
        .filter(|r| r.reused == Some(true) && r.miss_reason.is_none())
        .count();
    let proxy_port = i64::from(proxy.addr().port());
    let reproduced = match setup {
        None => Err("no connection setup span".to_owned()),
        Some(_) if tunnel.connections.len() != 1 => Err(format!(
            "{} setup spans for one tunnel",
            tunnel.connections.len()
        )),
        Some(c) if !c.proxied || c.peer_port != Some(proxy_port) => Err(format!(
            "the setup span has proxied = {}, peer port {:?} (proxy {proxy_port})",
            c.proxied, c.peer_port
        )),
        Some(c) if c.proxy_connect.len() != 1 => Err(format!(
            "{} proxy.connect spans on the setup",
            c.proxy_connect.len()
        )),
        Some(_) if tunnels != 1 => Err(format!("the proxy opened {tunnels} tunnels")),
        // The tunnel's reuse is the signal: every request after the first.
        Some(_) if hits == 0 || hits != n - 1 => Err(format!(
            "{hits} of {n} request(s) reused the tunnel (expected {})",
            n - 1
        )),
        Some(_) => Ok(()),
    };
    let mut findings = vec![format!(
        "{n} https request(s) through the proxy: {} new connection(s), {hits} pool hit(s); the proxy counted {tunnels} CONNECT tunnel(s) and {proxy_connections} client connection(s), the server {server_accepted} connection(s)",
        tunnel.connections.len()
    )];
    if let Some(c) = setup {
        findings.push(format!(
            "the setup span: proxied = {}, peer {}:{} (the proxy), server.address {} (the target); proxy.connect (the CONNECT round trip) {:.1} ms, then TLS with the target {:.1} ms; setup {:.1} ms in all",
            c.proxied,
            c.peer_address.as_deref().unwrap_or("?"),
            c.peer_port.unwrap_or_default(),
            c.server_address.as_deref().unwrap_or("?"),
            c.proxy_connect.first().map_or(0.0, |p| p.ms),
            c.tls.as_ref().map_or(0.0, |t| t.ms),
            c.total_ms
        ));
    }
    findings.push(format!(
        "mean request time {:.1} ms: requests after the first reuse the tunnel, with no CONNECT and no handshake",
        mean(tunnel.requests.iter().map(|r| r.total_ms))
    ));
    findings.push(format!(
        "plain http: {FORWARDED} request(s) over {} connection(s) to the proxy (proxied, no proxy.connect: nothing to tunnel); the proxy forwarded {} and the server accepted {} upstream connection(s): pooling to a forward proxy does not pool the proxy's upstream connections",
        forward.connections.len(),
        proxy.forwarded_requests(),
        plain.accepted_connections()
    ));
    Ok(Outcome {
        config: serde_json::json!({
            "requests": n,
            "url": url,
            "plain_url": plain_url,
            "proxy": proxy.url(),
        }),
        tables: vec![
            requests_table(format!("run: {RUN_TUNNEL}"), &tunnel),
            requests_table(format!("run: {RUN_FORWARD}"), &forward),
        ],
        runs: vec![tunnel, forward],
        findings,
        fix: None,
        reproduced,
    })
}
