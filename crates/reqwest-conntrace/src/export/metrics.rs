//! The handle's OpenTelemetry metrics: semantic-convention HTTP client and
//! DNS metrics, and this crate's own pool metrics (names in [`semconv`]).
//!
//! Cardinality is bounded by design: attributes are the method, scheme,
//! server address and port, status code, protocol version, TLS version,
//! error type and our enumerated values; never a URL, path, peer address or
//! connection id.

use std::sync::{Arc, Mutex, Weak};
use std::time::Instant;

use opentelemetry::KeyValue;
use opentelemetry::metrics::{
    Counter, Histogram, Meter, ObservableGauge, ObservableUpDownCounter, UpDownCounter,
};

use crate::semconv;

/// A host's gauges (`http.client.pool.peak_in_flight` / `.idle_limit`),
/// as the pool model reports them.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct HostGauges {
    pub(crate) server_address: String,
    pub(crate) server_port: u16,
    pub(crate) peak_in_flight: u64,
    /// The idle limit and where it came from (the
    /// `http.connection.pool.limits` value: `configured` or `inferred`).
    pub(crate) idle_limit: Option<(usize, &'static str)>,
}

/// Explicit bucket boundaries (seconds) the HTTP semantic conventions advise
/// for `http.client.request.duration` (semconv v1.42.0); used for every
/// duration histogram here.
pub(crate) const DURATION_BUCKETS: [f64; 14] = [
    0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
];

/// What the observable instruments read at each collection; implemented by
/// the handle, which the instruments hold only weakly.
pub(crate) trait PoolObservations: Send + Sync {
    /// Open connections by attribute set, for `http.client.open_connections`.
    fn open_connections(self: Arc<Self>, now: Instant) -> Vec<(Vec<KeyValue>, i64)>;
    /// Per host: this interval's peak in flight and the idle limit.
    fn pool_gauges(&self, now: Instant) -> Vec<HostGauges>;
}

/// Every instrument of one handle.
pub(crate) struct Metrics {
    pub(crate) request_duration: Histogram<f64>,
    pub(crate) active_requests: UpDownCounter<i64>,
    pub(crate) dns_duration: Histogram<f64>,
    pub(crate) connection_duration: Histogram<f64>,
    pub(crate) setup_duration: Histogram<f64>,
    pub(crate) connections_opened: Counter<u64>,
    pub(crate) pool_misses: Counter<u64>,
    pub(crate) untracked_requests: Counter<u64>,
    // Kept alive: the SDK calls their callbacks while they exist.
    _open_connections: ObservableUpDownCounter<i64>,
    _peak_in_flight: ObservableGauge<u64>,
    _idle_limit: ObservableGauge<u64>,
    /// What the observable instruments report once the handle is gone.
    last: Arc<Mutex<Option<FinalObservations>>>,
}

