//! What every scenario shares: the command's arguments, the span pipeline
//! (OTLP when configured, and always an in-memory copy the conclusions are
//! read from), run spans, and the output.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use clap::Args;

use super::report::{LabReport, ListedScenario, Outcome, ScenarioList};
use super::view::Spans;
use super::{
    Scenario, cancelled_handshake, connect_proxy, dead_first_address, discarded, dns_change,
    dns_queue, env_proxy, far_server, goaway, idle_expired, ipv6_blackhole, new_client,
    redirect_chain, request_limit, server_closed, stalled, text,
};
use crate::client::wait_for_connects;
use crate::telemetry::Telemetry;

/// The `--json` schema id.
pub(crate) const SCHEMA: &str = "conntrace.lab/v1";

/// Arguments of `conntrace lab`.
#[derive(Debug, Args)]
#[command(after_long_help = crate::help::lab_help())]
pub(crate) struct LabArgs {
    /// The scenario to run (`conntrace lab --list` names them all).
    #[arg(value_name = "SCENARIO")]
    pub(crate) scenario: Option<String>,

    /// List the scenarios, one line each, and exit.
    #[arg(long, conflicts_with_all = ["scenario", "rtt_ms", "requests", "traces_out", "html"])]
    pub(crate) list: bool,

    /// Emulated round-trip time to the far server, ms (far-server: default
    /// 150; cancelled-handshake: default 200; the other scenarios take no
    /// --rtt-ms). Shorter runs faster.
    #[arg(long, value_name = "MS",
          value_parser = clap::value_parser!(u64).range(1..=2_000))]
    pub(crate) rtt_ms: Option<u64>,

    /// Requests per run (far-server: default 3, at least 2; new-client: 5,
    /// at least 2; connect-proxy: 20, at least 2; ipv6-blackhole: parallel
    /// fetches, 8; the other scenarios take no --requests).
    #[arg(long, value_name = "N",
          value_parser = clap::value_parser!(u32).range(1..=200))]
    pub(crate) requests: Option<u32>,

    /// Print one JSON document to stdout instead of text (schema
    /// conntrace.lab/v1, in SCHEMA.md).
    #[arg(long)]
    pub(crate) json: bool,

    /// Also write the spans to this OTLP JSON file (ignored when
    /// OTEL_EXPORTER_OTLP_ENDPOINT is set). [default: no file]
    #[arg(long, value_name = "PATH")]
    pub(crate) traces_out: Option<PathBuf>,

    /// The page of the run's traces.
    #[command(flatten)]
    pub(crate) html: crate::view::HtmlArg,
}

/// A scenario in progress: its settings, the span pipeline and the spans
/// read back.
#[derive(Debug)]
pub(crate) struct Lab {
    scenario: Scenario,
    rtt_ms: Option<u64>,
    requests: Option<u32>,
    telemetry: Telemetry,
}

impl Lab {
    /// The emulated RTT: `--rtt-ms`, else the scenario's default.
    pub(crate) fn rtt(&self) -> Duration {
        Duration::from_millis(
            self.rtt_ms
                .or(self.scenario.default_rtt_ms())
                .unwrap_or_default(),
        )
    }

    /// Requests per run: `--requests`, else the scenario's default.
    pub(crate) fn requests(&self) -> usize {
        self.requests
            .or(self.scenario.requests().map(|r| r.default))
            .unwrap_or(1) as usize
    }

    /// The span a run's requests are children of (attribute
    /// `conntrace.lab.run`); drop it when the run is over.
    pub(crate) fn run_span(&self, run: &str) -> tracing::Span {
        tracing::info_span!(
            target: "conntrace",
            "lab run",
            otel.name = format!("lab {}: {run}", self.scenario.name()),
            conntrace.lab.scenario = self.scenario.name(),
            conntrace.lab.run = run,
        )
    }

    /// Waits until no connect is in flight in the process
    /// ([`reqwest_conntrace::connects_in_flight`]; see
    /// [`wait_for_connects`]). Call it before counting a server's accepted
    /// connections for a run.
    pub(crate) async fn connects_done() {
        wait_for_connects(reqwest_conntrace::connects_in_flight).await;
    }

    /// Takes spans a child process exported (received by the scenario's
    /// own OTLP receiver) into the lab's outputs, as if the lab had ended
    /// them: the traces file, the `--html` page and the OTLP collector
    /// ([`Telemetry::add_received`]).
    pub(crate) async fn add_child_spans(&mut self, spans: &[conntrace_lab::ReceivedSpan]) {
        self.telemetry.add_received(spans).await;
    }

    /// Takes a child process's last metrics collection into the run's
    /// metrics file (see `Telemetry::add_received_metrics`).
    pub(crate) fn add_child_metrics(
        &self,
        request: opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest,
    ) {
        self.telemetry.add_received_metrics(request);
    }

    /// Every span ended so far, exported and read back, once the connects
    /// still finishing in the background have ended their spans
    /// ([`connects_done`](Self::connects_done); the flush waits for the
    /// `tcp.connect` spans that wait on the kernel).
    pub(crate) async fn spans(&mut self) -> Spans {
        Self::connects_done().await;
        Spans::new(self.telemetry.captured_spans())
    }
}

