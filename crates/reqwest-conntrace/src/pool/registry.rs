//! Live connections by socket address pair: how a response's `HttpInfo`
//! (local and remote address) is traced back to the connect that made it.

use std::collections::VecDeque;
use std::hash::{BuildHasher, RandomState};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::sync::{LazyLock, OnceLock};
use std::time::{Duration, Instant};

use hashbrown::HashTable;
use opentelemetry::trace::{SpanContext, SpanId, TraceFlags, TraceId, TraceState};

use crate::export::report::ConnectionSetup;
use crate::kernel::{SocketEnd, SocketEndSink};
use crate::miss::ConnectionEnd;
use crate::pool::answers::HostAnswer;
use crate::pool::client::ClientState;
use crate::pool::host::HostKey;
use crate::pool::slot::MissSlot;

/// One established connection as this handle saw it being set up.
#[derive(Debug)]
pub(crate) struct ConnectionRecord {
    pub(crate) setup: Arc<ConnectionSetup>,
    /// The `http.connection_setup` span's context (see
    /// [`setup_span`](Self::setup_span)).
    setup_span: SetupSpan,
    /// Id of the request whose pool miss started the connect.
    pub(crate) trigger_id: Option<u64>,
    pub(crate) requests: AtomicU64,
    /// The client whose connector made it.
    pub(crate) client: Arc<ClientState>,
    /// The pool key it serves, when the trigger was known.
    pub(crate) host: Option<HostKey>,
    /// Why the connect was needed (the trigger's pool miss): by value once
    /// known (see [`MissSlot::settled`]).
    pub(crate) miss: Option<MissSlot>,
    /// Requests currently using it (HTTP/1.1: 0 or 1).
    in_use: AtomicU32,
    /// An HTTP/1.1 response was dropped mid-body: hyper closed it.
    discarded: AtomicBool,
    /// Released while the client's idle pool for the host was full: hyper
    /// closed it.
    over_idle_limit: AtomicBool,
    /// Released while the client's idle pool for the host may have been
    /// full: hyper-util may have closed it or kept it (requests in flight,
    /// not yet attributed, may hold connections our count saw idle). The
    /// kernel's view or a later response tells.
    over_idle_limit_unsure: AtomicBool,
    /// Pooled unused (its connect lost to another connection) while
    /// requests to the host were in flight with no connection shown yet:
    /// one of them may have been a checkout waiting in hyper-util's pool,
    /// which hands it the connection first.
    pooled_unused_with_waiters: AtomicBool,
    /// The kernel showed its client's pool closing it within
    /// [`CLOSED_AT_RELEASE`](crate::pool::inferred::CLOSED_AT_RELEASE) of
    /// its release (a limit this crate could not read): evidence that pool
    /// keeps no idle connection (see
    /// [`PoolHistory::shows_pool_off`](crate::pool::model::PoolHistory::shows_pool_off)).
    closed_at_release: AtomicBool,
    /// Its close was observed and counted.
    closed: AtomicBool,
    /// A miss named it as the connection whose announced close
    /// (`Connection: close`) caused it: each such close is named once.
    close_named: AtomicBool,
    /// End of the latest response on this connection (body read or
    /// dropped), as [`instant_nanos`]; 0 when none. An atomic, not a lock:
    /// every miss reads it for each remembered connection of its host.
    last_released: AtomicU64,
    /// An HTTP/1.1 response body was dropped before its end: hyper closed
    /// the connection unless it had already read the whole body (then it
    /// went back to the pool). Cleared by a later response on it.
    dropped_early: AtomicBool,
    /// The latest response said the server closes (`Connection: close`,
    /// or HTTP/1.0 without keep-alive).
    connection_close: AtomicBool,
    /// The latest request sent `Connection: close` itself.
    client_asked_close: AtomicBool,
    /// How it ended, as its own traffic showed it (a response's
    /// `Connection: close`, a request's error, a dropped body): first wins.
    end_seen: OnceLock<ConnectionEnd>,
    /// How it ended, as inferred from the kernel's view of its socket:
    /// first wins, and [`end_seen`](Self::end_seen) overrides it whenever it
    /// arrives (the kernel's answer may come before or after it).
    end_inferred: OnceLock<ConnectionEnd>,
    /// The server's advertised keep-alive timeout (`Keep-Alive: timeout=N`),
    /// in milliseconds; 0 = none seen.
    server_keep_alive_ms: AtomicU64,
    /// HTTP/2 responses dropped before their end: each a possible stream
    /// reset (none when the body had fully arrived, which is not seen).
    stream_resets: AtomicU64,
    /// A request timed out on it while nothing arrived from the peer.
    stalled: AtomicBool,
    /// The newest answer its client's resolver has given for its host, as
    /// it stands now (later lookups change it); `None` without a lookup
    /// (DNS skipped) or when proxied. See [`pool::answers`](crate::pool::answers).
    newest_answer: Option<Arc<HostAnswer>>,
    /// Other connections of its client to its host that were idle at its
    /// latest release (`usize::MAX`: not counted), for inferring an idle
    /// limit this crate could not read.
    idle_others_at_release: AtomicUsize,
    /// When a miss last named it as its candidate and asked the kernel
    /// about it (a close of ours dated after that may be the release
    /// race's: see [`pool::inferred`](crate::pool::inferred)), as
    /// [`instant_nanos`]; 0 when never.
    named_by_miss: AtomicU64,
    /// When the latest request counted on it started (its own start, as
    /// [`instant_nanos`]; 0 when none): whether the request that took it
    /// after a miss was already in flight at the miss (see
    /// [`rider_since`](crate::pool::kernel_decision::rider_since)).
    latest_request_started: AtomicU64,
    /// HTTP/2: the latest instant by which the server's end of it (GOAWAY,
    /// then its close) had reached this client, the earliest one seen: a
    /// request on it refused by the GOAWAY, a miss that found it unusable
    /// (hyper-util hands out a live HTTP/2 connection to every request), or
    /// our close after the GOAWAY as the kernel dates it. See
    /// [`ended_with_last_response`](Self::ended_with_last_response). As
    /// [`instant_nanos`]; 0 when none.
    server_end_by: AtomicU64,
    /// HTTP/2: it served a request other than the one whose connect made
    /// it, so hyper-util's pool held it. A connection a concurrent connect
    /// made while another one was pooled serves only that request (the
    /// pool's `put` keeps one HTTP/2 connection per host), then closes.
    shared: AtomicBool,
    /// Its socket's end is watched (HTTP/1.1, see
    /// [`kernel::watch_end`](crate::kernel::watch_end)).
    end_watched: AtomicBool,
    /// The kernel's report of its socket's end, once it came (boxed: it
    /// is read only over TLS, to tell who closed, and for a request that
    /// failed on a socket already closed).
    socket_end: OnceLock<Box<SocketEnd>>,
    /// The tokio runtime it was made on, whose task serves it (hyper-util
    /// spawns the connection's task there): see
    /// [`RequestState::given_up_unwritten`](crate::request::state::RequestState::given_up_unwritten).
    pub(crate) runtime: Option<tokio::runtime::Id>,
}

