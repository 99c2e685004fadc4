//! Loopback plumbing shared by the scenarios: certificates for the lab host
//! names (answered by [`PinnedResolver`](crate::resolve::PinnedResolver), so
//! the address-order policy and the `dns.lookup` span apply, unlike
//! reqwest's `resolve()` overrides), the lab's HTTPS server, clients and
//! requests.

use std::time::Duration;

use anyhow::Context as _;
use conntrace_lab::TestPki;
use reqwest_conntrace::{ConnTrace, InstrumentedClientBuilder, TlsSettings};
use reqwest_middleware::ClientWithMiddleware;

/// The lab's HTTPS server on loopback: `pki`'s certificate, HTTP/1.1 only
/// (one request per connection at a time, so pool attribution is exact).
pub(crate) fn https_server(pki: &TestPki) -> conntrace_lab::TestServerBuilder {
    conntrace_lab::TestServer::builder()
        .tls(pki)
        .http_versions(conntrace_lab::HttpVersions::Http1Only)
}

/// Starts `builder`, naming the lab server in the error.
pub(crate) async fn start(
    builder: conntrace_lab::TestServerBuilder,
) -> anyhow::Result<conntrace_lab::TestServer> {
    builder.start().await.context("cannot start the lab server")
}

/// A throw-away CA and a certificate for `host` and the loopback names.
pub(crate) fn pki(host: &str) -> anyhow::Result<TestPki> {
    TestPki::generate(&[host, "localhost", "127.0.0.1", "::1"])
        .context("cannot generate the lab certificates")
}

/// TLS settings trusting only `pki`'s CA.
pub(crate) fn tls(pki: &TestPki) -> TlsSettings {
    TlsSettings::new()
        .built_in_roots(false)
        .add_root_certificate(pki.ca_cert_der())
}

/// An instrumented client builder trusting `pki`, with the lab's user agent.
pub(crate) fn client(trace: &ConnTrace, pki: &TestPki) -> InstrumentedClientBuilder {
    trace
        .instrument_client(
            reqwest::Client::builder()
                .user_agent(concat!("conntrace-lab/", env!("CARGO_PKG_VERSION"))),
        )
        .tls(tls(pki))
        .pool_idle_timeout(Some(crate::client::REQWEST_DEFAULT_POOL_IDLE_TIMEOUT))
}

/// [`client`] for one lab host name, answered with 127.0.0.1 by the lab's
/// [`PinnedResolver`](crate::resolve::PinnedResolver).
pub(crate) fn loopback_client(
    trace: &ConnTrace,
    pki: &TestPki,
    host: &str,
) -> InstrumentedClientBuilder {
    client(trace, pki).dns_resolver(crate::resolve::PinnedResolver::single(
        host,
        &[std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST)],
    ))
}

/// Builds the client; one error line when the library refuses.
pub(crate) fn build(builder: InstrumentedClientBuilder) -> anyhow::Result<ClientWithMiddleware> {
    builder
        .build_with_middleware()
        .context("cannot build the lab client")
}

/// What to do with a response body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Body {
    /// Read it to the end.
    Read,
    /// Drop it unread right after the headers.
    Drop,
}

/// `GET url` through `client`, optionally with a per-request timeout. The
/// outcome is read back from the spans, not from here.
pub(crate) async fn fetch(
    client: &ClientWithMiddleware,
    url: &str,
    timeout: Option<Duration>,
    body: Body,
) {
    let mut request = client.get(url);
    if let Some(t) = timeout {
        request = request.timeout(t);
    }
    let Ok(response) = request.send().await else {
        return;
    };
    match body {
        Body::Read => {
            let _ = response.bytes().await;
        }
        Body::Drop => drop(response),
    }
}

/// The pause between two sequential requests on one client. hyper-util puts
/// an HTTP/1.1 connection back into its idle pool on a spawned task once the
/// previous body has ended; a request sent at the same instant can miss it,
/// start a connect of its own and then be served by the returning
/// connection anyway (the connect lands idle in the pool, `pooled`). The
/// scenarios that are not about that race leave it this long.
pub(crate) const BETWEEN_REQUESTS: Duration = Duration::from_millis(25);

/// `n` GETs of `url` one after the other on `client`, each body read,
/// [`BETWEEN_REQUESTS`] apart.
pub(crate) async fn fetch_in_turn(
    client: &ClientWithMiddleware,
    url: &str,
    n: usize,
    timeout: Option<Duration>,
) {
    for i in 0..n {
        if i > 0 {
            tokio::time::sleep(BETWEEN_REQUESTS).await;
        }
        fetch(client, url, timeout, Body::Read).await;
    }
}

/// Starts `first` (which picks a free port) and then `second` on the same
/// port (on another address); on a clash both are dropped and tried again.
pub(crate) async fn same_port<A, B, FA, FB>(
    mut first: impl FnMut() -> FA,
    mut second: impl FnMut(u16) -> FB,
) -> anyhow::Result<(A, B)>
where
    FA: Future<Output = anyhow::Result<(A, u16)>>,
    FB: Future<Output = anyhow::Result<B>>,
{
    let mut last = None;
    for _ in 0..10 {
        let (a, port) = first().await?;
        match second(port).await {
            Ok(b) => return Ok((a, b)),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| anyhow::anyhow!("no free port pair")))
        .context("cannot bind two listeners on one port")
}
