//! The [`ConnTrace`] handle: registry, tracer and settings shared by the
//! connector layer, the resolver wrapper, the TLS hooks and the middleware.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};

use std::time::{Duration, Instant};

use opentelemetry::global::{BoxedTracer, ObjectSafeTracerProvider};
use opentelemetry::metrics::{Meter, MeterProvider};
use opentelemetry::trace::TracerProvider;
use opentelemetry::{InstrumentationScope, KeyValue};

use crate::export::clock::Clock;
use crate::export::metrics::HostGauges;
use crate::export::metrics::{Metrics, PoolObservations};
use crate::export::phases::ConnectionPhases;
use crate::export::report::OnRequestEnd;
use crate::kernel::{KernelLookup, KernelView};
use crate::miss::{ConnectionEnd, MissReason};
use crate::pool::advice::PoolLoad;
use crate::pool::client::ClientState;
use crate::pool::host::HostKey;
use crate::pool::inferred::{
    CLOSED_AT_RELEASE, LimitSource, PoolClose, pool_close, pool_close_after,
};
use crate::pool::model::{
    KernelQuestion, MissVerdict, PoolHistory, PoolOff, RESPONSE_IN_FLIGHT_WAIT, ReportedEnd,
    decide_from_kernel, gone_at_release, look_again_at, may_wait_for_pool_off,
    reported_closed_at_release, reported_end, response_may_explain_end, tls_closed_at_release,
};
use crate::pool::registry::{ConnectionRecord, Registry};
use crate::pool::slot::{MissSlot, PendingMiss};
use crate::redact::UrlRedaction;
use crate::semconv;

/// Process-wide connection ids, so that ids from several handles never clash.
static NEXT_CONNECTION_ID: AtomicU64 = AtomicU64::new(1);
/// Process-wide request ids (internal: match a connect to its trigger).
static NEXT_REQUEST_ID: AtomicU64 = AtomicU64::new(1);

/// Handles built on the global meter provider before a pipeline installed
/// one (their metrics go to the no-op provider); see [`global_meter_installed`].
static BUILT_ON_NOOP_METER: AtomicU64 = AtomicU64::new(0);
/// Set once a pipeline of this crate installed the global meter provider.
static GLOBAL_METER_SET: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Handles that took the global meter before any pipeline installed one.
#[cfg_attr(not(feature = "otlp"), allow(dead_code))]
pub(crate) fn handles_on_global_meter() -> usize {
    BUILT_ON_NOOP_METER.load(Ordering::Relaxed) as usize
}

/// A pipeline installed the global meter provider: handles built from now
/// on record there.
#[cfg_attr(not(feature = "otlp"), allow(dead_code))]
pub(crate) fn global_meter_installed() {
    GLOBAL_METER_SET.store(true, Ordering::Relaxed);
}

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
    inner: Arc<Inner>,
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

pub(crate) enum TracerSource {
    /// Look up the global tracer provider at each connect, so a provider
    /// installed after the handle was made is still used.
    Global,
    Fixed(Arc<BoxedTracer>),
}

pub(crate) struct Inner {
    pub(crate) registry: Registry,
    pub(crate) pools: PoolHistory,
    pub(crate) load: PoolLoad,
    pub(crate) metrics: Metrics,
    /// The kernel's view of sockets (sock_diag), one thread per handle.
    pub(crate) kernel: KernelView,
    /// The registry-full warning was logged.
    registry_full_logged: AtomicBool,
    /// Attribute sets `http.client.open_connections` has reported, so a
    /// set whose connections all closed reports 0 instead of vanishing.
    open_sets: std::sync::Mutex<Vec<Vec<KeyValue>>>,
    clients_built: AtomicU64,
    /// Connects of this handle not finished yet (`connector::InFlightCount`).
    pub(crate) connects_in_flight: AtomicUsize,
    pub(crate) clock: Clock,
    tracer: TracerSource,
    /// `None` for [`DefaultOnRequestEnd`](crate::DefaultOnRequestEnd): no report is built.
    pub(crate) on_request_end: Option<Box<dyn OnRequestEnd>>,
    /// The redaction of every URL and error text this handle exports.
    pub(crate) redaction: UrlRedaction,
    /// Phase spans or phase events on the setup span.
    pub(crate) phases: ConnectionPhases,
}

