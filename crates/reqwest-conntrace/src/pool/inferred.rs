//! Pool limits inferred from what a client's own pool does with its
//! released connections, for the limits this crate could not read (set on
//! reqwest's builder, which has no getter for them).
//!
//! hyper-util's pool closes an idle connection for one of two limits, at
//! two distinguishable moments:
//! - `pool_max_idle_per_host`: at its release, when the host's idle list
//!   already holds that many (hyper-util `PoolInner::put`): closed within
//!   moments of the release, while `N` others were idle, so the limit is at
//!   most `N`;
//! - `pool_idle_timeout` `T`: by its idle check, which runs every `T` (at
//!   least every 90 ms, hyper-util `spawn_idle_interval`), so the close
//!   comes `T` to about `2T` after the release: the timeout is at most the
//!   idle time at close (and more than half of it).
//!
//! The close and its moment come from the kernel: our side closed first
//! (`FIN_WAIT*`, `TIME_WAIT`), and the `FIN_WAIT2` or `TIME_WAIT` timer
//! dates the close ([`TcpFacts::closed_ago`]); over TLS, `TIME_WAIT` is
//! the pool's close only when the kernel's report of the socket's end
//! shows no data from the server after the response (a server that
//! answers our close_notify with its FIN alone, as nginx does); else the
//! server's close_notify came first and hyper closed on it, and the miss
//! names the server (`pool::kernel_decision::decide_from_kernel`). A close of ours
//! that the server answers with its close_notify leaves no `TIME_WAIT`
//! (that data resets the socket). Only HTTP/1.1 connections that were idle in
//! the pool count: not one with a request on it, one whose body was
//! dropped early (hyper closed it for that), one whose own traffic showed
//! how it ended (a request that gave up on its response, a failed body), or
//! one the server ended (`Connection: close`, a reset).
//!
//! A third close looks like the idle limit's: the release race. A request
//! whose checkout found nothing idle (the connection was still on its way
//! back) starts a connect; when hyper-util then hands the returning
//! connection to that checkout but the connect completes first, it drops
//! the checkout and closes the connection with it (hyper-util 0.1
//! `client.rs`, "Connect won, checkout can just be dropped"). That close
//! comes after the miss that named the connection, by less than a connect
//! takes: on loopback within the `TIME_WAIT` timer's resolution
//! ([`CLOSE_DATING_SLACK`]). Such a close is told from the idle limit's by
//! what the pool did before ([`PoolClose::CheckoutDropped`]), or left
//! unsure until a second one confirms the limit ([`PoolClose::Unsure`]).
//!
//! Under load hyper-util's own task closes a connection of a pool that
//! keeps none after the next request's miss, so the kernel may still show
//! it alive, or our close undated: the miss looks again
//! ([`look_again_at`](crate::pool::kernel_decision::look_again_at)). And a release
//! may count as idle a connection already closed that way: a close found at
//! release is taken out of the later releases' counts
//! ([`PoolHistory::uncount_closed`](crate::pool::model::PoolHistory::uncount_closed)).
//! The pool is known on (its idle limit above 0) once it hands an HTTP/1.1
//! connection out again ([`InferredLimits::note_reuse`]).
//!
//! Under concurrency the idle counts at release have no order to rest on
//! (releases moments apart reach hyper-util in any order), so an idle
//! limit of 0 is also inferred from the client's connections as a whole:
//! every one it released was closed at its release, none kept
//! ([`PoolHistory::pool_off_evidence`](crate::pool::model::PoolHistory::pool_off_evidence)).

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::kernel::TcpFacts;
use crate::miss::{ConnectionEnd, MissReason};
use crate::pool::record::ConnectionRecord;
use crate::semconv;