/// A span context as a connection keeps it for its lifetime: the trace id
/// as bytes (a `u128` aligns to 16) and the trace state (a `tracestate`
/// header inherited from the parent; rarely any) boxed: 40 bytes instead of
/// `SpanContext`'s 64.
#[derive(Debug)]
struct SetupSpan {
    trace_id: [u8; 16],
    span_id: SpanId,
    flags: TraceFlags,
    remote: bool,
    state: Option<Box<TraceState>>,
}

impl SetupSpan {
    fn of(cx: SpanContext) -> Self {
        let state =
            (*cx.trace_state() != TraceState::NONE).then(|| Box::new(cx.trace_state().clone()));
        Self {
            trace_id: cx.trace_id().to_bytes(),
            span_id: cx.span_id(),
            flags: cx.trace_flags(),
            remote: cx.is_remote(),
            state,
        }
    }
}

/// A server's end of an HTTP/2 connection (GOAWAY) known no later than this
/// after the connection's latest response ended came with that response:
/// the server ended the connection on purpose once it had served it (its
/// per-connection request limit, nginx `keepalive_requests`), not after
/// idling. An idle close comes after the server's keep-alive timeout,
/// which servers set in seconds (nginx `keepalive_timeout`, default 75 s);
/// 75 ms leaves room for the next request of a sequential loop on a loaded
/// machine.
pub(crate) const ENDED_WITH_LAST_RESPONSE: Duration = Duration::from_millis(75);

impl ConnectionRecord {
    pub(crate) fn new(
        setup: Arc<ConnectionSetup>,
        setup_span: SpanContext,
        trigger_id: Option<u64>,
        client: Arc<ClientState>,
        host: Option<HostKey>,
        miss: Option<MissSlot>,
    ) -> Self {
        Self {
            setup,
            setup_span: SetupSpan::of(setup_span),
            trigger_id,
            requests: AtomicU64::new(0),
            client,
            host,
            miss: miss.map(MissSlot::settled),
            in_use: AtomicU32::new(0),
            discarded: AtomicBool::new(false),
            over_idle_limit: AtomicBool::new(false),
            over_idle_limit_unsure: AtomicBool::new(false),
            pooled_unused_with_waiters: AtomicBool::new(false),
            closed_at_release: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            close_named: AtomicBool::new(false),
            last_released: AtomicU64::new(0),
            dropped_early: AtomicBool::new(false),
            connection_close: AtomicBool::new(false),
            client_asked_close: AtomicBool::new(false),
            end_seen: OnceLock::new(),
            end_inferred: OnceLock::new(),
            server_keep_alive_ms: AtomicU64::new(0),
            stream_resets: AtomicU64::new(0),
            stalled: AtomicBool::new(false),
            newest_answer: None,
            idle_others_at_release: AtomicUsize::new(usize::MAX),
            named_by_miss: AtomicU64::new(0),
            latest_request_started: AtomicU64::new(0),
            server_end_by: AtomicU64::new(0),
            shared: AtomicBool::new(false),
            end_watched: AtomicBool::new(false),
            socket_end: OnceLock::new(),
            runtime: tokio::runtime::Handle::try_current().ok().map(|h| h.id()),
        }
    }

    /// Its socket's end is watched: the kernel's report of it will come
    /// ([`socket_end`](Self::socket_end)).
    pub(crate) fn mark_end_watched(&self) {
        self.end_watched.store(true, Ordering::Release);
    }

    /// The kernel's report of its socket's end, if it came.
    pub(crate) fn socket_end(&self) -> Option<SocketEnd> {
        self.socket_end.get().map(|end| **end)
    }

    /// Its socket's end is watched and the kernel's report of it has not
    /// come yet.
    pub(crate) fn awaits_socket_end(&self) -> bool {
        self.end_watched.load(Ordering::Acquire) && self.socket_end.get().is_none()
    }

    /// A miss classified at `at` named it as the connection it would have
    /// had, and asks the kernel about it.
    pub(crate) fn mark_named_by_miss(&self, at: Instant) {
        self.named_by_miss
            .fetch_max(instant_nanos(at), Ordering::AcqRel);
    }

    /// When a miss last named it (see [`mark_named_by_miss`](Self::mark_named_by_miss)).
    pub(crate) fn named_by_miss_at(&self) -> Option<Instant> {
        instant_of(self.named_by_miss.load(Ordering::Acquire))
    }

    /// Records how many other connections were idle at its release.
    pub(crate) fn set_idle_others_at_release(&self, n: usize) {
        self.idle_others_at_release
            .store(n.min(usize::MAX - 1), Ordering::Relaxed);
    }

