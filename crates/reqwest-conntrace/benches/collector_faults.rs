//! Request latency while the collector fails, side by side in one run
//! (issue 13): the same GET on a warm keep-alive loopback connection
//! through the instrumented client, every span and metric exported by the
//! library's pipeline (`otlp::pipeline_to`, 1 s export timeout, metrics
//! every second) to a collector that is
//! - `none`: no pipeline at all (the baseline),
//! - `healthy`: the in-process OTLP receiver,
//! - `refused`: a port with nothing listening,
//! - `blackhole`: a listener whose accept queue is full (SYNs dropped),
//! - `never_answers`: a listener that reads and never answers,
//! - `unavailable`: a gRPC server answering `UNAVAILABLE`.
//!
//! The goal: the request's latency does not depend on the collector.
//! After each run the guard's shutdown time and counts are printed.
//!
//! `span_end_during_outage`: the cost of ending a span while the collector
//! is blackholed, and the resident memory before and after (bounded: the
//! queue holds at most 2048 spans, the rest are dropped and counted).
//!
//! Run: `cargo bench -p reqwest-conntrace --features otlp --bench collector_faults`.

use std::time::{Duration, Instant};

use conntrace_lab::faulty_collector::Code;
use conntrace_lab::{
    CollectorFault, FaultyCollector, FullBacklogListener, OtlpReceiver, TestServer,
};
use reqwest_conntrace::ConnTrace;
use reqwest_conntrace::otlp::{self, PipelineOptions};
use tracing_subscriber::layer::SubscriberExt;

fn main() {
    divan::main();
}

const COLLECTORS: &[&str] = &[
    "none",
    "healthy",
    "refused",
    "blackhole",
    "never_answers",
    "unavailable",
];

/// Keeps whatever listens at the collector's address alive.
#[allow(dead_code)]
enum Collector {
    None,
    Receiver(OtlpReceiver),
    Refused,
    Blackhole(FullBacklogListener),
    Faulty(FaultyCollector),
}

async fn collector(kind: &str) -> (Collector, Option<String>) {
    match kind {
        "none" => (Collector::None, None),
        "healthy" => {
            let r = OtlpReceiver::start().await.expect("receiver");
            let e = r.endpoint();
            (Collector::Receiver(r), Some(e))
        }
        "refused" => {
            let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
            let e = format!("http://{}", l.local_addr().expect("addr"));
            (Collector::Refused, Some(e))
        }
        "blackhole" => {
            let b = FullBacklogListener::start("127.0.0.1:0".parse().expect("addr"))
                .await
                .expect("blackhole");
            let e = format!("http://{}", b.addr());
            (Collector::Blackhole(b), Some(e))
        }
        other => {
            let fault = match other {
                "never_answers" => CollectorFault::ReadsNeverAnswers,
                _ => CollectorFault::Answers(Code::Unavailable),
            };
            let c = FaultyCollector::start(fault).await.expect("collector");
            let e = c.endpoint();
            (Collector::Faulty(c), Some(e))
        }
    }
}

#[divan::bench(args = COLLECTORS, sample_count = 200, sample_size = 10)]
fn keep_alive_get(bencher: divan::Bencher<'_, '_>, kind: &str) {
    // Servers on their own worker; the client on the bench thread.
    let servers = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let client_rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let server = servers
        .block_on(TestServer::start_plain())
        .expect("loopback server");
    let url = server.url("/");
    let (_collector, endpoint) = servers.block_on(collector(kind));
    let guard = endpoint.map(|e| {
        otlp::pipeline_to(
            &e,
            PipelineOptions::default()
                .export_timeout(Some(Duration::from_secs(1)))
                .metric_interval(Some(Duration::from_secs(1))),
        )
        .expect("pipeline")
    });
    let handle = match &guard {
        Some(g) => ConnTrace::builder()
            .tracer_provider(g.tracer_provider().expect("provider"))
            .meter_provider(g.meter_provider().expect("meters"))
            .build(),
        None => ConnTrace::new(),
    };
    let _subscriber = guard.as_ref().map(|g| {
        let provider = g.tracer_provider().expect("provider").clone();
        tracing::subscriber::set_default(
            tracing_subscriber::registry().with(otlp::tracing_layer(&provider)),
        )
    });
    let client = handle
        .instrument_client(reqwest::Client::builder())
        .build_with_middleware()
        .expect("client");
    bencher.bench_local(|| {
        client_rt.block_on(async {
            let r = client.get(&url).send().await.expect("ok");
            r.bytes().await.expect("body")
        })
    });
    drop(client);
    drop(handle);
    if let Some(mut guard) = guard {
        let start = Instant::now();
        let closed = guard.close();
        eprintln!(
            "{kind}: shutdown {:.2} s, {}{}",
            start.elapsed().as_secs_f64(),
            guard.stats().summary(),
            closed.err().map(|e| format!(": {e}")).unwrap_or_default()
        );
    }
}

/// Resident set size, KiB (Linux `/proc/self/statm`, 4 KiB pages).
fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |pages| pages * 4)
}

/// Ending a span while the collector is blackholed (a long outage: every
/// span beyond the queue is dropped and counted); prints the resident
/// memory before and after, and the counts.
#[divan::bench(sample_count = 100, sample_size = 5000)]
fn span_end_during_outage(bencher: divan::Bencher<'_, '_>) {
    use opentelemetry::trace::{Tracer as _, TracerProvider as _};
    let servers = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let blackhole = servers
        .block_on(FullBacklogListener::start(
            "127.0.0.1:0".parse().expect("addr"),
        ))
        .expect("blackhole");
    let mut guard = otlp::pipeline_to(
        &format!("http://{}", blackhole.addr()),
        PipelineOptions::default().export_timeout(Some(Duration::from_secs(1))),
    )
    .expect("pipeline");
    let tracer = guard.tracer_provider().expect("provider").tracer("outage");
    let before = rss_kib();
    bencher.bench_local(|| tracer.in_span("work", |_| {}));
    let after = rss_kib();
    let stats = guard.stats();
    let start = Instant::now();
    let _ = guard.close();
    eprintln!(
        "outage: {} spans ended, {} dropped, {} queued or in flight; RSS {before} KiB -> {after} KiB; shutdown {:.2} s",
        stats.spans_ended,
        stats.spans_dropped,
        stats.spans_queued(),
        start.elapsed().as_secs_f64()
    );
}
