//! The instrumentation's cost at scale, against bare reqwest in the same
//! run: one client holding 10,000 live connections to a loopback server,
//! then 32, 128 and 256 concurrent requests on that pool.
//!
//! Reported per mode (`plain`: a plain reqwest client; `instrumented`: the
//! instrumented client with the tracing-opentelemetry layer and SDK tracer
//! and meter providers recording every span and metric, no exporter, as
//! `benches/overhead.rs`'s `instrumented_recording_metrics`):
//! - memory per connection: the client process's resident set growth over
//!   opening 10,000 connections at once (every request held by the server
//!   until all are in) and keeping them idle in the pool, divided by 10,000.
//!   It includes what the allocator kept from the 10,000 requests in
//!   flight, in both modes;
//! - CPU per request: the client process's CPU time (user + system, all
//!   threads: `CLOCK_PROCESS_CPUTIME_ID`) over a fixed number of requests at
//!   each concurrency, divided by that number, and the request rate;
//! - the same while opening the 10,000 connections (connect + request).
//!
//! Each mode runs in its own client process and the server in a third
//! (`current_exe` re-run with `CONNTRACE_SCALE_ROLE`), so CPU and memory
//! are the client's alone and one mode's allocations never flatter the
//! other's. The client runtime has two worker threads.
//!
//! Time in the library's shared locks (registry shards, pool history, pool
//! load, the kernel lookup queue) is read from a profile of one client
//! process (Debian `linux-perf`; the release build has no frame pointers,
//! hence DWARF call graphs): start a server with
//! `CONNTRACE_SCALE_ROLE=server <bench binary>` (it prints its URL and
//! serves until its stdin closes), then
//! `CONNTRACE_SCALE_ROLE=client CONNTRACE_SCALE_MODE=instrumented
//! CONNTRACE_SCALE_URL=<url> perf record -F 300 --call-graph dwarf,16384
//! <bench binary>` and
//! `perf report --no-children -G --symbols='<std::sys::sync::mutex::futex::Mutex>::lock_contended'`
//! for who waited on a lock (uncontended locks cost only their atomic
//! operations, inside the callers' own samples).
//!
//! Run: `cargo bench -p reqwest-conntrace --features otlp --bench scale`.
//! Needs about 10,000 open files per process: it raises its soft limit up
//! to the hard limit and stops with a clear message if that is too low.
//! Bounded: 10,000 connections, 20,000 requests per concurrency level.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use conntrace_lab::TestServer;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::metrics::data::ResourceMetrics;
use opentelemetry_sdk::metrics::exporter::PushMetricExporter;
use opentelemetry_sdk::metrics::{PeriodicReader, SdkMeterProvider, Temporality};
use opentelemetry_sdk::trace::SdkTracerProvider;
use reqwest_conntrace::{ConnTrace, otlp};
use tracing_subscriber::layer::SubscriberExt;

/// Live connections the client holds.
const CONNECTIONS: usize = 10_000;
/// Concurrency levels measured on the warm pool.
const CONCURRENCY: [usize; 3] = [32, 128, 256];
/// Requests per concurrency level.
const REQUESTS: usize = 20_000;
/// Modes, each in its own client process.
const MODES: [&str; 2] = ["plain", "instrumented"];

const ROLE: &str = "CONNTRACE_SCALE_ROLE";
const MODE: &str = "CONNTRACE_SCALE_MODE";
const URL: &str = "CONNTRACE_SCALE_URL";

fn main() {
    // The workspace builds reqwest without a default crypto provider.
    let _ = rustls::crypto::ring::default_provider().install_default();
    match std::env::var(ROLE).as_deref() {
        Ok("server") => server(),
        Ok("client") => {
            let mode = std::env::var(MODE).expect("CONNTRACE_SCALE_MODE");
            let url = std::env::var(URL).expect("CONNTRACE_SCALE_URL");
            let result = client(&mode, &url);
            println!("{}", result.to_line());
        }
        _ => orchestrate(),
    }
}

