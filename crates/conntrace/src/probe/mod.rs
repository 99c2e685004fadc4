//! `conntrace probe URL`: incident 1's measurement. The same GET, N times
//! with a new connection each time (`fresh`) and N times over one reused
//! connection (`reuse`), timed by the library's `OnRequestEnd` reports.
//! Each mode has its own `ConnTrace` handle, so the second mode's first
//! request is `cold`, not `new_client` (the two clients are on purpose).

mod report;
mod text;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::Context as _;
use clap::{Args, ValueEnum};
use futures::future::join_all;
use opentelemetry::KeyValue;
use reqwest_conntrace::ConnTrace;
use reqwest_middleware::ClientWithMiddleware;
use tracing::Instrument as _;
use url::Url;

use crate::capture::{self, CaptureReports};
use crate::client::{ClientOptions, ClientSpec};
use crate::row::RequestRow;
use crate::telemetry::Telemetry;
use report::{ModeReport, ProbeReport};

/// Arguments of `conntrace probe`.
#[derive(Debug, Args)]
#[command(after_long_help = crate::help::probe_help())]
pub(crate) struct ProbeArgs {
    /// The URL to GET (http:// or https://).
    pub(crate) url: String,

    /// Requests per mode.
    #[arg(short = 'n', long, value_name = "N", default_value_t = 20,
          value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub(crate) requests: u32,

    /// Which modes to run: `fresh` = a new connection per request (one
    /// client with pool_max_idle_per_host(0): no connection is kept, but
    /// the client's TLS session cache is, so resumption is visible), `reuse`
    /// = one client whose pool keeps connections, `both` = fresh then reuse.
    #[arg(long, value_enum, default_value_t = ModeArg::Both)]
    pub(crate) mode: ModeArg,

    /// Concurrent requests per wave: requests go out in waves of C at once,
    /// the next wave after the previous one finished, N requests in total.
    /// A wave's requests start one after another on one task, so on a fast
    /// server (loopback) the first may finish before the last starts: the
    /// peak in flight the report shows can be below C.
    #[arg(short = 'c', long, value_name = "C", default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(1..=1_000))]
    pub(crate) concurrency: u32,

    /// Idle connections the reuse mode's client keeps per host (reqwest's
    /// pool_max_idle_per_host); with --concurrency above it, some requests
    /// of every wave pay for new connections. The fresh mode always uses 0.
    /// [default: unlimited, reqwest's default]
    #[arg(long, value_name = "K")]
    pub(crate) pool_max_idle_per_host: Option<usize>,

    /// Client options.
    #[command(flatten)]
    pub(crate) client: ClientOptions,

    /// Print one JSON document to stdout instead of tables (schema below
    /// and in SCHEMA.md).
    #[arg(long)]
    pub(crate) json: bool,

    /// Write the spans to this OTLP JSON file (ignored when
    /// OTEL_EXPORTER_OTLP_ENDPOINT is set), and the metrics beside it
    /// (`<stem>.metrics.json`), each mode's apart: its instrumentation
    /// scope carries the attribute `conntrace.probe.mode` (also sent to a
    /// collector). [default: no file]
    #[arg(long, value_name = "PATH")]
    pub(crate) traces_out: Option<PathBuf>,

    /// After each table, print per request a bar of its phases (dns | tcp |
    /// proxy | tls | wait for a connection | server | body) scaled to the
    /// terminal width, with the miss reason beside it.
    #[arg(long, conflicts_with = "json")]
    pub(crate) waterfall: bool,

    /// The page of the run's traces.
    #[command(flatten)]
    pub(crate) html: crate::view::HtmlArg,
}

/// `--mode` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum ModeArg {
    /// A new connection per request.
    Fresh,
    /// One client, connections reused.
    Reuse,
    /// Fresh, then reuse, and the speedup.
    Both,
}

/// One probe mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// A new connection per request.
    Fresh,
    /// Connections reused from the pool.
    Reuse,
}

impl Mode {
    /// `fresh` or `reuse`.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Mode::Fresh => "fresh",
            Mode::Reuse => "reuse",
        }
    }
}