impl PoolObservations for Inner {
    fn open_connections(self: Arc<Self>, now: Instant) -> Vec<(Vec<KeyValue>, i64)> {
        Inner::open_connections(&self, now)
    }

    fn pool_gauges(&self, now: Instant) -> Vec<HostGauges> {
        self.load.gauges(now)
    }
}

fn scope() -> InstrumentationScope {
    InstrumentationScope::builder(env!("CARGO_PKG_NAME"))
        .with_version(env!("CARGO_PKG_VERSION"))
        .with_schema_url(opentelemetry_semantic_conventions::SCHEMA_URL)
        .build()
}

/// The tracer of one connect's spans: the global provider's, looked up for
/// it (no allocation for the no-op provider, whose tracer is zero-sized),
/// or the handle's own, shared.
pub(crate) enum ConnectTracer {
    Global(BoxedTracer),
    Fixed(Arc<BoxedTracer>),
}

impl std::ops::Deref for ConnectTracer {
    type Target = BoxedTracer;

    fn deref(&self) -> &BoxedTracer {
        match self {
            ConnectTracer::Global(t) => t,
            ConnectTracer::Fixed(t) => t,
        }
    }
}

impl Inner {
    /// The tracer connection spans are created with.
    pub(crate) fn tracer(&self) -> ConnectTracer {
        match &self.tracer {
            TracerSource::Global => ConnectTracer::Global(
                opentelemetry::global::tracer_provider().tracer_with_scope(scope()),
            ),
            TracerSource::Fixed(t) => ConnectTracer::Fixed(t.clone()),
        }
    }

    pub(crate) fn next_connection_id(&self) -> u64 {
        NEXT_CONNECTION_ID.fetch_add(1, Ordering::Relaxed)
    }

    pub(crate) fn next_request_id(&self) -> u64 {
        NEXT_REQUEST_ID.fetch_add(1, Ordering::Relaxed)
    }

    /// A connection's close was observed at `at`: count its lifetime once
    /// and forget it.
    pub(crate) fn connection_closed(&self, record: &ConnectionRecord, at: Instant) {
        if !record.mark_closed() {
            return;
        }
        let lifetime = at.saturating_duration_since(record.ready_at());
        self.metrics
            .connection_duration
            .record(lifetime.as_secs_f64(), &connection_attributes(record));
        if let (Some(l), Some(r)) = (record.setup.local_addr, record.setup.peer_addr) {
            self.registry.remove(l, r, record.id());
        }
    }

    /// Records that `record`'s client's own pool closed it (`close`): a
    /// bound on a limit this crate could not read. Releases after it
    /// counted it idle while it was not (see `uncount_closed`).
    fn note_pool_close(&self, record: &ConnectionRecord, close: PoolClose) {
        if !record.is_closed()
            && !record.client.max_idle_known
            && let Some(host) = &record.host
        {
            self.pools.uncount_closed(host, record, close);
        }
        record.client.inferred.observe(close);
        close.mark(record);
    }