    /// Its idle count at release is no bound (see `set_idle_others_at_release`).
    pub(crate) fn forget_idle_others_at_release(&self) {
        self.idle_others_at_release
            .store(usize::MAX, Ordering::Relaxed);
    }

    /// One connection counted idle at its latest release was not (see
    /// [`PoolHistory::uncount_closed`](crate::pool::model::PoolHistory::uncount_closed)).
    pub(crate) fn uncount_idle_other(&self) {
        let _ =
            self.idle_others_at_release
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                    (n != usize::MAX && n > 0).then(|| n - 1)
                });
    }

    /// Other connections idle at its latest release, if counted.
    pub(crate) fn idle_others_at_release(&self) -> Option<usize> {
        match self.idle_others_at_release.load(Ordering::Relaxed) {
            usize::MAX => None,
            n => Some(n),
        }
    }

    /// It was made from a lookup whose host's newest answer is `answer`.
    pub(crate) fn with_newest_answer(mut self, answer: Option<Arc<HostAnswer>>) -> Self {
        self.newest_answer = answer;
        self
    }

    /// Its peer address is not in the newest answer its client's resolver
    /// has given for its host, as that answer stands now (see
    /// `pool::answers`): judged at each request, so a connection whose
    /// address comes back into the answer is no longer stale. `false`
    /// without a lookup (IP literal, `resolve` override) or when proxied.
    pub(crate) fn is_dns_stale(&self) -> bool {
        // Through a proxy the peer is the proxy, and a lookup the proxy's.
        if self.setup.proxied {
            return false;
        }
        match (&self.newest_answer, self.setup.peer_addr) {
            (Some(answer), Some(peer)) => !answer.holds(peer.ip()),
            _ => false,
        }
    }

    /// An HTTP/1.1 body was dropped before its end at `at`.
    pub(crate) fn mark_dropped_early(&self, at: Instant) {
        self.dropped_early.store(true, Ordering::Relaxed);
        self.mark_released(at);
    }

    pub(crate) fn is_dropped_early(&self) -> bool {
        self.dropped_early.load(Ordering::Relaxed)
    }

    /// A response arrived on it: whatever was dropped before, the pool kept
    /// it, and it is not stalled.
    pub(crate) fn mark_alive(&self) {
        self.dropped_early.store(false, Ordering::Relaxed);
        self.stalled.store(false, Ordering::Relaxed);
    }

    /// Records whether the latest response said `Connection: close`.
    pub(crate) fn set_connection_close(&self, close: bool) {
        self.connection_close.store(close, Ordering::Relaxed);
    }

    /// Records whether the latest request sent `Connection: close` itself
    /// (then the close its response announces is the client's).
    pub(crate) fn set_client_asked_close(&self, asked: bool) {
        self.client_asked_close.store(asked, Ordering::Relaxed);
    }

    /// How a close announced by the latest exchange ends it: the client's
    /// own `Connection: close`, else the server's.
    pub(crate) fn announced_close_end(&self) -> ConnectionEnd {
        if self.client_asked_close.load(Ordering::Relaxed) {
            ConnectionEnd::ClientClose
        } else {
            ConnectionEnd::ConnectionClose
        }
    }

    pub(crate) fn said_connection_close(&self) -> bool {
        self.connection_close.load(Ordering::Relaxed)
    }

    /// A miss names it as the connection whose announced close caused it;
    /// `true` for the first such miss only (one close, one connection lost).
    pub(crate) fn name_close(&self) -> bool {
        !self.close_named.swap(true, Ordering::Relaxed)
    }

    /// A miss already named its announced close.
    pub(crate) fn is_close_named(&self) -> bool {
        self.close_named.load(Ordering::Relaxed)
    }

    /// Records how it ended, as its own traffic showed it (a response
    /// header, a request's error, a body dropped or failed): the first one
    /// recorded wins, over any [`infer_end`](Self::infer_end).
    pub(crate) fn set_end(&self, end: ConnectionEnd) {
        let _ = self.end_seen.set(end);
    }

    /// Records how it ended as inferred from the kernel's view of its
    /// socket (FIN, gone, closed by our side): used only while its own
    /// traffic said nothing (see [`set_end`](Self::set_end)).
    pub(crate) fn infer_end(&self, end: ConnectionEnd) {
        let _ = self.end_inferred.set(end);
    }

    /// How it ended as its own traffic showed it, if it did.
    pub(crate) fn seen_end(&self) -> Option<ConnectionEnd> {
        self.end_seen.get().copied()
    }

    /// How it ended, if known: its own traffic's word first.
    pub(crate) fn end(&self) -> Option<ConnectionEnd> {
        self.end_seen.get().or(self.end_inferred.get()).copied()
    }

    /// The kernel shows the server closed it (`fin`: its FIN is seen,
    /// CLOSE_WAIT / LAST_ACK; otherwise the socket is gone): records that
    /// end, as the response's own evidence names it when it had some (its
    /// last response said `Connection: close`), else as the kernel shows it
    /// (`goaway` for HTTP/2, `peer_fin`, `peer_closed`), and returns how it
    /// ended (an end its own traffic recorded first stays).
    pub(crate) fn closed_by_server(&self, fin: bool) -> ConnectionEnd {
        if self.said_connection_close() {
            self.set_end(self.announced_close_end());
        } else if self.http2() {
            self.infer_end(ConnectionEnd::GoAway);
        } else if fin {
            self.infer_end(ConnectionEnd::PeerFin);
        } else {
            self.infer_end(ConnectionEnd::PeerClosed);
        }
        self.end().unwrap_or(ConnectionEnd::PeerClosed)
    }

    /// The server's end of it (HTTP/2 GOAWAY) had reached this client by
    /// `at`; the earliest such instant is kept.
    pub(crate) fn note_server_end_by(&self, at: Instant) {
        let at = instant_nanos(at);
        let _ = self
            .server_end_by
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |earlier| {
                (earlier == 0 || at < earlier).then_some(at)
            });
    }

    /// HTTP/2: the earliest instant by which the server's end of it was
    /// known to have reached this client (see
    /// [`note_server_end_by`](Self::note_server_end_by)).
    pub(crate) fn server_end_by(&self) -> Option<Instant> {
        instant_of(self.server_end_by.load(Ordering::Acquire))
    }

    /// The server ended it with its latest response rather than after
    /// idling: its end had reached this client no later than
    /// [`ENDED_WITH_LAST_RESPONSE`] after that response ended (or before
    /// it: a GOAWAY that refused a request while others were still being
    /// served). `false` when the end was not dated (see
    /// [`note_server_end_by`](Self::note_server_end_by)).
    pub(crate) fn ended_with_last_response(&self) -> bool {
        let by = instant_of(self.server_end_by.load(Ordering::Acquire));
        match (by, self.last_released()) {
            (Some(by), Some(released)) => by <= released + ENDED_WITH_LAST_RESPONSE,
            _ => false,
        }
    }

    /// It served a request whose connect did not make it.
    pub(crate) fn mark_shared(&self) {
        self.shared.store(true, Ordering::Relaxed);
    }

    /// Whether it served a request whose connect did not make it (HTTP/2:
    /// hyper-util's pool held it).
    pub(crate) fn is_shared(&self) -> bool {
        self.shared.load(Ordering::Relaxed)
    }

    /// Records the server's advertised keep-alive timeout; returns `true`
    /// the first time one is seen on this connection.
    pub(crate) fn set_server_keep_alive(&self, timeout: Duration) -> bool {
        let ms = u64::try_from(timeout.as_millis())
            .unwrap_or(u64::MAX)
            .max(1);
        self.server_keep_alive_ms.swap(ms, Ordering::Relaxed) == 0
    }

    /// The server's advertised keep-alive timeout, if any.
    pub(crate) fn server_keep_alive(&self) -> Option<Duration> {
        match self.server_keep_alive_ms.load(Ordering::Relaxed) {
            0 => None,
            ms => Some(Duration::from_millis(ms)),
        }
    }

    /// Counts one more reset stream; returns the new total.
    pub(crate) fn count_stream_reset(&self) -> u64 {
        self.stream_resets.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// Streams reset so far.
    pub(crate) fn stream_resets(&self) -> u64 {
        self.stream_resets.load(Ordering::Relaxed)
    }

    /// A request timed out on it while the peer sent nothing.
    pub(crate) fn mark_stalled(&self) {
        self.stalled.store(true, Ordering::Relaxed);
    }

    pub(crate) fn is_stalled(&self) -> bool {
        self.stalled.load(Ordering::Relaxed)
    }

    /// Requests currently using the connection.
    pub(crate) fn in_use(&self) -> u32 {
        self.in_use.load(Ordering::Relaxed)
    }

    /// A request starts using the connection.
    pub(crate) fn take(&self) {
        self.in_use.fetch_add(1, Ordering::Relaxed);
    }

    /// A request stops using the connection.
    pub(crate) fn give_back(&self) {
        let _ = self
            .in_use
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
    }

    /// hyper closed it because a response was dropped before its end.
    pub(crate) fn mark_discarded(&self, at: Instant) {
        self.discarded.store(true, Ordering::Relaxed);
        self.set_end(ConnectionEnd::Discarded);
        self.mark_released(at);
    }

    pub(crate) fn is_discarded(&self) -> bool {
        self.discarded.load(Ordering::Relaxed)
    }

    /// hyper closed it at release because the idle pool was full (a
    /// belief until the kernel or a later response says otherwise).
    pub(crate) fn mark_over_idle_limit(&self) {
        self.over_idle_limit.store(true, Ordering::Relaxed);
    }

    /// A response arrived on it after all (or the kernel shows it
    /// established after its release): the pool had kept it.
    /// Returns whether it was believed over the limit (not merely unsure).
    pub(crate) fn clear_over_idle_limit(&self) -> bool {
        self.over_idle_limit_unsure.store(false, Ordering::Relaxed);
        self.over_idle_limit.swap(false, Ordering::Relaxed)
    }

    /// Whether its latest release may have been over the idle limit (see
    /// [`PoolHistory::on_released`](crate::pool::model::PoolHistory::on_released)).
    pub(crate) fn set_over_idle_limit_unsure(&self, unsure: bool) {
        self.over_idle_limit_unsure.store(unsure, Ordering::Relaxed);
    }

    pub(crate) fn is_over_idle_limit_unsure(&self) -> bool {
        self.over_idle_limit_unsure.load(Ordering::Relaxed)
    }

    /// Records that it was pooled unused while requests to the host may
    /// have been waiting for a connection (see
    /// [`PoolHistory::on_pooled_unused`](crate::pool::model::PoolHistory::on_pooled_unused)).
    pub(crate) fn mark_pooled_unused_with_waiters(&self) {
        self.pooled_unused_with_waiters
            .store(true, Ordering::Relaxed);
    }

    /// Whether it never carried a request and was pooled unused while a
    /// checkout may have been waiting: a close of ours at that put-back is
    /// hyper-util's hand-back to a checkout whose own connect had won, not
    /// a limit (see [`PoolClose::DroppedAtPutBack`](crate::pool::inferred::PoolClose::DroppedAtPutBack)).
    pub(crate) fn pooled_unused_to_waiter(&self) -> bool {
        self.pooled_unused_with_waiters.load(Ordering::Relaxed) && self.never_used()
    }

    /// Whether it never carried a request (pooled unused by a connect that
    /// lost to another connection, or not yet used).
    pub(crate) fn never_used(&self) -> bool {
        self.requests.load(Ordering::Relaxed) == 0
    }

    /// The kernel showed its client's pool closing it at its release (see
    /// [`is_closed_at_release`](Self::is_closed_at_release)).
    pub(crate) fn mark_closed_at_release(&self) {
        self.closed_at_release.store(true, Ordering::Relaxed);
    }

    /// Whether the kernel showed its client's pool closing it within
    /// [`CLOSED_AT_RELEASE`](crate::pool::inferred::CLOSED_AT_RELEASE) of
    /// its release.
    pub(crate) fn is_closed_at_release(&self) -> bool {
        self.closed_at_release.load(Ordering::Relaxed)
    }

    /// Marks the close observed; `true` the first time only.
    pub(crate) fn mark_closed(&self) -> bool {
        !self.closed.swap(true, Ordering::Relaxed)
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Relaxed)
    }

    pub(crate) fn is_over_idle_limit(&self) -> bool {
        self.over_idle_limit.load(Ordering::Relaxed)
    }

    pub(crate) fn id(&self) -> u64 {
        self.setup.id
    }

    /// The context of its `http.connection_setup` span, for links to it.
    pub(crate) fn setup_span(&self) -> SpanContext {
        let s = &self.setup_span;
        SpanContext::new(
            TraceId::from_bytes(s.trace_id),
            s.span_id,
            s.flags,
            s.remote,
            s.state.as_deref().cloned().unwrap_or(TraceState::NONE),
        )
    }

    /// Its (local, remote) socket address pair, which the registry finds it
    /// by; `None` for a local transport (a Unix domain socket).
    pub(crate) fn pair(&self) -> Option<Pair> {
        Some((self.setup.local_addr?, self.setup.peer_addr?))
    }

    /// When the connect finished and the connection became usable.
    pub(crate) fn ready_at(&self) -> Instant {
        self.setup.started + self.setup.total
    }

    /// HTTP/2 was negotiated (multiplexed: no one-at-a-time release).
    pub(crate) fn http2(&self) -> bool {
        self.setup.http2
    }

    /// When the connection was last released to the pool.
    pub(crate) fn last_released(&self) -> Option<Instant> {
        instant_of(self.last_released.load(Ordering::Acquire))
    }

    /// Records the end of a response on this connection (the latest wins).
    pub(crate) fn mark_released(&self, at: Instant) {
        self.last_released
            .fetch_max(instant_nanos(at), Ordering::AcqRel);
    }

    /// Counts one more request on this connection, one that started at
    /// `started`; returns the new total.
    pub(crate) fn count_request(&self, started: Instant) -> u64 {
        // Its start first: whoever sees the count grow sees this start
        // (or a later request's).
        self.latest_request_started
            .fetch_max(instant_nanos(started), Ordering::Release);
        self.requests.fetch_add(1, Ordering::AcqRel) + 1
    }

    /// When the latest request counted on it started (`None`: none yet).
    pub(crate) fn latest_request_started(&self) -> Option<Instant> {
        instant_of(self.latest_request_started.load(Ordering::Acquire))
    }

    /// The end of the latest response on this connection, or its ready
    /// time when it has carried none.
    pub(crate) fn last_activity(&self) -> Instant {
        self.last_released()
            .unwrap_or(self.ready_at())
            .max(self.ready_at())
    }
}

