//! `conntrace demo`: replays incident 2 (fan-out p99 doubled because the
//! idle pool was smaller than the in-flight concurrency) on loopback, with
//! no setup: an embedded HTTPS server (HTTP/1.1, fixed think time) behind a
//! delaying proxy, hit by fan-outs of concurrent batch calls, first with a
//! small idle pool, then with a right-sized one.

mod conclusion;
mod load;
mod report;
mod text;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use clap::Args;
use conntrace_lab::{DelayProxy, HttpVersions, TestPki, TestServer};
use reqwest_conntrace::{ConnTrace, TlsSettings};
use url::Url;

use crate::capture::CaptureReports;
use crate::progress;
use crate::telemetry::Telemetry;
use load::{Load, Target, run_phase};
use report::{DemoComparison, DemoConfig, DemoReport, PhaseSummary};

/// Arguments of `conntrace demo`.
#[derive(Debug, Args)]
#[command(after_long_help = crate::help::demo_help())]
pub(crate) struct DemoArgs {
    /// Emulated round-trip time to the service, ms (a userspace delaying
    /// proxy on loopback; half of it each way).
    #[arg(long, value_name = "MS", default_value_t = 40,
          value_parser = clap::value_parser!(u64).range(0..=10_000))]
    pub(crate) rtt_ms: u64,

    /// Service time per response, ms (the server waits this long before answering).
    #[arg(long, value_name = "MS", default_value_t = 25,
          value_parser = clap::value_parser!(u64).range(0..=10_000))]
    pub(crate) server_delay_ms: u64,

    /// User requests (fan-outs) started per second, at a steady rate.
    #[arg(long, value_name = "PER_SEC", default_value_t = 10.0, value_parser = parse_rate)]
    pub(crate) rate: f64,

    /// Concurrent batch calls per user request (the fan-out width).
    #[arg(long, value_name = "N", default_value_t = 5,
          value_parser = clap::value_parser!(u16).range(1..=200))]
    pub(crate) batches: u16,

    /// Measured seconds per phase (two phases run).
    #[arg(long, value_name = "SECS", default_value_t = 10.0, value_parser = parse_duration)]
    pub(crate) duration: f64,

    /// Warm-up seconds before each phase's measurement: same load, traced
    /// (user_request span attribute demo.warmup = true) but left out of the
    /// numbers, so a cold pool's first connects do not count as steady state.
    #[arg(long, value_name = "SECS", default_value_t = 1.0, value_parser = parse_warmup)]
    pub(crate) warmup: f64,

    /// Idle-pool size (pool_max_idle_per_host) of the first phase: smaller
    /// than the in-flight concurrency; at least 1 and below --right-pool.
    #[arg(long, value_name = "K", default_value_t = 2)]
    pub(crate) small_pool: usize,

    /// Idle-pool size of the second phase: at least the in-flight
    /// concurrency; above --small-pool.
    #[arg(long, value_name = "K", default_value_t = 10)]
    pub(crate) right_pool: usize,

    /// Where to write the spans as OTLP JSON when OTEL_EXPORTER_OTLP_ENDPOINT
    /// is not set (an ExportTraceServiceRequest document, opentelemetry-proto
    /// JSON encoding).
    #[arg(
        long,
        value_name = "PATH",
        default_value = "conntrace-demo-traces.json"
    )]
    pub(crate) traces_out: PathBuf,

    /// Print one JSON document to stdout instead of tables (schema below
    /// and in SCHEMA.md).
    #[arg(long)]
    pub(crate) json: bool,

    /// Nothing on stderr but errors: no start line, no progress bar (the
    /// bar is also hidden when stderr is not a terminal).
    #[arg(short, long)]
    pub(crate) quiet: bool,

    /// The page of the run's traces (a few fan-outs of each phase side by side).
    #[command(flatten)]
    pub(crate) html: crate::view::HtmlArg,
}

/// Parses a positive rate per second.
fn parse_rate(text: &str) -> Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 && v <= 1000.0 => Ok(v),
        _ => Err("expected a rate above 0 and at most 1000 per second".to_owned()),
    }
}

/// Parses a positive number of seconds.
fn parse_duration(text: &str) -> Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 && v <= 3600.0 => Ok(v),
        _ => Err("expected seconds above 0 and at most 3600".to_owned()),
    }
}