/// A close this soon after the release (our release time and hyper-util's
/// differ by scheduling delays, tens of milliseconds on a loaded machine)
/// is the idle limit's, not the idle timeout's: hyper-util's idle check
/// runs every `max(pool_idle_timeout, 90 ms)` (`MIN_CHECK`), so closes an
/// expired connection at least the idle timeout after it was put back;
/// 75 ms leaves the dating's 10 ms slack ([`CLOSE_DATING_SLACK`]) below
/// 90 ms. An idle timeout of 75 ms or less can be taken for the idle limit,
/// or, where that limit cannot explain the close, for the server's close
/// (row 10, [`servers_close_at_release`](crate::pool::kernel_decision::servers_close_at_release)).
pub(crate) const CLOSED_AT_RELEASE: Duration = Duration::from_millis(75);

/// Two releases of one client's connections to one host closer than this,
/// the earlier one during the later one's request,
/// may have reached hyper-util's pool in the other order (it puts a
/// connection back on a task of its own): the idle count at either release
/// is then no bound on the idle limit, and neither is kept.
pub(crate) const RELEASE_ORDER_UNSURE: Duration = Duration::from_millis(20);

/// How far apart two releases of one client's connections to one host may
/// reach hyper-util's pool in the other order, as far as a close at
/// release learned later is concerned
/// ([`PoolHistory::with_reordered_releases`](crate::pool::model::PoolHistory::with_reordered_releases)):
/// seen beside two CPU-burning processes with the whole e2e suite running,
/// three bodies read 100 ms apart, over an idle limit of 1, were put back
/// last first (the third kept, the first two closed), once in about 30
/// runs.
pub(crate) const RELEASE_REORDER_WINDOW: Duration = Duration::from_millis(500);

/// How far a close dated by the `TIME_WAIT` timer may be off: the timer
/// counts in jiffies (`HZ` is 100 to 1000, so up to 10 ms a tick), and
/// the state begins one round trip after our FIN.
pub(crate) const CLOSE_DATING_SLACK: Duration = Duration::from_millis(10);

/// How soon after its release an HTTP/1.1 connection found gone at a miss
/// is taken as closed by its client's pool, when that release may have
/// been over the idle limit ([`ConnectionRecord::is_over_idle_limit_unsure`]).
/// The pool closes it at release; a server closes an idle keep-alive
/// connection only after its keep-alive timeout, which servers set in
/// whole seconds (nginx `keepalive_timeout`, 75 s by default; Apache
/// `KeepAliveTimeout`, 5 s; Node.js `keepAliveTimeout`, 5 s). Later, a gone
/// socket is the server's close, as without the doubt.
pub(crate) const OWN_CLOSE_WINDOW: Duration = Duration::from_secs(1);

/// Where a pool limit a miss reason depended on came from
/// (`http.connection.pool.limits`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LimitSource {
    /// Set through this crate's builder.
    Configured,
    /// Inferred from the closes the client's pool made (this module).
    Inferred,
    /// Neither: the reason is the kernel's fallback.
    Unknown,
}

impl LimitSource {
    /// The `http.connection.pool.limits` value.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            LimitSource::Configured => semconv::POOL_LIMITS_CONFIGURED,
            LimitSource::Inferred => semconv::POOL_LIMITS_INFERRED,
            LimitSource::Unknown => semconv::POOL_LIMITS_UNKNOWN,
        }
    }
}

