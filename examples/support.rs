//! Where the examples' spans go: over OTLP when `OTEL_EXPORTER_OTLP_ENDPOINT`
//! (or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) is set, otherwise into memory,
//! printed as a tree when the example ends. Either way the pipeline is the
//! library's own (`reqwest_conntrace::otlp`): the same tracer provider,
//! `tracing-opentelemetry` layer and propagator, only the exporter differs.
//!
//! Included by each example with `#[path = "support.rs"] mod support;`.

use std::collections::HashSet;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::SystemTime;

use opentelemetry::trace::{SpanId, SpanKind, Status};
use opentelemetry::{KeyValue, Value};
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{SpanData, SpanExporter};
use reqwest_conntrace::otlp::{self, OtlpError, OtlpGuard};
use reqwest_conntrace::semconv;

/// The installed pipeline; [`finish`](Self::finish) flushes it.
pub(crate) struct Telemetry {
    guard: OtlpGuard,
    sink: Sink,
}

enum Sink {
    Otlp { endpoint: String },
    Memory(Collected),
}

impl Telemetry {
    /// Installs the global tracer provider and `tracing` subscriber. Must run
    /// inside a tokio runtime (the gRPC exporter needs one).
    pub(crate) fn init() -> Result<Self, OtlpError> {
        let endpoint = [
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            "OTEL_EXPORTER_OTLP_ENDPOINT",
        ]
        .iter()
        .find_map(|k| std::env::var(k).ok().filter(|v| !v.trim().is_empty()));
        match endpoint {
            Some(endpoint) => {
                // With OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf the exporter
                // builds its own reqwest client, and this workspace's reqwest
                // (feature `rustls-no-provider`) panics building one unless a
                // process-wide rustls crypto provider is installed.
                if rustls::crypto::CryptoProvider::get_default().is_none() {
                    let _ = rustls::crypto::ring::default_provider().install_default();
                }
                let guard = otlp::init_from_env()?;
                println!("exporting spans over OTLP to {endpoint}");
                Ok(Self {
                    guard,
                    sink: Sink::Otlp { endpoint },
                })
            }
            None => {
                println!(
                    "note: OTEL_EXPORTER_OTLP_ENDPOINT is not set, so spans are kept in memory and \
                     printed at the end (`docker compose up -d` and \
                     OTEL_EXPORTER_OTLP_ENDPOINT=http://localhost:4317 send them to Jaeger)"
                );
                let collected = Collected::default();
                let guard = otlp::init_with_exporter(collected.clone())?;
                Ok(Self {
                    guard,
                    sink: Sink::Memory(collected),
                })
            }
        }
    }

    /// Flushes every ended span and says where it went (or prints it).
    pub(crate) fn finish(self) {
        let result = self.guard.shutdown();
        match self.sink {
            Sink::Otlp { endpoint } => match result {
                Ok(()) => {
                    // The SDK's default service name when none is configured.
                    let service = std::env::var("OTEL_SERVICE_NAME").unwrap_or_else(|_| {
                        let exe = std::env::current_exe().ok();
                        let name = exe.as_deref().and_then(|p| p.file_name()?.to_str());
                        format!("unknown_service:{}", name.unwrap_or_default())
                    });
                    println!(
                        "spans exported to {endpoint}; with the bundled docker-compose.yml open \
                         http://localhost:16686 and search service `{service}`"
                    );
                }
                Err(e) => eprintln!(
                    "spans could not be exported to {endpoint}: {e} (is the collector running? \
                     `docker compose up -d`)"
                ),
            },
            Sink::Memory(collected) => {
                if let Err(e) = result {
                    eprintln!("flushing the in-memory pipeline failed: {e}");
                }
                print_tree(&collected.spans());
            }
        }
    }
}

/// A span exporter that keeps every span in memory.
#[derive(Debug, Clone, Default)]
struct Collected(Arc<Mutex<Vec<SpanData>>>);

impl Collected {
    fn lock(&self) -> MutexGuard<'_, Vec<SpanData>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn spans(&self) -> Vec<SpanData> {
        self.lock().clone()
    }
}