    /// Applies the kernel's answer about `record`'s socket: a close the
    /// kernel shows is counted (and remembered as the server's when the
    /// server closed first); a socket still established after a release
    /// over the idle limit leaves that release in doubt. `asked_at`: when
    /// the lookup was asked for (see [`note_close_at_release`](Self::note_close_at_release)).
    pub(crate) fn apply_kernel_view(
        &self,
        record: &ConnectionRecord,
        lookup: &KernelLookup,
        asked_at: Instant,
    ) {
        let now = Instant::now();
        self.note_close_at_release(record, lookup, now, asked_at.min(now));
        match lookup {
            KernelLookup::Found(facts) if facts.state == crate::TcpState::Established => {
                // Over the idle limit yet established: the pool kept it, or
                // has not closed it yet (hyper-util closes it on a task of
                // its own): a doubt, which a response on it clears.
                if record.clear_over_idle_limit() {
                    record.set_over_idle_limit_unsure(true);
                }
            }
            KernelLookup::Found(facts) => {
                if facts.state.closed_by_peer() {
                    record.closed_by_server(true);
                } else if record.is_dropped_early() {
                    record.mark_discarded(record.last_activity());
                } else if !record.client.limits_known()
                    && let Some(close) = pool_close(record, facts, Instant::now(), false)
                {
                    // The client's own pool closed it: a bound on a limit
                    // this crate could not read.
                    self.note_pool_close(record, close);
                }
                self.connection_closed(record, Instant::now());
            }
            KernelLookup::NotFound => {
                // Gone at once (no TIME_WAIT on our side): the server closed
                // first, unless we know our side dropped it.
                if record.is_dropped_early() {
                    record.mark_discarded(record.last_activity());
                } else if let Some(ReportedEnd::Ours { idle }) = reported_end(record) {
                    // Our close, which the server's close_notify reset: as a
                    // dated close of ours above.
                    if !record.client.limits_known()
                        && let Some(close) = pool_close_after(record, idle, false)
                    {
                        self.note_pool_close(record, close);
                    }
                } else if !record.is_discarded()
                    && !record.is_over_idle_limit()
                    && !record.awaits_socket_end()
                    && !crate::pool::model::gone_after_own_close(record, Instant::now())
                {
                    record.closed_by_server(false);
                }
                self.connection_closed(record, Instant::now());
            }
            KernelLookup::Unavailable | KernelLookup::TimedOut => {}
        }
    }

    /// Notes the kernel's `lookup` (at `now`) of `record`, a connection of
    /// a client whose idle limit this crate could not read, when it shows
    /// that client's pool closed it at its release: dated by a timer within
    /// [`CLOSED_AT_RELEASE`](crate::pool::inferred::CLOSED_AT_RELEASE) of
    /// the release (over TLS too: a `TIME_WAIT` that soon is no server's
    /// idle close, which comes after its keep-alive timeout), or found gone
    /// that soon ([`gone_at_release`]), or over TLS found closed in any way
    /// that soon ([`tls_closed_at_release`]). "That soon" is reckoned from
    /// `asked_at`, when the lookup was asked for, not from when a starved
    /// kernel thread answered it: what could close the connection between
    /// the two is no server's idle close (it comes seconds after the
    /// release). Once the client's connections
    /// to the host show its pool keeps none
    /// ([`PoolHistory::shows_pool_off`]), its idle limit is inferred as 0
    /// (row 3b).
    fn note_close_at_release(
        &self,
        record: &ConnectionRecord,
        lookup: &KernelLookup,
        now: Instant,
        asked_at: Instant,
    ) {
        let client = &record.client;
        if client.max_idle_known || client.inferred.keeps_idle() || record.is_closed_at_release() {
            return;
        }
        let at_release = match lookup {
            KernelLookup::Found(facts) => matches!(
                pool_close(record, facts, now, false),
                Some(PoolClose::AtRelease { .. } | PoolClose::Unsure)
            ),
            // Over TLS the kernel's report of the socket's end dates our
            // close itself, however late the lookup was asked for.
            KernelLookup::NotFound => {
                gone_at_release(record, asked_at) || reported_closed_at_release(record)
            }
            KernelLookup::Unavailable | KernelLookup::TimedOut => false,
        } || tls_closed_at_release(record, lookup, asked_at);
        if !at_release {
            return;
        }
        record.mark_closed_at_release();
        if let Some(host) = &record.host
            && self.pools.shows_pool_off(host, client)
        {
            client.inferred.observe(PoolClose::AtRelease {
                idle_others: Some(0),
            });
        }
    }

