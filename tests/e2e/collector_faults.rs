//! The export pipeline against collectors that fail (issue 13), through the
//! library's guard: `otlp::pipeline_to` with a 1 s export timeout. For each
//! fault: shutdown returns within a bound derived from the timeout, every
//! span is accounted for (exported, failed or dropped), and the failure
//! says what happened. A collector that comes back within the retry window
//! loses nothing.
//!
//! The set-up paths (issue 10) that install process-wide state run in a
//! child process each: the test re-runs its own binary with
//! `CONNTRACE_E2E_CHILD` naming the case.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use conntrace_lab::faulty_collector::Code;
use conntrace_lab::{
    CollectorFault, FaultyCollector, FullBacklogListener, OtlpReceiver, ReceivedSpan, TestPki,
    TestServer,
};
use opentelemetry::metrics::MeterProvider as _;
use opentelemetry::trace::{Tracer as _, TracerProvider as _};
use reqwest_conntrace::otlp::{self, ExportStats, FailureKind, OtlpGuard, PipelineOptions};
use reqwest_conntrace::{ConnTrace, semconv};

/// The export timeout the user configured in these tests.
const TIMEOUT: Duration = Duration::from_secs(1);
/// Spans each run ends.
const SPANS: u64 = 40;

/// The bound on shutdown: the timeout plus the documented margin, plus
/// 1.5 s for a loaded 2-core machine (thread scheduling, not the collector).
fn shutdown_bound() -> Duration {
    TIMEOUT + otlp::SHUTDOWN_MARGIN + Duration::from_millis(1500)
}

fn options() -> PipelineOptions {
    PipelineOptions::default()
        .export_timeout(Some(TIMEOUT))
        // Only flush and shutdown export, so each run is deterministic.
        .metric_interval(Some(Duration::from_secs(600)))
}

/// Ends `SPANS` spans and records one counter value through `guard`.
fn produce(guard: &OtlpGuard) {
    let tracer = guard.tracer_provider().expect("provider").tracer("faults");
    for i in 0..SPANS {
        tracer.in_span(format!("work {i}"), |_| {});
    }
    let meter = guard
        .meter_provider()
        .expect("meter provider")
        .meter("faults");
    meter.u64_counter("faults.work").build().add(1, &[]);
}

/// Shuts `guard` down off the runtime; returns how long it took, the
/// result and the final counts.
async fn shut_down(mut guard: OtlpGuard) -> (Duration, Result<(), otlp::OtlpError>, ExportStats) {
    let start = Instant::now();
    let (result, stats) = tokio::task::spawn_blocking(move || {
        let result = guard.close();
        (result, guard.stats())
    })
    .await
    .expect("shutdown task");
    (start.elapsed(), result, stats)
}

/// Runs the pipeline against `endpoint`; checks the bound and that every
/// span was lost and counted; returns the failure kind and the error text.
async fn fails_within_bound(endpoint: &str, what: &str) -> (FailureKind, String) {
    let guard = otlp::pipeline_to(endpoint, options()).expect("pipeline");
    produce(&guard);
    let (took, result, stats) = shut_down(guard).await;
    assert!(
        took <= shutdown_bound(),
        "{what}: shutdown took {took:?}, bound {:?}",
        shutdown_bound()
    );
    let error = result.expect_err(what).to_string();
    assert!(
        error.starts_with(&format!(
            "could not export to the OTLP collector at {endpoint}: "
        )),
        "{what}: the error names the collector: {error}"
    );
    assert_eq!(stats.spans_ended, SPANS, "{what}: {stats:?}");
    assert_eq!(stats.spans_exported, 0, "{what}: {stats:?}");
    assert_eq!(stats.spans_lost(), SPANS, "{what}: {stats:?}");
    assert_eq!(stats.spans_queued(), 0, "{what}: {stats:?}");
    assert!(stats.metric_exports_failed >= 1, "{what}: {stats:?}");
    assert_eq!(stats.metric_exports, 0, "{what}: {stats:?}");
    let failure = stats.last_failure.expect("a failure is recorded");
    assert!(
        error.contains(&failure.to_string()),
        "{what}: the error {error:?} says what happened ({failure})"
    );
    (failure.kind, error)
}