/// Raises the soft open-files limit to `needed`, up to the hard limit.
fn ensure_open_files(needed: u64) {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let limit = getrlimit(Resource::Nofile);
    if limit.current.is_none_or(|soft| soft >= needed) {
        return;
    }
    if limit.maximum.is_some_and(|hard| hard < needed) {
        eprintln!(
            "scale bench: needs {needed} open files per process; the hard limit is {:?} (raise `ulimit -Hn`)",
            limit.maximum
        );
        std::process::exit(2);
    }
    let mut raised = limit;
    raised.current = Some(needed);
    if let Err(e) = setrlimit(Resource::Nofile, raised) {
        eprintln!("scale bench: cannot raise the open-files limit to {needed}: {e}");
        std::process::exit(2);
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

/// The loopback server: prints its URL, serves until stdin closes.
fn server() {
    ensure_open_files(CONNECTIONS as u64 + 1024);
    let rt = runtime();
    let server = rt
        .block_on(TestServer::start_plain())
        .expect("loopback server");
    println!("{}", server.url("/"));
    std::io::stdout().flush().expect("stdout");
    // Parent gone or done: stdin reaches its end.
    let mut line = String::new();
    while std::io::stdin().read_line(&mut line).is_ok_and(|n| n > 0) {}
    drop(server);
}

/// What one client process measured.
struct Measured {
    mode: String,
    bytes_per_connection: f64,
    open_cpu_per_request: Duration,
    /// (concurrency, CPU per request, requests per second).
    levels: Vec<(usize, Duration, f64)>,
}

impl Measured {
    fn to_line(&self) -> String {
        let levels: Vec<String> = self
            .levels
            .iter()
            .map(|(c, cpu, rate)| format!("{c}:{}:{rate:.0}", cpu.as_nanos()))
            .collect();
        format!(
            "RESULT {} {:.0} {} {}",
            self.mode,
            self.bytes_per_connection,
            self.open_cpu_per_request.as_nanos(),
            levels.join(",")
        )
    }

    fn from_line(line: &str) -> Option<Self> {
        let mut fields = line.strip_prefix("RESULT ")?.split(' ');
        let mode = fields.next()?.to_owned();
        let bytes_per_connection = fields.next()?.parse().ok()?;
        let open_cpu_per_request = Duration::from_nanos(fields.next()?.parse().ok()?);
        let levels = fields
            .next()?
            .split(',')
            .map(|level| {
                let mut parts = level.split(':');
                Some((
                    parts.next()?.parse().ok()?,
                    Duration::from_nanos(parts.next()?.parse().ok()?),
                    parts.next()?.parse().ok()?,
                ))
            })
            .collect::<Option<Vec<_>>>()?;
        Some(Self {
            mode,
            bytes_per_connection,
            open_cpu_per_request,
            levels,
        })
    }
}

/// Resident set size of this process, in bytes (`/proc/self/statm`).
fn resident_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("/proc/self/statm");
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .expect("resident pages");
    pages * rustix::param::page_size() as u64
}

/// CPU time of this process so far (all threads, user + system).
fn cpu_time() -> Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

/// `n` concurrent GETs of `url`, bodies read.
async fn together(client: &reqwest_middleware::ClientWithMiddleware, url: &str, n: usize) {
    let requests = (0..n).map(|_| async {
        let response = client.get(url).send().await.expect("request");
        response.bytes().await.expect("body")
    });
    futures_util::future::join_all(requests).await;
}

/// `total` GETs of `url` from `concurrency` tasks, each request after the
/// previous one of its task.
async fn in_parallel(
    client: &reqwest_middleware::ClientWithMiddleware,
    url: &str,
    concurrency: usize,
    total: usize,
) {
    let per_task = total / concurrency;
    let tasks = (0..concurrency).map(|_| {
        let client = client.clone();
        let url = url.to_owned();
        tokio::spawn(async move {
            for _ in 0..per_task {
                let response = client.get(&url).send().await.expect("request");
                response.bytes().await.expect("body");
            }
        })
    });
    for task in futures_util::future::join_all(tasks).await {
        task.expect("request task");
    }
}

/// A metric exporter that drops everything (recording is measured, not export).
#[derive(Debug)]
struct Discard;

impl PushMetricExporter for Discard {
    async fn export(&self, _metrics: &ResourceMetrics) -> OTelSdkResult {
        Ok(())
    }

    fn force_flush(&self) -> OTelSdkResult {
        Ok(())
    }

    fn shutdown_with_timeout(&self, _timeout: Duration) -> OTelSdkResult {
        Ok(())
    }

    fn temporality(&self) -> Temporality {
        Temporality::Cumulative
    }
}

fn client(mode: &str, url: &str) -> Measured {
    ensure_open_files(CONNECTIONS as u64 + 1024);
    let rt = runtime();
    let tracer_provider = SdkTracerProvider::builder().build();
    let meter_provider = SdkMeterProvider::builder()
        .with_reader(
            PeriodicReader::builder(Discard)
                .with_interval(Duration::from_secs(3600))
                .build(),
        )
        .build();
    let client = match mode {
        "plain" => reqwest_middleware::ClientBuilder::new(
            reqwest::Client::builder().build().expect("client"),
        )
        .build(),
        _ => {
            let subscriber =
                tracing_subscriber::registry().with(otlp::tracing_layer(&tracer_provider));
            tracing::subscriber::set_global_default(subscriber).expect("subscriber");
            ConnTrace::builder()
                .tracer_provider(&tracer_provider)
                .meter_provider(&meter_provider)
                .build()
                .instrument_client(reqwest::Client::builder())
                .build_with_middleware()
                .expect("client")
        }
    };
    let base = url.trim_end_matches('/');
    rt.block_on(async {
        // Warm up: runtime, client and first-connection allocations.
        together(&client, &format!("{base}/"), 1).await;
        let (rss, cpu) = (resident_bytes(), cpu_time());
        let gate = format!("{base}/gate/open-{mode}/{CONNECTIONS}");
        together(&client, &gate, CONNECTIONS).await;
        let open_cpu_per_request = (cpu_time() - cpu) / CONNECTIONS as u32;
        let bytes_per_connection = resident_bytes().saturating_sub(rss) as f64 / CONNECTIONS as f64;
        let mut levels = Vec::new();
        for concurrency in CONCURRENCY {
            let (cpu, started) = (cpu_time(), Instant::now());
            in_parallel(&client, &format!("{base}/"), concurrency, REQUESTS).await;
            let done = (REQUESTS / concurrency) * concurrency;
            let cpu_per_request = (cpu_time() - cpu) / done as u32;
            let rate = done as f64 / started.elapsed().as_secs_f64();
            levels.push((concurrency, cpu_per_request, rate));
        }
        Measured {
            mode: mode.to_owned(),
            bytes_per_connection,
            open_cpu_per_request,
            levels,
        }
    })
}

fn orchestrate() {
    let exe = std::env::current_exe().expect("bench binary path");
    let mut server = Command::new(&exe)
        .env(ROLE, "server")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("start the server process");
    let mut url = String::new();
    BufReader::new(server.stdout.take().expect("server stdout"))
        .read_line(&mut url)
        .expect("server URL");
    let url = url.trim().to_owned();
    assert!(url.starts_with("http://"), "server said {url:?}");
    let mut results = Vec::new();
    for mode in MODES {
        let output = Command::new(&exe)
            .env(ROLE, "client")
            .env(MODE, mode)
            .env(URL, &url)
            .stderr(Stdio::inherit())
            .output()
            .expect("run a client process");
        let stdout = String::from_utf8_lossy(&output.stdout);
        let measured = stdout.lines().find_map(Measured::from_line);
        match (output.status.success(), measured) {
            (true, Some(m)) => results.push(m),
            _ => {
                eprintln!(
                    "scale bench: the {mode} client failed ({}): {stdout}",
                    output.status
                );
                std::process::exit(1);
            }
        }
    }
    drop(server.stdin.take());
    let _ = server.wait();
    report(&results);
}

fn micros(d: Duration) -> String {
    format!("{:.1} µs", d.as_secs_f64() * 1e6)
}

fn report(results: &[Measured]) {
    let [plain, instrumented] = results else {
        return;
    };
    println!(
        "scale: {CONNECTIONS} live connections, {REQUESTS} requests per concurrency level, 2 client worker threads"
    );
    println!(
        "memory per connection (RSS): plain {:.0} B, instrumented {:.0} B, instrumentation {:+.0} B",
        plain.bytes_per_connection,
        instrumented.bytes_per_connection,
        instrumented.bytes_per_connection - plain.bytes_per_connection
    );
    println!(
        "opening {CONNECTIONS} connections at once, CPU per request: plain {}, instrumented {}",
        micros(plain.open_cpu_per_request),
        micros(instrumented.open_cpu_per_request)
    );
    println!(
        "concurrency | CPU/request plain | instrumented | added | req/s plain | req/s instrumented"
    );
    for ((c, p_cpu, p_rate), (_, i_cpu, i_rate)) in plain.levels.iter().zip(&instrumented.levels) {
        println!(
            "{c:>11} | {:>17} | {:>12} | {:>9} | {:>11.0} | {:>18.0}",
            micros(*p_cpu),
            micros(*i_cpu),
            micros(i_cpu.saturating_sub(*p_cpu)),
            p_rate,
            i_rate
        );
    }
}
