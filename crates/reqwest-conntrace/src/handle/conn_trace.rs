//! [`ConnTrace`], the handle users clone into every client they
//! instrument, and its public queries.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::builder::ConnTraceBuilder;
use super::inner::Inner;

/// Default cap on the connections one handle tracks at once: 65,536.
///
/// The registry keeps every connection until its close is observed, so it
/// holds what the instrumented clients hold; this is only a safety cap on
/// its memory (`benches/scale.rs` measures the instrumentation's memory per
/// connection). Past it, new connections are untracked (see
/// [`ConnTraceBuilder::registry_capacity`]). 65,536: above the ~28,000
/// ephemeral ports Linux gives one destination (`ip_local_port_range`
/// 32768-60999) and the default file-descriptor limits, so a client reaches
/// it only with many destinations and a raised `ulimit -n`.
pub const DEFAULT_REGISTRY_CAPACITY: usize = 65_536;

/// Default interval over which the pool advice tracks each host's peak
/// in-flight requests, and at most how often it logs per host: 60 s.
pub const DEFAULT_POOL_ADVICE_INTERVAL: Duration = Duration::from_secs(60);

/// The instrumentation handle. Cheap to clone (one `Arc`); clone it into
/// every client it instruments so their connections share one registry.
///
/// ```no_run
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let conntrace = reqwest_conntrace::ConnTrace::new();
/// let client = conntrace
///     .instrument_client(reqwest::Client::builder())
///     // pool settings here, not on reqwest's builder (which cannot be read back)
///     .pool_max_idle_per_host(8)
///     .build_with_middleware()?;
/// let response = client.get("https://example.com/").send().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct ConnTrace {
    pub(super) inner: Arc<Inner>,
}

impl std::fmt::Debug for ConnTrace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnTrace")
            .field("connections", &self.inner.registry.len())
            .finish_non_exhaustive()
    }
}

impl Default for ConnTrace {
    fn default() -> Self {
        Self::new()
    }
}

impl ConnTrace {
    /// A handle using the global OpenTelemetry tracer provider (looked up at
    /// each connect) and no request callback.
    pub fn new() -> Self {
        Self::builder().build()
    }

    /// A builder for a handle with a specific tracer provider, registry size
    /// or [`OnRequestEnd`](crate::OnRequestEnd) callback.
    pub fn builder() -> ConnTraceBuilder {
        ConnTraceBuilder::default()
    }

    pub(crate) fn inner(&self) -> &Arc<Inner> {
        &self.inner
    }

    /// Number of connections the registry currently remembers.
    pub fn known_connections(&self) -> usize {
        self.inner.registry.len()
    }

    /// Pool-size advice (Little's law) for every host whose peak number of
    /// requests in flight in the current advice interval exceeded the idle
    /// limit set with
    /// [`InstrumentedClientBuilder::pool_max_idle_per_host`](crate::InstrumentedClientBuilder::pool_max_idle_per_host)
    /// and forced `all_busy` misses. Empty when no pool is too small (or no
    /// idle limit is known).
    pub fn pool_advice(&self) -> Vec<crate::PoolAdvice> {
        self.inner.load.advice(Instant::now())
    }

    /// The most requests to `server_address:server_port` in flight at once
    /// in the current advice interval: the number the pool advice, its WARN
    /// line and the `http.client.pool.peak_in_flight` gauge report (one
    /// definition, see [`PoolAdvice`](crate::PoolAdvice)). `None` when no
    /// request to that host went through the middleware (or it was
    /// forgotten: at most 1024 hosts are tracked).
    pub fn peak_in_flight(&self, server_address: &str, server_port: u16) -> Option<u64> {
        self.inner
            .load
            .peak_in_flight(server_address, server_port, Instant::now())
    }

    /// Number of clients built from this handle with
    /// [`instrument_client`](Self::instrument_client). A number that keeps
    /// growing means a client per request or per task (miss reason
    /// `new_client`).
    pub fn clients_built(&self) -> u64 {
        self.inner.clients_built.load(Ordering::Relaxed)
    }

    /// Connects of this handle's clients not finished yet, including those
    /// that finish in the background after their request was served by
    /// another connection; [`connects_in_flight`](crate::connects_in_flight)
    /// counts the whole process's. Never blocks.
    pub fn connects_in_flight(&self) -> usize {
        self.inner.connects_in_flight.load(Ordering::SeqCst)
    }
}
