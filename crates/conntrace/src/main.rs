//! `conntrace`: shows, per HTTP request, whether it reused a pooled
//! connection or paid for a new one (DNS, TCP, TLS), using the
//! reqwest-conntrace instrumentation.
//!
//! - `conntrace probe URL`: a connection per request versus one reused
//!   connection (incident 1), with per-request phases and the speedup.
//! - `conntrace demo`: replays incident 2 (fan-out p99 doubled by an idle
//!   pool smaller than the in-flight concurrency) on loopback.
//! - `conntrace lab SCENARIO`: replays one connection fault on loopback
//!   (incidents 3 and 4, each pool-miss reason, proxies, DNS queueing,
//!   dead addresses, cancelled handshakes) and prints what the spans show.

mod capture;
mod client;
mod demo;
mod error;
mod export;
mod help;
mod lab;
mod probe;
mod progress;
mod relay;
mod resolve;
mod row;
mod serve;
mod stats;
mod table;
mod telemetry;
mod view;

use std::process::ExitCode;
use std::time::Duration;

use clap::error::ErrorKind;
use clap::{CommandFactory as _, Parser, Subcommand};

/// Shows, per HTTP request, whether it reused a pooled connection or paid
/// for a new one, and what each new connection's DNS, TCP and TLS phases cost.
#[derive(Debug, Parser)]
#[command(name = "conntrace", version, propagate_version = true)]
#[command(after_long_help = help::ENV_HELP)]
struct Cli {
    /// The command to run.
    #[command(subcommand)]
    command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
enum Command {
    /// Time N requests with a new connection each (fresh) and over one
    /// reused connection (reuse): per-request DNS/TCP/TLS/TTFB table,
    /// totals, speedup and handshake share.
    Probe(probe::ProbeArgs),
    /// Replay incident 2 on loopback, no setup needed: fan-outs of
    /// concurrent batch calls to an embedded HTTPS service behind a delay
    /// proxy, first with an idle pool smaller than the in-flight
    /// concurrency, then with a right-sized one; shows which batches paid
    /// for new connections, the pool-miss ratio, fan-out and single-call
    /// p50/p99 and the handshake share, and writes the traces.
    Demo(demo::DemoArgs),
    /// Replay a connection fault on loopback and print what the telemetry
    /// concluded (from the spans it exported) and the fix; `--list` names
    /// every scenario.
    Lab(lab::LabArgs),
    /// Run a loopback HTTPS test server (optionally behind a delaying proxy)
    /// until Ctrl-C; prints its URL and writes its CA certificate for --cacert.
    Serve(serve::ServeArgs),
    /// Turn an OTLP JSON traces file (written by conntrace or a
    /// collector's file exporter) into one self-contained HTML page: a
    /// timeline of traces with connection phases, misses and links, miss
    /// rates per batch, calls in flight against the idle limit.
    View(view::ViewArgs),
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(err) => return argument_error(&err),
    };
    // A panic is a bug: say so in one line instead of a backtrace.
    std::panic::set_hook(Box::new(|info| {
        let what = info
            .payload()
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "unknown panic".to_owned());
        let at = info
            .location()
            .map(|l| format!(" at {}:{}", l.file(), l.line()))
            .unwrap_or_default();
        // `println!` panics when stdout is a closed pipe (`conntrace ... |
        // head`): that is the reader going away, not a bug: exit quietly
        // with the SIGPIPE convention (128 + 13).
        if what.contains("failed printing to stdout") && what.contains("Broken pipe") {
            std::process::exit(141);
        }
        eprintln!("error: internal error{at}: {}", error::one_line(&what));
    }));
    // reqwest is built without a default rustls provider; the OTLP/HTTP
    // exporter's own client needs a process-wide one.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async move {
        match cli.command {
            Command::Probe(args) => until_interrupted(probe::run(args)).await,
            Command::Demo(args) => until_interrupted(demo::run(args)).await,
            Command::Lab(args) => until_interrupted(lab::run(args)).await,
            // serve runs until Ctrl-C by design and reports on it itself.
            Command::Serve(args) => Some(serve::run(args).await),
            Command::View(args) => Some(view::run(&args)),
        }
    });
    runtime.shutdown_timeout(Duration::from_secs(1));
    match result {
        Some(Ok(code)) => code,
        Some(Err(e)) => match e.downcast_ref::<error::Usage>() {
            Some(usage) => {
                eprintln!("error: {usage}; see {} --help", command_path());
                ExitCode::from(2)
            }
            None => {
                eprintln!("error: {}", error::anyhow_line(&e));
                ExitCode::FAILURE
            }
        },
        None => ExitCode::from(INTERRUPTED),
    }
}

