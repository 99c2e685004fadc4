//! [`Inner`], what every clone of a [`ConnTrace`](super::ConnTrace) shares:
//! the registry of open connections, the pool history misses are read
//! from, the kernel view, the metrics, and what each observation changes
//! in them.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use opentelemetry::global::BoxedTracer;
use opentelemetry::metrics::Meter;
use opentelemetry::trace::TracerProvider;
use opentelemetry::{InstrumentationScope, KeyValue};

use super::settle::KernelAsk;
use crate::export::clock::Clock;
use crate::export::metrics::HostGauges;
use crate::export::metrics::{Metrics, PoolObservations};
use crate::export::phases::ConnectionPhases;
use crate::export::report::OnRequestEnd;
use crate::kernel::{KernelLookup, KernelView};
use crate::pool::advice::PoolLoad;
use crate::pool::client::ClientState;
use crate::pool::end_report::{
    ReportedEnd, reported_closed_at_release, reported_end, tls_closed_at_release,
};
use crate::pool::host::HostKey;
use crate::pool::inferred::{PoolClose, pool_close, pool_close_after};
use crate::pool::kernel_decision::{gone_at_release, tls_time_wait_is_servers};
use crate::pool::model::{MissVerdict, PoolHistory};
use crate::pool::record::ConnectionRecord;
use crate::pool::registry::Registry;
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