impl SocketEndSink for ConnectionRecord {
    fn socket_ended(&self, end: SocketEnd) {
        let _ = self.socket_end.set(Box::new(end));
    }
}

/// The origin of [`instant_nanos`]: a year before its first use, so every
/// instant the process sees comes after it.
static EPOCH: LazyLock<Instant> = LazyLock::new(|| {
    let now = Instant::now();
    now.checked_sub(Duration::from_secs(365 * 24 * 3600))
        .unwrap_or(now)
});

/// `at` as nanoseconds after [`EPOCH`], at least 1 (0 stands for none);
/// exact for 584 years after it (`Instant`'s resolution is 1 ns).
fn instant_nanos(at: Instant) -> u64 {
    let nanos = at.saturating_duration_since(*EPOCH).as_nanos();
    u64::try_from(nanos).unwrap_or(u64::MAX).max(1)
}

/// The instant [`instant_nanos`] gave `nanos` for; `None` for 0.
fn instant_of(nanos: u64) -> Option<Instant> {
    (nanos != 0).then(|| *EPOCH + Duration::from_nanos(nanos))
}

/// Shards of the table: requests on different connections take different
/// locks (one `Mutex<HashMap>` was the one lock every response took).
const SHARDS: usize = 16;

/// At most one sweep per this interval.
const SWEEP_INTERVAL: Duration = Duration::from_secs(1);

