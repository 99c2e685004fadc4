//! Long `--help` texts: the environment variables, and the `--json` schema
//! descriptions taken from SCHEMA.md so the two never disagree.

/// The whole schema document.
const SCHEMA_MD: &str = include_str!("../SCHEMA.md");

/// The section of SCHEMA.md whose `## ` heading starts with `heading`, up to
/// the next `## ` heading.
fn section(heading: &str) -> String {
    let mut out = String::new();
    let mut inside = false;
    for line in SCHEMA_MD.lines() {
        if let Some(title) = line.strip_prefix("## ") {
            inside = title.starts_with(heading);
            if inside {
                out.push_str(title);
                out.push_str(":\n");
            }
            continue;
        }
        if inside {
            out.push_str(line);
            out.push('\n');
        }
    }
    out.trim_end().to_owned()
}

/// Environment variables, shown in `--help`.
pub(crate) const ENV_HELP: &str = "\
Environment:
  OTEL_EXPORTER_OTLP_ENDPOINT   export spans and metrics over OTLP to this collector (e.g. http://localhost:4317);
                                also OTEL_EXPORTER_OTLP_TRACES_ENDPOINT [default: no OTLP export]
  OTEL_EXPORTER_OTLP_PROTOCOL   grpc or http/protobuf [default: grpc]
  OTEL_EXPORTER_OTLP_TIMEOUT    export timeout in ms [default here: 3000, shorter than the SDK's 10000]
  OTEL_SERVICE_NAME             service name of the spans and metrics [default here: conntrace]
  OTEL_METRIC_EXPORT_INTERVAL   metrics export interval in ms [default here: 5000, shorter than the SDK's 60000]
  RUST_LOG                      filter of diagnostics logged to stderr [default: warn]
An export that fails is reported in one line on stderr after the run, and the exit status is then 1.";

/// Long help of `conntrace probe`: environment and JSON schema.
pub(crate) fn probe_help() -> String {
    format!("{ENV_HELP}\n\n{}", section("conntrace probe --json"))
}

/// Long help of `conntrace demo`: environment and JSON schema.
pub(crate) fn demo_help() -> String {
    format!("{ENV_HELP}\n\n{}", section("conntrace demo --json"))
}

/// Long help of `conntrace lab`: environment and JSON schema.
pub(crate) fn lab_help() -> String {
    format!("{ENV_HELP}\n\n{}", section("conntrace lab --json"))
}
