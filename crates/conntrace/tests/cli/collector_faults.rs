//! `conntrace probe` exporting to collectors that fail (issue 13): the
//! process exits within a bound derived from the export timeout, with one
//! `error:` line naming the collector, what happened and what was lost;
//! a collector back within the retry window loses nothing.

use std::time::{Duration, Instant};

use conntrace_lab::faulty_collector::Code;
use conntrace_lab::{
    CollectorFault, FaultyCollector, FullBacklogListener, OtlpReceiver, TestServer,
};

use super::{conntrace, run, stderr};

/// `OTEL_EXPORTER_OTLP_TIMEOUT` in these runs.
const TIMEOUT: Duration = Duration::from_secs(1);

/// The bound on the whole run: the timeout plus the library's margin
/// (`otlp::SHUTDOWN_MARGIN`), plus 3 s for starting a debug binary and
/// its two requests on a loaded 2-core machine.
fn exit_bound() -> Duration {
    TIMEOUT + reqwest_conntrace::otlp::SHUTDOWN_MARGIN + Duration::from_secs(3)
}

/// Probes a local server with two requests, exporting to `endpoint`;
/// returns the run's duration, its stderr and its JSON report.
async fn probe_exporting_to(
    endpoint: &str,
    timeout: Duration,
) -> (Duration, bool, String, serde_json::Value) {
    let server = TestServer::builder().start().await.expect("server");
    let mut cmd = conntrace();
    cmd.args([
        "probe",
        &server.url("/"),
        "--requests",
        "2",
        "--mode",
        "fresh",
        "--json",
    ])
    .env("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
    .env(
        "OTEL_EXPORTER_OTLP_TIMEOUT",
        timeout.as_millis().to_string(),
    );
    let start = Instant::now();
    let out = run(cmd).await;
    let took = start.elapsed();
    let json = serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null);
    (took, out.status.success(), stderr(&out), json)
}

/// Runs against a failing `endpoint`: bounded exit, non-zero status, one
/// error line naming the collector and `what`, every span lost and counted.
async fn fails_naming(endpoint: &str, what: &str) {
    let (took, ok, err, json) = probe_exporting_to(endpoint, TIMEOUT).await;
    assert!(
        took <= exit_bound(),
        "{what}: exit after {took:?} > {:?}",
        exit_bound()
    );
    assert!(!ok, "{what}: a failed export exits non-zero");
    let lines: Vec<&str> = err.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(lines.len(), 1, "{what}: one error line: {err}");
    let line = lines[0];
    eprintln!("[{took:.1?}] {line}");
    assert!(
        line.contains(&format!("OTLP collector at {endpoint}")),
        "{what}: names the collector: {line}"
    );
    assert!(line.contains(what), "{what}: says what happened: {line}");
    assert!(line.contains("lost"), "{what}: says what was lost: {line}");
    let delivery = &json["telemetry"]["delivery"];
    let ended = delivery["spans_ended"].as_u64().expect("spans_ended");
    assert!(ended >= 2, "{delivery}");
    assert_eq!(delivery["spans_exported"].as_u64(), Some(0), "{delivery}");
    assert_eq!(
        delivery["spans_failed"].as_u64().unwrap_or(0)
            + delivery["spans_dropped"].as_u64().unwrap_or(0),
        ended,
        "every span counted as lost: {delivery}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probe_exits_in_bound_whatever_the_collector_does() {
    let blackhole = FullBacklogListener::start("127.0.0.1:0".parse().expect("addr"))
        .await
        .expect("blackhole");
    fails_naming(&format!("http://{}", blackhole.addr()), "connect timed out").await;

    let refused = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr")
    };
    fails_naming(&format!("http://{refused}"), "connection refused").await;

    for (fault, what) in [
        (CollectorFault::AcceptsNeverReads, "no answer within"),
        (CollectorFault::ReadsNeverAnswers, "no answer within"),
        (
            CollectorFault::Answers(Code::Unavailable),
            "answered Unavailable",
        ),
        (
            CollectorFault::AnswersAfter(Duration::from_secs(5)),
            "no answer within",
        ),
    ] {
        let collector = FaultyCollector::start(fault).await.expect("collector");
        fails_naming(&collector.endpoint(), what).await;
    }

    // TLS on the collector's side: the exporter's plaintext fails the
    // handshake; the TLS alert reads as a bad HTTP/2 frame, or the
    // connection closes first.
    let tls = FaultyCollector::start(CollectorFault::Tls)
        .await
        .expect("collector");
    fails_naming(&tls.endpoint(), "(a TLS-only").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probe_loses_nothing_when_the_collector_comes_back_within_the_retry_window() {
    let addr = {
        let first = OtlpReceiver::start().await.expect("receiver");
        first.grpc_addr()
    };
    // Down when the run starts; back 500 ms later, while the final export
    // retries (100/200/400 ms backoff within a 3 s timeout).
    let restart = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(500)).await;
        OtlpReceiver::start_on(addr).await.expect("receiver back")
    });
    let (_, ok, err, json) =
        probe_exporting_to(&format!("http://{addr}"), Duration::from_secs(3)).await;
    let receiver = restart.await.expect("restart");
    assert!(ok, "{err}");
    let delivery = &json["telemetry"]["delivery"];
    let ended = delivery["spans_ended"].as_u64().expect("spans_ended");
    assert_eq!(
        delivery["spans_exported"].as_u64(),
        Some(ended),
        "{delivery}"
    );
    let spans = receiver
        .wait_for_spans(ended as usize, Duration::from_secs(5))
        .await;
    assert_eq!(spans.len() as u64, ended, "the receiver got every span");
}
