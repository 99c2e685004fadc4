//! OpenTelemetry instrumentation for [`reqwest`] that shows, per request,
//! whether it reused a pooled connection or paid for a new one, and for every
//! new connection how long DNS, TCP connect and the TLS handshake took.
//!
//! # Span shape
//! ```text
//! GET                         request span (client), one per request:
//!  │                          http.connection.reused / .miss_reason / .id /
//!  │                          .wait_time / .request_count / .age / .idle_time
//!  └─ http.connection_setup   only when this request's pool miss started a connect
//!      ├─ dns.lookup          absent for IP literals and resolve() overrides
//!      ├─ tcp.connect         addresses tried, fallback, kernel RTT / cwnd / MSS /
//!      │                      retransmits (Linux); events tcp.syn_retransmit,
//!      │                      tcp.address_skipped
//!      ├─ proxy.connect       https through a proxy set with `.proxy(url)`
//!      └─ tls.handshake       https only; events tls.server_hello,
//!                             tls.certificate_verified, tls.server_finished
//! ```
//! A request served by a connection another request set up carries a span
//! link to that connection's `http.connection_setup` span. The full attribute
//! reference is in [`semconv`] and `docs/REFERENCE.md`; why a request missed
//! is a [`MissReason`]. [`fan_out`] runs batch futures under a parent span
//! that says which batches paid for new connections.
//!
//! # Metrics
//! The handle records the HTTP client and DNS semantic-convention metrics
//! (`http.client.request.duration` with `http.connection.reused`,
//! `http.client.active_requests`, `http.client.open_connections`,
//! `http.client.connection.duration`, `dns.lookup.duration`) and its own
//! (`http.client.connection.setup.duration`, `http.client.connections.opened`,
//! `http.client.pool.misses` by reason, and the Little's-law gauges
//! `http.client.pool.peak_in_flight` / `.idle_limit`); see
//! [`ConnTrace::pool_advice`].
//!
//! # Sampling and flushing
//! A setup whose request span is not sampled becomes the root of its own
//! trace, linked to the request; [`KeepConnectionSetups`] is the sampler
//! that keeps every such setup while requests are head-sampled (`otlp`
//! installs it). `tcp.connect` spans end when the kernel's answer arrives,
//! off the request path: [`wait_for_pending_spans`] before flushing a
//! tracer provider you set up yourself.
//!
//! # Use
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let conntrace = reqwest_conntrace::ConnTrace::new();
//! let client = conntrace
//!     .instrument_client(reqwest::Client::builder())
//!     // pool settings here, not on reqwest's builder (which cannot be read back)
//!     .pool_max_idle_per_host(8)
//!     .build_with_middleware()?;
//! client.get("https://example.com/").send().await?.text().await?;
//! # Ok(()) }
//! ```
//! Spans go through `tracing` + `tracing-opentelemetry` (request spans) and
//! the OpenTelemetry tracer provider (connection spans); [`otlp`] (feature
//! `otlp`) sets both up from the standard `OTEL_*` variables.

mod builder;
mod connect;
mod error;
mod export;
mod handle;
mod kernel;
#[cfg(test)]
mod layout;
mod miss;
#[cfg(feature = "otlp")]
pub mod otlp;
mod pool;
mod redact;
mod request;
pub mod semconv;

pub use builder::{InstrumentedClientBuilder, ReqwestClientBuilder};
pub use connect::address::AddressOrder;
pub use connect::connector::{ConnectFuture, ConnectService, ConnectorLayer, connects_in_flight};
pub use connect::dns::{SystemResolver, TracedResolver};
pub use connect::tls::TlsSettings;
pub use error::BuildError;
pub use export::pending::wait_for_pending_spans;
pub use export::phases::ConnectionPhases;
pub use export::report::{
    ConnectionSetup, ConnectionUse, DefaultOnRequestEnd, OnRequestEnd, RequestReport,
    SettledMissReason, TlsVersion,
};
pub use export::sampling::KeepConnectionSetups;
pub use handle::{
    ConnTrace, ConnTraceBuilder, DEFAULT_POOL_ADVICE_INTERVAL, DEFAULT_REGISTRY_CAPACITY,
};
pub use kernel::{TIME_WAIT_LENGTH, TcpFacts, TcpInfo, TcpState};
pub use miss::MissReason;
pub use pool::advice::{DEFAULT_POOL_ADVICE_HOSTS, PoolAdvice};
pub use pool::model::DEFAULT_POOL_HISTORY_HOSTS;
pub use redact::{DEFAULT_REDACTED_QUERY_KEYS, UrlRedaction, redact_url};
pub use request::fanout::fan_out;
pub use request::middleware::{
    ConnTraceMiddleware, DefaultMakeRequestSpan, MakeRequestSpan, UseCurrentSpan,
};
