//! What the instrumentation costs, side by side in one run, against a
//! loopback server in another process, each variant in its own process:
//!
//! | variant | client |
//! |---|---|
//! | `bare` | a plain `reqwest::Client` |
//! | `reqwest-tracing` | reqwest + `reqwest_tracing::TracingMiddleware`, one span per request exported over OTLP/gRPC |
//! | `ours-none` | ours, nothing installed (no subscriber, no tracer or meter provider) |
//! | `ours-unsampled` | ours, `otlp::init_from_env()` with `OTEL_TRACES_SAMPLER=parentbased_always_off` (metrics still exported) |
//! | `ours-exporting` | ours, `otlp::init_from_env()`: every span and metric exported over OTLP/gRPC |
//! | `ours-stalled` | as `ours-exporting`, but the collector accepts the connection and never answers (misses only) |
//! | `ours-exporting-events` | as `ours-exporting`, with `ConnectionPhases::Events`: a connection's phases as events on its setup span (misses only) |
//!
//! Workloads: HTTP/1.1 keep-alive at concurrency 1 and 32, HTTPS
//! keep-alive (TLS 1.3, ALPN `h2`) at 1 and 32, a new TLS 1.3 connection
//! per request (HTTP/1.1, the server closes each connection after its
//! response, so every request is a pool miss asking the kernel whether the
//! server closed the previous one) at concurrency 4, and 256 idle HTTPS
//! connections (HTTP/1.1) held open (memory per connection).
//!
//! Spans go to an OTLP/gRPC receiver (`conntrace_lab::OtlpReceiver`) in
//! another process. CPU is the client process's CPU time
//! (`CLOCK_PROCESS_CPUTIME_ID`: every thread, exporter and kernel-lookup
//! threads included) over the measured requests plus a final flush of the
//! exporters; latency is per request (send to end of body); memory is the
//! live heap (a counting global allocator) added by opening the idle
//! connections, after flushing the exporters. Each figure is the median of
//! the rounds, which run interleaved.
//!
//! Run: `cargo bench -p reqwest-conntrace --features otlp --bench overhead`
//! (`CONNTRACE_BENCH_SCALE=0.2` for a quick pass, `CONNTRACE_BENCH_ROUNDS`
//! for the number of rounds, default 3).
//!
//! `CONNTRACE_BENCH_MEMORY=1` runs only the memory figure (live heap per
//! idle connection).
//!
//! `CONNTRACE_BENCH_CHURN=N` runs only the churn instead: `bare` and
//! `ours-exporting` (or the comma-separated variants in
//! `CONNTRACE_BENCH_CHURN_VARIANTS`) each open N plain HTTP/1.1
//! connections, 4 at a time, against a server that closes each after its
//! response, and print the live heap and the resident set size every N/10
//! connections (after a flush of the exporters): flat figures mean nothing
//! grows per churned connection.
//!
//! On a loaded machine CPU time moves by microseconds between runs;
//! instruction counts do not. One client process run under
//! `valgrind --tool=callgrind` (with `CONNTRACE_BENCH_NO_CPU_CLOCK=1`: the
//! CPU clock's vDSO lookup crashes under valgrind, and `cpu_us` then reads
//! 0) for two request counts gives the instructions per request as the
//! difference, and callgrind's per-function counts say where they go
//! (docs/ARCHITECTURE.md, "Cost and sampling at scale").

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use conntrace_lab::{OtlpReceiver, TestPki, TestServer, TlsVersions};
use opentelemetry_sdk::trace::SdkTracerProvider;
use reqwest_conntrace::{ConnTrace, ConnectionPhases, TlsSettings, otlp};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// Counts live heap bytes (`cap`), for memory per connection.
#[global_allocator]
static ALLOCATED: cap::Cap<std::alloc::System> = cap::Cap::new(std::alloc::System, usize::MAX);

const VARIANTS: &[&str] = &[
    "bare",
    "reqwest-tracing",
    "ours-none",
    "ours-unsampled",
    "ours-exporting",
];

