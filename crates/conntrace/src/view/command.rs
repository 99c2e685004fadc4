//! `conntrace view TRACES.json --html FILE`: the page from an OTLP JSON
//! traces file.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::Args;

use super::html::HtmlOutput;
use super::model::{DEFAULT_SHOWN_TRACES, is_connection, is_request};

/// Arguments of `conntrace view`.
#[derive(Debug, Args)]
pub(crate) struct ViewArgs {
    /// An OTLP JSON traces file: one written by conntrace (--traces-out,
    /// the demo's conntrace-demo-traces.json) or by an OpenTelemetry
    /// Collector's file exporter (JSON lines of ExportTraceServiceRequest).
    #[arg(value_name = "TRACES.json")]
    pub(crate) traces: PathBuf,

    /// Write the page to this file (one self-contained HTML file).
    #[arg(long, value_name = "FILE")]
    pub(crate) html: PathBuf,

    /// Traces drawn on the timeline per group (demo phase, probe mode, lab
    /// run, or root span name), the first ones in start order; 0 draws
    /// every trace. The miss rates and calls in flight always count all.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_SHOWN_TRACES)]
    pub(crate) max_traces: usize,
}

/// Runs `conntrace view`; prints where the page went.
///
/// # Errors
/// A file that cannot be read, is not OTLP JSON, or holds no HTTP client
/// request span (one with `http.request.method`) and no connection setup
/// span (nothing to draw); a page that cannot be written. No page is
/// written then.
pub(crate) fn run(args: &ViewArgs) -> anyhow::Result<ExitCode> {
    super::html::refuse_same_file(&args.html, &args.traces, "the traces file read")?;
    let out = HtmlOutput::create(&args.html)?;
    let shown = args.traces.display();
    let text = std::fs::read_to_string(&args.traces)
        .with_context(|| format!("cannot read traces file {shown}"))?;
    let spans = conntrace_lab::spans_from_otlp_json(&text).map_err(|e| {
        anyhow::anyhow!(
            "{shown} is not an OTLP JSON traces file (ExportTraceServiceRequest, or JSON lines of them): {e}"
        )
    })?;
    if spans.is_empty() {
        anyhow::bail!("{shown} holds no spans");
    }
    if !spans.iter().any(|s| is_request(s) || is_connection(s)) {
        anyhow::bail!(
            "{shown} holds {} span(s) but no HTTP client request (http.request.method) and no {} span: nothing to draw",
            spans.len(),
            reqwest_conntrace::semconv::CONNECTION_SETUP_SPAN
        );
    }
    let title = args
        .traces
        .file_name()
        .map_or_else(|| shown.to_string(), |n| n.to_string_lossy().into_owned());
    let written = out.write_with(&title, &spans, args.max_traces)?;
    println!("{}", written.line(spans.len()));
    Ok(ExitCode::SUCCESS)
}