/// Parses a non-negative number of seconds.
fn parse_warmup(text: &str) -> Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && (0.0..=600.0).contains(&v) => Ok(v),
        _ => Err("expected seconds from 0 to 600".to_owned()),
    }
}

/// The embedded service B: server plus one delay proxy per phase, so each
/// phase is its own `server.port` in the metrics (gauges and advice per host).
struct Lab {
    /// The throw-away CA and the server's certificate.
    pki: TestPki,
    /// The HTTPS server (HTTP/1.1 only, fixed think time).
    server: TestServer,
    /// The delaying proxies in front of it, one per phase.
    proxies: [DelayProxy; 2],
    /// The URL of the service through each proxy.
    urls: [Url; 2],
}

impl Lab {
    /// Starts the server and the proxy.
    async fn start(args: &DemoArgs) -> anyhow::Result<Self> {
        let pki = TestPki::localhost().context("cannot generate the test certificates")?;
        let server = TestServer::builder()
            .tls(&pki)
            .http_versions(HttpVersions::Http1Only)
            .delay(Duration::from_millis(args.server_delay_ms))
            .start()
            .await
            .context("cannot start the embedded HTTPS server")?;
        let one_way = Duration::from_millis(args.rtt_ms) / 2;
        let proxies = [
            DelayProxy::start(server.addr(), one_way)
                .await
                .context("cannot start the delay proxy")?,
            DelayProxy::start(server.addr(), one_way)
                .await
                .context("cannot start the delay proxy")?,
        ];
        let url = |p: &DelayProxy| {
            Url::parse(&format!("https://localhost:{}/", p.addr().port()))
                .context("cannot form the server URL")
        };
        let urls = [url(&proxies[0])?, url(&proxies[1])?];
        Ok(Self {
            pki,
            server,
            proxies,
            urls,
        })
    }
}

/// Runs the demo; see [`DemoArgs`].
///
/// # Errors
/// When the embedded server, the client or the span pipeline cannot start.
pub(crate) async fn run(args: DemoArgs) -> anyhow::Result<ExitCode> {
    check_pools(&args)?;
    // The library's log lines stay off (RUST_LOG turns them on): its pool
    // advice would be logged at the first forced miss of the warm-up, with
    // numbers that contradict the measured summary, which prints the same
    // advice from the whole phase.
    let html = args.html.open_apart_from(Some(&args.traces_out))?;
    let mut telemetry = match html {
        Some(_) => Telemetry::init_capturing(Some(args.traces_out.clone()), true)?,
        None => Telemetry::init(Some(args.traces_out.clone()), true)?,
    };
    // The handle is built after the pipeline (it takes the global meter
    // provider) and outlives the final flush, so the last metric
    // collection still has its gauges.
    let trace = ConnTrace::builder()
        .on_request_end(CaptureReports)
        .pool_advice_interval(Duration::from_secs_f64(args.warmup + args.duration + 60.0))
        .build();
    let result = run_phases(&args, &trace).await;
    let spans = html.as_ref().map(|_| telemetry.captured_spans());
    let telemetry = telemetry.finish().await;
    drop(trace);
    let (config, phases) = match result {
        Ok(r) => r,
        Err(e) => {
            if let Some(t) = &telemetry.error {
                eprintln!("error: {t}");
            }
            return Err(e);
        }
    };
    let comparison = match (phases.first(), phases.get(1)) {
        (Some(s), Some(r)) => Some(DemoComparison::new(s, r)),
        _ => None,
    };
    let conclusion = conclusion::write(&config, &phases);
    let traces_file = telemetry.traces_file.clone();
    let report = DemoReport {
        schema: "conntrace.demo/v1",
        conntrace_version: env!("CARGO_PKG_VERSION"),
        config,
        phases,
        comparison,
        conclusion,
        traces_file,
        telemetry,
    };
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report).context("cannot serialize the report")?
        );
    } else {
        text::print(&report);
    }
    if let (Some(html), Some(spans)) = (html, spans) {
        let c = &report.config;
        let title = format!(
            "demo: fan-outs of {} calls, idle pool {} vs {}, {} ms RTT",
            c.batches, c.small_pool, c.right_pool, c.rtt_ms
        );
        html.write(&title, &spans, args.quiet)?;
    }
    let mut ok = true;
    let failed: usize = report.phases.iter().map(|p| p.failed_calls).sum();
    if failed > 0 {
        eprintln!("error: {failed} batch call(s) failed");
        ok = false;
    }
    Ok(crate::error::exit_code(
        ok,
        report.telemetry.error.as_deref(),
    ))
}

