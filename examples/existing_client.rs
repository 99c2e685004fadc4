//! Instrumenting the `reqwest::ClientBuilder` your code already has.
//!
//! The integration is four steps (marked 1-4 below): set up the OpenTelemetry
//! pipeline, keep your builder with its options, hand it to
//! [`ConnTrace::instrument_client`], and wrap the client with the conntrace
//! middleware. Every request span then says whether it reused a pooled
//! connection (`http.connection.reused`, `.wait_time`, `.idle_time`, ...) and
//! every new connection is an `http.connection_setup` span with `dns.lookup`,
//! `tcp.connect` and `tls.handshake` children.
//!
//! Runs with no setup against an HTTPS test server on loopback (a throw-away
//! CA from `conntrace-lab`):
//!
//! ```text
//! cargo run -p examples --example existing_client
//! ```
//!
//! Without `OTEL_EXPORTER_OTLP_ENDPOINT` the spans are printed as a tree. To
//! see them in Jaeger, start the collector and Jaeger from the repository's
//! `docker-compose.yml` and point the exporter at the collector:
//!
//! ```text
//! docker compose up -d
//! OTEL_EXPORTER_OTLP_ENDPOINT=http://localhost:4317 OTEL_SERVICE_NAME=existing-client \
//!     cargo run -p examples --example existing_client
//! # then http://localhost:16686
//! ```

#[path = "support.rs"]
mod support;

use std::error::Error;
use std::time::Duration;

use conntrace_lab::{HttpVersions, TestPki, TestServer};
use reqwest_conntrace::{ConnTrace, RequestReport, TlsSettings};
use tokio::task::JoinSet;

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error>> {
    // 1. The pipeline: `otlp::init_from_env()` when an OTLP endpoint is set
    //    (tracer provider + tracing-opentelemetry subscriber from OTEL_*),
    //    otherwise the same pipeline with an in-memory exporter.
    let telemetry = support::Telemetry::init()?;

    // A loopback HTTPS server (HTTP/1.1, TLS 1.2 and 1.3) whose certificate
    // names `localhost`, so the client does a real DNS lookup, TCP connect
    // and TLS handshake without leaving this machine.
    let pki = TestPki::localhost()?;
    let server = TestServer::builder()
        .tls(&pki)
        .http_versions(HttpVersions::Http1Only)
        .start()
        .await?;

    // 2. The builder your code already has, options and all: they are kept.
    let builder = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .user_agent("conntrace-example/0.1");

    // 3. Instrument it. Options the instrumentation must see go on the
    //    instrumented builder instead of reqwest's: the pool settings (reqwest's
    //    builder cannot be read back, and the miss reasons, the idle-limit
    //    gauge and the pool advice need them), the connect timeout (so a
    //    connect abandoned at it reads `error.type = timeout`), the DNS
    //    resolver, and root certificates and client identities (reqwest's
    //    builder hides them; the TLS options it shows are carried over).
    //    Here: trust only the test CA. A real client keeps `TlsSettings::default()`.
    let conntrace = ConnTrace::builder().on_request_end(print_report).build();
    let client = conntrace
        .instrument_client(builder)
        .pool_max_idle_per_host(4)
        .pool_idle_timeout(Some(Duration::from_secs(90)))
        .connect_timeout(Duration::from_secs(3))
        .tls(
            TlsSettings::new()
                .built_in_roots(false)
                .add_root_certificate(pki.ca_cert_der()),
        )
        .build()?;

    // 4. The middleware opens the request span and attributes each response
    //    to the connection that carried it. Other middleware can sit around
    //    it (`build_with_middleware()` is the one-liner when there is none).
    let client = reqwest_middleware::ClientBuilder::new(client)
        .with(conntrace.middleware())
        .build();

    println!("\nthree sequential requests: one pool miss, then two hits");
    for _ in 0..3 {
        client.get(server.url("/")).send().await?.text().await?;
    }

    println!("\nthree concurrent requests: one idle connection, so two must connect");
    let mut batch = JoinSet::new();
    for _ in 0..3 {
        let (client, url) = (client.clone(), server.url("/delay/50"));
        batch.spawn(async move {
            client
                .get(url)
                .send()
                .await?
                .bytes()
                .await
                .map_err(reqwest_middleware::Error::from)
        });
    }
    while let Some(result) = batch.join_next().await {
        result??;
    }

    println!(
        "\nthe server accepted {} connections ({} TLS handshakes resumed) for {} requests",
        server.accepted_connections(),
        server.tls_resumed_handshakes(),
        server.request_count()
    );
    drop(client);
    server.shutdown().await;
    telemetry.finish();
    Ok(())
}

/// The Rust-side view of what the spans carry: one report per request, when
/// its body was read to the end (or dropped, or the request failed).
fn print_report(report: &RequestReport) {
    let status = report
        .status
        .map_or_else(|| "---".to_owned(), |s| s.to_string());
    let how = match &report.connection {
        None => format!(
            "no connection ({})",
            report.error_type.as_deref().unwrap_or("unknown")
        ),
        Some(c) if c.paid_by_this_request => {
            let s = &c.setup;
            format!(
                "connection #{} set up by this request: {} (dns {}, tcp {}, tls {} {}{})",
                c.id,
                ms(Some(s.total)),
                ms(s.dns),
                ms(Some(s.tcp)),
                ms(s.tls),
                s.tls_version.map_or("", |v| v.as_str()),
                if s.tls_resumed == Some(true) {
                    " resumed"
                } else {
                    ""
                },
            )
        }
        Some(c) => format!(
            "connection #{} {} (request {} on it, waited {}{})",
            c.id,
            if c.reused {
                "reused"
            } else {
                "set up by another request"
            },
            c.request_count,
            ms(Some(c.wait)),
            c.idle
                .map(|idle| format!(", idle {}", ms(Some(idle))))
                .unwrap_or_default(),
        ),
    };
    println!(
        "  {} {} -> {status} in {}: {how}",
        report.method,
        report.url,
        ms(Some(report.total))
    );
}

fn ms(d: Option<Duration>) -> String {
    d.map_or_else(
        || "-".to_owned(),
        |d| format!("{:.2} ms", d.as_secs_f64() * 1000.0),
    )
}
