//! Secrets never leave through the telemetry: a URL carrying a distinct
//! secret in its user name, its password and the value of every
//! redacted query key is requested once per outcome (success, DNS failure,
//! refused, TLS rejection, connect timeout, proxy failure, a CONNECT
//! tunnel through a proxy with credentials, HTTP/2 error),
//! and every exported byte (spans with their attributes, events, links and
//! status; metrics; the library's log lines; the `RequestReport`s handed to
//! the callback) is searched for the secrets.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use conntrace_lab::{HttpVersions, TestPki, TestServer, TlsVersions};
use opentelemetry_sdk::metrics::{InMemoryMetricExporter, PeriodicReader, SdkMeterProvider};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider};
use reqwest_conntrace::{ConnTrace, DEFAULT_REDACTED_QUERY_KEYS, UrlRedaction, otlp, semconv};
use tracing_subscriber::Layer as _;
use tracing_subscriber::layer::SubscriberExt;

use crate::support::{silent_listener, trust};

/// The marker every planted secret starts with.
const MARK: &str = "S3CRETx";

/// The path and query with one distinct secret per redacted key (the
/// default list, one key in another case, and a user-added key).
fn secret_query() -> String {
    let mut pairs: Vec<String> = DEFAULT_REDACTED_QUERY_KEYS
        .iter()
        .enumerate()
        .map(|(i, k)| format!("{k}={MARK}q{i}"))
        .collect();
    pairs.push(format!("x-amz-signature={MARK}lower"));
    pairs.push(format!("session_id={MARK}added"));
    pairs.push("page=2".to_owned());
    format!("/p?{}", pairs.join("&"))
}

/// `scheme://user:password@host:port/p?...` with the secrets planted.
fn secret_url(scheme: &str, host_port: &str) -> String {
    format!(
        "{scheme}://{MARK}user:{MARK}pass@{host_port}{}#{MARK}frag",
        secret_query()
    )
}