/// How the client's own pool closed one of its idle connections.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum PoolClose {
    /// At its release, while `idle_others` other connections of the client
    /// to the host were idle (as far as this crate knew then: some of them
    /// may have been closed already, so the limit is at most this); `None`
    /// when the release order was unsure ([`RELEASE_ORDER_UNSURE`]).
    AtRelease { idle_others: Option<usize> },
    /// At its release, but dated no earlier than a miss that named it (see
    /// the module docs): hyper-util handed it to that miss's checkout after
    /// the miss's own connect had won, and dropped it. Told so because the
    /// client's pool could not have closed it for its idle limit: the pool
    /// has handed a connection out again (so it is on: that limit is not
    /// 0) while none other was idle; or the limit was set through this
    /// crate's builder and the release was within it (or nothing else was
    /// in flight at the miss: the pool held nothing idle, the checkout
    /// would have had it).
    CheckoutDropped,
    /// At its release, dated no earlier than a miss that named it, and
    /// nothing yet tells the idle limit's close from the release race's
    /// (the first such close of a client whose pool never handed a
    /// connection out again): no bound is taken. A second one at no more
    /// idle others, on another connection, confirms the limit
    /// ([`PoolClose::AtRelease`]).
    Unsure,
    /// After sitting idle for `idle`: the idle timeout is at most this.
    Expired { idle: Duration },
    /// Between hyper's read of its latest response and the caller's late
    /// read of the body ([`CloseTiming::InDoubt`]): at a put-back a
    /// body's end arriving late delayed (its idle limit), or past its idle
    /// timeout, not known which. No bound, and no close at release: no
    /// limit is inferred from it (taken for one, a tester's client idle
    /// timeout closing connections 50 ms after each late read read
    /// `pool_disabled`, 80 of 88 misses).
    InDoubt,
    /// At its put-back, never having carried a request (its connect lost
    /// to another connection), while a request to the host may have been
    /// waiting for one ([`ConnectionRecord::pooled_unused_to_waiter`]):
    /// hyper-util's pool hands a put-back connection to a waiting checkout
    /// before it counts the idle limit, and drops it when that checkout's
    /// own connect had won. It was never idle in the pool: no bound, and no
    /// miss names it.
    DroppedAtPutBack,
}

impl PoolClose {
    /// Records on `record` how it ended (and, at release, that it was over
    /// the idle limit, so later misses and counts skip it).
    pub(crate) fn mark(self, record: &ConnectionRecord) {
        match self {
            PoolClose::AtRelease { .. } => {
                record.mark_over_idle_limit();
                record.infer_end(ConnectionEnd::IdleLimit);
            }
            PoolClose::Expired { .. } => record.infer_end(ConnectionEnd::IdleTimeout),
            PoolClose::Unsure | PoolClose::InDoubt => record.infer_end(ConnectionEnd::PoolClosed),
            PoolClose::DroppedAtPutBack => {
                record.infer_end(ConnectionEnd::PoolClosed);
                record.name_close();
            }
            // Alive when the miss named it: no end that caused a miss.
            PoolClose::CheckoutDropped => {}
        }
    }
}

/// How the client's pool closed `record`, if the kernel's `facts` (asked
/// at `now`) show our side closed it while it was idle in the pool and
/// date that close; `None` otherwise. A close at release dated no earlier
/// than a miss that named the connection is judged against the client's
/// history ([`close_after_miss`]); `alone`: nothing else to the host was
/// in flight at that miss.
pub(crate) fn pool_close(
    record: &ConnectionRecord,
    facts: &TcpFacts,
    now: Instant,
    alone: bool,
) -> Option<PoolClose> {
    if !facts.state.closed_by_us() {
        return None;
    }
    let closed_at = now.checked_sub(facts.closed_ago()?)?;
    pool_close_at(record, closed_at, alone)
}

/// As [`pool_close`], for a close of ours the kernel reported at its
/// socket's end (HTTP/1.1 over TLS: the server's close_notify answered it
/// and reset the socket, so no timer dates it; see
/// [`kernel::SocketEnd`](crate::kernel::SocketEnd)): `idle` after the
/// candidate's last response, the time between the last data the socket
/// received and our close_notify.
pub(crate) fn pool_close_after(
    record: &ConnectionRecord,
    idle: Duration,
    alone: bool,
) -> Option<PoolClose> {
    pool_close_at(record, record.put_back_from()? + idle, alone)
}