/// At most this many kernel lookups per sweep (the idle-longest
/// connections first), so a sweep never floods the sock_diag queue that
/// pool-miss classification also waits on.
pub(crate) const SWEEP_KERNEL_CHECKS: usize = 1024;

type Pair = (SocketAddr, SocketAddr);

/// One shard: its open connections and its most recently closed ones,
/// under one lock, so a connection moves from one to the other at once: a
/// lookup (a response on the connection, say the last streams of an HTTP/2
/// connection the server ended with GOAWAY) never falls between the two.
/// With a lock each, a lookup between the removal from the open table and
/// the push to the closed one found neither, and its request was
/// `untracked` (seen in e2e runs under load).
#[derive(Debug, Default)]
struct Shard {
    /// Open connections, found by their own socket address pair. A slot
    /// holds only the record's pointer (8 bytes; a map keyed by a copy of
    /// the pair took 72), the pair is read from the record.
    open: HashTable<Arc<ConnectionRecord>>,
    /// The most recently closed connections, oldest first (see
    /// [`CLOSED_PER_SHARD`]).
    closed: VecDeque<(Pair, Arc<ConnectionRecord>)>,
}

/// The shard of an address pair: connections to one server differ in their
/// local port.
fn shard_of((local, remote): Pair) -> usize {
    usize::from(local.port() ^ remote.port().rotate_left(8)) % SHARDS
}