impl SpanExporter for Collected {
    fn export(&self, batch: Vec<SpanData>) -> impl Future<Output = OTelSdkResult> + Send {
        self.lock().extend(batch);
        std::future::ready(Ok(()))
    }
}

fn print_tree(spans: &[SpanData]) {
    let ids: HashSet<SpanId> = spans.iter().map(|s| s.span_context.span_id()).collect();
    let mut roots: Vec<&SpanData> = spans
        .iter()
        .filter(|s| !ids.contains(&s.parent_span_id))
        .collect();
    roots.sort_by_key(|s| s.start_time);
    println!("\n{} spans, one tree per trace root:", spans.len());
    for root in roots {
        println!();
        print_span(spans, root, "", None);
    }
}

/// Prints `span` and its children. `last` is `None` for a root, else whether
/// it is its parent's last child.
fn print_span(all: &[SpanData], span: &SpanData, prefix: &str, last: Option<bool>) {
    let (branch, inner) = match last {
        None => ("", prefix.to_owned()),
        Some(true) => ("└─ ", format!("{prefix}   ")),
        Some(false) => ("├─ ", format!("{prefix}│  ")),
    };
    let mut children: Vec<&SpanData> = all
        .iter()
        .filter(|s| s.parent_span_id == span.span_context.span_id())
        .collect();
    children.sort_by_key(|s| s.start_time);
    let kind = match span.span_kind {
        SpanKind::Client => " [client]",
        _ => "",
    };
    let status = match &span.status {
        Status::Error { description } => format!("  ERROR: {description}"),
        Status::Ok => "  (status ok)".to_owned(),
        Status::Unset => String::new(),
    };
    println!(
        "{prefix}{branch}{}{kind}  {}{status}",
        span.name,
        millis(span.start_time, span.end_time)
    );
    let detail = if children.is_empty() {
        format!("{inner}     ")
    } else {
        format!("{inner}│    ")
    };
    let shown: Vec<&KeyValue> = span.attributes.iter().collect();
    print_wrapped(&detail, &shown);
    for event in span.events.iter() {
        let mut line = format!(
            "event {} at +{}",
            event.name,
            millis(span.start_time, event.timestamp)
        );
        for kv in &event.attributes {
            let _ = write!(line, " {}={}", kv.key, show(&kv.value));
        }
        println!("{detail}{line}");
    }
    for link in span.links.iter() {
        let target = all
            .iter()
            .find(|s| s.span_context.span_id() == link.span_context.span_id());
        let what = match target {
            Some(t) => format!("{} of connection #{}", t.name, connection_id(t)),
            None => format!("span {}", link.span_context.span_id()),
        };
        let attrs: Vec<String> = link
            .attributes
            .iter()
            .map(|kv| format!("{}={}", kv.key, show(&kv.value)))
            .collect();
        println!("{detail}link -> {what} ({})", attrs.join(", "));
    }
    for (i, child) in children.iter().enumerate() {
        print_span(all, child, &inner, Some(i + 1 == children.len()));
    }
}

fn connection_id(span: &SpanData) -> String {
    span.attributes
        .iter()
        .find(|kv| kv.key.as_str() == semconv::HTTP_CONNECTION_ID)
        .map_or_else(|| "?".to_owned(), |kv| show(&kv.value))
}

/// Prints `key=value` pairs after `indent`, wrapped near 110 columns.
fn print_wrapped(indent: &str, attributes: &[&KeyValue]) {
    let mut line = String::new();
    for kv in attributes {
        let item = format!("{}={}", kv.key, show(&kv.value));
        if !line.is_empty() && indent.chars().count() + line.len() + item.len() > 110 {
            println!("{indent}{line}");
            line.clear();
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(&item);
    }
    if !line.is_empty() {
        println!("{indent}{line}");
    }
}

fn show(value: &Value) -> String {
    match value {
        // Every double this crate emits is a duration in seconds.
        Value::F64(f) => format!("{f:.6}"),
        Value::String(s) => s.to_string(),
        other => other.to_string(),
    }
}

fn millis(from: SystemTime, to: SystemTime) -> String {
    let d = to.duration_since(from).unwrap_or_default();
    format!("{:.3} ms", d.as_secs_f64() * 1000.0)
}