/// Whether `record` was released within its client's idle limit for
/// sure, so that the pool did not close it at its release: the limit set
/// through our builder and fewer other connections idle at the release
/// than it, the release not counted over it. Never for a connection that
/// carried no request: hyper-util may drop one at its put-back, handed to
/// a checkout whose own connect won, whatever the limit (a tester saw such
/// a close, at the ready time, read as the server's). A limit not set through our
/// builder gives no such certainty, even one a reuse showed above 0: the
/// idle count at a release is a belief that closes learned late lower (a
/// fan-out's connections closed over reqwest's `pool_max_idle_per_host`
/// read as the server's).
pub(crate) fn released_within_idle_limit(record: &ConnectionRecord) -> bool {
    let client = &record.client;
    let others = record.idle_others_at_release();
    release_not_counted_over(record)
        && client.max_idle_known
        && client
            .max_idle_per_host
            .zip(others)
            .is_none_or(|(limit, others)| others < limit)
}

/// Whether the client's pool kept `record` at its latest release, as far
/// as it has shown, with nothing else to the host in flight at the miss
/// asking (`alone`; with other requests in flight the idle count at a
/// release is no bound): released within an idle limit set through our
/// builder ([`released_within_idle_limit`]), or, the limit not ours to
/// read, the pool has handed an HTTP/1.1 connection out again (so it keeps
/// one at least: hyper-util turns the pool off for a limit of 0) and held
/// no other idle connection then. hyper-util closes an idle HTTP/1.1
/// connection at its put-back for that limit only (or with a checkout its
/// connect won, which comes after a miss).
pub(crate) fn kept_at_release(record: &ConnectionRecord, alone: bool) -> bool {
    let client = &record.client;
    alone
        && !record.http2()
        && (released_within_idle_limit(record)
            || (!client.max_idle_known
                && client.inferred.keeps_idle()
                && release_not_counted_over(record)
                && record.idle_others_at_release() == Some(0)))
}

/// Whether `record` carried a request and its latest release was not
/// counted over the idle limit, surely or maybe: what
/// [`released_within_idle_limit`] and [`kept_at_release`] ask first.
fn release_not_counted_over(record: &ConnectionRecord) -> bool {
    !record.never_used() && !record.is_over_idle_limit() && !record.is_over_idle_limit_unsure()
}

/// When a close of ours came, against hyper-util's put-back of the
/// connection's latest response ([`close_timing`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum CloseTiming {
    /// No more than [`CLOSED_AT_RELEASE`] after the put-back's earliest
    /// date ([`ConnectionRecord::idle_since`]): at the put-back.
    AtPutBack,
    /// Later than that, but no more than `CLOSED_AT_RELEASE` after the
    /// caller's late read of the body, under a pool not shown to keep the
    /// connection there: at a put-back the body's end delayed, or past the
    /// idle timeout, not known which.
    InDoubt,
    /// Later: past the idle timeout (or the server's, answered).
    Later,
}

/// When a close of ours at `closed_at` came against hyper-util's put-back
/// of `record`'s latest response (`None` before its first release). The
/// put-back came no earlier than [`ConnectionRecord::idle_since`] (hyper
/// had read the response) and no later than our release (the caller read
/// the body's end); between the two, when the caller read the body late
/// without waiting for it, the body's reads do not tell when its end
/// arrived. So a close within `CLOSED_AT_RELEASE` of the release but later
/// after `idle_since` is [`CloseTiming::InDoubt`] unless the pool kept the
/// connection there ([`kept_at_release`], `alone`): then only the idle
/// timeout closes it ([`CloseTiming::Later`]). [`pool_close`] reads an
/// `InDoubt` close as the put-back's only over an idle limit the pool has
/// shown, else as not known: [`PoolClose::InDoubt`] (a server that sent
/// the body's end after the headers, read late, had closes at the put-back
/// over reqwest's `pool_max_idle_per_host` read as `idle_expired`, 54 of 54
/// misses of a tester's waves, while counted from `idle_since` alone).
pub(crate) fn close_timing(
    record: &ConnectionRecord,
    closed_at: Instant,
    alone: bool,
) -> Option<CloseTiming> {
    let released = record.last_released()?;
    Some(if closed_at <= record.idle_since() + CLOSED_AT_RELEASE {
        CloseTiming::AtPutBack
    } else if closed_at <= released + CLOSED_AT_RELEASE && !kept_at_release(record, alone) {
        CloseTiming::InDoubt
    } else {
        CloseTiming::Later
    })
}