/// One workload: what each client process runs.
#[derive(Debug, Clone, Copy)]
struct Workload {
    name: &'static str,
    /// `plain`, `tls` or `tls-close` (server closes after each response).
    server: &'static str,
    concurrency: usize,
    /// Requests measured (before scaling).
    requests: usize,
    /// Requests before measuring (connections opened, caches warm).
    warmup: usize,
    /// A new connection per request.
    per_connection: bool,
}

const WORKLOADS: &[Workload] = &[
    Workload {
        name: "HTTP/1.1 keep-alive, sequential",
        server: "plain",
        concurrency: 1,
        requests: 3000,
        warmup: 300,
        per_connection: false,
    },
    Workload {
        name: "HTTP/1.1 keep-alive, 32 concurrent",
        server: "plain",
        concurrency: 32,
        requests: 16000,
        warmup: 1000,
        per_connection: false,
    },
    Workload {
        name: "HTTPS (h2) keep-alive, sequential",
        server: "tls",
        concurrency: 1,
        requests: 3000,
        warmup: 300,
        per_connection: false,
    },
    Workload {
        name: "HTTPS (h2) keep-alive, 32 concurrent",
        server: "tls",
        concurrency: 32,
        requests: 16000,
        warmup: 1000,
        per_connection: false,
    },
    Workload {
        name: "new TLS 1.3 connection per request, 4 concurrent",
        server: "tls-close",
        concurrency: 4,
        requests: 800,
        warmup: 100,
        per_connection: true,
    },
];

/// Idle connections held open for the memory figure.
const IDLE_CONNECTIONS: usize = 256;

fn main() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let args: Vec<String> = std::env::args().collect();
    match flag(&args, "--role").as_deref() {
        Some("server") => server_main(),
        Some("sink") => sink_main(),
        Some("client") => client_main(&args),
        _ => coordinator_main(),
    }
}

