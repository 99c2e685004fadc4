//! What the cost work promises beyond speed (speed itself is the
//! `overhead` benchmark's): no span lost at a flush, and every connection
//! setup kept while requests are head-sampled. Spans are read from the
//! in-process OTLP receiver, exported over OTLP/gRPC by a batch processor.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use conntrace_lab::{HttpVersions, OtlpReceiver, ReceivedSpan, TestPki, TestServer, TlsVersions};
use futures::StreamExt;
use opentelemetry::trace::TraceContextExt;
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::trace::{Sampler, SdkTracerProvider};
use reqwest_conntrace::{ConnTrace, KeepConnectionSetups, otlp, semconv};
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::layer::SubscriberExt;

use crate::support::trust;

/// A tracer provider exporting to `receiver` through a batch processor.
fn provider_to(
    receiver: &OtlpReceiver,
    sampler: Option<KeepConnectionSetups>,
) -> SdkTracerProvider {
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .with_endpoint(receiver.endpoint())
        .build()
        .expect("OTLP exporter");
    let builder = SdkTracerProvider::builder().with_batch_exporter(exporter);
    match sampler {
        Some(s) => builder.with_sampler(s),
        None => builder,
    }
    .build()
}

/// Flushes the way `otlp::OtlpGuard::flush` does: connection spans still
/// ending first, then the provider (blocking: off the runtime's core).
fn flush(provider: &SdkTracerProvider) {
    tokio::task::block_in_place(|| {
        assert!(
            reqwest_conntrace::wait_for_pending_spans(Duration::from_secs(5)),
            "connection spans still pending after 5 s"
        );
        provider.force_flush().expect("flush");
    });
}

fn named<'a>(spans: &'a [ReceivedSpan], name: &str) -> Vec<&'a ReceivedSpan> {
    spans.iter().filter(|s| s.name() == name).collect()
}

/// 150 connections churned at 6 in flight (the server closes each after its
/// response): right after the flush returns, without waiting, the receiver
/// holds every request span and every connection's setup, `tcp.connect`
/// and `tls.handshake` span. `tcp.connect` ends when the kernel's answer
/// arrives on the sock_diag thread, possibly after its response: the
/// flush waits for it (that wait, behind a slow kernel lookup, is proven
/// deterministically by the unit test in `tcp.rs`; here the whole path is
/// checked end to end).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flush_delivers_every_span_of_churned_connections() {
    const CONNECTIONS: usize = 150;
    let receiver = OtlpReceiver::start().await.expect("OTLP receiver");
    let provider = provider_to(&receiver, None);
    let pki = TestPki::localhost().expect("pki");
    let server = TestServer::builder()
        .tls(&pki)
        .tls_versions(TlsVersions::Tls13Only)
        .http_versions(HttpVersions::Http1Only)
        .keep_alive(false)
        .start()
        .await
        .expect("server");
    let client = ConnTrace::builder()
        .tracer_provider(&provider)
        .build()
        .instrument_client(reqwest::Client::builder())
        .tls(trust(&pki))
        .build_with_middleware()
        .expect("client");
    let url = server.ip_url("/");
    let subscriber = tracing_subscriber::registry().with(otlp::tracing_layer(&provider));
    let _guard = tracing::subscriber::set_default(subscriber);
    futures::stream::iter(0..CONNECTIONS)
        .for_each_concurrent(6, |_| async {
            let response = client.get(&url).send().await.expect("request");
            response.bytes().await.expect("body");
        })
        .await;
    assert_eq!(server.accepted_connections(), CONNECTIONS as u64);

    flush(&provider);
    let spans = receiver.spans();
    let counts: Vec<(&str, usize)> = [
        "GET",
        semconv::CONNECTION_SETUP_SPAN,
        semconv::TCP_CONNECT_SPAN,
        semconv::TLS_HANDSHAKE_SPAN,
    ]
    .into_iter()
    .map(|name| (name, named(&spans, name).len()))
    .collect();
    assert_eq!(
        counts,
        vec![
            ("GET", CONNECTIONS),
            (semconv::CONNECTION_SETUP_SPAN, CONNECTIONS),
            (semconv::TCP_CONNECT_SPAN, CONNECTIONS),
            (semconv::TLS_HANDSHAKE_SPAN, CONNECTIONS),
        ],
        "spans at the receiver right after the flush"
    );
}