/// A `Write` that appends to a shared buffer (the fmt layer's output).
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("log buffer").extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn no_secret_reaches_any_exported_byte_on_success_or_any_failure() {
    let spans = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(spans.clone())
        .build();
    let metrics = InMemoryMetricExporter::default();
    let meter_provider = SdkMeterProvider::builder()
        .with_reader(PeriodicReader::builder(metrics.clone()).build())
        .build();
    let logs = Captured::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::registry()
        .with(otlp::tracing_layer(&provider))
        .with(
            tracing_subscriber::fmt::layer()
                .with_ansi(false)
                .with_writer(move || writer.clone())
                .with_filter(tracing_subscriber::EnvFilter::new(
                    "reqwest_conntrace=trace",
                )),
        );
    let _guard = tracing::subscriber::set_default(subscriber);
    let reports = Arc::new(Mutex::new(Vec::<String>::new()));
    let sink = reports.clone();
    let trace = ConnTrace::builder()
        .tracer_provider(&provider)
        .meter_provider(&meter_provider)
        .url_redaction(UrlRedaction::new().add_query_key("Session_Id"))
        .on_request_end(move |r: &reqwest_conntrace::RequestReport| {
            sink.lock().expect("reports").push(format!("{r:?}"));
        })
        .build();

    let pki = TestPki::localhost().expect("pki");
    let other = TestPki::untrusted_other().expect("pki");
    let tls_server = TestServer::builder()
        .tls(&pki)
        .tls_versions(TlsVersions::Tls13Only)
        .http_versions(HttpVersions::Http1Only)
        .start()
        .await
        .expect("server");
    let h1_server = TestServer::builder()
        .http_versions(HttpVersions::Http1Only)
        .start()
        .await
        .expect("server");
    let tls_port = tls_server.addr().port();
    let closed_port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr").port()
    };
    let (silent, hold) = silent_listener().await;
    let silent_port = silent.port();

    let build = |tls, configure: fn(reqwest::ClientBuilder) -> reqwest::ClientBuilder| {
        trace
            .instrument_client(configure(reqwest::Client::builder()))
            .tls(tls)
            .connect_timeout(Duration::from_millis(300))
    };
    let plain = |b: reqwest::ClientBuilder| b;
    let mut outcomes = Vec::new();

    // Success.
    let client = build(trust(&pki), plain)
        .build_with_middleware()
        .expect("client");
    let response = client
        .get(secret_url("https", &format!("localhost:{tls_port}")))
        .send()
        .await
        .expect("success");
    assert_eq!(response.status(), 200);
    response.bytes().await.expect("body");
    outcomes.push("success");

    // DNS failure: a resolver that fails for the name.
    #[derive(Debug)]
    struct NoSuchHost;
    impl reqwest::dns::Resolve for NoSuchHost {
        fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
            let name = name.as_str().to_owned();
            Box::pin(
                async move { Err(format!("failed to lookup address information: {name}").into()) },
            )
        }
    }
    let client = build(trust(&pki), plain)
        .dns_resolver(NoSuchHost)
        .build_with_middleware()
        .expect("client");
    client
        .get(secret_url("https", "no-such-host.test"))
        .send()
        .await
        .expect_err("dns");
    outcomes.push("dns");

    // Refused, TLS rejection, timeout.
    let client = build(trust(&other), plain)
        .build_with_middleware()
        .expect("client");
    for (what, url) in [
        (
            "refused",
            secret_url("http", &format!("127.0.0.1:{closed_port}")),
        ),
        ("tls", secret_url("https", &format!("localhost:{tls_port}"))),
        (
            "timeout",
            secret_url("https", &format!("127.0.0.1:{silent_port}")),
        ),
    ] {
        client.get(url).send().await.expect_err(what);
        outcomes.push(what);
    }

    // A proxy with credentials that refuses.
    let client = build(trust(&pki), plain)
        .proxy(format!(
            "http://{MARK}proxyuser:{MARK}proxypass@127.0.0.1:{closed_port}"
        ))
        .build_with_middleware()
        .expect("client");
    client
        .get(secret_url("http", "example.test"))
        .send()
        .await
        .expect_err("proxy");
    outcomes.push("proxy");

    // Through a CONNECT proxy with credentials, to the TLS server.
    let proxy = conntrace_lab::ConnectProxy::start().await.expect("proxy");
    let client = build(trust(&pki), plain)
        .proxy(format!(
            "http://{MARK}proxyuser:{MARK}proxypass@{}",
            proxy.addr()
        ))
        .build_with_middleware()
        .expect("client");
    let response = client
        .get(secret_url("https", &format!("localhost:{tls_port}")))
        .send()
        .await
        .expect("through the proxy");
    response.bytes().await.expect("body");
    assert_eq!(proxy.tunnels(), 1, "the request went through the proxy");
    outcomes.push("proxy tunnel");

    // HTTP/2 by prior knowledge against an HTTP/1.1-only server.
    let client = build(trust(&pki), |b| b.http2_prior_knowledge())
        .build_with_middleware()
        .expect("client");
    client
        .get(secret_url("http", &h1_server.addr().to_string()))
        .send()
        .await
        .expect_err("h2");
    outcomes.push("http2");
    hold.abort();

    // Every request ended (one report each): the exported data is complete.
    assert_eq!(reports.lock().expect("reports").len(), outcomes.len());
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let exported = loop {
        let s = spans.get_finished_spans().expect("spans");
        let requests = s
            .iter()
            .filter(|s| {
                s.attributes
                    .iter()
                    .any(|kv| kv.key.as_str() == semconv::URL_FULL)
            })
            .count();
        if requests == outcomes.len() || std::time::Instant::now() >= deadline {
            break s;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    meter_provider.force_flush().expect("metrics flush");
    let mut everything = format!("{exported:?}");
    let error_statuses = exported
        .iter()
        .filter(|s| matches!(s.status, opentelemetry::trace::Status::Error { .. }))
        .count();
    assert!(
        error_statuses >= outcomes.len() - 1,
        "every failure has an error status: {error_statuses}"
    );
    assert!(
        everything.contains("REDACTED"),
        "url.full is exported, redacted"
    );
    everything.push_str(&format!(
        "{:?}",
        metrics.get_finished_metrics().expect("metrics")
    ));
    everything.push_str(&String::from_utf8_lossy(&logs.0.lock().expect("logs")));
    everything.push_str(&reports.lock().expect("reports").join("\n"));
    if let Some(at) = everything.find(MARK) {
        let from = at.saturating_sub(200);
        let to = (at + 100).min(everything.len());
        panic!(
            "a secret leaked (outcomes {outcomes:?}): ...{}...",
            everything.get(from..to).unwrap_or(&everything)
        );
    }
}