/// The observable instruments' values when the handle was dropped, so a
/// final export (the pipeline's shutdown usually runs after the handle is
/// gone) still carries every instrument.
#[derive(Debug, Default)]
pub(crate) struct FinalObservations {
    /// `http.client.open_connections` by attribute set (0: the handle's
    /// clients are gone).
    pub(crate) open: Vec<(Vec<KeyValue>, i64)>,
    /// Per-host pool gauges.
    pub(crate) hosts: Vec<HostGauges>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

fn histogram(meter: &Meter, name: &'static str, description: &'static str) -> Histogram<f64> {
    meter
        .f64_histogram(name)
        .with_unit("s")
        .with_description(description)
        .with_boundaries(DURATION_BUCKETS.to_vec())
        .build()
}

impl Metrics {
    /// Creates the instruments; the observable ones read `inner` at each
    /// collection (a `Weak`, so they never keep the handle alive).
    pub(crate) fn new(meter: &Meter, inner: Weak<dyn PoolObservations>) -> Self {
        let open_inner = inner.clone();
        let peak_inner = inner.clone();
        let limit_inner = inner;
        let last: Arc<Mutex<Option<FinalObservations>>> = Arc::default();
        let (open_last, peak_last, limit_last) = (last.clone(), last.clone(), last.clone());
        Self {
            last,
            request_duration: histogram(
                meter,
                semconv::HTTP_CLIENT_REQUEST_DURATION,
                "Duration of HTTP client requests, to the end of the response body.",
            ),
            active_requests: meter
                .i64_up_down_counter(semconv::HTTP_CLIENT_ACTIVE_REQUESTS)
                .with_unit("{request}")
                .with_description("Number of active HTTP requests.")
                .build(),
            dns_duration: histogram(
                meter,
                semconv::DNS_LOOKUP_DURATION,
                "Measures the time taken to perform a DNS lookup.",
            ),
            connection_duration: histogram(
                meter,
                semconv::HTTP_CLIENT_CONNECTION_DURATION,
                "The duration of the successfully established outbound HTTP connections.",
            ),
            setup_duration: histogram(
                meter,
                semconv::HTTP_CLIENT_CONNECTION_SETUP_DURATION,
                "Time from the pool miss to the new connection being ready (DNS, TCP, proxy, TLS).",
            ),
            connections_opened: meter
                .u64_counter(semconv::HTTP_CLIENT_CONNECTIONS_OPENED)
                .with_unit("{connection}")
                .with_description("New connections established.")
                .build(),
            pool_misses: meter
                .u64_counter(semconv::HTTP_CLIENT_POOL_MISSES)
                .with_unit("{request}")
                .with_description(
                    "Requests not served by an idle pooled connection, by http.connection.miss_reason.",
                )
                .build(),
            untracked_requests: meter
                .u64_counter(semconv::HTTP_CLIENT_REQUESTS_UNTRACKED)
                .with_unit("{request}")
                .with_description(
                    "Requests whose pool facts are missing because a bounded table was full, by http.connection.untracked.",
                )
                .build(),
            _open_connections: meter
                .i64_observable_up_down_counter(semconv::HTTP_CLIENT_OPEN_CONNECTIONS)
                .with_unit("{connection}")
                .with_description(
                    "Number of outbound HTTP connections that are currently active or idle on the client.",
                )
                .with_callback(move |observer| {
                    if let Some(inner) = open_inner.upgrade() {
                        for (attributes, count) in inner.open_connections(Instant::now()) {
                            observer.observe(count, &attributes);
                        }
                    } else if let Ok(last) = open_last.lock()
                        && let Some(last) = last.as_ref()
                    {
                        for (attributes, count) in &last.open {
                            observer.observe(*count, attributes);
                        }
                    }
                })
                .build(),
            _peak_in_flight: meter
                .u64_observable_gauge(semconv::HTTP_CLIENT_POOL_PEAK_IN_FLIGHT)
                .with_unit("{request}")
                .with_description(
                    "Peak number of concurrent requests to the host since the current advice interval started.",
                )
                .with_callback(move |observer| {
                    let observe = |gauges: &[HostGauges]| {
                        for g in gauges {
                            observer.observe(g.peak_in_flight, &host_attributes(&g.server_address, g.server_port));
                        }
                    };
                    if let Some(inner) = peak_inner.upgrade() {
                        observe(&inner.pool_gauges(Instant::now()));
                    } else if let Ok(last) = peak_last.lock()
                        && let Some(last) = last.as_ref()
                    {
                        observe(&last.hosts);
                    }
                })
                .build(),
            _idle_limit: meter
                .u64_observable_gauge(semconv::HTTP_CLIENT_POOL_IDLE_LIMIT)
                .with_unit("{connection}")
                .with_description(
                    "pool_max_idle_per_host of the client serving the host: set through reqwest-conntrace (http.connection.pool.limits=configured) or inferred from the connections its pool closed (inferred).",
                )
                .with_callback(move |observer| {
                    let observe = |gauges: &[HostGauges]| {
                        for g in gauges {
                            if let Some((limit, source)) = g.idle_limit {
                                let [address, port] = host_attributes(&g.server_address, g.server_port);
                                let source = KeyValue::new(semconv::HTTP_CONNECTION_POOL_LIMITS, source);
                                observer.observe(limit as u64, &[address, port, source]);
                            }
                        }
                    };
                    if let Some(inner) = limit_inner.upgrade() {
                        observe(&inner.pool_gauges(Instant::now()));
                    } else if let Ok(last) = limit_last.lock()
                        && let Some(last) = last.as_ref()
                    {
                        observe(&last.hosts);
                    }
                })
                .build(),
        }
    }
}

impl Metrics {
    /// Keeps what the observable instruments report after the handle is
    /// dropped.
    pub(crate) fn keep_final(&self, last: FinalObservations) {
        if let Ok(mut slot) = self.last.lock() {
            *slot = Some(last);
        }
    }
}

/// `server.address` and `server.port`.
pub(crate) fn host_attributes(address: &str, port: u16) -> [KeyValue; 2] {
    [
        KeyValue::new(semconv::SERVER_ADDRESS, address.to_owned()),
        KeyValue::new(semconv::SERVER_PORT, i64::from(port)),
    ]
}