/// The demo compares a small idle pool with a larger one: `1 <= --small-pool
/// < --right-pool`.
///
/// # Errors
/// One line naming both values.
fn check_pools(args: &DemoArgs) -> anyhow::Result<()> {
    if args.small_pool < 1 || args.small_pool >= args.right_pool {
        anyhow::bail!(
            "--small-pool must be at least 1 and below --right-pool (got --small-pool {} and --right-pool {})",
            args.small_pool,
            args.right_pool
        );
    }
    Ok(())
}

/// Starts the lab and runs both phases.
async fn run_phases(
    args: &DemoArgs,
    trace: &ConnTrace,
) -> anyhow::Result<(DemoConfig, Vec<PhaseSummary>)> {
    let lab = Lab::start(args).await?;
    let load = Load {
        rate: args.rate,
        batches: usize::from(args.batches),
        duration: Duration::from_secs_f64(args.duration),
        warmup: Duration::from_secs_f64(args.warmup),
    };
    let config = DemoConfig {
        rtt_ms: args.rtt_ms,
        server_delay_ms: args.server_delay_ms,
        rate_per_s: args.rate,
        batches: load.batches,
        duration_s: args.duration,
        warmup_s: args.warmup,
        small_pool: args.small_pool,
        right_pool: args.right_pool,
        url: lab.urls[0].to_string(),
        urls: lab.urls.iter().map(ToString::to_string).collect(),
    };
    if !args.json && !args.quiet {
        eprintln!(
            "conntrace demo: {} fan-outs/s x {} batch calls against {} (small-pool) then {} (right-pool), one service behind two delay-proxy ports ({} ms RTT, {} ms per response), {} s per phase",
            args.rate,
            load.batches,
            lab.urls[0],
            lab.urls[1],
            args.rtt_ms,
            args.server_delay_ms,
            args.duration
        );
    }
    let tls = TlsSettings::new()
        .built_in_roots(false)
        .add_root_certificate(lab.pki.ca_cert_der());
    let server = Arc::new(lab.server);
    let mut phases = Vec::new();
    for (phase, (name, pool)) in [
        ("small-pool", args.small_pool),
        ("right-pool", args.right_pool),
    ]
    .into_iter()
    .enumerate()
    {
        // Each phase has its own proxy port: its own host in the pool
        // advice and the metrics.
        let proxy_addr = lab.proxies[phase].addr();
        let url = Arc::new(lab.urls[phase].clone());
        let client = trace
            .instrument_client(
                reqwest::Client::builder()
                    .resolve("localhost", proxy_addr)
                    .timeout(Duration::from_secs(30))
                    .user_agent(concat!("conntrace-demo/", env!("CARGO_PKG_VERSION"))),
            )
            .tls(tls.clone())
            .pool_max_idle_per_host(pool)
            .pool_idle_timeout(Some(crate::client::REQWEST_DEFAULT_POOL_IDLE_TIMEOUT))
            .connect_timeout(Duration::from_secs(10))
            .map_reqwest(reqwest::ClientBuilder::http1_only)
            .build_with_middleware()
            .context("cannot build the demo client")?;
        let bar = progress::bar(
            (load.warmup_fanouts() + load.fanouts()) as u64,
            name,
            args.quiet,
        );
        let counter = server.clone();
        let target = Target {
            client: Arc::new(client),
            url: url.clone(),
            accepted: Box::new(move || counter.accepted_connections()),
        };
        let mut run = run_phase(target, name, pool, load, bar.clone()).await;
        bar.finish_and_clear();
        // Connects still in flight (pool race losers) reach the server, and
        // end their setup spans, before the phase is counted.
        crate::client::wait_for_connects(|| trace.connects_in_flight()).await;
        let accepted = server
            .accepted_connections()
            .saturating_sub(run.accepted_at_start);
        let advice = trace
            .pool_advice()
            .into_iter()
            .find(|a| a.server_port == proxy_addr.port())
            .map(|a| a.to_string());
        // The library's peak, the one its advice states: one number.
        run.in_flight_peak = url
            .host_str()
            .and_then(|host| trace.peak_in_flight(host, proxy_addr.port()))
            .unwrap_or_default() as usize;
        phases.push(PhaseSummary::new(
            name,
            url.to_string(),
            pool,
            &load,
            &run,
            accepted,
            advice,
        ));
    }
    Ok((config, phases))
}