/// How the client's pool closed `record`, closed by our side at
/// `closed_at` while it was idle in the
/// pool; `None` when it was not idle there, or its traffic showed another
/// end.
fn pool_close_at(record: &ConnectionRecord, closed_at: Instant, alone: bool) -> Option<PoolClose> {
    if record.http2()
        || record.in_use() > 0
        || record.is_discarded()
        || record.is_dropped_early()
        || record.said_connection_close()
        || record.seen_end().is_some()
        || record.end().is_some_and(ConnectionEnd::by_server)
    {
        return None;
    }
    let released = record.last_released()?;
    // From hyper-util's put-back as early as it may have come: a body the
    // caller read late was back in the pool, its idle clock running, since
    // hyper read it.
    let idle = closed_at.saturating_duration_since(record.idle_since());
    let at_release = match close_timing(record, closed_at, alone)? {
        CloseTiming::AtPutBack => true,
        // The body read late, the close between the put-back's earliest
        // date and the caller's read, the pool not shown to keep it: at a
        // put-back as late as the body's end, or past the idle timeout, as
        // it happened. Over an idle limit it has shown (set through our
        // builder, or inferred), the put-back's; else not known (a
        // tester's spare left by a release race, idle with it, read
        // `pool_disabled` as a close at release over a limit of 1).
        CloseTiming::InDoubt => {
            let idle_others = record.idle_others_at_release();
            let over_shown_limit = record.is_over_idle_limit()
                || (!record.client.max_idle_known
                    && record
                        .client
                        .inferred
                        .idle_limit()
                        .zip(idle_others)
                        .is_some_and(|(limit, others)| others >= limit));
            return Some(if over_shown_limit {
                PoolClose::AtRelease { idle_others }
            } else {
                PoolClose::InDoubt
            });
        }
        CloseTiming::Later => put_back_late(record, idle),
    };
    if at_release {
        let idle_others = record.idle_others_at_release();
        let after_miss = record
            .named_by_miss_at()
            .is_some_and(|named| named >= released && closed_at + CLOSE_DATING_SLACK >= named);
        // Within a known limit the pool did not turn it away; with the
        // limit unknown nothing tells, and a bound taken from a close that
        // may be the hand-back's would be wrong (seen under load: a
        // connection pooled unused during a concurrent wave read as closed
        // at the idle limit of a pool that had none).
        let within_limit = !record.client.max_idle_known
            || record
                .client
                .max_idle_per_host
                .zip(idle_others)
                .is_none_or(|(limit, others)| others < limit);
        Some(if record.pooled_unused_to_waiter() && within_limit {
            PoolClose::DroppedAtPutBack
        } else if after_miss {
            close_after_miss(record, idle_others, alone)
        } else {
            PoolClose::AtRelease { idle_others }
        })
    } else if never_used_unsure_expiry(record, idle) {
        Some(PoolClose::Unsure)
    } else {
        Some(PoolClose::Expired { idle })
    }
}

/// Whether a close of `record` dated `idle` after its release, later than
/// [`CLOSED_AT_RELEASE`], came at hyper-util's put-back all the same: it
/// never carried a request (its ready time stands for the put-back, which
/// hyper-util's background connect task makes once the connection's task
/// has run, later on a starved runtime), the client's idle timeout is set
/// through our builder, and the close came before it (so no expiry).
fn put_back_late(record: &ConnectionRecord, idle: Duration) -> bool {
    let client = &record.client;
    record.never_used()
        && idle < OWN_CLOSE_WINDOW
        && client.idle_timeout_known
        && client
            .idle_timeout
            .is_none_or(|t| idle + CLOSE_DATING_SLACK < t)
}

