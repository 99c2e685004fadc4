//! reqwest-conntrace next to `reqwest_tracing::TracingMiddleware`.
//!
//! `TracingMiddleware` opens the HTTP client span; the conntrace middleware,
//! placed *after* it with [`UseCurrentSpan`], adds its pool attributes
//! (`http.connection.reused`, `.id`, `.wait_time`, ...) to that same span
//! instead of opening a second one, and the `http.connection_setup` span of a
//! new connection nests under it. The requests here run inside an
//! application span (`sync_orders`), so the whole trace reads:
//!
//! ```text
//! sync_orders
//! ├─ GET                          reqwest-tracing's span + pool attributes
//! │  └─ http.connection_setup     first request only: a pool miss
//! │     ├─ dns.lookup
//! │     ├─ tcp.connect
//! │     └─ tls.handshake          ALPN h2 here
//! └─ GET                          reused = true, link to the setup span
//! ```
//!
//! ```text
//! cargo run -p examples --example with_reqwest_tracing
//! ```
//!
//! Set `OTEL_EXPORTER_OTLP_ENDPOINT=http://localhost:4317` (with
//! `docker compose up -d`) to send the spans to Jaeger instead of printing them.

#[path = "support.rs"]
mod support;

use std::error::Error;

use conntrace_lab::{TestPki, TestServer};
use reqwest_conntrace::{ConnTrace, TlsSettings, UseCurrentSpan};
use reqwest_middleware::ClientWithMiddleware;

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error>> {
    let telemetry = support::Telemetry::init()?;

    // Loopback HTTPS test server speaking HTTP/1.1 and HTTP/2 (ALPN picks h2).
    let pki = TestPki::localhost()?;
    let server = TestServer::builder().tls(&pki).start().await?;

    let conntrace = ConnTrace::new();
    let client = conntrace
        .instrument_client(reqwest::Client::builder())
        .tls(
            TlsSettings::new()
                .built_in_roots(false)
                .add_root_certificate(pki.ca_cert_der()),
        )
        .build()?;
    // Order matters: reqwest-tracing first (it opens the span and makes it
    // current), conntrace second (it uses the current span).
    let client = reqwest_middleware::ClientBuilder::new(client)
        .with(reqwest_tracing::TracingMiddleware::default())
        .with(conntrace.middleware().make_span(UseCurrentSpan))
        .build();

    sync_orders(&client, &server).await?;

    drop(client);
    server.shutdown().await;
    telemetry.finish();
    Ok(())
}

/// The application's own span around the requests. (`#[tracing::instrument]`
/// rather than `tracing::Instrument`: with that trait in scope,
/// `conntrace.instrument(builder)` resolves to the trait's method.)
#[tracing::instrument(skip_all)]
async fn sync_orders(
    client: &ClientWithMiddleware,
    server: &TestServer,
) -> Result<(), Box<dyn Error>> {
    for path in ["/orders", "/bytes/4096"] {
        let body = client.get(server.url(path)).send().await?.bytes().await?;
        println!("GET {path}: {} bytes", body.len());
    }
    Ok(())
}