    /// Tracks a new connection in the registry. From three quarters full on
    /// it first sweeps for connections that closed unnoticed; at the cap the
    /// connection stays untracked (its requests carry
    /// `http.connection.untracked`), with one warning per handle naming the
    /// setting to raise.
    pub(crate) fn register(self: &Arc<Self>, record: Arc<ConnectionRecord>, now: Instant) {
        if self.registry.sweep_due(now) {
            // Off the request path: the connect that called this is some
            // request's poll.
            let inner = Arc::clone(self);
            match tokio::runtime::Handle::try_current() {
                Ok(runtime) => drop(runtime.spawn_blocking(move || inner.sweep(now))),
                Err(_) => inner.sweep(now),
            }
        }
        if record.setup.tls.is_some()
            && !record.http2()
            && let (Some(l), Some(r)) = (record.setup.local_addr, record.setup.peer_addr)
        {
            // Over TLS a socket found gone may be a close of ours the
            // server's close_notify reset: the kernel's report of its end
            // tells (see `pool::model::reported_end`).
            let sink: std::sync::Weak<dyn crate::kernel::SocketEndSink> =
                Arc::downgrade(&record) as _;
            if crate::kernel::watch_end(l, r, sink) {
                record.mark_end_watched();
            }
        }
        if let Err(full) = self.registry.insert(record)
            && !self.registry_full_logged.swap(true, Ordering::Relaxed)
        {
            tracing::warn!(
                target: "reqwest_conntrace",
                "connection registry full: {} open connections tracked; requests on newer connections are untracked ({}={}); raise ConnTraceBuilder::registry_capacity",
                full.capacity,
                semconv::HTTP_CONNECTION_UNTRACKED,
                semconv::UNTRACKED_CONNECTION_REGISTRY,
            );
        }
    }

    /// Marks a request whose facts `table` could not hold: the
    /// `http.connection.untracked` attribute and the
    /// `http.client.requests.untracked` counter.
    pub(crate) fn note_untracked(&self, span: &tracing::Span, host: &HostKey, table: &'static str) {
        use tracing_opentelemetry::OpenTelemetrySpanExt;
        span.set_attribute(semconv::HTTP_CONNECTION_UNTRACKED, table);
        let [address, port, scheme] = host.attributes();
        let attributes = [
            address,
            port,
            scheme,
            KeyValue::new(semconv::HTTP_CONNECTION_UNTRACKED, table),
        ];
        self.metrics.untracked_requests.add(1, &attributes);
    }

    /// Forgets connections that closed without the handle seeing it: idle
    /// past their client's idle timeout (hyper-util's pool dropped them) at
    /// once; the idle-longest others (at most
    /// [`SWEEP_KERNEL_CHECKS`](crate::pool::registry::SWEEP_KERNEL_CHECKS)) when
    /// the kernel shows their socket closed. Never one in use.
    fn sweep(self: &Arc<Self>, now: Instant) {
        let mut idle: Vec<Arc<ConnectionRecord>> = Vec::new();
        for record in self.registry.snapshot() {
            if record.is_closed() || record.in_use() > 0 {
                continue;
            }
            if let Some(t) = record.client.idle_timeout
                && now.saturating_duration_since(record.last_activity()) >= t
            {
                self.connection_closed(&record, record.last_activity() + t);
            } else {
                idle.push(record);
            }
        }
        let checks = crate::pool::registry::SWEEP_KERNEL_CHECKS;
        if idle.len() > checks {
            idle.select_nth_unstable_by_key(checks, |r| r.last_activity());
            idle.truncate(checks);
        }
        for record in idle {
            self.check_with_kernel(record);
        }
    }

    /// Asks the kernel about `record`'s socket; the answer applies when it
    /// arrives (see [`apply_kernel_view`](Self::apply_kernel_view)).
    /// A response came on `record`, whose release this crate believed over
    /// the idle limit: the pool had kept it, so a connection counted idle
    /// at that release was not in hyper-util's idle list (closed unbeknown
    /// to us: hyper-util dropped it in its release race while the kernel
    /// still showed it established). The client's other connections to the
    /// host believed idle are checked with the kernel, off the request
    /// path, so the next release counts right.
    pub(crate) fn recheck_believed_idle(self: &Arc<Self>, record: &ConnectionRecord) {
        let Some(host) = &record.host else {
            return;
        };
        for other in self
            .pools
            .idle_of_client(host, record.client.id, INFER_FOLLOW_UPS)
        {
            if other.id() != record.id() {
                self.check_with_kernel(other);
            }
        }
    }

