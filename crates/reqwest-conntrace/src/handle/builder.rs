//! [`ConnTraceBuilder`]: the settings a [`ConnTrace`] is built with.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};
use std::sync::{Arc, Weak};
use std::time::Duration;

use opentelemetry::global::{BoxedTracer, ObjectSafeTracerProvider};
use opentelemetry::metrics::{Meter, MeterProvider};
use opentelemetry::trace::TracerProvider;
use opentelemetry::{InstrumentationScope, KeyValue};

use super::conn_trace::{ConnTrace, DEFAULT_POOL_ADVICE_INTERVAL, DEFAULT_REGISTRY_CAPACITY};
use super::inner::{Inner, TracerSource, meter_for_new_handle, scope, scope_with};
use crate::export::clock::Clock;
use crate::export::metrics::{Metrics, PoolObservations};
use crate::export::phases::ConnectionPhases;
use crate::export::report::OnRequestEnd;
use crate::kernel::KernelView;
use crate::pool::advice::PoolLoad;
use crate::pool::model::PoolHistory;
use crate::pool::registry::Registry;
use crate::redact::UrlRedaction;

/// Makes the meter of a handle from its instrumentation scope (the meter
/// provider set with [`ConnTraceBuilder::meter_provider`]).
type MeterSource = Box<dyn FnOnce(InstrumentationScope) -> Meter + Send>;

/// Builds a [`ConnTrace`].
pub struct ConnTraceBuilder {
    tracer: TracerSource,
    meter: Option<MeterSource>,
    meter_scope_attributes: Vec<KeyValue>,
    advice_interval: Duration,
    advice_hosts: usize,
    history_hosts: usize,
    capacity: usize,
    on_request_end: Option<Box<dyn OnRequestEnd>>,
    redaction: UrlRedaction,
    phases: ConnectionPhases,
}

impl std::fmt::Debug for ConnTraceBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnTraceBuilder")
            .field("capacity", &self.capacity)
            .finish_non_exhaustive()
    }
}

impl Default for ConnTraceBuilder {
    fn default() -> Self {
        Self {
            tracer: TracerSource::Global,
            meter: None,
            meter_scope_attributes: Vec::new(),
            advice_interval: DEFAULT_POOL_ADVICE_INTERVAL,
            advice_hosts: crate::pool::advice::DEFAULT_POOL_ADVICE_HOSTS,
            history_hosts: crate::pool::model::DEFAULT_POOL_HISTORY_HOSTS,
            capacity: DEFAULT_REGISTRY_CAPACITY,
            on_request_end: None,
            redaction: UrlRedaction::default(),
            phases: ConnectionPhases::default(),
        }
    }
}

impl ConnTraceBuilder {
    /// Creates connection spans with a tracer from `provider` (instrumentation
    /// scope `reqwest-conntrace`, with this crate's version and the semconv
    /// schema URL). Request spans are `tracing` spans and go wherever the
    /// `tracing-opentelemetry` layer sends them; use the same provider there.
    /// Default: the global tracer provider, looked up at each connect.
    pub fn tracer_provider<P>(mut self, provider: &P) -> Self
    where
        P: TracerProvider + ObjectSafeTracerProvider,
        P::Tracer: Send + Sync + 'static,
    {
        self.tracer =
            TracerSource::Fixed(Arc::new(BoxedTracer::new(provider.boxed_tracer(scope()))));
        self
    }

    /// Records metrics (see [`semconv`](crate::semconv)'s metric names) with
    /// a meter from `provider` (scope `reqwest-conntrace`). Default: the
    /// global meter provider as installed when [`build`](Self::build) runs;
    /// install yours first, or set it here (the `otlp` set-up functions
    /// fail with `OtlpError::BuiltBeforePipeline` when a handle took the
    /// global meter before they installed theirs).
    pub fn meter_provider<P>(mut self, provider: &P) -> Self
    where
        P: MeterProvider + Clone + Send + 'static,
    {
        let provider = provider.clone();
        self.meter = Some(Box::new(move |scope| provider.meter_with_scope(scope)));
        self
    }

    /// Attributes of the instrumentation scope of this handle's metrics
    /// (the scope stays `reqwest-conntrace` with this crate's version), so
    /// handles sharing one meter provider export separate series: each
    /// handle's counters count its own clients only, and each handle's
    /// gauges (`http.client.open_connections`, `http.client.pool.*`) are
    /// not overwritten by another's for the same host. OpenTelemetry tells
    /// meters with different scope attributes apart (metrics API,
    /// *Get a Meter*); OTLP carries them as
    /// `InstrumentationScope.attributes`, and the collector's Prometheus
    /// exporter as `otel_scope_*` labels. Use a few fixed values (a client
    /// role, `conntrace probe`'s `conntrace.probe.mode`), never per-request
    /// data. Spans are unaffected. Default: none.
    pub fn meter_scope_attributes<I>(mut self, attributes: I) -> Self
    where
        I: IntoIterator<Item = KeyValue>,
    {
        self.meter_scope_attributes = attributes.into_iter().collect();
        self
    }

    /// The interval over which each host's peak in-flight requests is
    /// tracked for the pool advice, and at most how often the advice is
    /// logged per host. Default: [`DEFAULT_POOL_ADVICE_INTERVAL`] (60 s).
    pub fn pool_advice_interval(mut self, interval: Duration) -> Self {
        self.advice_interval = interval;
        self
    }