/// Whether a close of `record` dated `idle` after its release, later than
/// [`CLOSED_AT_RELEASE`], is not known to be an expiry: it never carried a
/// request (its put-back may have come that late, and been the close: over
/// the idle limit, or handed to a checkout that dropped it; seen beside two
/// burners, a fan-out of 100 over an idle limit of 10 read `idle_expired`
/// for such closes), less than [`OWN_CLOSE_WINDOW`]
/// after its ready time, under an idle timeout not set through our builder
/// that no close of a connection with a known release has bounded at or
/// below `idle`. Such a close bounds nothing (`pool_closed`).
fn never_used_unsure_expiry(record: &ConnectionRecord, idle: Duration) -> bool {
    let client = &record.client;
    record.never_used()
        && idle < OWN_CLOSE_WINDOW
        && !client.idle_timeout_known
        && client.inferred.idle_timeout().is_none_or(|t| idle < t)
}

/// What closed `record` at its release, `idle_others` other connections
/// idle then, when the close is dated no earlier than a miss that named it
/// (`alone`: nothing else to the host in flight at that miss): the release
/// race's dropped checkout, the idle limit, or not yet known.
fn close_after_miss(
    record: &ConnectionRecord,
    idle_others: Option<usize>,
    alone: bool,
) -> PoolClose {
    let client = &record.client;
    if client.max_idle_known {
        // With nothing else in flight the pool held no idle connection at
        // the miss (the checkout would have had it), so none at the
        // release: within any limit, the release race. With other requests
        // in flight the count at the release is no proof that it was
        // within the limit (connections pooled unused by connects that
        // lost to a freed one, checkouts served by a release, are seen
        // late): the idle limit closed it.
        return if alone {
            PoolClose::CheckoutDropped
        } else {
            PoolClose::AtRelease { idle_others }
        };
    }
    let Some(k) = idle_others else {
        return PoolClose::Unsure;
    };
    if k == 0 && client.inferred.keeps_idle() {
        return PoolClose::CheckoutDropped;
    }
    if client.inferred.idle_limit().is_some_and(|limit| limit <= k) {
        return PoolClose::AtRelease {
            idle_others: Some(k),
        };
    }
    match client.inferred.confirm_unsure(record.id(), k) {
        Some(bound) => PoolClose::AtRelease {
            idle_others: Some(bound),
        },
        None => PoolClose::Unsure,
    }
}

/// The reason for a miss whose candidate the pool closed at its release,
/// under an inferred idle limit: with no other connection idle then, or
/// the limit already inferred as 0 (`inferred`: the client's bounds so
/// far; a count can include connections closed unbeknown to us), the pool
/// keeps none (`pool_disabled`); else `all_busy`.
pub(crate) fn over_limit_reason(
    idle_others: Option<usize>,
    inferred: &InferredLimits,
) -> MissReason {
    if idle_others == Some(0) || inferred.idle_limit() == Some(0) {
        MissReason::PoolDisabled
    } else {
        MissReason::AllBusy
    }
}

/// The limits one client's pool has shown so far: the smallest bound each
/// close gave. Lock-free; read on every response.
#[derive(Debug)]
pub(crate) struct InferredLimits {
    /// Smallest idle time at close, in ms (`u64::MAX`: none seen).
    idle_timeout_ms: AtomicU64,
    /// Smallest count of others idle at a release the pool closed
    /// (`usize::MAX`: none seen).
    idle_limit: AtomicUsize,
    /// The pool handed out an HTTP/1.1 connection that had served before
    /// (an idle hit, or one handed to a waiting checkout): the pool is on
    /// (hyper-util turns it off for an idle limit of 0), so its idle limit
    /// is at least 1.
    keeps_idle: AtomicBool,
    /// The first [`PoolClose::Unsure`] close not yet confirmed: the
    /// connection's id and the idle others at its release.
    unsure: Mutex<Option<(u64, usize)>>,
}