    fn check_with_kernel(self: &Arc<Self>, record: Arc<ConnectionRecord>) {
        if let (Some(l), Some(r)) = (record.setup.local_addr, record.setup.peer_addr) {
            let weak = Arc::downgrade(self);
            let asked_at = Instant::now();
            self.kernel.lookup_batched(l, r, move |lookup| {
                if let Some(inner) = weak.upgrade() {
                    inner.apply_kernel_view(&record, &lookup, asked_at);
                }
            });
        }
    }

    /// Classifies the miss of a connect `client` is starting to `host` now
    /// (called from the connector layer when reqwest calls it): decided from
    /// the history, or when the kernel answers about the candidate connection.
    pub(crate) fn miss_slot(self: &Arc<Self>, host: &HostKey, client: &ClientState) -> MissSlot {
        let in_flight = self.load.in_flight(host);
        match self
            .pools
            .classify_miss(host, client, Instant::now(), in_flight)
        {
            MissVerdict::Decided(miss) => MissSlot::Decided(miss),
            MissVerdict::Closed { miss, record } => {
                let at = record.last_activity();
                record.mark_discarded(at);
                self.connection_closed(&record, at);
                MissSlot::Decided(miss)
            }
            MissVerdict::AskKernel(question) => {
                let slot = Arc::new(PendingMiss::new(question.alive));
                if !question.candidate.client.max_idle_known {
                    // The client's other connections believed idle first
                    // (answered in order, before the candidate): one closed
                    // unbeknown to us was counted idle at the candidate's
                    // release, which an inferred idle limit depends on.
                    self.recheck_believed_idle(&question.candidate);
                }
                let (local, remote) = (question.local, question.remote);
                let asked_at = question.classified_at;
                let ask = KernelAsk {
                    host: host.clone(),
                    question,
                    waited_for_response: false,
                    waited_for_pool_off: false,
                    first_answer: None,
                    asked_at,
                    pool_off_wait_over: false,
                    slot: slot.clone(),
                };
                self.kernel.lookup_then(local, remote, {
                    let weak = Arc::downgrade(self);
                    move |lookup| settle_miss(&weak, ask, &lookup)
                });
                MissSlot::Pending(slot)
            }
        }
    }

    /// Open connections by attribute set, for `http.client.open_connections`.
    /// Connections idle past their client's idle timeout are closed here
    /// (hyper-util's pool drops them then); every other one is checked with
    /// the kernel, whose answers apply from the next collection on.
    pub(crate) fn open_connections(self: &Arc<Self>, now: Instant) -> Vec<(Vec<KeyValue>, i64)> {
        let mut counts: Vec<(Vec<KeyValue>, i64)> = Vec::new();
        for record in self.registry.snapshot() {
            if record.is_closed() {
                continue;
            }
            if record.in_use() == 0
                && let Some(t) = record.client.idle_timeout
                && now.saturating_duration_since(record.last_activity()) >= t
            {
                self.connection_closed(&record, record.last_activity() + t);
                continue;
            }
            self.check_with_kernel(record.clone());
            if record.is_over_idle_limit() {
                continue;
            }
            let mut attributes = connection_attributes(&record);
            attributes.push(KeyValue::new(
                semconv::HTTP_CONNECTION_STATE,
                // A stalled connection is not a usable idle one.
                if record.in_use() > 0 || record.is_stalled() {
                    "active"
                } else {
                    "idle"
                },
            ));
            match counts.iter_mut().find(|(a, _)| *a == attributes) {
                Some((_, n)) => *n += 1,
                None => counts.push((attributes, 1)),
            }
        }
        let mut seen = self.open_sets.lock().unwrap_or_else(|e| e.into_inner());
        for (attributes, _) in &counts {
            if !seen.contains(attributes) && seen.len() < MAX_OPEN_SETS {
                seen.push(attributes.clone());
            }
        }
        for attributes in seen.iter() {
            if !counts.iter().any(|(a, _)| a == attributes) {
                counts.push((attributes.clone(), 0));
            }
        }
        counts
    }

