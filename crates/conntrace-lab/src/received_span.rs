//! `ReceivedSpan`: one exported span, flattened with its resource and scope.

use std::time::Duration;

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use opentelemetry_proto::tonic::trace::v1::status::StatusCode;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, Span};

use crate::{Attributes, LabError};

/// One span as received over OTLP (or read from an OTLP JSON file), with its
/// resource attributes and instrumentation scope.
#[derive(Debug, Clone, PartialEq)]
pub struct ReceivedSpan {
    resource: Attributes,
    scope_name: String,
    scope_version: String,
    attributes: Attributes,
    span: Span,
}

/// One span event: name, time and attributes.
#[derive(Debug, Clone, PartialEq)]
pub struct ReceivedEvent {
    /// The event name.
    pub name: String,
    /// When it happened, nanoseconds since the Unix epoch.
    pub time_unix_nano: u64,
    /// The event's attributes.
    pub attributes: Attributes,
}

/// One span link: the linked span's ids and the link's attributes.
#[derive(Debug, Clone, PartialEq)]
pub struct ReceivedLink {
    /// The linked span's trace id, 32 lowercase hex digits.
    pub trace_id_hex: String,
    /// The linked span's id, 16 lowercase hex digits.
    pub span_id_hex: String,
    /// The link's attributes.
    pub attributes: Attributes,
}

impl ReceivedSpan {
    /// The span name.
    pub fn name(&self) -> &str {
        &self.span.name
    }

    /// The trace id, 32 lowercase hex digits.
    pub fn trace_id_hex(&self) -> String {
        hex(&self.span.trace_id)
    }

    /// The span id, 16 lowercase hex digits.
    pub fn span_id_hex(&self) -> String {
        hex(&self.span.span_id)
    }

    /// The parent span id (16 hex digits), `None` for a root span.
    pub fn parent_span_id_hex(&self) -> Option<String> {
        (!self.span.parent_span_id.is_empty()).then(|| hex(&self.span.parent_span_id))
    }

    /// The span kind (`Unspecified` if the value is unknown).
    pub fn kind(&self) -> SpanKind {
        SpanKind::try_from(self.span.kind).unwrap_or(SpanKind::Unspecified)
    }

    /// The span's attributes.
    pub fn attributes(&self) -> &Attributes {
        &self.attributes
    }

    /// The resource attributes of the exporting process (e.g. `service.name`).
    pub fn resource(&self) -> &Attributes {
        &self.resource
    }

    /// The instrumentation scope (tracer) name.
    pub fn scope_name(&self) -> &str {
        &self.scope_name
    }

    /// The instrumentation scope version (empty if not set).
    pub fn scope_version(&self) -> &str {
        &self.scope_version
    }

    /// A string span attribute (see [`Attributes::str`]).
    pub fn attr_str(&self, key: &str) -> Option<&str> {
        self.attributes.str(key)
    }

    /// An integer span attribute (see [`Attributes::i64`]).
    pub fn attr_i64(&self, key: &str) -> Option<i64> {
        self.attributes.i64(key)
    }

    /// A float span attribute; integers are converted (see [`Attributes::f64`]).
    pub fn attr_f64(&self, key: &str) -> Option<f64> {
        self.attributes.f64(key)
    }

    /// A boolean span attribute (see [`Attributes::bool`]).
    pub fn attr_bool(&self, key: &str) -> Option<bool> {
        self.attributes.bool(key)
    }

    /// A string-array span attribute (see [`Attributes::str_array`]).
    pub fn attr_str_array(&self, key: &str) -> Option<Vec<String>> {
        self.attributes.str_array(key)
    }

    /// Whether the span has attribute `key`.
    pub fn has_attr(&self, key: &str) -> bool {
        self.attributes.has(key)
    }

    /// The span's events, in recorded order.
    pub fn events(&self) -> Vec<ReceivedEvent> {
        self.span
            .events
            .iter()
            .map(|e| ReceivedEvent {
                name: e.name.clone(),
                time_unix_nano: e.time_unix_nano,
                attributes: Attributes::new(e.attributes.clone()),
            })
            .collect()
    }