/// The registry refused a connection: it holds `capacity` connections
/// that may all still be in use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RegistryFull {
    pub(crate) capacity: usize,
}

/// Connections closed most recently, per shard, that a response may still
/// name: 64 per shard, 1,024 in all (the oldest is forgotten first).
///
/// A server that closes after its last response (`Connection: close`, its
/// per-connection request limit) makes the socket disappear as soon as
/// hyper has read that response and closed its side, before the request
/// that carried it has run the middleware (it waits for its task to be
/// polled: milliseconds on a loaded machine); a miss asking the kernel
/// about the connection then sees its close first. Its response must
/// still name it. 1,024: at a thousand connections closed per second,
/// about a second of closes, far longer than a response waits for its
/// task.
const CLOSED_PER_SHARD: usize = 64;

/// Connections by (local, remote) socket address.
///
/// A connection stays until its close is observed (the handle removes it:
/// see `Inner::connection_closed`), never because newer ones arrived: a
/// connection the client can still use must stay attributable. The bound is
/// a safety cap on memory: at the cap a new connection is refused (and its
/// requests say so, `http.connection.untracked`), never an old one evicted.
/// Connections that closed without the handle seeing it (the server closed an
/// idle one; the client was dropped) are found by sweeps once the registry
/// is three quarters full: see [`Registry::sweep_due`]. A removed
/// connection stays findable by [`get`](Registry::get) among the most
/// recently closed ([`CLOSED_PER_SHARD`]), outside the cap, so a response
/// that arrives after its connection's close was observed still names it.
#[derive(Debug)]
pub(crate) struct Registry {
    shards: [Mutex<Shard>; SHARDS],
    /// Hashes a pair for the shards' tables (std's SipHash, randomly keyed).
    hasher: RandomState,
    len: AtomicUsize,
    capacity: usize,
    /// Start of the latest sweep, in ms since `created`.
    last_sweep_ms: AtomicU64,
    created: Instant,
}