/// Requests head-sampled out (parent-based always_off) behind
/// `KeepConnectionSetups`: no request span is exported, but the one
/// connection the five requests needed is, as the root of its own trace
/// with a link to the trace of the request whose miss started it, its
/// `tcp.connect` and `tls.handshake` children in that new trace, and its
/// miss reason (`cold`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unsampled_requests_keep_their_connection_setup_as_a_linked_trace() {
    let receiver = OtlpReceiver::start().await.expect("OTLP receiver");
    let sampler = KeepConnectionSetups::new(Sampler::ParentBased(Box::new(Sampler::AlwaysOff)));
    let provider = provider_to(&receiver, Some(sampler));
    let pki = TestPki::localhost().expect("pki");
    let server = TestServer::builder()
        .tls(&pki)
        .tls_versions(TlsVersions::Tls13Only)
        .http_versions(HttpVersions::Http1Only)
        .start()
        .await
        .expect("server");
    let conntrace = ConnTrace::builder().tracer_provider(&provider).build();
    // The request spans' trace ids, as the middleware opens them.
    let traces = Arc::new(Mutex::new(Vec::new()));
    let seen = traces.clone();
    let make_span = move |_: &reqwest::Request| {
        let span = tracing::info_span!(target: "reqwest_conntrace", "HTTP request", otel.name = "GET", otel.kind = "client");
        let cx = span.context();
        let id = cx.span().span_context().trace_id();
        seen.lock().expect("trace ids").push(id.to_string());
        span
    };
    let client = reqwest_middleware::ClientBuilder::new(
        conntrace
            .instrument_client(reqwest::Client::builder())
            .tls(trust(&pki))
            .build()
            .expect("client"),
    )
    .with(conntrace.middleware().make_span(make_span))
    .build();
    let url = server.ip_url("/");
    let subscriber = tracing_subscriber::registry().with(otlp::tracing_layer(&provider));
    let _guard = tracing::subscriber::set_default(subscriber);
    for _ in 0..5 {
        let response = client.get(&url).send().await.expect("request");
        response.bytes().await.expect("body");
    }
    // One connection, or more when a sequential request beat hyper-util's
    // return of the connection to its pool (`release_race`): the server's
    // count of accepted connections is the truth the spans must match.
    let accepted = server.accepted_connections();
    assert!(accepted >= 1, "the first request paid for a connection");

    flush(&provider);
    let spans = receiver
        .wait_for_spans(3 * accepted as usize, Duration::from_secs(10))
        .await;
    let names: Vec<&str> = spans.iter().map(|s| s.name()).collect();
    assert_eq!(
        names.iter().filter(|n| **n == "GET").count(),
        0,
        "unsampled requests are not exported: {names:?}"
    );
    let setups = named(&spans, semconv::CONNECTION_SETUP_SPAN);
    assert_eq!(
        setups.len(),
        accepted as usize,
        "one per accepted connection: {names:?}"
    );
    let requests = traces.lock().expect("trace ids").clone();
    for setup in &setups {
        assert_eq!(setup.parent_span_id_hex(), None, "a root span");
        let links = setup.links();
        assert_eq!(links.len(), 1, "linked to its request");
        assert!(
            requests.contains(&links[0].trace_id_hex),
            "a request's trace"
        );
        assert!(!requests.contains(&setup.trace_id_hex()), "its own trace");
        assert!(setup.has_attr(semconv::HTTP_CONNECTION_MISS_REASON));
    }
    // The first request's miss is the cold one.
    let cold: Vec<_> = setups
        .iter()
        .filter(|s| s.attr_str(semconv::HTTP_CONNECTION_MISS_REASON) == Some("cold"))
        .collect();
    assert_eq!(cold.len(), 1, "{names:?}");
    assert_eq!(cold[0].links()[0].trace_id_hex, requests[0]);
    for phase in [semconv::TCP_CONNECT_SPAN, semconv::TLS_HANDSHAKE_SPAN] {
        let children = named(&spans, phase);
        assert_eq!(children.len(), accepted as usize, "{phase}: {names:?}");
        for child in children {
            let parent = setups
                .iter()
                .find(|s| Some(s.span_id_hex()) == child.parent_span_id_hex())
                .unwrap_or_else(|| panic!("{phase} under a setup span"));
            assert_eq!(child.trace_id_hex(), parent.trace_id_hex(), "{phase}");
        }
    }
    assert_eq!(
        spans.len(),
        3 * accepted as usize,
        "nothing else exported: {names:?}"
    );
}
