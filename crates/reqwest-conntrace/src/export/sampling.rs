//! Keeping every connection setup while requests are head-sampled.
//!
//! A pool miss is rare and expensive; a pool hit is common and cheap. Head
//! sampling at ratio `s` keeps a share `s` of both, so at 1 % a busy
//! service exports 1 % of its misses, and the incident that shows up as a
//! burst of misses is mostly lost. This crate therefore records the
//! `http.connection_setup` span of a request that is **not sampled** as
//! the root of its own trace, with a span link to the request's span
//! context (its trace id is still the one logs and downstream services
//! see), and [`KeepConnectionSetups`] is the sampler that keeps those roots
//! and their phase children while the wrapped sampler decides everything
//! else. A sampled request's setup span stays its child, as before.
//!
//! Volume, at `R` requests per second, head-sampling ratio `s`, miss ratio
//! `m` (misses that connect) and `k` spans per setup (setup span plus its
//! phases: 4 for `https` to a name, 3 to an IP literal or for `http`, 5
//! through a CONNECT proxy):
//!
//! ```text
//! spans/s = R·s·(1 + m·k)        sampled requests and their setups
//!         + R·(1 − s)·m·k        every other request's setups, own traces
//! ```
//!
//! e.g. `R = 10 000`, `s = 1 %`, `m = 0.5 %`, `k = 4`: 100 request spans +
//! 2 setup spans from sampled traces + 198 from the others, about 300
//! spans/s, against 10 200 spans/s with everything exported. The second
//! term grows with the miss ratio only: a pool that churns (`m = 20 %`)
//! exports `10 000 · 0.99 · 0.2 · 4 ≈ 7 900` setup spans/s, which is the
//! signal. See `docs/ARCHITECTURE.md` for the trade-off against tail
//! sampling in the collector.

use opentelemetry::trace::{Link, SpanKind, TraceContextExt, TraceId};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::trace::{SamplingDecision, SamplingResult, ShouldSample};

use crate::semconv;

/// A sampler that keeps every connection setup and lets `inner` decide
/// every other span:
/// - a root `http.connection_setup` span (a setup whose request was not
///   sampled, or that has no request span) is recorded and sampled;
/// - a `dns.lookup`, `tcp.connect`, `proxy.connect` or `tls.handshake`
///   span whose parent is sampled is sampled (so a non-parent-based
///   `inner` still keeps the phases of a kept setup);
/// - anything else is `inner`'s decision.
///
/// Use it in place of the sampler you would set on the tracer provider:
///
/// ```
/// use opentelemetry_sdk::trace::{Sampler, SdkTracerProvider};
/// use reqwest_conntrace::KeepConnectionSetups;
///
/// let provider = SdkTracerProvider::builder()
///     .with_sampler(KeepConnectionSetups::new(Sampler::ParentBased(Box::new(
///         Sampler::TraceIdRatioBased(0.01),
///     ))))
///     .build();
/// ```
///
/// `reqwest_conntrace::otlp::init_from_env` (feature `otlp`) wraps the
/// sampler named by `OTEL_TRACES_SAMPLER` with it
/// ([`KeepConnectionSetups::from_env`]).
#[derive(Debug, Clone)]
pub struct KeepConnectionSetups {
    inner: Box<dyn ShouldSample>,
}

impl KeepConnectionSetups {
    /// Wraps `inner`, which decides every span but connection setups.
    pub fn new(inner: impl ShouldSample + 'static) -> Self {
        Self {
            inner: Box::new(inner),
        }
    }

    /// Wraps the sampler the OpenTelemetry SDK builds from
    /// `OTEL_TRACES_SAMPLER` and `OTEL_TRACES_SAMPLER_ARG` (SDK
    /// environment variables; default `parentbased_always_on`).
    pub fn from_env() -> Self {
        Self {
            inner: opentelemetry_sdk::trace::Config::default().sampler,
        }
    }
}

/// The phase spans under a setup span.
const PHASE_SPANS: [&str; 4] = [
    semconv::DNS_LOOKUP_SPAN,
    semconv::TCP_CONNECT_SPAN,
    semconv::PROXY_CONNECT_SPAN,
    semconv::TLS_HANDSHAKE_SPAN,
];

impl ShouldSample for KeepConnectionSetups {
    fn should_sample(
        &self,
        parent_context: Option<&Context>,
        trace_id: TraceId,
        name: &str,
        span_kind: &SpanKind,
        attributes: &[KeyValue],
        links: &[Link],
    ) -> SamplingResult {
        let parent = parent_context
            .filter(|cx| cx.has_active_span())
            .map(|cx| cx.span().span_context().clone())
            .filter(|sc| sc.is_valid());
        let keep = match &parent {
            None => name == semconv::CONNECTION_SETUP_SPAN,
            Some(p) => p.is_sampled() && PHASE_SPANS.contains(&name),
        };
        if keep {
            return SamplingResult {
                decision: SamplingDecision::RecordAndSample,
                attributes: Vec::new(),
                trace_state: parent.map(|p| p.trace_state().clone()).unwrap_or_default(),
            };
        }
        self.inner
            .should_sample(parent_context, trace_id, name, span_kind, attributes, links)
    }
}