    /// Counts one more client built from this handle.
    pub(crate) fn count_client(&self) {
        self.clients_built.fetch_add(1, Ordering::Relaxed);
    }
}

impl Drop for Inner {
    /// Hands the observable instruments their final values: 0 open
    /// connections for every set reported before or still in the registry
    /// (the clients are gone with the handle), the pool gauges as they are.
    fn drop(&mut self) {
        let mut open: Vec<(Vec<KeyValue>, i64)> = self
            .open_sets
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|a| (a.clone(), 0))
            .collect();
        for record in self.registry.snapshot() {
            let mut attributes = connection_attributes(&record);
            attributes.push(KeyValue::new(semconv::HTTP_CONNECTION_STATE, "idle"));
            if open.len() < MAX_OPEN_SETS && !open.iter().any(|(a, _)| *a == attributes) {
                open.push((attributes, 0));
            }
        }
        let hosts = self.load.gauges(Instant::now());
        self.metrics
            .keep_final(crate::export::metrics::FinalObservations { open, hosts });
    }
}

/// Most attribute sets remembered for reporting 0 open connections.
const MAX_OPEN_SETS: usize = 4096;

/// Other idle connections of the client checked with the kernel after a
/// close at release was inferred (their closes tighten the idle limit).
const INFER_FOLLOW_UPS: usize = 8;

/// How often a miss whose candidate its pool closed at release asks again
/// while the client's other connections released just before are not
/// seen closed yet (see [`PoolHistory::pool_off_evidence`]).
const POOL_OFF_LOOK_EVERY: std::time::Duration = std::time::Duration::from_millis(5);

/// A miss whose reason waits for the kernel's view of its candidate.
struct KernelAsk {
    host: HostKey,
    question: KernelQuestion,
    /// The second look after [`RESPONSE_IN_FLIGHT_WAIT`] was taken.
    waited_for_response: bool,
    /// It looked again at a candidate the kernel showed established, with
    /// other requests in flight ([`may_wait_for_pool_off`]): unless the
    /// pool is shown to keep none by the end, the miss is `alive`.
    waited_for_pool_off: bool,
    /// The kernel's first answer and when it came, kept while the miss
    /// waits for the client's pool to show it keeps none
    /// ([`PoolOff::Pending`]).
    first_answer: Option<(KernelLookup, Instant)>,
    /// When the lookup being answered was asked for (the miss, or when a
    /// look again was due): a close the answer shows came no later than
    /// that, as far as a late answer (a starved kernel thread) can date it
    /// ([`Inner::note_close_at_release`]).
    asked_at: Instant,
    /// That wait is over (it is taken once, for at most
    /// [`CLOSED_AT_RELEASE`] after the miss).
    pool_off_wait_over: bool,
    slot: Arc<PendingMiss>,
}

impl Drop for KernelAsk {
    /// A lookup dropped unanswered (the kernel view's thread ended with it
    /// still queued): the miss settles as if the kernel were silent.
    fn drop(&mut self) {
        if !self.slot.is_settled() {
            self.slot.set(self.question.alive);
        }
    }
}

/// The kernel answered `lookup` about `ask`'s candidate (on the kernel
/// view's thread): settles the miss, or asks again later when the
/// candidate's fate was still being decided (see [`look_again_at`]) or a
/// response in flight on it may explain the close the kernel shows (see
/// [`response_may_explain_end`]; asked once, after
/// [`RESPONSE_IN_FLIGHT_WAIT`]).
fn settle_miss(weak: &Weak<Inner>, ask: KernelAsk, lookup: &KernelLookup) {
    settle_miss_at(weak, ask, lookup, Instant::now());
}