    /// The span's links.
    pub fn links(&self) -> Vec<ReceivedLink> {
        self.span
            .links
            .iter()
            .map(|l| ReceivedLink {
                trace_id_hex: hex(&l.trace_id),
                span_id_hex: hex(&l.span_id),
                attributes: Attributes::new(l.attributes.clone()),
            })
            .collect()
    }

    /// Start time, nanoseconds since the Unix epoch.
    pub fn start_unix_nanos(&self) -> u64 {
        self.span.start_time_unix_nano
    }

    /// End time, nanoseconds since the Unix epoch.
    pub fn end_unix_nanos(&self) -> u64 {
        self.span.end_time_unix_nano
    }

    /// End minus start (zero if the end precedes the start).
    pub fn duration(&self) -> Duration {
        Duration::from_nanos(
            self.span
                .end_time_unix_nano
                .saturating_sub(self.span.start_time_unix_nano),
        )
    }

    /// The status code (`Unset` when no status was recorded).
    pub fn status_code(&self) -> StatusCode {
        self.span
            .status
            .as_ref()
            .and_then(|s| StatusCode::try_from(s.code).ok())
            .unwrap_or(StatusCode::Unset)
    }

    /// The status message (empty when none).
    pub fn status_message(&self) -> &str {
        self.span
            .status
            .as_ref()
            .map(|s| s.message.as_str())
            .unwrap_or("")
    }

    /// The decoded protobuf span, for anything the accessors do not cover.
    pub fn proto(&self) -> &Span {
        &self.span
    }
}

/// Flattens decoded resource spans into one [`ReceivedSpan`] per span.
pub(crate) fn flatten_resource_spans(resource_spans: Vec<ResourceSpans>) -> Vec<ReceivedSpan> {
    let mut out = Vec::new();
    for rs in resource_spans {
        let resource = Attributes::new(rs.resource.map(|r| r.attributes).unwrap_or_default());
        for ss in rs.scope_spans {
            let (scope_name, scope_version) =
                ss.scope.map(|s| (s.name, s.version)).unwrap_or_default();
            for span in ss.spans {
                let attributes = Attributes::new(span.attributes.clone());
                out.push(ReceivedSpan {
                    resource: resource.clone(),
                    scope_name: scope_name.clone(),
                    scope_version: scope_version.clone(),
                    attributes,
                    span,
                });
            }
        }
    }
    out
}

/// Flattens one decoded `ExportTraceServiceRequest` (e.g. built in process
/// from SDK spans with opentelemetry-proto's transform) into one
/// [`ReceivedSpan`] per span, exactly as [`OtlpReceiver`](crate::OtlpReceiver)
/// would have received it.
pub fn spans_from_export_request(request: ExportTraceServiceRequest) -> Vec<ReceivedSpan> {
    flatten_resource_spans(request.resource_spans)
}

/// Parses OTLP/JSON trace data (the protobuf JSON mapping, as written by
/// the demo or a collector's file exporter) into flattened spans.
///
/// Accepts one `ExportTraceServiceRequest` / `TracesData` object
/// (`{"resourceSpans": [...]}`), a JSON array of such objects, or JSON Lines
/// (one object per line). Trace and span ids are hex strings.
///
/// # Errors
/// [`LabError::Json`] when the text matches none of these shapes.
pub fn spans_from_otlp_json(json: &str) -> Result<Vec<ReceivedSpan>, LabError> {
    let trimmed = json.trim_start();
    let requests: Vec<ExportTraceServiceRequest> = if trimmed.starts_with('[') {
        serde_json::from_str(trimmed)?
    } else {
        match serde_json::from_str::<ExportTraceServiceRequest>(trimmed) {
            Ok(request) => vec![request],
            Err(whole) => {
                let mut requests = Vec::new();
                for line in trimmed.lines().filter(|l| !l.trim().is_empty()) {
                    match serde_json::from_str(line) {
                        Ok(request) => requests.push(request),
                        Err(_) => return Err(whole.into()),
                    }
                }
                requests
            }
        }
    };
    Ok(requests
        .into_iter()
        .flat_map(|r| flatten_resource_spans(r.resource_spans))
        .collect())
}

/// Lowercase hex of `bytes`.
pub(crate) fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}