impl Registry {
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            shards: std::array::from_fn(|_| Mutex::new(Shard::default())),
            hasher: RandomState::new(),
            len: AtomicUsize::new(0),
            capacity: capacity.max(1),
            last_sweep_ms: AtomicU64::new(0),
            created: Instant::now(),
        }
    }

    fn shard(&self, pair: Pair) -> MutexGuard<'_, Shard> {
        self.shards[shard_of(pair)]
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    fn hash(&self, pair: Pair) -> u64 {
        self.hasher.hash_one(pair)
    }

    /// Records a new connection, found by its socket address pair (a
    /// connection without one, a local transport, is not kept: nothing
    /// could find it). A previous connection on the same pair (the port was
    /// reused after a close) is replaced. At the cap the connection is
    /// refused.
    pub(crate) fn insert(&self, record: Arc<ConnectionRecord>) -> Result<(), RegistryFull> {
        let Some(pair) = record.pair() else {
            return Ok(());
        };
        let hash = self.hash(pair);
        let mut shard = self.shard(pair);
        if let Some(previous) = shard.open.find_mut(hash, |r| r.pair() == Some(pair)) {
            *previous = record;
            return Ok(());
        }
        let reserved = self
            .len
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (n < self.capacity).then_some(n + 1)
            });
        if reserved.is_err() {
            // Its responses must not name a closed connection that had the
            // same address pair.
            shard.closed.retain(|(p, _)| *p != pair);
            return Err(RegistryFull {
                capacity: self.capacity,
            });
        }
        // Only records with a pair are kept: the 0 is never used.
        shard
            .open
            .insert_unique(hash, record, |r| r.pair().map_or(0, |p| self.hash(p)));
        Ok(())
    }

    /// The connection on this address pair, if known: the open one, else
    /// the latest one closed recently (see [`CLOSED_PER_SHARD`]).
    pub(crate) fn get(
        &self,
        local: SocketAddr,
        remote: SocketAddr,
    ) -> Option<Arc<ConnectionRecord>> {
        let pair = (local, remote);
        let hash = self.hash(pair);
        let shard = self.shard(pair);
        if let Some(open) = shard.open.find(hash, |r| r.pair() == Some(pair)) {
            return Some(Arc::clone(open));
        }
        shard
            .closed
            .iter()
            .rev()
            .find(|(p, _)| *p == pair)
            .map(|(_, record)| Arc::clone(record))
    }

    /// Forgets a connection known to be closed: it leaves the open ones,
    /// and stays findable among the recently closed (see
    /// [`CLOSED_PER_SHARD`]), in one step under the shard's lock: a
    /// concurrent [`get`](Self::get) finds it in one or the other.
    pub(crate) fn remove(&self, local: SocketAddr, remote: SocketAddr, id: u64) {
        let pair = (local, remote);
        let hash = self.hash(pair);
        let mut shard = self.shard(pair);
        let removed = match shard.open.find_entry(hash, |r| r.pair() == Some(pair)) {
            Ok(entry) if entry.get().id() == id => entry.remove().0,
            _ => return,
        };
        self.len.fetch_sub(1, Ordering::Relaxed);
        if shard.closed.len() >= CLOSED_PER_SHARD {
            shard.closed.pop_front();
        }
        shard.closed.push_back((pair, removed));
    }

    /// The HTTP/2 connection to `host` among the recently closed (see
    /// [`CLOSED_PER_SHARD`]) that its server ended (GOAWAY, or another end
    /// of the server's) with the end reaching this client at or after
    /// `since`, or, undated, with traffic at or after it: hyper-util
    /// resends a request such a connection refused unprocessed. Walks every
    /// shard's closed list (1,024 at most): for the rare call that opened
    /// two connections, never per request.
    pub(crate) fn closed_http2_ended_since(&self, host: &HostKey, since: Instant) -> Option<u64> {
        let ended = |r: &ConnectionRecord| {
            r.http2()
                && r.host.as_ref() == Some(host)
                && match r.server_end_by() {
                    Some(by) => by >= since,
                    None => r.end().is_some_and(|e| e.by_server()) && r.last_activity() >= since,
                }
        };
        self.shards.iter().find_map(|shard| {
            shard
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .closed
                .iter()
                .rev()
                .find(|(_, r)| ended(r))
                .map(|(_, r)| r.id())
        })
    }

    /// Every connection currently remembered.
    pub(crate) fn snapshot(&self) -> Vec<Arc<ConnectionRecord>> {
        let mut all = Vec::with_capacity(self.len());
        for shard in &self.shards {
            all.extend(
                shard
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .open
                    .iter()
                    .cloned(),
            );
        }
        all
    }

    /// Number of connections currently remembered.
    pub(crate) fn len(&self) -> usize {
        self.len.load(Ordering::Relaxed)
    }

    /// Whether the caller should sweep now: the registry is at least three
    /// quarters full and no sweep started in the last second. `true` for
    /// one caller only.
    pub(crate) fn sweep_due(&self, now: Instant) -> bool {
        if self.len() < self.capacity - self.capacity / 4 {
            return false;
        }
        let now_ms = now.saturating_duration_since(self.created).as_millis() as u64;
        let interval = SWEEP_INTERVAL.as_millis() as u64;
        let last = self.last_sweep_ms.load(Ordering::Relaxed);
        // 0: never swept.
        (last == 0 || now_ms.saturating_sub(last) >= interval)
            && self
                .last_sweep_ms
                .compare_exchange(last, now_ms.max(1), Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;
    use crate::export::report::ConnectionSetup;
    use crate::pool::host::HostKey;

    /// Connection `id` on the address pair of local port `port`.
    fn record(id: u64, port: u16) -> Arc<ConnectionRecord> {
        let (local, remote) = pair(port);
        let mut setup = ConnectionSetup::for_test(id, Instant::now());
        setup.local_addr = Some(local);
        setup.peer_addr = Some(remote);
        Arc::new(ConnectionRecord::new(
            Arc::new(setup),
            SpanContext::empty_context(),
            None,
            Arc::new(ClientState::unknown_settings()),
            None,
            None,
        ))
    }

    fn pair(port: u16) -> Pair {
        (
            (Ipv4Addr::LOCALHOST, port).into(),
            (Ipv4Addr::LOCALHOST, 80).into(),
        )
    }

    #[test]
    fn the_latest_release_wins_and_reads_back_exactly() {
        let r = record(1, 1);
        assert_eq!(r.last_released(), None);
        let t0 = Instant::now();
        let later = t0 + Duration::from_nanos(1_500_000_007);
        r.mark_released(later);
        assert_eq!(r.last_released(), Some(later));
        // An earlier end reported late does not move it back.
        r.mark_released(t0);
        assert_eq!(r.last_released(), Some(later));
        assert_eq!(r.last_activity(), later);
    }

    #[test]
    fn the_setup_span_reads_back_whole() {
        use opentelemetry::trace::{SpanId, TraceFlags, TraceId, TraceState};
        let state = TraceState::from_key_value([("vendor", "v1")]).expect("trace state");
        for (cx, state) in [
            (
                SpanContext::new(
                    TraceId::from(7),
                    SpanId::from(9),
                    TraceFlags::SAMPLED,
                    false,
                    state.clone(),
                ),
                Some(state),
            ),
            (
                SpanContext::new(
                    TraceId::from(7),
                    SpanId::from(9),
                    TraceFlags::default(),
                    true,
                    TraceState::NONE,
                ),
                None,
            ),
            (SpanContext::empty_context(), None),
        ] {
            let r = ConnectionRecord::new(
                Arc::new(ConnectionSetup::for_test(1, Instant::now())),
                cx.clone(),
                None,
                Arc::new(ClientState::unknown_settings()),
                None,
                None,
            );
            assert_eq!(r.setup_span(), cx);
            assert_eq!(r.setup_span.state.is_some(), state.is_some());
        }
    }

    #[test]
    fn the_earliest_server_end_and_the_latest_naming_miss_win() {
        let r = record(1, 1);
        assert_eq!(r.named_by_miss_at(), None);
        assert!(!r.ended_with_last_response(), "no end dated");
        let t0 = Instant::now();
        r.mark_named_by_miss(t0 + Duration::from_millis(5));
        r.mark_named_by_miss(t0 + Duration::from_millis(2));
        assert_eq!(
            r.named_by_miss_at(),
            Some(t0 + Duration::from_millis(5)),
            "a miss classified earlier, marked later, does not move it back"
        );
        r.mark_released(t0);
        r.note_server_end_by(t0 + ENDED_WITH_LAST_RESPONSE + Duration::from_millis(1));
        assert!(!r.ended_with_last_response(), "too late after the release");
        r.note_server_end_by(t0 + ENDED_WITH_LAST_RESPONSE);
        assert!(r.ended_with_last_response(), "an earlier end wins");
        r.note_server_end_by(t0 + Duration::from_secs(10));
        assert!(r.ended_with_last_response(), "a later one does not move it");
    }

    #[test]
    fn a_connection_keeps_the_pool_historys_host_strings() {
        let history = crate::pool::model::PoolHistory::default();
        let first = HostKey::new("https", "example.test", 443);
        let unknown = HostKey::new("https", "example.test", 443);
        // Unknown host: the request's own key.
        assert!(Arc::ptr_eq(
            &history.shared_key(&unknown).host,
            &unknown.host
        ));
        assert!(history.record_connection(first.clone(), record(1, 1)));
        let later = HostKey::new("https", "example.test", 443);
        let shared = history.shared_key(&later);
        assert_eq!(shared, later);
        assert!(Arc::ptr_eq(&shared.host, &first.host));
        assert!(!Arc::ptr_eq(&shared.host, &later.host));
    }

    #[test]
    fn keeps_every_connection_and_refuses_past_the_cap() {
        let registry = Registry::new(3);
        for port in 1..=3 {
            assert_eq!(registry.insert(record(u64::from(port), port)), Ok(()));
        }
        assert_eq!(
            registry.insert(record(4, 4)),
            Err(RegistryFull { capacity: 3 })
        );
        // Nothing was evicted to make room.
        for port in 1..=3 {
            let (l, r) = pair(port);
            assert_eq!(registry.get(l, r).map(|r| r.id()), Some(u64::from(port)));
        }
        // A port reused after a close replaces its pair without a new slot.
        assert_eq!(registry.insert(record(22, 2)), Ok(()));
        assert_eq!(registry.len(), 3);
        let (l, r) = pair(2);
        assert_eq!(registry.get(l, r).map(|r| r.id()), Some(22));
        // A close frees a slot; a stale close (another id) does not.
        registry.remove(l, r, 2);
        assert_eq!(registry.len(), 3);
        registry.remove(l, r, 22);
        assert_eq!(registry.len(), 2, "closed: no longer counted");
        assert!(registry.snapshot().iter().all(|c| c.id() != 22), "not open");
        assert_eq!(registry.insert(record(4, 4)), Ok(()));
        assert_eq!((registry.len(), registry.snapshot().len()), (3, 3));
    }

    #[test]
    fn a_closed_connection_stays_findable_until_newer_closes_push_it_out() {
        let registry = Registry::new(8);
        let (l, r) = pair(7);
        registry.insert(record(7, 7)).expect("room");
        registry.remove(l, r, 7);
        assert_eq!(registry.len(), 0, "no longer counted against the cap");
        assert!(registry.snapshot().is_empty(), "not open");
        assert_eq!(registry.get(l, r).map(|r| r.id()), Some(7));
        // A new connection on the same pair is the one found.
        registry.insert(record(77, 7)).expect("room");
        assert_eq!(registry.get(l, r).map(|r| r.id()), Some(77));
        registry.remove(l, r, 77);
        assert_eq!(registry.get(l, r).map(|r| r.id()), Some(77));
        // Closes in the same shard push the oldest out (ports 16 apart
        // share a shard).
        for k in 1..=CLOSED_PER_SHARD as u16 {
            let (l2, r2) = pair(7 + 16 * k);
            registry
                .insert(record(1000 + u64::from(k), 7 + 16 * k))
                .expect("room");
            registry.remove(l2, r2, 1000 + u64::from(k));
        }
        assert_eq!(registry.get(l, r).map(|r| r.id()), None);
        let (l2, r2) = pair(7 + 16 * CLOSED_PER_SHARD as u16);
        assert!(registry.get(l2, r2).is_some());
    }

    /// A connection closing while a response on it looks it up (the last
    /// streams of an HTTP/2 connection the server ended) is found, open or
    /// closed, at every moment of its close: each connection is looked up
    /// by another thread all through its removal. Before, the open and the
    /// closed tables had a lock each, and a lookup between the two steps
    /// found neither.
    #[test]
    fn a_connection_is_found_all_through_its_close() {
        use std::sync::atomic::AtomicU64;
        const CLOSES: u64 = 20_000;
        let registry = Registry::new(8);
        // 0: none yet; else the id being closed (its port is `id % 60 + 1`).
        let closing = AtomicU64::new(0);
        // The last id the looker has seen closed (it looks once more after).
        let seen = AtomicU64::new(0);
        let port = |id: u64| u16::try_from(id % 60 + 1).expect("small");
        std::thread::scope(|s| {
            s.spawn(|| {
                for id in 1..=CLOSES {
                    registry.insert(record(id, port(id))).expect("room");
                    closing.store(id, Ordering::Release);
                    let (l, r) = pair(port(id));
                    registry.remove(l, r, id);
                    // In step with the looker: at most one close ahead.
                    while seen.load(Ordering::Acquire) < id {
                        std::hint::spin_loop();
                    }
                }
            });
            let mut missing = Vec::new();
            let mut last = 0;
            while last < CLOSES {
                let id = closing.load(Ordering::Acquire);
                if id == 0 {
                    std::hint::spin_loop();
                    continue;
                }
                let (l, r) = pair(port(id));
                if registry.get(l, r).map(|r| r.id()) != Some(id) {
                    missing.push(id);
                }
                if id != last {
                    last = id;
                    seen.store(id, Ordering::Release);
                }
            }
            assert!(missing.is_empty(), "not found: {missing:?}");
        });
    }

    #[test]
    fn a_refused_connection_does_not_name_the_closed_one_on_its_pair() {
        let registry = Registry::new(1);
        let (l, r) = pair(1);
        registry.insert(record(1, 1)).expect("room");
        registry.remove(l, r, 1);
        registry.insert(record(2, 2)).expect("room");
        assert!(registry.insert(record(3, 1)).is_err());
        assert_eq!(registry.get(l, r).map(|r| r.id()), None);
    }

    #[test]
    fn a_sweep_is_due_from_three_quarters_full_once_per_interval() {
        let registry = Registry::new(8);
        let t0 = Instant::now();
        for port in 1..=5 {
            registry
                .insert(record(u64::from(port), port))
                .expect("room");
        }
        assert!(!registry.sweep_due(t0), "5 of 8: not yet");
        registry.insert(record(6, 6)).expect("room");
        let t1 = t0 + Duration::from_millis(5);
        assert!(registry.sweep_due(t1));
        assert!(!registry.sweep_due(t1 + Duration::from_millis(10)));
        assert!(registry.sweep_due(t1 + SWEEP_INTERVAL));
    }
}
