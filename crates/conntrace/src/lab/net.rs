//! Loopback plumbing shared by the scenarios: lab host names answered by a
//! static resolver (so the address-order policy and the `dns.lookup` span
//! apply, unlike reqwest's `resolve()` overrides), certificates for them,
//! and requests.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use conntrace_lab::TestPki;
use reqwest::dns::{Addrs, Name, Resolve, Resolving};
use reqwest_conntrace::{ConnTrace, InstrumentedClientBuilder, TlsSettings};
use reqwest_middleware::ClientWithMiddleware;

/// A resolver answering lab names from a fixed table, in the table's
/// order, like a DNS server returning those records. Other names fail.
#[derive(Debug, Clone, Default)]
pub(crate) struct StaticResolver {
    names: Arc<HashMap<String, Vec<IpAddr>>>,
}

impl StaticResolver {
    /// A resolver answering `name` with `addrs` (port taken from the URL).
    pub(crate) fn new(name: &str, addrs: &[IpAddr]) -> Self {
        let mut names = HashMap::new();
        names.insert(name.to_owned(), addrs.to_vec());
        Self {
            names: Arc::new(names),
        }
    }
}

impl Resolve for StaticResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let found = self.names.get(name.as_str()).cloned();
        let asked = name.as_str().to_owned();
        Box::pin(async move {
            match found {
                // Port 0: hyper-util puts the URL's port in.
                Some(addrs) => Ok(Box::new(
                    addrs
                        .into_iter()
                        .map(|ip| SocketAddr::new(ip, 0))
                        .collect::<Vec<_>>()
                        .into_iter(),
                ) as Addrs),
                None => Err(format!("{asked} is not a lab name").into()),
            }
        })
    }
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