impl Default for InferredLimits {
    fn default() -> Self {
        Self {
            idle_timeout_ms: AtomicU64::new(u64::MAX),
            idle_limit: AtomicUsize::new(usize::MAX),
            keeps_idle: AtomicBool::new(false),
            unsure: Mutex::new(None),
        }
    }
}

impl InferredLimits {
    /// Takes the bound `close` gives (the release race's and an unsure
    /// close give none).
    pub(crate) fn observe(&self, close: PoolClose) {
        match close {
            PoolClose::AtRelease { idle_others } => {
                if let Some(n) = idle_others {
                    self.idle_limit.fetch_min(n, Ordering::Relaxed);
                }
            }
            PoolClose::Expired { idle } => {
                let ms = u64::try_from(idle.as_millis()).unwrap_or(u64::MAX - 1);
                self.idle_timeout_ms.fetch_min(ms, Ordering::Relaxed);
            }
            PoolClose::CheckoutDropped
            | PoolClose::Unsure
            | PoolClose::InDoubt
            | PoolClose::DroppedAtPutBack => {}
        }
    }

    /// An HTTP/1.1 response came on a connection that had served before:
    /// hyper-util's pool handed it out again (from its idle list, or to a
    /// waiting checkout as it came back), so the pool is on: its idle limit
    /// is not 0 (`Config::is_enabled`: a limit of 0 turns the pool off and
    /// every connection carries one request). One relaxed load on every
    /// such response, a store on the first.
    pub(crate) fn note_reuse(&self) {
        if !self.keeps_idle.load(Ordering::Relaxed) {
            self.keeps_idle.store(true, Ordering::Relaxed);
            // A limit inferred as 0 was wrong: forget it.
            let _ = self.idle_limit.compare_exchange(
                0,
                usize::MAX,
                Ordering::Relaxed,
                Ordering::Relaxed,
            );
        }
    }

    /// The pool keeps no idle connection, as inferred: an idle limit of 0
    /// and never a connection handed out again.
    pub(crate) fn keeps_none(&self) -> bool {
        self.idle_limit() == Some(0) && !self.keeps_idle()
    }

    /// The pool has handed a connection out again ([`note_reuse`](Self::note_reuse)).
    pub(crate) fn keeps_idle(&self) -> bool {
        self.keeps_idle.load(Ordering::Relaxed)
    }

    /// An unsure close of connection `id` at `idle_others`: when an
    /// earlier unsure close of another connection, at as many idle others
    /// or more, was noted, both are taken as the idle limit's (two release
    /// races in a row, with no connection handed out again between, do not
    /// happen: the race is rare) and `idle_others` is the bound; otherwise
    /// it is noted (the fewer idle others kept) and `None` returned.
    fn confirm_unsure(&self, id: u64, idle_others: usize) -> Option<usize> {
        let mut unsure = self.unsure.lock().unwrap_or_else(|e| e.into_inner());
        match *unsure {
            Some((first, k)) if first != id && k >= idle_others => Some(idle_others),
            Some((_, k)) if k <= idle_others => None,
            _ => {
                *unsure = Some((id, idle_others));
                None
            }
        }
    }

    /// The idle timeout as inferred so far: the shortest idle time at which
    /// the pool was seen closing a connection (the timeout is at most this,
    /// and more than half of it).
    pub(crate) fn idle_timeout(&self) -> Option<Duration> {
        match self.idle_timeout_ms.load(Ordering::Relaxed) {
            u64::MAX => None,
            ms => Some(Duration::from_millis(ms)),
        }
    }