fn flag(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// Blocks until the parent closes our stdin.
fn wait_for_parent() {
    let mut sink = String::new();
    while std::io::stdin().read_line(&mut sink).is_ok_and(|n| n > 0) {}
}

// ---------------------------------------------------------------- server

fn server_main() {
    let rt = runtime();
    let pki = TestPki::localhost().expect("test PKI");
    let ca = std::env::temp_dir().join(format!("conntrace-bench-ca-{}.pem", std::process::id()));
    std::fs::write(&ca, pki.ca_cert_pem()).expect("write CA");
    let (plain, tls, close, plain_close) = rt.block_on(async {
        let plain = TestServer::start_plain().await.expect("plain server");
        let plain_close = TestServer::builder()
            .keep_alive(false)
            .start()
            .await
            .expect("plain server, no keep-alive");
        let tls = TestServer::builder()
            .tls(&pki)
            .tls_versions(TlsVersions::Tls13Only)
            .start()
            .await
            .expect("TLS server");
        let close = TestServer::builder()
            .tls(&pki)
            .tls_versions(TlsVersions::Tls13Only)
            .keep_alive(false)
            .start()
            .await
            .expect("TLS server, no keep-alive");
        (plain, tls, close, plain_close)
    });
    println!(
        "READY plain={} tls={} tls-close={} plain-close={} ca={}",
        plain.ip_url("/"),
        tls.ip_url("/"),
        close.ip_url("/"),
        plain_close.ip_url("/"),
        ca.display()
    );
    let _ = std::io::stdout().flush();
    wait_for_parent();
    let _ = std::fs::remove_file(ca);
    drop((plain, tls, close, plain_close));
}

// ---------------------------------------------------------------- sink

fn sink_main() {
    let rt = runtime();
    let receiver = rt.block_on(OtlpReceiver::start()).expect("OTLP receiver");
    println!("READY endpoint={}", receiver.endpoint());
    let _ = std::io::stdout().flush();
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watcher = done.clone();
    std::thread::spawn(move || {
        wait_for_parent();
        watcher.store(true, Ordering::SeqCst);
    });
    // Keep the receiver's memory flat: it decodes and stores every span.
    rt.block_on(async {
        while !done.load(Ordering::SeqCst) {
            receiver.clear();
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
}

// ---------------------------------------------------------------- client

enum Client {
    Bare(reqwest::Client),
    Middleware(reqwest_middleware::ClientWithMiddleware),
}

impl Client {
    async fn fetch(&self, url: &str) {
        let response = match self {
            Client::Bare(c) => c.get(url).send().await.expect("request"),
            Client::Middleware(c) => c.get(url).send().await.expect("request"),
        };
        assert!(response.status().is_success(), "{}", response.status());
        response.bytes().await.expect("body");
    }
}

/// What must be flushed before CPU and memory are read.
enum Pipeline {
    None,
    Ours(otlp::OtlpGuard),
    Tracing(SdkTracerProvider),
}

impl Pipeline {
    fn flush(&self) {
        match self {
            Pipeline::None => {}
            Pipeline::Ours(guard) => {
                let _ = guard.flush();
            }
            Pipeline::Tracing(provider) => {
                let _ = provider.force_flush();
            }
        }
    }
}

fn rustls_config(ca_pem: &[u8], http1_only: bool) -> rustls::ClientConfig {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem) {
        roots.add(cert.expect("CA PEM")).expect("CA");
    }
    let mut config = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = if http1_only {
        vec![b"http/1.1".to_vec()]
    } else {
        vec![b"h2".to_vec(), b"http/1.1".to_vec()]
    };
    config
}

/// Builds the variant's client (inside the runtime: the gRPC exporter
/// needs one).
fn build_client(variant: &str, ca_pem: &[u8], per_connection: bool) -> (Client, Pipeline) {
    let reqwest_builder = || {
        let b = reqwest::Client::builder();
        if per_connection { b.http1_only() } else { b }
    };
    let bare = || {
        reqwest_builder()
            .tls_backend_preconfigured(rustls_config(ca_pem, per_connection))
            .build()
            .expect("client")
    };
    let ours = |trace: &ConnTrace| {
        let tls = TlsSettings::new()
            .built_in_roots(false)
            .add_root_certificates_pem(ca_pem)
            .expect("CA");
        Client::Middleware(
            trace
                .instrument_client(reqwest_builder())
                .tls(tls)
                .build_with_middleware()
                .expect("client"),
        )
    };
    match variant {
        "bare" => (Client::Bare(bare()), Pipeline::None),
        "reqwest-tracing" => {
            let provider = SdkTracerProvider::builder()
                .with_batch_exporter(otlp::span_exporter_from_env().expect("exporter"))
                .build();
            // The same filter as ours: no spans of hyper, h2, reqwest...
            tracing_subscriber::registry()
                .with(otlp::tracing_layer(&provider))
                .init();
            let client = reqwest_middleware::ClientBuilder::new(bare())
                .with(reqwest_tracing::TracingMiddleware::default())
                .build();
            (Client::Middleware(client), Pipeline::Tracing(provider))
        }
        "ours-none" => (ours(&ConnTrace::new()), Pipeline::None),
        "ours-unsampled" | "ours-exporting" | "ours-stalled" => {
            let guard = otlp::init_from_env().expect("pipeline");
            (ours(&ConnTrace::new()), Pipeline::Ours(guard))
        }
        "ours-exporting-events" => {
            let guard = otlp::init_from_env().expect("pipeline");
            let trace = ConnTrace::builder()
                .connection_phases(ConnectionPhases::Events)
                .build();
            (ours(&trace), Pipeline::Ours(guard))
        }
        other => panic!("unknown variant {other}"),
    }
}

fn cpu_time() -> Duration {
    // rustix's vDSO lookup crashes under valgrind: instruction counts
    // (callgrind) need no CPU clock.
    if std::env::var_os("CONNTRACE_BENCH_NO_CPU_CLOCK").is_some() {
        return Duration::ZERO;
    }
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

/// Runs `count` requests, `concurrency` at a time; returns each one's latency.
async fn drive(client: &Arc<Client>, url: &str, count: usize, concurrency: usize) -> Vec<Duration> {
    let next = Arc::new(AtomicUsize::new(0));
    let mut workers = Vec::new();
    for _ in 0..concurrency {
        let (client, next, url) = (client.clone(), next.clone(), url.to_owned());
        workers.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            while next.fetch_add(1, Ordering::Relaxed) < count {
                let started = Instant::now();
                client.fetch(&url).await;
                latencies.push(started.elapsed());
            }
            latencies
        }));
    }
    let mut all = Vec::with_capacity(count);
    for w in workers {
        all.extend(w.await.expect("worker"));
    }
    all
}

fn client_main(args: &[String]) {
    let variant = flag(args, "--variant").expect("--variant");
    let url = flag(args, "--url").expect("--url");
    let ca_pem = std::fs::read(flag(args, "--ca").expect("--ca")).expect("read CA");
    let scale: f64 = flag(args, "--scale").map_or(1.0, |s| s.parse().expect("scale"));
    let rt = runtime();
    if let Some(total) = flag(args, "--churn") {
        let total: usize = total.parse().expect("churn count");
        rt.block_on(churn(&variant, &url, &ca_pem, total));
        return;
    }
    if flag(args, "--memory").is_some() {
        let per_connection = rt.block_on(memory_per_connection(&variant, &url, &ca_pem));
        println!("RESULT mem_per_conn={per_connection}");
        return;
    }
    let concurrency: usize = flag(args, "--concurrency").expect("c").parse().expect("c");
    let per_connection = flag(args, "--per-connection").is_some();
    let requests = ((flag(args, "--requests")
        .expect("n")
        .parse::<f64>()
        .expect("n")
        * scale) as usize)
        .max(concurrency * 4);
    let warmup: usize = flag(args, "--warmup").expect("w").parse().expect("w");
    let (client, pipeline) = rt.block_on(async { build_client(&variant, &ca_pem, per_connection) });
    let client = Arc::new(client);
    rt.block_on(drive(&client, &url, warmup, concurrency));
    pipeline.flush();
    let cpu0 = cpu_time();
    let t0 = Instant::now();
    let mut latencies = rt.block_on(drive(&client, &url, requests, concurrency));
    let wall = t0.elapsed();
    pipeline.flush();
    let cpu = cpu_time() - cpu0;
    latencies.sort();
    let pct = |p: f64| latencies[((latencies.len() as f64 * p) as usize).min(latencies.len() - 1)];
    println!(
        "RESULT rps={:.1} cpu_us={:.3} p50_us={:.1} p99_us={:.1}",
        requests as f64 / wall.as_secs_f64(),
        cpu.as_secs_f64() * 1e6 / requests as f64,
        pct(0.50).as_secs_f64() * 1e6,
        pct(0.99).as_secs_f64() * 1e6,
    );
    drop(client);
    drop(pipeline);
    drop(rt);
}

/// Live heap added per idle HTTPS connection: `IDLE_CONNECTIONS` requests
/// held in flight together (each waits 200 ms at the server), so as many
/// connections open and then stay idle in the pool.
async fn memory_per_connection(variant: &str, url: &str, ca_pem: &[u8]) -> f64 {
    // HTTP/1.1: one connection per request in flight.
    let (client, pipeline) = build_client(variant, ca_pem, true);
    let client = Arc::new(client);
    let plain = url.trim_end_matches('/');
    client.fetch(&format!("{plain}/")).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    pipeline.flush();
    let before = ALLOCATED.allocated();
    let slow = format!("{plain}/delay/200");
    drive(&client, &slow, IDLE_CONNECTIONS, IDLE_CONNECTIONS).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    pipeline.flush();
    let after = ALLOCATED.allocated();
    (after as f64 - before as f64) / IDLE_CONNECTIONS as f64
}

/// Opens `total` connections, 4 at a time (the server closes each after its
/// response), printing the live heap and the resident set size every
/// `total / 10` connections, after a flush.
async fn churn(variant: &str, url: &str, ca_pem: &[u8], total: usize) {
    let (client, pipeline) = build_client(variant, ca_pem, true);
    let client = Arc::new(client);
    let step = (total / 10).max(1);
    let mut done = 0;
    let started = Instant::now();
    while done < total {
        drive(&client, url, step, 4).await;
        done += step;
        tokio::time::sleep(Duration::from_millis(50)).await;
        pipeline.flush();
        println!(
            "CHURN connections={done} heap_bytes={} rss_bytes={} secs={:.0}",
            ALLOCATED.allocated(),
            rss_bytes(),
            started.elapsed().as_secs_f64()
        );
        let _ = std::io::stdout().flush();
    }
    println!("RESULT done=1");
}

/// The process's resident set size (`/proc/self/statm`, 4 KiB pages).
fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |pages| pages * 4096)
}