/// [`settle_miss`] with the kernel's answer `lookup` as of `now`.
fn settle_miss_at(weak: &Weak<Inner>, mut ask: KernelAsk, lookup: &KernelLookup, now: Instant) {
    let inner = weak.upgrade();
    let candidate = &ask.question.candidate;
    // Its own close at release, before the rest: once the pool's closes
    // show it keeps none, the miss is decided at once (row 3b).
    let mut pool_off = inner.as_ref().is_some_and(|inner| {
        inner.note_close_at_release(candidate, lookup, now, ask.asked_at.min(now));
        !candidate.http2()
            && !candidate.client.max_idle_known
            && candidate.client.inferred.keeps_none()
    });
    if !pool_off
        && !ask.pool_off_wait_over
        && let Some(inner) = inner.as_ref()
        && (candidate.is_closed_at_release()
            || may_wait_for_pool_off(candidate, &ask.question.alive))
        && inner
            .pools
            .pool_off_evidence(
                &ask.host,
                &candidate.client,
                Some((now, ask.question.classified_at)),
            )
            .0
            == PoolOff::Shown
    {
        // Every connection the client released before this miss was closed
        // at its release (two or more): its pool keeps none (row 3b). The
        // ones released since, still on their way to the same close (this
        // answer can come late: a starved kernel thread, or a wave that
        // ended meanwhile), neither confirm nor refute it.
        candidate.client.inferred.observe(PoolClose::AtRelease {
            idle_others: Some(0),
        });
        pool_off = candidate.client.inferred.keeps_none();
    }
    if let Some(inner) = inner.as_ref().filter(|_| !pool_off) {
        if !ask.pool_off_wait_over
            && (candidate.is_closed_at_release()
                || may_wait_for_pool_off(candidate, &ask.question.alive))
            && let (PoolOff::Pending(until), pending) = inner.pools.pool_off_evidence(
                &ask.host,
                &candidate.client,
                Some((now, ask.question.classified_at)),
            )
            && now < until.min(ask.question.classified_at + CLOSED_AT_RELEASE)
        {
            // Closed at its release (or all busy, its pool's limits
            // unknown), and the client's other connections released just
            // before are on their way to the same close (a pool that keeps
            // none closes each on hyper-util's own task): asked again, with
            // them, until they are (row 3b) or their time is up. If they
            // are not, the miss is decided from this answer, as it would
            // have been.
            for other in pending {
                if other.id() != candidate.id() {
                    inner.check_with_kernel(other);
                }
            }
            ask.first_answer
                .get_or_insert_with(|| (lookup.clone(), now));
            let (local, remote) = (ask.question.local, ask.question.remote);
            let until = until.min(ask.question.classified_at + CLOSED_AT_RELEASE);
            let due = (now + POOL_OFF_LOOK_EVERY).min(until);
            let weak = weak.clone();
            ask.asked_at = due;
            inner.kernel.lookup_at(local, remote, due, move |lookup| {
                settle_miss(&weak, ask, &lookup);
            });
            return;
        }
        if let Some((first, answered)) = ask.first_answer.take() {
            ask.pool_off_wait_over = true;
            // Waited for a pool that keeps none, which did not show: the
            // answer the miss first had decides.
            settle_miss_at(weak, ask, &first, answered);
            return;
        }
        if let Some(due) = look_again_at(
            &ask.question.candidate,
            lookup,
            now,
            &ask.question.alive,
            ask.question.requests_seen,
            ask.question.classified_at,
        ) {
            if !ask.question.candidate.client.max_idle_known {
                // Their closes, answered first, may lower the idle count at
                // the candidate's release.
                inner.recheck_believed_idle(&ask.question.candidate);
            }
            if matches!(lookup, KernelLookup::Found(facts) if facts.state == crate::TcpState::Established)
                && may_wait_for_pool_off(&ask.question.candidate, &ask.question.alive)
            {
                ask.waited_for_pool_off = true;
            }
            let (local, remote) = (ask.question.local, ask.question.remote);
            let weak = weak.clone();
            ask.asked_at = due;
            inner.kernel.lookup_at(local, remote, due, move |lookup| {
                settle_miss(&weak, ask, &lookup);
            });
            return;
        }
        if !ask.waited_for_response
            && response_may_explain_end(
                &ask.question.candidate,
                lookup,
                ask.question.requests_seen,
                ask.question.others_in_flight,
            )
        {
            // Decided once a response in flight on it has had time to
            // show. The close is applied now (the history forgets closed
            // connections; a response still finds it among the registry's
            // recently closed, and its `Connection: close` replaces an
            // inferred end), but for a close of ours under limits this
            // crate cannot read: that one infers a limit, which a close
            // after `Connection: close` must not.
            let ours = matches!(
                lookup,
                KernelLookup::Found(facts) if facts.state.closed_by_us()
            );
            if !ours || ask.question.candidate.client.limits_known() {
                inner.apply_kernel_view(&ask.question.candidate, lookup, ask.asked_at);
            }
            ask.waited_for_response = true;
            ask.asked_at = now + RESPONSE_IN_FLIGHT_WAIT;
            let (local, remote) = (ask.question.local, ask.question.remote);
            let weak = weak.clone();
            inner
                .kernel
                .lookup_at(local, remote, now + RESPONSE_IN_FLIGHT_WAIT, move |later| {
                    settle_miss(&weak, ask, &later);
                });
            return;
        }
    }
    let mut miss = if ask.waited_for_pool_off && !pool_off {
        ask.question.alive
    } else {
        decide_from_kernel(
            candidate,
            lookup,
            now,
            ask.question.alive,
            ask.question.requests_seen,
            ask.question.classified_at,
        )
    };
    if let Some(inner) = &inner {
        inner.apply_kernel_view(candidate, lookup, ask.asked_at);
        if miss.reason == MissReason::AllBusy
            && miss.previous.is_none()
            && let Some(ended) = inner.pools.name_known_loss(
                &ask.host,
                candidate.client.id,
                ask.question.classified_at,
                now,
            )
        {
            // Busy, but a connection ended by its announced close is why
            // the pool had none free (row 4's exception).
            miss = ended;
        }
        if miss.limits == Some(LimitSource::Inferred)
            && miss.previous.and_then(|p| p.end) == Some(ConnectionEnd::IdleLimit)
        {
            // The idle count at its release may include connections already
            // closed over the limit: the client's other idle ones give
            // tighter bounds.
            for other in
                inner
                    .pools
                    .idle_of_client(&ask.host, candidate.client.id, INFER_FOLLOW_UPS)
            {
                if other.id() != candidate.id() {
                    inner.check_with_kernel(other);
                }
            }
        }
    }
    if let Some(previous) = &mut miss.previous {
        // Its idle time up to the miss, not up to the answer.
        previous.idle = previous
            .idle
            .saturating_sub(now.saturating_duration_since(ask.question.classified_at));
    }
    ask.slot.set(miss);
}