/// Runs `conntrace lab`; see [`LabArgs`].
///
/// # Errors
/// An unknown or missing scenario name, a fixture or client that cannot
/// start, or a span pipeline that cannot be set up.
pub(crate) async fn run(args: LabArgs) -> anyhow::Result<ExitCode> {
    if args.list {
        print_list(args.json)?;
        return Ok(ExitCode::SUCCESS);
    }
    let names = || {
        Scenario::ALL
            .iter()
            .map(|s| s.name())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let Some(name) = args.scenario.as_deref() else {
        return Err(crate::error::usage(anyhow::anyhow!(
            "name a scenario to run: {} (conntrace lab --list describes them)",
            names()
        )));
    };
    let Some(scenario) = Scenario::from_name(name) else {
        return Err(crate::error::usage(anyhow::anyhow!(
            "unknown scenario {name:?}; the scenarios are: {}",
            names()
        )));
    };
    check_parameters(scenario, &args).map_err(crate::error::usage)?;
    let html = args.html.open_apart_from(args.traces_out.as_deref())?;
    let telemetry = Telemetry::init_capturing(args.traces_out.clone(), false)?;
    let mut lab = Lab {
        scenario,
        rtt_ms: args.rtt_ms,
        requests: args.requests,
        telemetry,
    };
    let result = match scenario {
        Scenario::FarServer => far_server::run(&mut lab).await,
        Scenario::Ipv6Blackhole => ipv6_blackhole::run(&mut lab).await,
        Scenario::IdleExpired => idle_expired::run(&mut lab).await,
        Scenario::Discarded => discarded::run(&mut lab).await,
        Scenario::ServerClosed => server_closed::run(&mut lab).await,
        Scenario::NewClient => new_client::run(&mut lab).await,
        Scenario::ConnectProxy => connect_proxy::run(&mut lab).await,
        Scenario::DnsQueue => dns_queue::run(&mut lab).await,
        Scenario::DeadFirstAddress => dead_first_address::run(&mut lab).await,
        Scenario::CancelledHandshake => cancelled_handshake::run(&mut lab).await,
        Scenario::RedirectChain => redirect_chain::run(&mut lab).await,
        Scenario::EnvProxy => env_proxy::run(&mut lab).await,
        Scenario::RequestLimit => request_limit::run(&mut lab).await,
        Scenario::GoAway => goaway::run(&mut lab).await,
        Scenario::StalledConnection => stalled::run(&mut lab).await,
        Scenario::DnsChange => dns_change::run(&mut lab).await,
    };
    let spans = html.as_ref().map(|_| lab.telemetry.captured_spans());
    let telemetry = lab.telemetry.finish().await;
    let outcome = match result {
        Ok(o) => o,
        Err(e) => {
            if let Some(t) = &telemetry.error {
                eprintln!("error: {t}");
            }
            return Err(e);
        }
    };
    let Outcome {
        config,
        runs,
        tables,
        findings,
        fix,
        reproduced,
    } = outcome;
    let report = LabReport {
        schema: SCHEMA,
        conntrace_version: env!("CARGO_PKG_VERSION"),
        scenario: scenario.name(),
        description: scenario.description(),
        config,
        runs,
        findings,
        fix,
        reproduced: reproduced.is_ok(),
        not_reproduced_because: reproduced.err(),
        telemetry,
    };
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report).context("cannot serialize the report")?
        );
    } else {
        text::print(&report, &tables);
    }
    if let (Some(html), Some(spans)) = (html, spans) {
        html.write(&format!("lab {}", scenario.name()), &spans, false)?;
    }
    if let Some(why) = &report.not_reproduced_because {
        eprintln!(
            "warning: the spans did not show what scenario {} replays: {why}",
            scenario.name()
        );
    }
    Ok(crate::error::exit_code(
        true,
        report.telemetry.error.as_deref(),
    ))
}

/// Refuses `--rtt-ms` and `--requests` where the scenario ignores them, and
/// a `--requests` too small to show what the scenario replays.
///
/// # Errors
/// One line naming the scenario and the parameter (and the minimum).
fn check_parameters(scenario: Scenario, args: &LabArgs) -> anyhow::Result<()> {
    let name = scenario.name();
    if args.rtt_ms.is_some() && scenario.default_rtt_ms().is_none() {
        anyhow::bail!("{name} takes no --rtt-ms");
    }
    if let Some(n) = args.requests {
        let Some(count) = scenario.requests() else {
            anyhow::bail!("{name} takes no --requests");
        };
        if n < count.min {
            anyhow::bail!(
                "{name} needs --requests {} or more (got {n}): {}",
                count.min,
                count.why
            );
        }
    }
    Ok(())
}

/// `--list`: one line per scenario, or JSON.
fn print_list(json: bool) -> anyhow::Result<()> {
    if json {
        let list = ScenarioList {
            schema: SCHEMA,
            scenarios: Scenario::ALL
                .iter()
                .map(|s| ListedScenario {
                    name: s.name(),
                    description: s.description(),
                })
                .collect(),
        };
        println!(
            "{}",
            serde_json::to_string_pretty(&list).context("cannot serialize the list")?
        );
        return Ok(());
    }
    let width = Scenario::ALL
        .iter()
        .map(|s| s.name().len())
        .max()
        .unwrap_or(0);
    for s in Scenario::ALL {
        println!("{:width$}  {}", s.name(), s.description());
    }
    Ok(())
}