impl ModeArg {
    /// The modes to run, in order.
    fn modes(self) -> Vec<Mode> {
        match self {
            ModeArg::Fresh => vec![Mode::Fresh],
            ModeArg::Reuse => vec![Mode::Reuse],
            ModeArg::Both => vec![Mode::Fresh, Mode::Reuse],
        }
    }
}

/// Parses and checks the URL.
fn parse_url(text: &str) -> anyhow::Result<Url> {
    let url = Url::parse(text)
        .with_context(|| format!("invalid URL {text:?} (a URL starts with http:// or https://)"))?;
    match url.scheme() {
        "http" | "https" => {}
        // `localhost:8443` parses with the scheme `localhost`.
        _ if url.cannot_be_a_base() || !text.contains("://") => anyhow::bail!(
            "invalid URL {text:?}: no http:// or https:// (did you mean https://{text}/?)"
        ),
        other => anyhow::bail!("unsupported URL scheme {other:?} in {text:?}: use http or https"),
    }
    if url.host_str().is_none_or(str::is_empty) {
        anyhow::bail!("invalid URL {text:?}: no host");
    }
    Ok(url)
}

/// Runs the probe; see [`ProbeArgs`].
///
/// # Errors
/// Bad arguments, a client that cannot be built, or a first request that
/// fails (nothing to measure then; with `--json` the document, holding that
/// failed request, is printed first).
pub(crate) async fn run(args: ProbeArgs) -> anyhow::Result<ExitCode> {
    let url = parse_url(&args.url).map_err(crate::error::usage)?;
    let tls = args.client.tls_settings()?;
    let resolve = args.client.resolve_for(&url);
    let html = args.html.open_apart_from(args.traces_out.as_deref())?;
    let mut telemetry = match html {
        Some(_) => Telemetry::init_capturing(args.traces_out.clone(), false)?,
        None => Telemetry::init(args.traces_out.clone(), false)?,
    };
    let mut modes = Vec::new();
    // A client that could not be built: no report.
    let mut fatal = None;
    // A first request that failed: the report so far, then this error.
    let mut stopped = None;
    for mode in args.mode.modes() {
        let spec = ClientSpec {
            tls: tls.clone(),
            resolve: resolve.clone(),
            http: args.client.http_policy(),
            timeout: args.client.timeout,
            pool_max_idle_per_host: match mode {
                Mode::Fresh => Some(0),
                Mode::Reuse => args.pool_max_idle_per_host,
            },
            address_order: args.client.address_order.order(),
        };
        // A handle per mode: the reuse mode's client is not judged against
        // the fresh mode's (its first request is `cold`, not `new_client`,
        // whose fix "share one client" does not apply to two clients made
        // on purpose). Connection ids stay unique across modes. Each
        // handle's metrics carry the mode as a scope attribute (the
        // span's `conntrace.probe.mode`), so the metrics file holds each
        // mode's counters and gauges apart.
        let trace = ConnTrace::builder()
            .on_request_end(CaptureReports)
            .meter_scope_attributes([KeyValue::new("conntrace.probe.mode", mode.as_str())])
            .build();
        let client = match spec.build(&trace) {
            Ok(c) => c,
            Err(e) => {
                fatal = Some(e);
                break;
            }
        };
        let span = tracing::info_span!(
            target: "conntrace",
            "probe",
            otel.name = format!("probe {}", mode.as_str()),
            conntrace.probe.mode = mode.as_str(),
            conntrace.probe.requests = args.requests,
            conntrace.probe.concurrency = args.concurrency,
            conntrace.probe.pool_max_idle_per_host = tracing::field::Empty,
        );
        // The client's idle-pool size (absent: reqwest's default, unlimited);
        // the page draws it as the idle limit.
        if let Some(k) = spec.pool_max_idle_per_host {
            span.record("conntrace.probe.pool_max_idle_per_host", k as u64);
        }
        let started = Instant::now();
        let rows = run_mode(&client, &url, mode, args.requests, args.concurrency)
            .instrument(span)
            .await;
        let wall = started.elapsed();
        // Connects the run started that lost the pool race finish in the
        // background: their setup spans and connection counts belong to
        // this mode (and the process must not end before they do).
        crate::client::wait_for_connects(|| trace.connects_in_flight()).await;
        drop(client);
        // Its connections end with it (`http.client.connection.duration`);
        // its final gauges are kept for the last metric collection.
        drop(trace);
        let first_failed = rows.first().filter(|r| r.failed()).map(|first| {
            anyhow::anyhow!(
                "request 1 ({} mode) failed: {}",
                mode.as_str(),
                args.client
                    .explain(first.error.as_deref().unwrap_or("unknown error"))
            )
        });
        modes.push(ModeReport::new(
            mode,
            spec.pool_max_idle_per_host,
            rows,
            wall,
        ));
        // Nothing to measure when the very first request failed: stop, and
        // report that request (in --json too) and the error.
        if let Some(e) = first_failed {
            stopped = Some(e);
            break;
        }
    }

    let spans = html.as_ref().map(|_| telemetry.captured_spans());
    let telemetry = telemetry.finish().await;
    if let Some(e) = fatal {
        if let Some(t) = &telemetry.error {
            eprintln!("error: {t}");
        }
        return Err(e);
    }
    let report = ProbeReport::new(&url, &args, modes, telemetry);
    let title = format!("probe {}", report.url);
    if let Some(e) = stopped {
        if args.json {
            println!(
                "{}",
                serde_json::to_string_pretty(&report).context("cannot serialize the report")?
            );
        }
        // The failed request's spans were exported: the page shows them too
        // (where the connect stopped, and the error on hover).
        if let (Some(html), Some(spans)) = (html, spans) {
            html.write(&title, &spans, false)?;
        }
        if let Some(t) = &report.telemetry.error {
            eprintln!("error: {t}");
        }
        return Err(e);
    }
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report).context("cannot serialize the report")?
        );
    } else {
        text::print(&report);
        if args.waterfall {
            let modes: Vec<(&str, &[RequestRow])> = report
                .modes
                .iter()
                .map(|m| (m.mode, m.requests.as_slice()))
                .collect();
            println!();
            crate::view::waterfall::print(&modes);
        }
    }
    if let (Some(html), Some(spans)) = (html, spans) {
        html.write(&title, &spans, false)?;
    }
    let mut ok = true;
    if report.failed_requests > 0 {
        let first = report
            .modes
            .iter()
            .flat_map(|m| &m.requests)
            .find_map(|r| r.error.as_deref())
            .unwrap_or("unknown error");
        eprintln!(
            "error: {} of {} requests failed (first: {first})",
            report.failed_requests, report.total_requests
        );
        ok = false;
    }
    Ok(crate::error::exit_code(
        ok,
        report.telemetry.error.as_deref(),
    ))
}

/// Sends `n` GETs in waves of `concurrency`, returns one row per request in
/// request order.
async fn run_mode(
    client: &ClientWithMiddleware,
    url: &Url,
    mode: Mode,
    n: u32,
    concurrency: u32,
) -> Vec<RequestRow> {
    let start = Instant::now();
    let n = n as usize;
    let c = concurrency.max(1) as usize;
    let mut outcomes = Vec::with_capacity(n);
    let mut next = 1;
    while next <= n {
        let wave = c.min(n - next + 1);
        outcomes.extend(join_all((0..wave).map(|_| capture::get(client, url))).await);
        // Nothing to measure when the very first request failed.
        if next == 1
            && outcomes
                .first()
                .is_some_and(|o: &capture::Outcome| o.hops.is_empty() && o.result.is_err())
        {
            break;
        }
        next += wave;
    }
    // The miss reasons the spans record, once the kernel's answers they
    // may wait for have come (after the run: no wave waits for them).
    for outcome in &mut outcomes {
        capture::settle_reports(outcome).await;
    }
    let mut rows = Vec::with_capacity(n);
    for (i, outcome) in outcomes.iter().enumerate() {
        rows.extend(RequestRow::physical(i + 1, mode.as_str(), start, outcome));
    }
    rows
}