/// `server.address`, `server.port`, `url.scheme`, `network.protocol.version`
/// of a connection (no peer address: bounded cardinality).
pub(crate) fn connection_attributes(record: &ConnectionRecord) -> Vec<KeyValue> {
    let mut attributes = Vec::with_capacity(5);
    if let Some(host) = &record.host {
        attributes.extend(host.attributes());
    }
    attributes.push(KeyValue::new(
        semconv::NETWORK_PROTOCOL_VERSION,
        if record.http2() { "2" } else { "1.1" },
    ));
    attributes
}

impl ConnTrace {
    /// A handle using the global OpenTelemetry tracer provider (looked up at
    /// each connect) and no request callback.
    pub fn new() -> Self {
        Self::builder().build()
    }

    /// A builder for a handle with a specific tracer provider, registry size
    /// or [`OnRequestEnd`] callback.
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

/// Builds a [`ConnTrace`].
pub struct ConnTraceBuilder {
    tracer: TracerSource,
    meter: Option<Meter>,
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
    pub fn meter_provider<P: MeterProvider>(mut self, provider: &P) -> Self {
        self.meter = Some(provider.meter_with_scope(scope()));
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
        let meter = self.meter.unwrap_or_else(|| {
            if !GLOBAL_METER_SET.load(Ordering::Relaxed) {
                BUILT_ON_NOOP_METER.fetch_add(1, Ordering::Relaxed);
            }
            opentelemetry::global::meter_with_scope(scope())
        });
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