/// A port with nothing listening.
fn refused_addr() -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.local_addr().expect("addr")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blackholed_collector_connect_times_out_within_the_bound() {
    let blackhole = FullBacklogListener::start("127.0.0.1:0".parse().expect("addr"))
        .await
        .expect("blackhole");
    let (kind, error) =
        fails_within_bound(&format!("http://{}", blackhole.addr()), "blackhole").await;
    assert_eq!(kind, FailureKind::ConnectTimedOut, "{error}");
    assert!(error.contains("connect timed out after 1."), "{error}");
}

/// Explicit flush and the guard's drop are bounded the same way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flush_and_drop_are_bounded_against_a_blackhole() {
    let blackhole = FullBacklogListener::start("127.0.0.1:0".parse().expect("addr"))
        .await
        .expect("blackhole");
    let guard =
        otlp::pipeline_to(&format!("http://{}", blackhole.addr()), options()).expect("pipeline");
    produce(&guard);
    let (flush_took, flushed, drop_took) = tokio::task::spawn_blocking(move || {
        let start = Instant::now();
        let flushed = guard.flush();
        let flush_took = start.elapsed();
        produce(&guard);
        let start = Instant::now();
        drop(guard);
        (flush_took, flushed, start.elapsed())
    })
    .await
    .expect("flush task");
    let error = flushed.expect_err("nothing delivered").to_string();
    assert!(error.contains("connect timed out"), "{error}");
    assert!(flush_took <= shutdown_bound(), "flush took {flush_took:?}");
    assert!(drop_took <= shutdown_bound(), "drop took {drop_took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_collector_is_named_as_refused() {
    let (kind, error) = fails_within_bound(&format!("http://{}", refused_addr()), "refused").await;
    assert_eq!(kind, FailureKind::Refused, "{error}");
    assert!(error.contains("connection refused"), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn collector_that_never_reads_or_never_answers_is_cut_at_the_timeout() {
    for fault in [
        CollectorFault::AcceptsNeverReads,
        CollectorFault::ReadsNeverAnswers,
    ] {
        let collector = FaultyCollector::start(fault.clone())
            .await
            .expect("collector");
        let (kind, error) = fails_within_bound(&collector.endpoint(), &format!("{fault:?}")).await;
        assert_eq!(kind, FailureKind::NoAnswer, "{fault:?}: {error}");
        assert!(
            collector.accepted_connections() >= 1,
            "{fault:?}: connected"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unavailable_collector_is_reported_with_its_status() {
    let collector = FaultyCollector::start(CollectorFault::Answers(Code::Unavailable))
        .await
        .expect("collector");
    let (kind, error) = fails_within_bound(&collector.endpoint(), "unavailable").await;
    assert_eq!(
        kind,
        FailureKind::ServerError("Unavailable".to_owned()),
        "{error}"
    );
    assert!(error.contains("answered Unavailable"), "{error}");
    // UNAVAILABLE is retryable: the exporter tried more than once.
    assert!(
        collector.requests() >= 3,
        "{} requests",
        collector.requests()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn collector_slower_than_the_timeout_is_cut_at_the_timeout() {
    let collector = FaultyCollector::start(CollectorFault::AnswersAfter(Duration::from_secs(5)))
        .await
        .expect("collector");
    let (kind, error) = fails_within_bound(&collector.endpoint(), "slow").await;
    assert_eq!(kind, FailureKind::NoAnswer, "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_collector_reached_over_plaintext_fails_within_the_bound() {
    let collector = FaultyCollector::start(CollectorFault::Tls)
        .await
        .expect("collector");
    let (kind, error) = fails_within_bound(&collector.endpoint(), "tls").await;
    assert!(
        matches!(
            kind,
            FailureKind::ConnectionClosed | FailureKind::ProtocolMismatch
        ),
        "{kind:?}: {error}"
    );
    assert!(error.contains("(a TLS-only"), "{error}");
    assert!(collector.accepted_connections() >= 1, "connected");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn collector_back_within_the_retry_window_loses_nothing() {
    let addr = {
        let first = OtlpReceiver::start().await.expect("receiver");
        first.grpc_addr()
    };
    // The collector is down (its port refuses) when the export starts, and
    // back 300 ms later, inside the exporter's retries (100, 200, 400 ms
    // backoff within the 1 s timeout).
    let guard = otlp::pipeline_to(&format!("http://{addr}"), options()).expect("pipeline");
    produce(&guard);
    let restart = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        OtlpReceiver::start_on(addr).await.expect("receiver back")
    });
    let (took, result, stats) = shut_down(guard).await;
    let receiver = restart.await.expect("restart");
    result.expect("delivered once the collector is back");
    assert!(took <= shutdown_bound(), "took {took:?}");
    assert_eq!(stats.spans_exported, SPANS, "{stats:?}");
    assert_eq!(stats.spans_lost(), 0, "{stats:?}");
    assert_eq!(stats.metric_exports_failed, 0, "{stats:?}");
    let spans = receiver
        .wait_for_spans(SPANS as usize, Duration::from_secs(5))
        .await;
    assert_eq!(spans.len() as u64, SPANS, "the receiver got every span");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_outage_keeps_the_queue_bounded_and_counts_every_drop() {
    let blackhole = FullBacklogListener::start("127.0.0.1:0".parse().expect("addr"))
        .await
        .expect("blackhole");
    let queue = 64;
    let guard = otlp::pipeline_to(
        &format!("http://{}", blackhole.addr()),
        options().max_queue_size(Some(queue)),
    )
    .expect("pipeline");
    let tracer = guard.tracer_provider().expect("provider").tracer("outage");
    let ended = 5_000u64;
    for i in 0..ended {
        tracer.in_span(format!("work {i}"), |_| {});
    }
    let during = guard.stats();
    assert_eq!(during.spans_ended, ended);
    // At most the queue plus one batch in flight is held.
    assert!(
        during.spans_queued() <= 2 * queue as u64,
        "held {} spans with a queue of {queue}: {during:?}",
        during.spans_queued()
    );
    assert!(
        during.spans_dropped >= ended - 2 * queue as u64,
        "{during:?}"
    );
    let (took, result, stats) = shut_down(guard).await;
    assert!(took <= shutdown_bound(), "took {took:?}");
    assert!(result.is_err());
    assert_eq!(
        stats.spans_exported + stats.spans_failed + stats.spans_dropped,
        ended,
        "every span accounted for: {stats:?}"
    );
    assert_eq!(stats.spans_exported, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthy_collector_gets_every_span_and_every_instrument_at_shutdown() {
    let receiver = OtlpReceiver::start().await.expect("receiver");
    let server = TestServer::builder().start().await.expect("server");
    let guard = otlp::pipeline_to(&receiver.endpoint(), options()).expect("pipeline");
    let handle = ConnTrace::builder()
        .tracer_provider(guard.tracer_provider().expect("provider"))
        .meter_provider(guard.meter_provider().expect("meter provider"))
        .build();
    let client = handle
        .instrument_client(reqwest::Client::builder())
        .pool_max_idle_per_host(4)
        .build_with_middleware()
        .expect("client");
    for _ in 0..3 {
        client
            .get(server.url("/"))
            .send()
            .await
            .expect("request")
            .bytes()
            .await
            .expect("body");
    }
    // The README's order: the client and the handle go first, the guard last.
    drop(client);
    drop(handle);
    let (_, result, stats) = shut_down(guard).await;
    result.expect("delivered");
    assert_eq!(stats.spans_lost(), 0, "{stats:?}");
    assert_eq!(stats.spans_exported, stats.spans_ended, "{stats:?}");
    assert!(stats.spans_exported >= 1, "{stats:?}");
    let spans = receiver
        .wait_for_spans(stats.spans_exported as usize, Duration::from_secs(5))
        .await;
    assert_eq!(spans.len() as u64, stats.spans_exported);
    for name in [
        semconv::HTTP_CLIENT_REQUEST_DURATION,
        semconv::HTTP_CLIENT_CONNECTIONS_OPENED,
        semconv::HTTP_CLIENT_OPEN_CONNECTIONS,
        semconv::HTTP_CLIENT_POOL_PEAK_IN_FLIGHT,
        semconv::HTTP_CLIENT_POOL_IDLE_LIMIT,
    ] {
        assert!(
            receiver
                .wait_for_metric(name, Duration::from_secs(5))
                .await
                .is_some(),
            "{name} in the final export"
        );
    }
}

// ---- Set-up paths, each in a fresh process -------------------------------

/// The variable naming the case a child process runs.
const CHILD: &str = "CONNTRACE_E2E_CHILD";

/// Whether this process is the child running `case`.
fn is_child(case: &str) -> bool {
    std::env::var(CHILD).is_ok_and(|v| v == case)
}

/// Re-runs this test binary for the one test `test` with `CHILD=case` and
/// `envs`; asserts it ran that test and passed.
fn run_child(test: &str, case: &str, envs: &[(&str, String)]) {
    let out = std::process::Command::new(std::env::current_exe().expect("test binary"))
        .args([
            "--exact",
            &format!("collector_faults::{test}"),
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, case)
        .env_remove("RUST_LOG")
        .envs(envs.iter().map(|(k, v)| (*k, v.as_str())))
        .output()
        .expect("run the child");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.contains("1 passed"),
        "child {case} failed:\n{stdout}\n{stderr}"
    );
}

/// The OTLP environment of a child exporting to `receiver`.
fn otlp_env(receiver: &OtlpReceiver) -> Vec<(&'static str, String)> {
    vec![
        ("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint()),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc".to_owned()),
        ("OTEL_EXPORTER_OTLP_TIMEOUT", "2000".to_owned()),
        ("OTEL_METRIC_EXPORT_INTERVAL", "600000".to_owned()),
    ]
}

/// In the child: a runtime, a TLS server with the trusted CA, and three
/// HTTPS requests through a handle built by `handle`.
fn https_requests(handle: impl FnOnce() -> ConnTrace) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let pki = TestPki::localhost().expect("pki");
        let server = TestServer::builder()
            .tls(&pki)
            .start()
            .await
            .expect("server");
        let handle = handle();
        let client = handle
            .instrument_client(reqwest::Client::builder())
            .tls(
                reqwest_conntrace::TlsSettings::new()
                    .add_root_certificates_pem(pki.ca_cert_pem().as_bytes())
                    .expect("ca"),
            )
            .pool_max_idle_per_host(4)
            .build_with_middleware()
            .expect("client");
        for _ in 0..3 {
            client
                .get(server.url("/"))
                .send()
                .await
                .expect("request")
                .bytes()
                .await
                .expect("body");
        }
    });
}

/// Request spans (`GET`) the receiver got.
fn request_spans(spans: &[ReceivedSpan]) -> Vec<&ReceivedSpan> {
    spans.iter().filter(|s| s.name() == "GET").collect()
}

/// Path 2: the application composes its own subscriber (its fmt layer plus
/// the guard's layer); spans, metrics and every instrument reach the
/// collector, in the README's drop order.
#[test]
fn existing_subscriber_gets_spans_and_metrics_from_the_providers_path() {
    let case = "existing_subscriber_gets_spans_and_metrics_from_the_providers_path";
    if is_child(case) {
        use tracing_subscriber::layer::SubscriberExt as _;
        use tracing_subscriber::util::SubscriberInitExt as _;
        let guard = otlp::init_providers_from_env(PipelineOptions::default()).expect("providers");
        tracing_subscriber::registry()
            .with(tracing_subscriber::fmt::layer().with_writer(std::io::stderr))
            .with(guard.tracing_layer())
            .init();
        https_requests(ConnTrace::new);
        guard.shutdown().expect("delivered");
        return;
    }
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let receiver = runtime.block_on(OtlpReceiver::start()).expect("receiver");
    run_child(case, case, &otlp_env(&receiver));
    let spans = receiver.spans();
    let requests = request_spans(&spans);
    assert_eq!(requests.len(), 3, "request spans: {spans:#?}");
    for name in [
        semconv::HTTP_CLIENT_REQUEST_DURATION,
        semconv::HTTP_CLIENT_OPEN_CONNECTIONS,
        semconv::HTTP_CLIENT_POOL_PEAK_IN_FLIGHT,
        semconv::HTTP_CLIENT_POOL_IDLE_LIMIT,
    ] {
        assert!(
            receiver.metrics().iter().any(|m| m.name == name),
            "{name} in the final export"
        );
    }
    // Issue 9: none of tracing-opentelemetry's default extras.
    for span in requests {
        for key in [
            "code.file.path",
            "code.filepath",
            "code.line.number",
            "code.lineno",
            "code.module.name",
            "code.namespace",
            "thread.id",
            "thread.name",
            "busy_ns",
            "idle_ns",
            "target",
        ] {
            assert!(
                !span.attributes().has(key),
                "{key} on {:?}",
                span.attributes()
            );
        }
    }
}

/// A handle built on the global meter before the pipeline: the set-up
/// fails loudly instead of exporting no metrics.
#[test]
fn handle_built_before_the_pipeline_fails_loudly() {
    let case = "handle_built_before_the_pipeline_fails_loudly";
    if is_child(case) {
        let _early = ConnTrace::new();
        let error = otlp::init_from_env().expect_err("wrong order");
        assert!(
            matches!(error, otlp::OtlpError::BuiltBeforePipeline(1)),
            "{error}"
        );
        assert!(
            error.to_string().contains("build ConnTrace after"),
            "{error}"
        );
        return;
    }
    run_child(
        case,
        case,
        &[(
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "http://127.0.0.1:9".to_owned(),
        )],
    );
}

/// Path 1 with a subscriber already installed: the error names path 2.
#[test]
fn init_from_env_with_a_subscriber_names_the_providers_path() {
    let case = "init_from_env_with_a_subscriber_names_the_providers_path";
    if is_child(case) {
        use tracing_subscriber::util::SubscriberInitExt as _;
        tracing_subscriber::registry().init();
        let error = otlp::init_from_env().expect_err("a subscriber exists");
        assert!(
            matches!(error, otlp::OtlpError::SubscriberAlreadySet),
            "{error}"
        );
        assert!(
            error.to_string().contains("init_providers_from_env"),
            "{error}"
        );
        return;
    }
    run_child(
        case,
        case,
        &[(
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "http://127.0.0.1:9".to_owned(),
        )],
    );
}

/// Events on request spans whose text comes from rustls' log records.
fn rustls_events(spans: &[ReceivedSpan]) -> usize {
    request_spans(spans)
        .iter()
        .flat_map(|s| s.events())
        .filter(|e| {
            format!("{} {:?}", e.name, e.attributes)
                .to_ascii_lowercase()
                .contains("rustls")
        })
        .count()
}

/// With `log` records bridged into `tracing` (tracing-subscriber's default
/// `tracing-log` feature), rustls' records never become events on request
/// spans in our set-up; the control run, a plain tracing-opentelemetry
/// layer, shows they would.
#[test]
fn bridged_log_records_stay_off_request_spans() {
    let ours = "bridged_log_records_stay_off_request_spans";
    let control = "bridged_log_records_control_plain_layer";
    if is_child(ours) {
        tracing_log::LogTracer::init().expect("log bridge");
        let guard = otlp::init_from_env().expect("pipeline");
        https_requests(ConnTrace::new);
        guard.shutdown().expect("delivered");
        return;
    }
    if is_child(control) {
        use tracing_subscriber::layer::SubscriberExt as _;
        use tracing_subscriber::util::SubscriberInitExt as _;
        tracing_log::LogTracer::init().expect("log bridge");
        let guard = otlp::init_providers_from_env(PipelineOptions::default()).expect("providers");
        let provider = guard.tracer_provider().expect("provider").clone();
        tracing_subscriber::registry()
            .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("control")))
            .init();
        https_requests(ConnTrace::new);
        guard.shutdown().expect("delivered");
        return;
    }
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let receiver = runtime.block_on(OtlpReceiver::start()).expect("receiver");
    run_child(ours, ours, &otlp_env(&receiver));
    let spans = receiver.spans();
    assert_eq!(request_spans(&spans).len(), 3, "{spans:#?}");
    assert_eq!(rustls_events(&spans), 0, "{spans:#?}");
    receiver.clear();
    run_child(ours, control, &otlp_env(&receiver));
    let spans = receiver.spans();
    assert!(
        rustls_events(&spans) > 0,
        "the control attaches rustls records"
    );
}
