//! What the pipeline delivered and lost: [`ExportStats`] and the last
//! [`ExportFailure`], read with [`OtlpGuard::stats`](super::OtlpGuard::stats).

use std::fmt;
use std::time::Duration;

/// Counts of the pipeline's spans and metric exports since it was set up.
///
/// Every span handed to the pipeline ends in exactly one of `exported`,
/// `failed`, `dropped`, or is still queued:
/// `spans_ended = spans_exported + spans_failed + spans_dropped + spans_queued()`.
/// After [`OtlpGuard::shutdown`](super::OtlpGuard::shutdown) nothing is
/// queued: spans the final export could not send are counted as dropped.
///
/// Metrics are cumulative: a failed metric export loses nothing once a
/// later export succeeds (it carries the totals); only the last export
/// failing loses the changes since the previous success.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ExportStats {
    /// Spans ended and handed to the pipeline (sampled spans only).
    pub spans_ended: u64,
    /// Spans the collector accepted.
    pub spans_exported: u64,
    /// Spans sent in a batch the collector did not accept in time (refused
    /// connection, error status, no answer within the export timeout): lost.
    pub spans_failed: u64,
    /// Spans never sent: the export queue was full (the collector was too
    /// slow or unreachable for longer than the queue holds), or they were
    /// still queued when shutdown's deadline passed: lost.
    pub spans_dropped: u64,
    /// Metric exports the collector accepted.
    pub metric_exports: u64,
    /// Metric exports that failed (see the type's docs for what that loses).
    pub metric_exports_failed: u64,
    /// The most recent failed export, if any.
    pub last_failure: Option<ExportFailure>,
}

impl ExportStats {
    /// Spans lost: `spans_failed + spans_dropped`.
    pub fn spans_lost(&self) -> u64 {
        self.spans_failed + self.spans_dropped
    }

    /// Spans ended but not yet exported, failed or dropped (waiting in the
    /// export queue or in an export in flight).
    pub fn spans_queued(&self) -> u64 {
        self.spans_ended
            .saturating_sub(self.spans_exported + self.spans_failed + self.spans_dropped)
    }

    /// Whether anything was lost or failed: a span lost or a metric export
    /// failed.
    pub fn has_losses(&self) -> bool {
        self.spans_lost() > 0 || self.metric_exports_failed > 0
    }

    /// One line for people: `12 spans exported, 3 lost (2 in failed
    /// exports, 1 dropped: queue full or shutdown deadline); 1 of 4 metric
    /// exports failed`.
    pub fn summary(&self) -> String {
        let mut line = format!("{} spans exported", self.spans_exported);
        if self.spans_lost() > 0 {
            line.push_str(&format!(
                ", {} lost ({} in failed exports, {} dropped: queue full or shutdown deadline)",
                self.spans_lost(),
                self.spans_failed,
                self.spans_dropped
            ));
        }
        let metric_total = self.metric_exports + self.metric_exports_failed;
        if self.metric_exports_failed > 0 {
            line.push_str(&format!(
                "; {} of {metric_total} metric exports failed",
                self.metric_exports_failed
            ));
        } else {
            line.push_str(&format!("; {metric_total} metric exports"));
        }
        line
    }
}

/// Which signal an export carried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Signal {
    /// Spans.
    Traces,
    /// Metrics.
    Metrics,
}

impl fmt::Display for Signal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Signal::Traces => "spans",
            Signal::Metrics => "metrics",
        })
    }
}

/// What went wrong in a failed export, as far as the client can tell.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum FailureKind {
    /// The TCP connection to the collector was not established in time
    /// (nothing answers: a blackholed address, a full accept queue, a
    /// firewall dropping packets).
    ConnectTimedOut,
    /// The collector's host refused the connection (nothing listens there).
    Refused,
    /// Connected, but no answer came within the export timeout (a collector
    /// that does not read or does not answer, or a TLS listener waiting
    /// for a handshake the plaintext exporter never starts).
    NoAnswer,
    /// The collector (or whatever listens there) closed the connection
    /// without an answer: broken pipe, reset (a TLS-only port reached over
    /// plaintext, a port that does not speak gRPC/HTTP).
    ConnectionClosed,
    /// What answered is not OTLP over HTTP/2 (an HTTP/2 protocol error:
    /// a TLS-only port reached over plaintext answers with a TLS alert).
    ProtocolMismatch,
    /// The collector answered with an error status (gRPC status code
    /// name such as `Unavailable`, or an HTTP status such as `503`).
    ServerError(String),
    /// Anything else (connection reset, protocol error...); see the detail.
    Other,
}

