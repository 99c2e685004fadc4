//! One connection as the handle saw it set up and used
//! ([`ConnectionRecord`]): its setup, client, host, requests, releases, how
//! it ended and the misses that named it, in atomics read on the request
//! path without a lock.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{LazyLock, OnceLock};
use std::time::{Duration, Instant};

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
    /// When its close was observed (see [`Self::closed_seen_at`]), as
    /// [`instant_nanos`]; 0 until then.
    closed_seen: AtomicU64,
    /// A miss named it as the connection whose announced close
    /// (`Connection: close`) caused it: each such close is named once.
    close_named: AtomicBool,
    /// End of the latest response on this connection (body read or
    /// dropped), as [`instant_nanos`]; 0 when none. An atomic, not a lock:
    /// every miss reads it for each remembered connection of its host.
    last_released: AtomicU64,
    /// When hyper-util's idle clock for the latest release may have
    /// started at the earliest, as [`instant_nanos`] (see
    /// [`idle_since`](Self::idle_since)); 0 when never released.
    put_back_from: AtomicU64,
    /// The release (its `last_released` value) after which a request with
    /// no response of its own last named it as the connection it most
    /// likely went out on ([`claim_unanswered`](Self::claim_unanswered)).
    unanswered_claim: AtomicU64,
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
    /// in milliseconds; `u64::MAX` = none seen (`timeout=0` is a value: a
    /// server that closes at once).
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
    /// HTTP/1.1: when the headers of a response announcing its close
    /// (`Connection: close`) reached the caller (as [`instant_nanos`]; 0
    /// when none): hyper closed it on reading that response.
    closing_response_at: AtomicU64,
    /// HTTP/2: the latest restart of hyper-util's idle clock a miss found
    /// (see [`InFlight::http2_clock_restart`]; as [`instant_nanos`], 0 when
    /// none).
    ///
    /// [`InFlight::http2_clock_restart`]: crate::pool::in_flight::InFlight::http2_clock_restart
    http2_clock_restart: AtomicU64,
    /// HTTP/2: the latest instant by which the server's end of it (GOAWAY,
    /// then its close) had reached this client, the earliest one seen: a
    /// request on it refused by the GOAWAY, a miss that found it unusable
    /// (hyper-util hands out a live HTTP/2 connection to every request), or
    /// our close after the GOAWAY as the kernel dates it. See
    /// [`ended_with_last_response`](Self::ended_with_last_response). As
    /// [`instant_nanos`]; 0 when none.
    server_end_by: AtomicU64,
    /// HTTP/2: the earliest miss that found hyper-util's pool had expired
    /// it (its idle timeout ran out): the pool dropped it then, and never
    /// hands it out again, even while a stream still runs on it. As
    /// [`instant_nanos`]; 0 when none.
    http2_pool_expired_at: AtomicU64,
    /// HTTP/2: it served a request other than the one whose connect made
    /// it, so hyper-util's pool held it. A connection a concurrent connect
    /// made while another one was pooled serves only that request (the
    /// pool's `put` keeps one HTTP/2 connection per host), then closes.
    shared: AtomicBool,
    /// Its socket's end is watched (HTTP/1.1, see
    /// [`kernel::watch_end`](crate::kernel::watch_end)).
    end_watched: AtomicBool,
    /// The kernel reports its socket's end (HTTP/2 included, where nothing
    /// waits for the report): a socket gone with no report yet ended
    /// moments ago.
    end_reported: AtomicBool,
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
            closed_seen: AtomicU64::new(0),
            close_named: AtomicBool::new(false),
            last_released: AtomicU64::new(0),
            put_back_from: AtomicU64::new(0),
            unanswered_claim: AtomicU64::new(0),
            dropped_early: AtomicBool::new(false),
            connection_close: AtomicBool::new(false),
            client_asked_close: AtomicBool::new(false),
            end_seen: OnceLock::new(),
            end_inferred: OnceLock::new(),
            server_keep_alive_ms: AtomicU64::new(u64::MAX),
            stream_resets: AtomicU64::new(0),
            stalled: AtomicBool::new(false),
            newest_answer: None,
            idle_others_at_release: AtomicUsize::new(usize::MAX),
            named_by_miss: AtomicU64::new(0),
            latest_request_started: AtomicU64::new(0),
            closing_response_at: AtomicU64::new(0),
            http2_clock_restart: AtomicU64::new(0),
            server_end_by: AtomicU64::new(0),
            http2_pool_expired_at: AtomicU64::new(0),
            shared: AtomicBool::new(false),
            end_watched: AtomicBool::new(false),
            end_reported: AtomicBool::new(false),
            socket_end: OnceLock::new(),
            runtime: tokio::runtime::Handle::try_current().ok().map(|h| h.id()),
        }
    }

    /// Its socket's end is watched: the kernel's report of it will come
    /// ([`socket_end`](Self::socket_end)).
    pub(crate) fn mark_end_watched(&self) {
        self.end_watched.store(true, Ordering::Release);
    }

    /// The kernel will report its socket's end (HTTP/1.1 and HTTP/2).
    pub(crate) fn mark_end_reported(&self) {
        self.end_reported.store(true, Ordering::Release);
    }

    /// Whether the kernel reports its socket's end (see
    /// [`mark_end_reported`](Self::mark_end_reported)).
    pub(crate) fn end_reported(&self) -> bool {
        self.end_reported.load(Ordering::Acquire)
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

    /// Records whether a response on it said `Connection: close` (the
    /// middleware only ever sets it: see `request::attribution`).
    pub(crate) fn set_connection_close(&self, close: bool) {
        self.connection_close.store(close, Ordering::Relaxed);
    }

    /// Records whether the request whose response announced the close sent
    /// `Connection: close` itself (then that close is the client's).
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

    /// A request with no response of its own to read its connection from
    /// (it failed, or its redirect was refused) names this idle HTTP/1.1
    /// connection as the one hyper-util most likely handed it: `true` for
    /// the first such request since its latest release only. HTTP/1.1
    /// carries one request at a time, so a concurrent one that lost the
    /// claim went out on another connection. A connection never released
    /// (pooled unused) can be claimed once before its first release.
    pub(crate) fn claim_unanswered(&self) -> bool {
        // 0: never released; the claim's initial value, so it stands for
        // the unused connection's one claim as `u64::MAX`.
        let release = match self.last_released.load(Ordering::Acquire) {
            0 => u64::MAX,
            at => at,
        };
        self.unanswered_claim.swap(release, Ordering::AcqRel) != release
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
    /// (`goaway` for HTTP/2, but `peer_fin` when the kernel's report of the
    /// socket's end shows the close unannounced, see
    /// [`http2_close_unannounced`](Self::http2_close_unannounced);
    /// `peer_fin`, `peer_closed`), and returns how it ended (an end its own
    /// traffic recorded first stays).
    pub(crate) fn closed_by_server(&self, fin: bool) -> ConnectionEnd {
        let reported = self
            .socket_end()
            .map(|end| (end.since_last_receive, end.seen_at));
        self.closed_by_server_after(fin, reported)
    }

    /// As [`closed_by_server`](Self::closed_by_server), with what the
    /// kernel showed of its last receive: `since_last_receive` before `at`
    /// (the socket's `tcp_info` as found closing, or the report of its
    /// end).
    pub(crate) fn closed_by_server_after(
        &self,
        fin: bool,
        last_receive: Option<(Duration, Instant)>,
    ) -> ConnectionEnd {
        if self.said_connection_close() {
            self.set_end(self.announced_close_end());
        } else if self.http2() {
            let unannounced =
                last_receive.is_some_and(|(since, at)| self.http2_close_unannounced(since, at));
            self.infer_end(if unannounced {
                ConnectionEnd::PeerFin
            } else {
                ConnectionEnd::GoAway
            });
        } else if fin {
            self.infer_end(ConnectionEnd::PeerFin);
        } else {
            self.infer_end(ConnectionEnd::PeerClosed);
        }
        self.end().unwrap_or(ConnectionEnd::PeerClosed)
    }

    /// HTTP/2: the server's close, seen closing by `at` with its last data
    /// received `since_last_receive` before, came with no data after the
    /// connection's last response: no GOAWAY (RFC 9113 section 6.8) nor,
    /// over TLS, close_notify announced it, only a FIN, as a proxy closing
    /// an idle `CONNECT` tunnel or a load balancer sends (a tester's proxy:
    /// read `goaway` in 11 of 11 runs, sending the operator to the
    /// server's keep-alive). Told only when the close came more than
    /// [`ENDED_WITH_LAST_RESPONSE`] after that response (a GOAWAY sent with
    /// it leaves no later data either), with a jiffy (10 ms) for the
    /// kernel counter's resolution. hyper's HTTP/2 client closes its side
    /// as soon as it reads the FIN, so `at` dates the close.
    pub(crate) fn http2_close_unannounced(
        &self,
        since_last_receive: Duration,
        at: Instant,
    ) -> bool {
        let Some(released) = self.last_released() else {
            return false;
        };
        let quiet_since_response = at.saturating_duration_since(released);
        quiet_since_response > ENDED_WITH_LAST_RESPONSE
            && since_last_receive + Duration::from_millis(10) >= quiet_since_response
    }

    /// The server's end of it (HTTP/2 GOAWAY) had reached this client by
    /// `at`; the earliest such instant is kept.
    pub(crate) fn note_server_end_by(&self, at: Instant) {
        keep_earliest(&self.server_end_by, at);
    }

    /// HTTP/2: the earliest instant by which the server's end of it was
    /// known to have reached this client (see
    /// [`note_server_end_by`](Self::note_server_end_by)).
    pub(crate) fn server_end_by(&self) -> Option<Instant> {
        instant_of(self.server_end_by.load(Ordering::Acquire))
    }

    /// HTTP/2: a miss classified `at` found that hyper-util's pool had
    /// expired it (see `http2_pool_expired_at`); the earliest is kept.
    pub(crate) fn mark_http2_pool_expired(&self, at: Instant) {
        keep_earliest(&self.http2_pool_expired_at, at);
    }

    /// HTTP/2: when a miss first found hyper-util's pool had expired it
    /// (see [`mark_http2_pool_expired`](Self::mark_http2_pool_expired)).
    pub(crate) fn http2_pool_expired_at(&self) -> Option<Instant> {
        instant_of(self.http2_pool_expired_at.load(Ordering::Acquire))
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
            .min(u64::MAX - 1);
        self.server_keep_alive_ms.swap(ms, Ordering::Relaxed) == u64::MAX
    }

    /// The server's advertised keep-alive timeout, if any.
    pub(crate) fn server_keep_alive(&self) -> Option<Duration> {
        match self.server_keep_alive_ms.load(Ordering::Relaxed) {
            u64::MAX => None,
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

    /// Marks the close observed at `at` (the first time only counts); `true`
    /// the first time only.
    pub(crate) fn mark_closed_at(&self, at: Instant) -> bool {
        if !self.mark_closed() {
            return false;
        }
        self.closed_seen.store(instant_nanos(at), Ordering::Release);
        true
    }

    /// When its close was observed (the kernel's view, a failure on it, an
    /// announced close), if it was through [`Self::mark_closed_at`].
    pub(crate) fn closed_seen_at(&self) -> Option<Instant> {
        instant_of(self.closed_seen.load(Ordering::Acquire))
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

    /// Records the end of a response on this connection (the latest wins),
    /// hyper-util's put-back taken to be no earlier than that end.
    pub(crate) fn mark_released(&self, at: Instant) {
        self.mark_released_put_back_from(at, at);
    }

    /// Records the end of a response on this connection, read by the
    /// caller `at`, which hyper may have finished reading, and hyper-util
    /// put back in its pool, as early as `put_back_from` (no later than
    /// `at`): see [`PutBackBound`](crate::request::put_back::PutBackBound).
    /// The latest release wins; a later release's bound is never earlier
    /// than an earlier release's end (one HTTP/1.1 response at a time, and
    /// HTTP/2's bound is its end).
    pub(crate) fn mark_released_put_back_from(&self, at: Instant, put_back_from: Instant) {
        self.put_back_from
            .fetch_max(instant_nanos(put_back_from.min(at)), Ordering::AcqRel);
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

    /// Records that the headers of a response announcing its close reached
    /// the caller `at` (HTTP/1.1 `Connection: close`).
    pub(crate) fn note_closing_response(&self, at: Instant) {
        self.closing_response_at
            .store(instant_nanos(at), Ordering::Release);
    }

    /// When the headers of its response announcing its close reached the
    /// caller (`None`: none did).
    pub(crate) fn closing_response_at(&self) -> Option<Instant> {
        instant_of(self.closing_response_at.load(Ordering::Acquire))
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

    /// [`idle_since`](Self::idle_since) of a connection that has been
    /// released (`None` before its first release): the earliest date of
    /// hyper-util's put-back of its latest response.
    pub(crate) fn put_back_from(&self) -> Option<Instant> {
        self.last_released().map(|_| self.idle_since())
    }

    /// When it went idle, or closed, at the earliest: hyper-util's put-back
    /// bound of its latest response ([`idle_since`](Self::idle_since),
    /// which a caller reading the body late follows), or, while the caller
    /// still holds a response announcing its close (HTTP/1.1 `Connection:
    /// close`, its body unread: hyper closed the connection on reading it),
    /// when that response's headers arrived. Not the caller's read: under
    /// concurrent streams that read late, a tester saw 38 of 159
    /// `request_limit` misses name a connection the server had closed over
    /// 500 ms before, while the one it had just closed went unnamed.
    pub(crate) fn idle_or_closed_since(&self) -> Instant {
        let idle_since = self.idle_since();
        match self.closing_response_at() {
            Some(at) if !self.http2() && self.in_use() > 0 && self.said_connection_close() => {
                at.max(idle_since)
            }
            _ => idle_since,
        }
    }

    /// HTTP/2: when hyper-util's idle clock for this shared connection last
    /// restarted, as far as we know: the start of the latest request
    /// counted on it (hyper-util dates a shared connection at each checkout,
    /// which comes right after a request's start; a stream's end restarts
    /// nothing), or a later restart a miss found by requests in flight
    /// ([`note_http2_clock_restart`](Self::note_http2_clock_restart)), or
    /// its ready time (its insertion into the pool).
    pub(crate) fn http2_idle_since(&self) -> Instant {
        let restart = instant_of(self.http2_clock_restart.load(Ordering::Acquire));
        self.latest_request_started()
            .max(restart)
            .map_or(self.ready_at(), |started| started.max(self.ready_at()))
    }

    /// HTTP/2: records that a miss found hyper-util's idle clock for this
    /// connection restarted as late as `at` by requests still in flight
    /// (the latest such date wins).
    pub(crate) fn note_http2_clock_restart(&self, at: Instant) {
        self.http2_clock_restart
            .fetch_max(instant_nanos(at), Ordering::AcqRel);
    }

    /// When hyper-util's idle clock for this connection may have started at
    /// the earliest: the earliest instant hyper may have finished reading
    /// its latest response (hyper-util puts an HTTP/1.1 connection back as
    /// soon as hyper has, a small body read later by the caller or not),
    /// or its ready time when it has carried none. No later than
    /// [`last_activity`](Self::last_activity). What an idle timeout is
    /// measured from: a body the caller read after the timeout had already
    /// expired the connection in hyper-util's pool.
    pub(crate) fn idle_since(&self) -> Instant {
        instant_of(self.put_back_from.load(Ordering::Acquire))
            .unwrap_or(self.ready_at())
            .max(self.ready_at())
    }
}

impl SocketEndSink for ConnectionRecord {
    fn socket_ended(&self, end: SocketEnd) {
        let _ = self.socket_end.set(Box::new(end));
    }
}

/// Stores `at` in `slot` (as [`instant_nanos`], 0 for none) unless an
/// earlier instant is there already.
fn keep_earliest(slot: &AtomicU64, at: Instant) {
    let at = instant_nanos(at);
    let _ = slot.fetch_update(Ordering::AcqRel, Ordering::Acquire, |earlier| {
        (earlier == 0 || at < earlier).then_some(at)
    });
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

/// A connection's socket address pair: (local, remote).
pub(crate) type Pair = (SocketAddr, SocketAddr);

#[cfg(test)]
pub(crate) mod tests {
    use std::net::Ipv4Addr;

    use super::*;
    use crate::export::report::ConnectionSetup;
    use crate::pool::host::HostKey;

    /// Connection `id` on the address pair of local port `port`.
    pub(crate) fn record(id: u64, port: u16) -> Arc<ConnectionRecord> {
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

    pub(crate) fn pair(port: u16) -> Pair {
        (
            (Ipv4Addr::LOCALHOST, port).into(),
            (Ipv4Addr::LOCALHOST, 80).into(),
        )
    }

    /// The server's advertised keep-alive timeout reads back exactly,
    /// `timeout=0` included (a server that closes at once; it read 1 ms
    /// when 0 stood for none), and only the first one counts as first.
    #[test]
    fn a_server_keep_alive_reads_back_exactly_zero_included() {
        let r = record(1, 1);
        assert_eq!(r.server_keep_alive(), None);
        assert!(r.set_server_keep_alive(Duration::ZERO));
        assert_eq!(r.server_keep_alive(), Some(Duration::ZERO));
        assert!(!r.set_server_keep_alive(Duration::from_secs(5)));
        assert_eq!(r.server_keep_alive(), Some(Duration::from_secs(5)));
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
}
