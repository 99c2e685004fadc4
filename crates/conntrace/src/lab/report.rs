//! What a scenario hands back, and the `--json` document (schema
//! `conntrace.lab/v1`, see SCHEMA.md).

use serde::Serialize;

use super::view::RunView;
use crate::telemetry::TelemetryReport;

/// A scenario's result: the runs as their spans tell them, and what they mean.
#[derive(Debug)]
pub(crate) struct Outcome {
    /// The scenario's settings (RTT, timeouts, counts), for `--json`.
    pub(crate) config: serde_json::Value,
    /// The runs, read back from the exported spans.
    pub(crate) runs: Vec<RunView>,
    /// Tables to print before the findings.
    pub(crate) tables: Vec<TextTable>,
    /// What the telemetry concluded, in plain words with the numbers.
    pub(crate) findings: Vec<String>,
    /// What to change, when the scenario shows a problem.
    pub(crate) fix: Option<String>,
    /// Whether the spans showed the fault's signature; when not, why.
    pub(crate) reproduced: Result<(), String>,
}

/// A table for the text output.
#[derive(Debug, Clone)]
pub(crate) struct TextTable {
    /// The line above it.
    pub(crate) title: String,
    /// Column names.
    pub(crate) header: Vec<&'static str>,
    /// Indexes of the right-aligned (numeric) columns.
    pub(crate) right: Vec<usize>,
    /// The rows.
    pub(crate) rows: Vec<Vec<String>>,
}

/// The `--json` document of one scenario.
#[derive(Debug, Serialize)]
pub(crate) struct LabReport {
    /// `conntrace.lab/v1`.
    pub(crate) schema: &'static str,
    /// Version of the binary.
    pub(crate) conntrace_version: &'static str,
    /// The scenario's name.
    pub(crate) scenario: &'static str,
    /// Its one-line description.
    pub(crate) description: &'static str,
    /// Its settings.
    pub(crate) config: serde_json::Value,
    /// The runs.
    pub(crate) runs: Vec<RunView>,
    /// What the telemetry concluded.
    pub(crate) findings: Vec<String>,
    /// What to change.
    pub(crate) fix: Option<String>,
    /// Whether the spans showed the fault's signature.
    pub(crate) reproduced: bool,
    /// Why not, when they did not.
    pub(crate) not_reproduced_because: Option<String>,
    /// Where the spans went.
    pub(crate) telemetry: TelemetryReport,
}

/// One entry of `--list --json`.
#[derive(Debug, Serialize)]
pub(crate) struct ListedScenario {
    /// The name.
    pub(crate) name: &'static str,
    /// The one-line description.
    pub(crate) description: &'static str,
}

/// `conntrace lab --list --json`.
#[derive(Debug, Serialize)]
pub(crate) struct ScenarioList {
    /// `conntrace.lab/v1`.
    pub(crate) schema: &'static str,
    /// Every scenario, in order.
    pub(crate) scenarios: Vec<ListedScenario>,
}