    /// The idle limit as inferred so far: the fewest idle connections the
    /// pool held when it was seen closing a released one (the limit is at
    /// most this; equal to it once the first close of a burst was seen).
    pub(crate) fn idle_limit(&self) -> Option<usize> {
        match self.idle_limit.load(Ordering::Relaxed) {
            usize::MAX => None,
            n => Some(n),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use opentelemetry::trace::SpanContext;

    use super::*;
    use crate::export::report::ConnectionSetup;
    use crate::kernel::{TIME_WAIT_LENGTH, TcpState};
    use crate::pool::client::ClientState;

    /// An HTTP/1.1 connection ready at `ready`, of a client with unknown limits.
    fn record(ready: Instant) -> ConnectionRecord {
        ConnectionRecord::new(
            Arc::new(ConnectionSetup::for_test(1, ready)),
            SpanContext::empty_context(),
            None,
            Arc::new(ClientState::unknown_settings()),
            None,
            None,
        )
    }

    /// `TIME_WAIT` entered `ago` before the lookup.
    fn time_wait(ago: Duration) -> TcpFacts {
        TcpFacts {
            state: TcpState::TimeWait,
            info: None,
            receive_queue: 0,
            time_wait_left: Some(TIME_WAIT_LENGTH - ago),
            fin_wait2_left: None,
        }
    }

    #[test]
    fn a_dated_close_of_ours_is_told_at_release_or_expired() {
        let t0 = Instant::now();
        let r = record(t0);
        r.mark_released(t0 + Duration::from_millis(100));
        r.set_idle_others_at_release(2);
        let lookup = t0 + Duration::from_secs(3);
        // Closed 10 ms after the release: the idle limit, at most 2.
        assert_eq!(
            pool_close(&r, &time_wait(Duration::from_millis(2890)), lookup, false),
            Some(PoolClose::AtRelease {
                idle_others: Some(2)
            })
        );
        // Closed 1.5 s after the release: the idle timeout, at most 1.5 s.
        assert_eq!(
            pool_close(&r, &time_wait(Duration::from_millis(1400)), lookup, false),
            Some(PoolClose::Expired {
                idle: Duration::from_millis(1500)
            })
        );
        // Not dated (FIN_WAIT1: a full socket, no time-wait timer), or not ours.
        let undated = TcpFacts {
            state: TcpState::FinWait1,
            info: None,
            receive_queue: 0,
            time_wait_left: None,
            fin_wait2_left: None,
        };
        assert_eq!(pool_close(&r, &undated, lookup, false), None);
        let theirs = TcpFacts {
            state: TcpState::CloseWait,
            info: None,
            receive_queue: 0,
            time_wait_left: None,
            fin_wait2_left: None,
        };
        assert_eq!(pool_close(&r, &theirs, lookup, false), None);
        // A close hyper made for another reason is no pool limit's.
        r.set_connection_close(true);
        assert_eq!(
            pool_close(&r, &time_wait(Duration::from_millis(2890)), lookup, false),
            None
        );
        r.set_connection_close(false);
        r.take();
        assert_eq!(
            pool_close(&r, &time_wait(Duration::from_millis(2890)), lookup, false),
            None,
            "a request was on it"
        );
    }

    #[test]
    fn each_limit_keeps_the_tightest_bound_seen() {
        let limits = InferredLimits::default();
        assert_eq!((limits.idle_timeout(), limits.idle_limit()), (None, None));
        limits.observe(PoolClose::AtRelease {
            idle_others: Some(2),
        });
        limits.observe(PoolClose::AtRelease {
            idle_others: Some(1),
        });
        limits.observe(PoolClose::AtRelease { idle_others: None });
        limits.observe(PoolClose::Expired {
            idle: Duration::from_millis(1700),
        });
        limits.observe(PoolClose::Expired {
            idle: Duration::from_millis(1200),
        });
        limits.observe(PoolClose::Expired {
            idle: Duration::from_millis(1900),
        });
        assert_eq!(limits.idle_limit(), Some(1));
        assert_eq!(limits.idle_timeout(), Some(Duration::from_millis(1200)));
    }
}