    /// The most hosts whose load (requests in flight, peak, idle limit) the
    /// pool advice tracks at once. A host is forgotten once it has had
    /// nothing in flight for two advice intervals (its peaks have rolled
    /// away). When every tracked host is still active, a new host is not
    /// tracked: no advice and no `http.client.pool.*` gauges for it, its
    /// requests carry `http.connection.untracked = pool_advice` and count in
    /// `http.client.requests.untracked`, and one WARN line (target
    /// `reqwest_conntrace`) names this setting. Default:
    /// [`DEFAULT_POOL_ADVICE_HOSTS`](crate::DEFAULT_POOL_ADVICE_HOSTS) (1,024).
    pub fn pool_advice_hosts(mut self, hosts: usize) -> Self {
        self.advice_hosts = hosts;
        self
    }

    /// The most hosts whose connections the pool history (what a miss's
    /// reason is read from) remembers at once. When it is full, a host
    /// whose connections are all closed or idle-expired is forgotten (the
    /// one unused the longest; its next miss reads `cold`, its pool having
    /// emptied). When every remembered host still has a live connection, a
    /// miss to a further host is untracked: it carries
    /// `http.connection.untracked = pool_history` instead of
    /// `http.connection.miss_reason`, counts in
    /// `http.client.requests.untracked`, and one WARN line (target
    /// `reqwest_conntrace`) names this setting. The same applies to a host
    /// once it had more than 16,384 open connections at once (one was
    /// forgotten). Default:
    /// [`DEFAULT_POOL_HISTORY_HOSTS`](crate::DEFAULT_POOL_HISTORY_HOSTS) (1,024).
    pub fn pool_history_hosts(mut self, hosts: usize) -> Self {
        self.history_hosts = hosts;
        self
    }

    /// The most connections the handle tracks at once (a memory cap). A
    /// connection is tracked from its connect until its close is observed,
    /// so the registry holds what the instrumented clients hold; no tracked
    /// connection is ever forgotten to make room. From three quarters full,
    /// connections that closed unnoticed are swept out (idle past the pool's
    /// idle timeout; at most once a second, the kernel's view of the
    /// idle-longest ones). At the cap a new connection is not tracked: its
    /// requests carry `http.connection.untracked = connection_registry`
    /// instead of `http.connection.id`, `reused` and a miss reason, count in
    /// `http.client.requests.untracked`, and one WARN line (target
    /// `reqwest_conntrace`) names this setting. The requests themselves are
    /// unaffected. Default: [`DEFAULT_REGISTRY_CAPACITY`] (65,536).
    pub fn registry_capacity(mut self, capacity: usize) -> Self {
        self.capacity = capacity;
        self
    }

    /// Called with a [`RequestReport`](crate::RequestReport) when each request
    /// ends. Default: [`DefaultOnRequestEnd`](crate::DefaultOnRequestEnd) (nothing, and no report is built).
    pub fn on_request_end(mut self, callback: impl OnRequestEnd) -> Self {
        self.on_request_end = Some(Box::new(callback));
        self
    }

    /// How URLs and error texts are redacted before they are exported
    /// (`url.full`, span status, `exception.message`) or handed out
    /// ([`RequestReport::url`](crate::RequestReport::url)): add query keys,
    /// or redact every query value. Default: [`UrlRedaction::default`]
    /// (credentials and the [`DEFAULT_REDACTED_QUERY_KEYS`](crate::DEFAULT_REDACTED_QUERY_KEYS)).
    pub fn url_redaction(mut self, redaction: UrlRedaction) -> Self {
        self.redaction = redaction;
        self
    }

    /// How each new connection's phases (`dns.lookup`, `tcp.connect`,
    /// `proxy.connect`, `tls.handshake`) are recorded: as child spans of its
    /// `http.connection_setup` span, or as events on it
    /// ([`ConnectionPhases::Events`]: one span per new connection instead
    /// of up to 4, the same attributes and timings; see the README's Cost
    /// section for what it saves). Metrics and
    /// [`RequestReport`](crate::RequestReport)s are the same either way.
    /// Default: [`ConnectionPhases::Spans`].
    pub fn connection_phases(mut self, phases: ConnectionPhases) -> Self {
        self.phases = phases;
        self
    }

    /// The handle.
    pub fn build(self) -> ConnTrace {
        let scope = scope_with(self.meter_scope_attributes);
        let meter = match self.meter {
            Some(make) => make(scope),
            None => meter_for_new_handle(scope),
        };
        ConnTrace {
            inner: Arc::new_cyclic(|weak| Inner {
                registry: Registry::new(self.capacity),
                pools: PoolHistory::new(self.history_hosts),
                load: PoolLoad::new(self.advice_interval, self.advice_hosts),
                metrics: Metrics::new(&meter, weak.clone() as Weak<dyn PoolObservations>),
                kernel: KernelView::new(),
                registry_full_logged: AtomicBool::new(false),
                open_sets: std::sync::Mutex::new(Vec::new()),
                clients_built: AtomicU64::new(0),
                connects_in_flight: AtomicUsize::new(0),
                clock: Clock::new(),
                tracer: self.tracer,
                on_request_end: self.on_request_end,
                redaction: self.redaction,
                phases: self.phases,
            }),
        }
    }
}