/// Exit status of a run stopped by Ctrl-C: 128 + SIGINT, as a shell reports it.
const INTERRUPTED: u8 = 130;

/// Runs `run` until it ends or Ctrl-C arrives. On Ctrl-C: clears the
/// progress bars, prints `error: interrupted`, drops the run (its traces
/// files are not written) and returns `None`.
async fn until_interrupted<F: Future>(run: F) -> Option<F::Output> {
    let mut run = std::pin::pin!(run);
    tokio::select! {
        // Ctrl-C first: its handler is installed before the run starts.
        biased;
        signal = tokio::signal::ctrl_c() => {
            if signal.is_err() {
                // No signal handling here: just run to the end.
                return Some(run.await);
            }
            progress::clear_all();
            eprintln!("error: interrupted");
            None
        }
        out = &mut run => Some(out),
    }
}

/// Reports a command-line parsing failure. `--help`, `--version` and the
/// help shown for a missing subcommand are clap's own, unchanged; any other
/// argument error becomes one line, `error: <clap's message> (<tip>); see
/// conntrace <subcommand> --help`, with exit status 2.
fn argument_error(err: &clap::Error) -> ExitCode {
    let code = u8::try_from(err.exit_code()).unwrap_or(2);
    if matches!(
        err.kind(),
        ErrorKind::DisplayHelp
            | ErrorKind::DisplayVersion
            | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
    ) {
        let _ = err.print();
        return ExitCode::from(code);
    }
    eprintln!(
        "error: {}; see {} --help",
        one_line_clap_message(&err.render().to_string()),
        command_path()
    );
    ExitCode::from(2)
}

/// clap's rendered error as one line: its first paragraph (the message,
/// with the argument list some messages put on the lines after it) and its
/// tips in parentheses; the usage lines are left out.
fn one_line_clap_message(rendered: &str) -> String {
    let mut paragraphs = rendered.split("\n\n");
    let message = paragraphs.next().unwrap_or_default();
    let message = error::one_line(message.trim().trim_start_matches("error:"));
    let tips: Vec<String> = rendered
        .lines()
        .filter_map(|l| l.trim().strip_prefix("tip:"))
        .map(error::one_line)
        .collect();
    if tips.is_empty() {
        message
    } else {
        format!("{message} ({})", tips.join("; "))
    }
}

/// `conntrace` and, when the command line names one, the subcommand.
fn command_path() -> String {
    let command = Cli::command();
    let sub = std::env::args().skip(1).find_map(|a| {
        command
            .get_subcommands()
            .find(|s| s.get_name() == a)
            .map(|s| s.get_name().to_owned())
    });
    match sub {
        Some(sub) => format!("conntrace {sub}"),
        None => "conntrace".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clap_errors_become_one_line() {
        let rendered = "error: the following required arguments were not provided:\n  <URL>\n\nUsage: conntrace probe <URL>\n\nFor more information, try '--help'.\n";
        assert_eq!(
            one_line_clap_message(rendered),
            "the following required arguments were not provided: <URL>"
        );
        let rendered = "error: unrecognized subcommand 'prob'\n\n  tip: a similar subcommand exists: 'probe'\n\nUsage: conntrace <COMMAND>\n";
        assert_eq!(
            one_line_clap_message(rendered),
            "unrecognized subcommand 'prob' (a similar subcommand exists: 'probe')"
        );
    }

    #[test]
    fn the_command_line_is_valid() {
        Cli::command().debug_assert();
    }
}