/// The meter of a handle built without a meter provider of its own: the
/// global meter provider's as installed now, for `scope` (counted when no
/// pipeline of this crate installed it yet, see
/// [`handles_on_global_meter`]).
pub(super) fn meter_for_new_handle(scope: InstrumentationScope) -> Meter {
    if !GLOBAL_METER_SET.load(Ordering::Relaxed) {
        BUILT_ON_NOOP_METER.fetch_add(1, Ordering::Relaxed);
    }
    opentelemetry::global::meter_with_scope(scope)
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
    pub(super) registry_full_logged: AtomicBool,
    /// Attribute sets `http.client.open_connections` has reported, so a
    /// set whose connections all closed reports 0 instead of vanishing.
    pub(super) open_sets: std::sync::Mutex<Vec<Vec<KeyValue>>>,
    pub(super) clients_built: AtomicU64,
    /// Connects of this handle not finished yet (`connector::InFlightCount`).
    pub(crate) connects_in_flight: AtomicUsize,
    pub(crate) clock: Clock,
    pub(super) tracer: TracerSource,
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

/// The instrumentation scope of every span and metric of this crate: its
/// name and version, and the semantic conventions' schema URL.
pub(super) fn scope() -> InstrumentationScope {
    scope_with(Vec::new())
}

/// [`scope`] with `attributes` (`ConnTraceBuilder::meter_scope_attributes`).
pub(super) fn scope_with(attributes: Vec<KeyValue>) -> InstrumentationScope {
    InstrumentationScope::builder(env!("CARGO_PKG_NAME"))
        .with_version(env!("CARGO_PKG_VERSION"))
        .with_schema_url(opentelemetry_semantic_conventions::SCHEMA_URL)
        .with_attributes(attributes)
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
        if !record.mark_closed_at(at) {
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
    ///
    /// A close at release bounds the limit by the others idle then, counted
    /// in our order of releases; hyper-util may have taken releases in
    /// another order, so the client's connections released just after this
    /// one and still open count too (see
    /// [`PoolHistory::with_reordered_releases`](crate::pool::model::PoolHistory::with_reordered_releases)):
    /// a pool that kept the later one and closed this one has a limit of at
    /// least 1, not 0.
    fn note_pool_close(&self, record: &ConnectionRecord, close: PoolClose) {
        let close = self.pools.with_reordered_releases(record, close);
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
        // HTTP/2 closed once the client's idle clock had run out: the
        // pool's close, whoever closed the socket first (row 9), not a
        // server's end for later misses to read.
        if crate::pool::kernel_decision::http2_closed_by_pool(
            record,
            lookup,
            now,
            asked_at.min(now),
        ) {
            record.infer_end(crate::miss::ConnectionEnd::IdleTimeout);
            self.connection_closed(record, now);
            return;
        }
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
                    let last_receive = facts
                        .info
                        .as_ref()
                        .map(|info| (info.since_last_receive, now));
                    record.closed_by_server_after(true, last_receive);
                } else if tls_time_wait_is_servers(record, facts, now, false) {
                    // Our close only answered the server's close_notify.
                    record.closed_by_server(false);
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
                    && (record.setup.tls.is_none() || !record.awaits_socket_end())
                    && !crate::pool::end_report::gone_after_own_close(record, Instant::now())
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
    /// (row 3b). A connection that never carried a request shows nothing
    /// of the kind: hyper-util pools a connect's connection unused only
    /// when its pool is on (`Pool::is_enabled`: an idle limit above 0).
    pub(super) fn note_close_at_release(
        &self,
        record: &ConnectionRecord,
        lookup: &KernelLookup,
        now: Instant,
        asked_at: Instant,
    ) {
        let client = &record.client;
        if client.max_idle_known
            || client.inferred.keeps_idle()
            || record.is_closed_at_release()
            || record.never_used()
        {
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
        if let (Some(l), Some(r)) = (record.setup.local_addr, record.setup.peer_addr) {
            // Over TLS a socket found gone may be a close of ours the
            // server's close_notify reset: the kernel's report of its end
            // tells (see `pool::model::reported_end`). Over either, a
            // request that gave up on its response leaves hyper closing
            // the socket: the report keeps the stall's evidence
            // (`request::stall_evidence::FailureEvidence`).
            // HTTP/2: only to date an end while it idled (see
            // `pool::end_report::ended_before_idle_timeout`); nothing waits
            // for its report.
            let sink: std::sync::Weak<dyn crate::kernel::SocketEndSink> =
                Arc::downgrade(&record) as _;
            if crate::kernel::watch_end(l, r, sink) {
                record.mark_end_reported();
                if !record.http2() {
                    record.mark_end_watched();
                }
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

    /// A release only maybe over the idle limit
    /// ([`ConnectionRecord::is_over_idle_limit_unsure`]): the kernel is
    /// asked [`UNSURE_RELEASE_CHECK`] later, off the request path.
    /// hyper-util closes a connection its full idle pool turns away at once
    /// (the pool drops it, its connection task ends), so a socket our side
    /// closed by then was turned away (over the limit, when the limit is
    /// ours to count; its close applies as any the kernel shows), and
    /// one still established then and again [`UNSURE_RELEASE_KEPT`] after
    /// the release, not taken or released again meanwhile, was kept: no
    /// longer in doubt, the next release counts it idle. Without it, a
    /// connection turned away long ago would stay counted as maybe idle,
    /// and one kept would never count as surely idle.
    pub(crate) fn confirm_unsure_release(self: &Arc<Self>, record: &Arc<ConnectionRecord>) {
        if record.is_over_idle_limit_unsure() {
            self.look_at_unsure_release(record, Instant::now() + UNSURE_RELEASE_CHECK, false);
        }
    }

    /// [`confirm_unsure_release`](Self::confirm_unsure_release)'s lookup
    /// at `asked_at`; `last`: the second look, after which a socket still
    /// established was kept.
    fn look_at_unsure_release(
        self: &Arc<Self>,
        record: &Arc<ConnectionRecord>,
        asked_at: Instant,
        last: bool,
    ) {
        let (Some(l), Some(r)) = (record.setup.local_addr, record.setup.peer_addr) else {
            return;
        };
        let weak = Arc::downgrade(self);
        let record = Arc::clone(record);
        let released = record.last_released();
        self.kernel.lookup_at(l, r, asked_at, move |lookup| {
            let Some(inner) = weak.upgrade() else {
                return;
            };
            let untouched = record.in_use() == 0 && record.last_released() == released;
            if !untouched || record.is_closed() {
                return;
            }
            match &lookup {
                // hyper-util's task may not have closed a connection its
                // pool turned away yet (a starved runtime): kept only if
                // still established well after (seen beside two
                // CPU-burning processes: a turned-away connection taken for
                // kept was counted idle, and a later release that the pool
                // kept read as over the limit).
                KernelLookup::Found(facts) if facts.state == crate::TcpState::Established => {
                    match released.filter(|_| !last) {
                        Some(released) => inner.look_at_unsure_release(
                            &record,
                            released + UNSURE_RELEASE_KEPT,
                            true,
                        ),
                        None => record.set_over_idle_limit_unsure(false),
                    }
                }
                // Our side closed it right after its release: the pool
                // turned it away, over the limit (no longer in doubt).
                KernelLookup::Found(facts) if facts.state.closed_by_us() => {
                    if record.client.max_idle_known && record.is_over_idle_limit_unsure() {
                        record.set_over_idle_limit_unsure(false);
                        record.mark_over_idle_limit();
                    }
                    inner.apply_kernel_view(&record, &lookup, asked_at);
                }
                _ => inner.apply_kernel_view(&record, &lookup, asked_at),
            }
        });
    }

    /// Asks the kernel about `record`'s socket, off the request path; the
    /// answer applies when it arrives (see
    /// [`apply_kernel_view`](Self::apply_kernel_view)).
    pub(super) fn check_with_kernel(self: &Arc<Self>, record: Arc<ConnectionRecord>) {
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

    /// Checks each of `records` with the kernel as
    /// [`check_with_kernel`](Self::check_with_kernel) does, and waits until
    /// every answer is applied or `wait` has passed.
    fn check_with_kernel_and_wait(
        self: &Arc<Self>,
        records: &[Arc<ConnectionRecord>],
        wait: Duration,
    ) {
        let deadline = Instant::now() + wait;
        let (answered, answers) = std::sync::mpsc::channel();
        let mut asked = 0;
        for record in records {
            let (Some(l), Some(r)) = (record.setup.local_addr, record.setup.peer_addr) else {
                continue;
            };
            asked += 1;
            let weak = Arc::downgrade(self);
            let record = record.clone();
            let answered = answered.clone();
            let asked_at = Instant::now();
            self.kernel.lookup_then(l, r, move |lookup| {
                if let Some(inner) = weak.upgrade() {
                    inner.apply_kernel_view(&record, &lookup, asked_at);
                }
                let _ = answered.send(());
            });
        }
        for _ in 0..asked {
            let left = deadline.saturating_duration_since(Instant::now());
            if answers.recv_timeout(left).is_err() {
                break;
            }
        }
    }

    /// Classifies the miss of a connect `client` starts to `host` at `at`
    /// (called from the connector layer when reqwest calls it, `at` that
    /// call): decided from the history, or when the kernel answers about
    /// the candidate connection.
    pub(crate) fn miss_slot(
        self: &Arc<Self>,
        host: &HostKey,
        client: &ClientState,
        at: Instant,
    ) -> MissSlot {
        let in_flight = self.load.in_flight_with_starts(host);
        match self.pools.classify_miss(host, client, at, in_flight) {
            MissVerdict::Decided(miss) => MissSlot::Decided(miss),
            MissVerdict::Closed { miss, record } => {
                let at = record.last_activity();
                record.mark_discarded(at);
                self.connection_closed(&record, at);
                MissSlot::Decided(miss)
            }
            MissVerdict::AskKernel(question) => {
                let http2 = question.candidate.http2().then(|| question.candidate.id());
                let slot = Arc::new(PendingMiss::asking_about(question.alive, http2));
                if !question.candidate.client.max_idle_known {
                    // The client's other connections believed idle first
                    // (answered in order, before the candidate): one closed
                    // unbeknown to us was counted idle at the candidate's
                    // release, which an inferred idle limit depends on.
                    self.recheck_believed_idle(&question.candidate);
                }
                KernelAsk::send(self, host.clone(), question, slot.clone());
                MissSlot::Pending(slot)
            }
        }
    }

    /// Open connections by attribute set, for `http.client.open_connections`.
    /// Connections idle past their client's idle timeout are closed here
    /// (hyper-util's pool drops them then); every other one is checked with
    /// the kernel first, and the collection waits for the answers (at most
    /// [`COLLECTION_KERNEL_WAIT`], on the metric reader's thread, never a
    /// request's), so a connection the server or the pool closed since the
    /// last collection is not counted open. An answer later than that
    /// applies from the next collection on.
    pub(crate) fn open_connections(self: &Arc<Self>, now: Instant) -> Vec<(Vec<KeyValue>, i64)> {
        let mut open = Vec::new();
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
            open.push(record);
        }
        self.check_with_kernel_and_wait(&open, COLLECTION_KERNEL_WAIT);
        let mut counts: Vec<(Vec<KeyValue>, i64)> = Vec::new();
        for record in open {
            if record.is_closed() || record.is_over_idle_limit() {
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
    /// (the clients are gone with the handle, and their pools' connections
    /// with them: each still in the registry ends now, its lifetime
    /// recorded in `http.client.connection.duration`), the pool gauges as
    /// they are.
    fn drop(&mut self) {
        let now = Instant::now();
        let mut open: Vec<(Vec<KeyValue>, i64)> = self
            .open_sets
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|a| (a.clone(), 0))
            .collect();
        for record in self.registry.snapshot() {
            self.connection_closed(&record, now);
            let mut attributes = connection_attributes(&record);
            attributes.push(KeyValue::new(semconv::HTTP_CONNECTION_STATE, "idle"));
            if open.len() < MAX_OPEN_SETS && !open.iter().any(|(a, _)| *a == attributes) {
                open.push((attributes, 0));
            }
        }
        let hosts = self.load.gauges(now);
        self.metrics
            .keep_final(crate::export::metrics::FinalObservations { open, hosts });
    }
}

/// How long after a release only maybe over the idle limit the kernel is
/// asked whether the pool kept it ([`Inner::confirm_unsure_release`]):
/// 20 ms, long enough for hyper-util's connection task to close a
/// connection its pool turned away (it does so on its next poll), short
/// enough to settle before most later releases of a burst.
pub(crate) const UNSURE_RELEASE_CHECK: Duration = Duration::from_millis(20);

/// How long after a release only maybe over the idle limit a socket
/// still established shows the pool kept it
/// ([`Inner::confirm_unsure_release`]'s second look): 250 ms, well above
/// the scheduling delay of a runtime sharing two cores with two
/// CPU-bound processes (tens of milliseconds), well under a server's idle
/// timeout (whole seconds).
pub(crate) const UNSURE_RELEASE_KEPT: Duration = Duration::from_millis(250);

/// Longest a metric collection waits for the kernel's answers about the
/// connections it counts (`http.client.open_connections`): 100 ms, well
/// above a sock_diag lookup's usual sub-millisecond answer on a loaded
/// machine, well under the SDK's default 30 s export timeout.
pub(crate) const COLLECTION_KERNEL_WAIT: Duration = Duration::from_millis(100);

/// Most attribute sets remembered for reporting 0 open connections.
const MAX_OPEN_SETS: usize = 4096;

/// Other idle connections of the client checked with the kernel after a
/// close at release was inferred (their closes tighten the idle limit).
pub(super) const INFER_FOLLOW_UPS: usize = 8;

/// `server.address`, `server.port`, `url.scheme`, `network.protocol.version`
/// of a connection (no peer address: bounded cardinality).
fn connection_attributes(record: &ConnectionRecord) -> Vec<KeyValue> {
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