/// One failed export: what happened, how long it waited, and the
/// exporter's own text.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ExportFailure {
    /// What the export carried.
    pub signal: Signal,
    /// What went wrong.
    pub kind: FailureKind,
    /// How long the export (retries included) waited before giving up.
    pub waited: Duration,
    /// The exporter's error text, on one line.
    pub detail: String,
}

impl fmt::Display for ExportFailure {
    /// `connect timed out after 3.0 s`, `connection refused (after 0.7 s of
    /// retries)`, `no answer within 3.0 s`, `the collector answered
    /// Unavailable (after 2.1 s of retries)`, or `<detail> after 0.2 s`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let secs = self.waited.as_secs_f64();
        match &self.kind {
            FailureKind::ConnectTimedOut => write!(f, "connect timed out after {secs:.1} s"),
            FailureKind::Refused => write!(f, "connection refused (gave up after {secs:.1} s)"),
            FailureKind::NoAnswer => write!(f, "no answer within {secs:.1} s"),
            FailureKind::ProtocolMismatch => write!(
                f,
                "the collector's port does not speak OTLP over plaintext HTTP/2 (a TLS-only port?): {}",
                self.detail
            ),
            FailureKind::ConnectionClosed => write!(
                f,
                "the collector closed the connection without answering (a TLS-only or non-OTLP port?): {}",
                self.detail
            ),
            FailureKind::ServerError(status) => write!(
                f,
                "the collector answered {status} (gave up after {secs:.1} s)"
            ),
            FailureKind::Other => write!(f, "{} (gave up after {secs:.1} s)", self.detail),
        }
    }
}

impl ExportFailure {
    /// Classifies an exporter's error text (`opentelemetry-otlp`'s gRPC and
    /// HTTP exporters) or our own deadline (`timed_out`).
    pub(crate) fn classify(
        signal: Signal,
        detail: &str,
        timed_out: bool,
        waited: Duration,
    ) -> Self {
        let lower = detail.to_ascii_lowercase();
        let kind = if lower.contains("connection refused") {
            FailureKind::Refused
        } else if lower.contains("tcp connect error") && lower.contains("timed out")
            || lower.contains("connect timed out")
            || (lower.contains("transport error") && lower.contains("elapsed"))
        {
            FailureKind::ConnectTimedOut
        } else if timed_out || lower.contains("timeout expired") || lower.contains("timed out") {
            FailureKind::NoAnswer
        } else if lower.contains("http2 error") || lower.contains("invalid http version") {
            FailureKind::ProtocolMismatch
        } else if lower.contains("broken pipe")
            || lower.contains("connection reset")
            || lower.contains("connection closed")
            || lower.contains("stream closed")
        {
            FailureKind::ConnectionClosed
        } else if let Some(code) = grpc_code(detail) {
            FailureKind::ServerError(code)
        } else if let Some(status) = http_status(&lower) {
            FailureKind::ServerError(format!("HTTP {status}"))
        } else {
            FailureKind::Other
        };
        Self {
            signal,
            kind,
            waited,
            detail: detail.split_whitespace().collect::<Vec<_>>().join(" "),
        }
    }
}

/// `Unavailable` from `... export failed with gRPC code: Unavailable` when
/// nothing follows (a status the server sent, not a transport error).
fn grpc_code(detail: &str) -> Option<String> {
    let (_, rest) = detail.split_once("gRPC code: ")?;
    let code: String = rest.chars().take_while(|c| c.is_alphanumeric()).collect();
    (!code.is_empty() && !rest[code.len()..].trim_start().starts_with(':')).then_some(code)
}

/// The HTTP status in the HTTP exporter's `... status code 503 ...`.
fn http_status(lower: &str) -> Option<u16> {
    let (_, rest) = lower.split_once("status")?;
    rest.split(|c: char| !c.is_ascii_digit())
        .find(|s| s.len() == 3)
        .and_then(|s| s.parse().ok())
}
