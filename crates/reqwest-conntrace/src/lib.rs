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

mod address;
mod advice;
mod attempt;
mod attribution;
mod body;
mod builder;
mod client;
mod clock;
mod connector;
mod dns;
mod error;
mod fanout;
mod handle;
mod kernel;
mod metrics;
mod middleware;
mod miss;
#[cfg(feature = "otlp")]
pub mod otlp;
mod pool;
mod proxy;
mod redact;
mod redirect;
mod registry;
mod report;
mod request;
pub mod semconv;
mod setup;
mod tcp;
mod tls;

pub use advice::{DEFAULT_POOL_ADVICE_HOSTS, PoolAdvice};
pub use builder::{InstrumentedClientBuilder, ReqwestClientBuilder};
pub use connector::{ConnectFuture, ConnectService, ConnectorLayer};
pub use dns::{AddressOrder, SystemResolver, TracedResolver};
pub use error::BuildError;
pub use fanout::fan_out;
pub use handle::{
    ConnTrace, ConnTraceBuilder, DEFAULT_POOL_ADVICE_INTERVAL, DEFAULT_REGISTRY_CAPACITY,
};
pub use kernel::{TcpFacts, TcpInfo, TcpState};
pub use middleware::{
    ConnTraceMiddleware, DefaultMakeRequestSpan, MakeRequestSpan, UseCurrentSpan,
};
pub use miss::MissReason;
pub use pool::DEFAULT_POOL_HISTORY_HOSTS;
pub use redact::{DEFAULT_REDACTED_QUERY_KEYS, UrlRedaction, redact_url};
pub use report::{
    ConnectionSetup, ConnectionUse, DefaultOnRequestEnd, OnRequestEnd, RequestReport, TlsVersion,
};
pub use tls::TlsSettings;