/// `CONNTRACE_BENCH_CHURN`: the churn of `total` connections, per variant.
fn churn_main(total: usize, server: &Helper, endpoint: &str) {
    let url = server.field("plain-close");
    let ca = server.field("ca");
    println!("### churn: {total} connections, 4 at a time, server closes each\n");
    let variants = std::env::var("CONNTRACE_BENCH_CHURN_VARIANTS")
        .unwrap_or_else(|_| "bare,ours-exporting".to_owned());
    for variant in variants.split(',').map(str::trim) {
        let mut command = Command::new(std::env::current_exe().expect("own path"));
        command
            .args(["--role", "client", "--variant", variant])
            .args(["--url", &url, "--ca", &ca, "--churn", &total.to_string()])
            .env("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
            .env("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
            .env("OTEL_SERVICE_NAME", "conntrace-bench")
            .env("RUST_LOG", "off")
            .stdout(Stdio::piped());
        let mut child = command.spawn().expect("churn client");
        let stdout = BufReader::new(child.stdout.take().expect("stdout"));
        for line in stdout.lines() {
            let line = line.expect("churn output");
            if let Some(rest) = line.strip_prefix("CHURN ") {
                println!("{variant} {rest}");
            }
        }
        assert!(child.wait().expect("churn client").success(), "{variant}");
    }
}

// ---------------------------------------------------------------- coordinator

struct Helper {
    child: Child,
    ready: String,
}

impl Helper {
    fn start(role: &str) -> Helper {
        let mut child = Command::new(std::env::current_exe().expect("own path"))
            .args(["--role", role])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn helper");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("stdout"))
            .read_line(&mut line)
            .expect("helper ready line");
        assert!(line.starts_with("READY "), "{role}: {line}");
        Helper {
            child,
            ready: line.trim().to_owned(),
        }
    }

    fn field(&self, name: &str) -> String {
        self.ready
            .split_whitespace()
            .find_map(|kv| kv.strip_prefix(&format!("{name}=")))
            .unwrap_or_else(|| panic!("no {name} in {}", self.ready))
            .to_owned()
    }
}

impl Drop for Helper {
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        let _ = self.child.wait();
    }
}

/// A collector that accepts connections and never answers.
fn stalled_collector() -> (std::net::SocketAddr, std::thread::JoinHandle<()>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    let handle = std::thread::spawn(move || {
        let mut held = Vec::new();
        for stream in listener.incoming() {
            match stream {
                Ok(s) => held.push(s),
                Err(_) => break,
            }
            if held.len() > 64 {
                break;
            }
        }
        std::thread::sleep(Duration::from_secs(3600));
    });
    (addr, handle)
}

fn run_client(variant: &str, endpoint: &str, args: &[String]) -> Vec<(String, f64)> {
    let mut command = Command::new(std::env::current_exe().expect("own path"));
    command
        .args(["--role", "client", "--variant", variant])
        .args(args)
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
        .env("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
        .env("OTEL_SERVICE_NAME", "conntrace-bench")
        .env_remove("OTEL_TRACES_SAMPLER")
        .env_remove("OTEL_TRACES_SAMPLER_ARG")
        .env("RUST_LOG", "off");
    if variant == "ours-unsampled" {
        command.env("OTEL_TRACES_SAMPLER", "parentbased_always_off");
    }
    if variant == "ours-stalled" {
        // Each export gives up after 0.5 s (the final flushes included).
        command.env("OTEL_EXPORTER_OTLP_TIMEOUT", "500");
    }
    let output = command.output().expect("client process");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let Some(line) = stdout.lines().find(|l| l.starts_with("RESULT ")) else {
        panic!(
            "{variant} {args:?} failed: {}\n{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
    };
    line.split_whitespace()
        .skip(1)
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.parse().expect("number")))
        .collect()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn coordinator_main() {
    let scale: f64 = std::env::var("CONNTRACE_BENCH_SCALE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1.0);
    let rounds: usize = std::env::var("CONNTRACE_BENCH_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3)
        .max(1);
    let server = Helper::start("server");
    let sink = Helper::start("sink");
    let endpoint = sink.field("endpoint");
    let (stalled, _stall_thread) = stalled_collector();
    let stalled_endpoint = format!("http://{stalled}");
    let ca = server.field("ca");
    if let Some(total) = std::env::var("CONNTRACE_BENCH_CHURN")
        .ok()
        .and_then(|s| s.parse().ok())
    {
        churn_main(total, &server, &endpoint);
        return;
    }
    println!(
        "reqwest-conntrace overhead: {rounds} interleaved rounds, scale {scale}, {} CPUs; \
         median per figure; CPU = client process CPU time per request (all threads, \
         exporter flush included); 'added' = minus bare reqwest\n",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    let memory_only = std::env::var("CONNTRACE_BENCH_MEMORY").is_ok_and(|v| v == "1");
    for w in WORKLOADS.iter().filter(|_| !memory_only) {
        let url = server.field(w.server);
        let args: Vec<String> = [
            "--url",
            url.as_str(),
            "--ca",
            ca.as_str(),
            "--concurrency",
            &w.concurrency.to_string(),
            "--requests",
            &w.requests.to_string(),
            "--warmup",
            &w.warmup.to_string(),
            "--scale",
            &scale.to_string(),
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .chain(w.per_connection.then(|| "--per-connection".to_owned()))
        .chain(w.per_connection.then(|| "1".to_owned()))
        .collect();
        let mut variants: Vec<&str> = VARIANTS.to_vec();
        if w.per_connection {
            variants.push("ours-exporting-events");
            variants.push("ours-stalled");
        }
        let mut results: Vec<Vec<Vec<(String, f64)>>> = vec![Vec::new(); variants.len()];
        for _ in 0..rounds {
            for (i, v) in variants.iter().enumerate() {
                let ep = if *v == "ours-stalled" {
                    &stalled_endpoint
                } else {
                    &endpoint
                };
                results[i].push(run_client(v, ep, &args));
            }
        }
        let figure = |i: usize, key: &str| {
            median(
                results[i]
                    .iter()
                    .map(|r| {
                        r.iter()
                            .find(|(k, _)| k == key)
                            .map_or(f64::NAN, |(_, v)| *v)
                    })
                    .collect(),
            )
        };
        let (bare_rps, bare_cpu) = (figure(0, "rps"), figure(0, "cpu_us"));
        let (bare_p50, bare_p99) = (figure(0, "p50_us"), figure(0, "p99_us"));
        let per = if w.per_connection { "conn" } else { "req" };
        println!("### {}\n", w.name);
        println!(
            "| variant | req/s (x bare) | CPU/{per} µs | added CPU/{per} µs | p50 µs (x bare) | p99 µs (x bare) |"
        );
        println!("|---|---|---|---|---|---|");
        for (i, v) in variants.iter().enumerate() {
            let (rps, cpu) = (figure(i, "rps"), figure(i, "cpu_us"));
            let (p50, p99) = (figure(i, "p50_us"), figure(i, "p99_us"));
            println!(
                "| {v} | {rps:.0} ({:.2}x) | {cpu:.1} | {:+.1} | {p50:.0} ({:.2}x) | {p99:.0} ({:.2}x) |",
                rps / bare_rps,
                cpu - bare_cpu,
                p50 / bare_p50,
                p99 / bare_p99,
            );
        }
        println!();
    }
    // Memory per idle connection.
    let url = server.field("tls");
    let mut per_variant = vec![Vec::new(); VARIANTS.len()];
    for _ in 0..rounds {
        for (i, v) in VARIANTS.iter().enumerate() {
            let r = run_client(
                v,
                &endpoint,
                &[
                    "--url".into(),
                    url.clone(),
                    "--ca".into(),
                    ca.clone(),
                    "--memory".into(),
                    "1".into(),
                ],
            );
            per_variant[i].push(r[0].1);
        }
    }
    println!("### live heap per idle HTTPS connection ({IDLE_CONNECTIONS} open)\n");
    println!("| variant | bytes/conn | added bytes/conn |");
    println!("|---|---|---|");
    let bare = median(per_variant[0].clone());
    for (i, v) in VARIANTS.iter().enumerate() {
        let m = median(per_variant[i].clone());
        println!("| {v} | {m:.0} | {:+.0} |", m - bare);
    }
    drop(sink);
    drop(server);
}
