//! A miss decided from the kernel's view of its candidate (the most
//! recently released idle connection): rows 8 to 10f of the miss-reason
//! decision table (docs/REFERENCE.md section 14). [`KernelQuestion`] is
//! what a miss asks, [`decide_from_kernel`] reads the answer, and
//! [`look_again_at`] says when an answer is worth asking for again.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use crate::kernel::{KernelLookup, TcpFacts};
use crate::miss::{ConnectionEnd, MissReason};
use crate::pool::end_report::{
    ReportedEnd, closed_before_late_read, closed_first_by_tls_server, ended_before_idle_timeout,
    gone_after_own_close, gone_may_be_ours, reported_end, tls_closed_at_release,
    tls_time_wait_is_ours,
};
use crate::pool::inferred::{
    CLOSE_DATING_SLACK, CLOSED_AT_RELEASE, CloseTiming, OWN_CLOSE_WINDOW, PoolClose, close_timing,
    kept_at_release, over_limit_reason, pool_close, pool_close_after, released_within_idle_limit,
};
use crate::pool::losses::{announced_close_miss, ended_by_server};
use crate::pool::record::ConnectionRecord;
use crate::pool::slot::{Miss, Previous};

/// What a miss asks the kernel about its candidate, and what it needs to
/// decide from the answer ([`MissVerdict::AskKernel`]).
///
/// [`MissVerdict::AskKernel`]: crate::pool::model::MissVerdict::AskKernel
#[derive(Debug, Clone)]
pub(crate) struct KernelQuestion {
    pub(crate) local: SocketAddr,
    pub(crate) remote: SocketAddr,
    pub(crate) candidate: Arc<ConnectionRecord>,
    /// When the kernel shows the socket alive (HTTP/1.1), or gives no
    /// answer.
    pub(crate) alive: Miss,
    /// The candidate's request count when the miss was classified.
    pub(crate) requests_seen: u64,
    /// The candidate's latest release when the miss was classified.
    pub(crate) released: Option<Instant>,
    /// When the miss was classified.
    pub(crate) classified_at: Instant,
    /// Other requests to the host were in flight without a response
    /// yet: one of them may hold the candidate (see
    /// [`response_may_explain_end`]).
    pub(crate) others_in_flight: bool,
    /// How many of those requests may hold the candidate or, each, another
    /// connection released before the miss: when the kernel shows the
    /// candidate alive, one of them holds it, and the miss would have had
    /// the next one ([`PoolHistory::next_candidate`]), asked about with one
    /// fewer.
    ///
    /// [`PoolHistory::next_candidate`]: crate::pool::model::PoolHistory::next_candidate
    pub(crate) may_hold: u64,
}

/// Whether `candidate`, HTTP/1.1 and closed by our side no later than
/// `closed_by` ([`own_close_upper_bound`]), at most [`CLOSED_AT_RELEASE`]
/// after its last request started (later, hyper-util's idle check may
/// have closed it expired: it counts from its own put-back, as soon as it
/// has read the response, which a caller reading the body late puts long
/// before our release; a tester's slow reader under a 100 ms idle timeout
/// read `closed_by_peer`, 48 of 160 misses, with the bound taken from the
/// release), with nothing else to the host in flight at the miss
/// (`alone`), was closed by its server all the same: its client's pool
/// had no reason to close it. Not at its release over the idle limit: the
/// limit was set through our builder and the release within it, or the
/// pool has handed an HTTP/1.1 connection out again (so it keeps one at
/// least: hyper-util turns the pool off for a limit of 0) and held no
/// other idle connection then. Nor in the release race: hyper-util drops
/// the checkout that a returning connection was handed to once the miss's
/// own connect won, after the miss began (`classified_at`), and this close
/// came before it. Left is a server that closed it just after its
/// response, unannounced, whose close (FIN or reset, with close_notify or
/// without) our side answered at once: over TLS every age in the kernel's
/// report is then within one jiffy and tells nothing (a tester's server
/// ending every third exchange so read `release_race`, or `pool_disabled`
/// / `idle_limit` inferred, in 60 of 60 misses over TLS; over plain HTTP,
/// where our answer leaves no `TIME_WAIT`, right). A miss that follows
/// the response at once (its start within the close's dating) is left as
/// before: a close dated after a connect of that miss was ready was also
/// taken as the server's, and beside two CPU-burning processes a release
/// race between sequential requests once read `closed_by_peer` so.
pub(crate) fn servers_close_at_release(
    candidate: &ConnectionRecord,
    closed_by: Option<Instant>,
    alone: bool,
    classified_at: Instant,
) -> bool {
    // Moments after its last request started, so moments after hyper-util
    // put it back whenever that was: a later close may be the idle
    // timeout's (hyper-util puts a connection back once it has read the
    // response's body, which can be long before the caller reads it, and
    // our release with it).
    let Some(closed_by) = closed_by.filter(|at| {
        candidate
            .latest_request_started()
            .is_some_and(|started| *at <= started + CLOSED_AT_RELEASE)
    }) else {
        return false;
    };
    kept_at_release(candidate, alone) && closed_by < classified_at
}

/// The latest our side can have closed `candidate`'s socket, as `lookup`
/// (asked at `now`) and the kernel's report of the socket's end show it:
/// no later than the report was read (our close comes before the socket
/// is freed), and in `TIME_WAIT` no later than the timer dates it, to
/// within [`CLOSE_DATING_SLACK`]. `None` when neither shows a close of
/// ours: the socket alive or closed by the server, or gone with no report
/// naming us.
pub(crate) fn own_close_upper_bound(
    candidate: &ConnectionRecord,
    lookup: &KernelLookup,
    now: Instant,
) -> Option<Instant> {
    let reported = match reported_end(candidate) {
        Some(ReportedEnd::Ours { .. }) => candidate.socket_end().map(|end| end.seen_at),
        _ => None,
    };
    match lookup {
        KernelLookup::NotFound => reported,
        KernelLookup::Found(facts) if facts.state.closed_by_us() => {
            let timer = facts
                .closed_ago()
                .and_then(|ago| now.checked_sub(ago))
                .map(|at| at + CLOSE_DATING_SLACK);
            match (timer, reported) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            }
        }
        _ => None,
    }
}

/// The reason for a miss whose candidate (the most recently released idle
/// connection, not known closed, not expired) the kernel shows as
/// `lookup`; `requests_seen` is the candidate's request count when the
/// miss was classified. See the decision table in docs/REFERENCE.md
/// section 14.
///
/// The answer comes later than the classification. An HTTP/1.1 candidate
/// that carried a response in between was alive and not closed at the
/// miss (it was still serving a request, or hyper-util had not put it back
/// yet): its later end (that response's `Connection: close`, say) is not
/// the cause, whatever the kernel now shows, and the miss is `alive`. The
/// same holds for an HTTP/1.1 close of ours that the kernel dates after
/// `classified_at` (the `TIME_WAIT` timer, to within [`CLOSE_DATING_SLACK`]):
/// hyper-util drops a connection handed back to a checkout that its own
/// connect had already won, so the pool that could not serve the miss
/// still held it alive.
pub(crate) fn decide_from_kernel(
    candidate: &ConnectionRecord,
    lookup: &KernelLookup,
    now: Instant,
    alive: Miss,
    requests_seen: u64,
    classified_at: Instant,
) -> Miss {
    // Row 3b, inferred between the miss and this answer (the kernel's
    // answers about the client's other connections came first): a pool
    // that keeps no idle connection closed the candidate at its release.
    if !candidate.http2()
        && !candidate.client.max_idle_known
        && candidate.client.inferred.keeps_none()
    {
        // Named when it was released (closed there); one still carrying
        // the request its connect was made for is not.
        if candidate.last_released().is_none() {
            return Miss::new(MissReason::PoolDisabled).limits_inferred();
        }
        candidate.infer_end(ConnectionEnd::IdleLimit);
        return Miss::caused_by(
            MissReason::PoolDisabled,
            Previous::of(candidate, now, Some(ConnectionEnd::IdleLimit)),
        )
        .limits_inferred();
    }
    // Row 9 for HTTP/2, the client's idle timeout set through our builder:
    // the connection closed (whoever closed the socket first: after our
    // GOAWAY the server may) or alive (a stream held it) once hyper-util's
    // idle clock had run out: the pool expired it. A close dated before:
    // the server's GOAWAY or close, read below.
    if candidate.http2()
        && http2_end_date(candidate, lookup, now, classified_at)
            .is_some_and(|at| http2_pool_expired_by(candidate, at))
        && !candidate.end().is_some_and(ConnectionEnd::by_server)
    {
        return http2_idle_expired(candidate, now, classified_at);
    }
    if !candidate.http2()
        && (candidate.requests.load(Ordering::Relaxed) != requests_seen
            || candidate.said_connection_close())
    {
        // Another request held it (`alive` is `all_busy`), and the response
        // it carried announced its close: that close is why the pool had
        // it no more (named once; see `name_next_known_loss`). Not when it
        // carried more than that one response since the miss, or when the
        // request whose response announced it started after the miss: the
        // close came with a request that started after the miss, on a
        // connection then alive (busy, or on its way back to the pool).
        if alive.reason == MissReason::AllBusy
            && alive.previous.is_none()
            && candidate.requests.load(Ordering::Relaxed) <= requests_seen + 1
            && candidate
                .latest_request_started()
                .is_none_or(|started| started <= classified_at)
            && candidate.said_connection_close()
            && candidate.name_close()
        {
            return announced_close_miss(candidate, now);
        }
        return alive;
    }
    // Nothing else to the host was in flight at the miss (HTTP/1.1).
    let alone = alive.reason == MissReason::ReleaseRace;
    // Row 9 for a candidate the miss reached past a busy one (row 10e's
    // look, `PoolHistory::next_candidate`), or one idle past the timeout
    // only as counted from hyper-util's put-back (`idle_since`, a body the
    // caller read late): idle past the client's idle timeout (set through
    // our builder) at the miss, hyper-util's checkout dropped it expired.
    // Not one its release put over the idle limit, nor one the kernel
    // dates closed at its release: the idle limit closed it before the
    // timeout could (a tester's bursts of 4 over a limit of 2, both limits
    // set through our builder, read `idle_expired` for the two closed at
    // release, 6 of 6 runs).
    let closed_at_its_release = candidate.is_over_idle_limit()
        || matches!(lookup, KernelLookup::Found(facts)
            if facts.state.closed_by_us() && closed_at_release(candidate, facts, now, alone));
    let past = |since: Instant| {
        candidate
            .client
            .idle_timeout
            .is_some_and(|t| classified_at.saturating_duration_since(since) >= t)
    };
    // Past it counted from the caller's read: whatever the kernel shows
    // of it since. Past it only from hyper's read (the put-back's earliest
    // date): unless the kernel shows the server's close, which may have
    // come first (a tester's server closing 150 ms after each response,
    // the body read 300 ms late under a 200 ms timeout, read
    // `idle_expired`, 30 of 30, while this ignored the kernel).
    if !candidate.http2()
        && !candidate.is_dropped_early()
        && (past(candidate.last_activity())
            || (past(candidate.idle_since())
                && !servers_close_shown(candidate, lookup, now, alone)))
        && !ended_before_idle_timeout(candidate)
        && !closed_at_its_release
    {
        return Miss::caused_by(
            MissReason::IdleExpired,
            Previous::of(candidate, now, Some(ConnectionEnd::IdleTimeout)),
        );
    }
    // Its body was dropped before the end: closed by our side (gone at
    // once when unread data was left: RST), or still established with
    // unread bytes in the socket once hyper's task had time to read what
    // had arrived (see `look_again_at`), means hyper had not read it all; established with nothing
    // unread means it had, and
    // the pool was putting it back. No answer: the model's belief.
    if candidate.is_dropped_early() {
        let closed = match lookup {
            KernelLookup::NotFound => true,
            KernelLookup::Found(facts) if facts.state.closed_by_peer() => false,
            KernelLookup::Found(facts) => {
                facts.state.closed_by_us()
                    || (facts.state == crate::TcpState::Established && facts.receive_queue > 0)
            }
            KernelLookup::Unavailable | KernelLookup::TimedOut => true,
        };
        if closed {
            candidate.set_end(ConnectionEnd::Discarded);
            // This miss tells the loss: no later one names it again. One
            // that another miss told while this one waited for the kernel
            // explains that miss: this one found every connection busy, or
            // met another loss (named when it settles, row 4's exception).
            return if candidate.name_close() {
                Miss::caused_by(
                    MissReason::Discarded,
                    Previous::of(candidate, now, Some(ConnectionEnd::Discarded)),
                )
            } else {
                Miss::new(MissReason::AllBusy)
            };
        }
    }
    // Closed by our side at its release, by the pool's own account for no
    // reason: the server's close, answered at once.
    if servers_close_at_release(
        candidate,
        own_close_upper_bound(candidate, lookup, now),
        alone,
        classified_at,
    ) {
        let end = candidate.closed_by_server(false);
        return ended_by_server(candidate, now, Some(end), classified_at);
    }
    match lookup {
        // HTTP/1.1 over TLS, the server's FIN first but found no more than
        // 75 ms after the release, nothing else in flight, under an idle
        // limit not ours to count that the pool never showed above 0: a
        // pool that keeps none closed it at release (its close_notify drew
        // the server's close_notify and FIN before our own FIN), or the
        // server closed it unannounced: not known which (`pool_closed`).
        KernelLookup::Found(facts)
            if facts.state.closed_by_peer()
                && alone
                && !candidate.client.max_idle_known
                && !candidate.client.inferred.keeps_idle()
                && tls_closed_at_release(candidate, lookup, now) =>
        {
            Miss::caused_by(
                MissReason::PoolClosed,
                Previous::of(candidate, now, Some(ConnectionEnd::PoolClosed)),
            )
            .limits_unknown()
        }
        // HTTP/2: hyper-util hands a live connection to every request, so
        // the miss shows the server's end had reached us by `classified_at`.
        KernelLookup::Found(facts) if facts.state.closed_by_peer() => {
            let last_receive = facts
                .info
                .as_ref()
                .map(|info| (info.since_last_receive, now));
            let end = candidate.closed_by_server_after(true, last_receive);
            ended_by_server(candidate, now, Some(end), classified_at)
        }
        // Gone (over TLS: over plain TCP a close of ours leaves
        // `TIME_WAIT`, see `gone_may_be_ours`), missed moments after its
        // release with nothing else in flight and no end shown, nor a
        // report of the socket's end naming the server: hyper-util's own
        // close. The pool held nothing
        // idle at the miss (the checkout would have had it), so with an
        // idle limit above 0 the candidate was not over it: dropped with
        // this miss's checkout, alive at the miss. A pool that may keep
        // none closes it at release: not known which (`pool_closed`).
        KernelLookup::NotFound
            if alone
                && gone_may_be_ours(candidate)
                && reported_end(candidate) != Some(ReportedEnd::Server)
                && gone_with_no_end_shown(candidate)
                && released_just_before(candidate, classified_at) =>
        {
            let client = &candidate.client;
            if client.max_idle_known || client.inferred.keeps_idle() {
                return alive;
            }
            Miss::caused_by(
                MissReason::PoolClosed,
                Previous::of(candidate, now, Some(ConnectionEnd::PoolClosed)),
            )
            .limits_unknown()
        }
        // HTTP/1.1 over TLS, gone, and the kernel reported how its socket
        // ended: the server's close (its close_notify came first, or its
        // reset), or ours (our close_notify, which the server's answer
        // reset), dated like a close of ours the kernel shows below.
        KernelLookup::NotFound if reported_end(candidate).is_some() => {
            let Some(ReportedEnd::Ours { idle }) = reported_end(candidate) else {
                let end = candidate.closed_by_server(false);
                return ended_by_server(candidate, now, Some(end), classified_at);
            };
            let closed = candidate.put_back_from().map(|from| from + idle);
            if closed_after_the_miss(candidate, closed, classified_at) {
                return alive_unless_expired_at_checkout(
                    candidate,
                    alone,
                    alive,
                    classified_at,
                    now,
                );
            }
            own_close_miss(
                candidate,
                pool_close_after(candidate, idle, alone),
                alive,
                now,
            )
        }
        // Gone, but our side closed it first: the server answered our FIN
        // with data (a TLS server's close_notify) and the kernel reset the
        // orphaned socket, which leaves no TIME_WAIT.
        KernelLookup::NotFound if gone_after_own_close(candidate, now) => {
            let client = &candidate.client;
            let over_limit =
                candidate.is_over_idle_limit_unsure() || candidate.is_over_idle_limit();
            let (reason, end) = if over_limit || client.idle_timeout_known {
                (MissReason::AllBusy, ConnectionEnd::IdleLimit)
            } else {
                (MissReason::PoolClosed, ConnectionEnd::PoolClosed)
            };
            if candidate.is_over_idle_limit_unsure() {
                candidate.mark_over_idle_limit();
            }
            let miss = Miss::caused_by(reason, Previous::of(candidate, now, Some(end)));
            if client.limits_known() {
                miss
            } else {
                miss.limits_unknown()
            }
        }
        KernelLookup::NotFound => {
            let end = candidate.closed_by_server(false);
            ended_by_server(candidate, now, Some(end), classified_at)
        }
        // HTTP/2: after the server's GOAWAY the client closes first once no
        // stream is left; the kernel dates that close.
        KernelLookup::Found(facts) if facts.state.closed_by_us() && candidate.http2() => {
            let closed = facts.closed_ago().and_then(|ago| now.checked_sub(ago));
            let by = closed.map_or(classified_at, |at| at.min(classified_at));
            candidate.infer_end(ConnectionEnd::GoAway);
            ended_by_server(candidate, now, candidate.end(), by)
        }
        // HTTP/1.1 over TLS, our side closed first and the server answered
        // with its FIN alone: its close_notify came before our FIN, so we
        // only answered its close (hyper closes on it); or our pool closed
        // it and the server answered our close_notify with its FIN alone
        // (nginx sends no close_notify back). The kernel's report of the
        // socket's end (its full socket is freed as it enters TIME_WAIT, or
        // when hyper's task closes the descriptor, if later) tells them
        // apart: data from the server after the response is its
        // close_notify; none, and our close_notify the last data, is our
        // close (below, dated as any), and so is data never read (the
        // server's answer to our close_notify after hyper shut the
        // connection down). Without a report: the server's. Dated within
        // 75 ms of the release it is the pool's close at release, unless
        // the release was within an idle limit set through our builder (a
        // server closing just after a response, unannounced).
        KernelLookup::Found(facts)
            if tls_time_wait_is_servers(candidate, facts, now, alone)
                && !closed_after(facts, now, classified_at) =>
        {
            let end = candidate.closed_by_server(false);
            ended_by_server(candidate, now, Some(end), classified_at)
        }
        // Our side closed it and nothing we saw explains why: hyper-util's
        // pool dropped it, at release over its idle limit or past its idle
        // timeout, or dropped it with this miss's checkout (the release
        // race). With the idle timeout known and not reached (row 9; our
        // release time is no later than hyper-util's), the idle limit did
        // it: `all_busy`, inferred when that limit is unknown. With the
        // idle timeout unknown, or the release race not ruled out, any may
        // have (our release model can miss a release over the limit):
        // `pool_closed`.
        KernelLookup::Found(facts) if facts.state.closed_by_us() => {
            let closed = facts.closed_ago().and_then(|ago| now.checked_sub(ago));
            if closed_after_the_miss(candidate, closed, classified_at) {
                return alive_unless_expired_at_checkout(
                    candidate,
                    alone,
                    alive,
                    classified_at,
                    now,
                );
            }
            // Believed closed at its release over an idle limit ours to
            // count (row 8, asked as 8b: others in flight), and the kernel
            // dates our close there: the idle limit's (an idle timeout
            // closes no sooner than hyper-util's idle check, 90 ms at
            // least). Alone, row 8 does not hold (see there).
            if !alone
                && candidate.is_over_idle_limit()
                && candidate.client.max_idle_known
                && closed
                    .zip(candidate.last_released())
                    .is_some_and(|(closed, released)| {
                        closed.saturating_duration_since(released) <= CLOSED_AT_RELEASE
                    })
            {
                return Miss::caused_by(
                    MissReason::AllBusy,
                    Previous::of(candidate, now, Some(ConnectionEnd::IdleLimit)),
                );
            }
            own_close_miss(
                candidate,
                pool_close(candidate, facts, now, alone),
                alive,
                now,
            )
        }
        // Alive and free, yet the checkout failed. HTTP/2: the server sent
        // GOAWAY and has not closed the socket yet. HTTP/1.1: `alive`
        // (another request holds it, or hyper-util had not put it back).
        KernelLookup::Found(_) if candidate.http2() => {
            candidate.infer_end(ConnectionEnd::GoAway);
            ended_by_server(candidate, now, candidate.end(), classified_at)
        }
        KernelLookup::Found(_) => alive,
        KernelLookup::Unavailable | KernelLookup::TimedOut => alive,
    }
}

/// Row 9 for HTTP/2, the client's idle timeout set through our builder:
/// whether hyper-util's idle clock for `candidate` had run out by `at`, a
/// date no earlier than the close it dates. hyper-util dates a shared connection at
/// each checkout, not at a response's end (hyper-util 0.1
/// `client/legacy/pool.rs`, `IdlePopper::pop`), and closes it no sooner
/// than the timeout after that date, at a checkout or its idle interval;
/// the date is the latest request start a response or a miss showed
/// ([`ConnectionRecord::http2_idle_since`]). A close dated before that
/// ([`http2_end_date`]) was the server's (its GOAWAY, which our close
/// answers, or its own close); one dated after, whoever closed the socket
/// first (the server may, answering the GOAWAY our pool's close sends),
/// came once the pool's clock had run out. A tester's 100 ms timeout under
/// 150 ms responses read `request_limit` / `goaway` (45 of 45) while
/// counted from the responses' ends; decided at the miss alone, a server's
/// GOAWAY or close 20-50 ms before the clock ran out read `idle_expired`
/// (126 of 126).
fn http2_pool_expired_by(candidate: &ConnectionRecord, at: Instant) -> bool {
    candidate
        .client
        .idle_timeout
        .is_some_and(|t| at >= candidate.http2_idle_since() + t)
}

/// Whether the kernel's `lookup` (at `now`, asked at `asked_at`) shows
/// `record` (HTTP/2) closed by the client's pool: closed (or gone) once
/// its idle clock had run out ([`http2_pool_expired_by`]), its traffic
/// having shown no end by the server. Then its end is the idle timeout's,
/// not a server's a later miss would read (a wave's three misses on one
/// connection: the first one's look, showing the server's FIN that
/// answered our GOAWAY, made the third read `closed_by_peer`).
pub(crate) fn http2_closed_by_pool(
    record: &ConnectionRecord,
    lookup: &KernelLookup,
    now: Instant,
    asked_at: Instant,
) -> bool {
    record.http2()
        && lookup.shows_closed()
        && !record.seen_end().is_some_and(ConnectionEnd::by_server)
        && http2_end_date(record, lookup, now, asked_at)
            .is_some_and(|at| http2_pool_expired_by(record, at))
}

/// When `candidate`'s (HTTP/2) socket ended as the kernel dates it, no
/// later than `classified_at` (the miss), and no earlier than the close
/// (the report is read after the socket's end; the timer is counted in
/// jiffies: [`CLOSE_DATING_SLACK`] is added); `None` when nothing dates a
/// close the server made first. Our close first: by its `TIME_WAIT` /
/// `FIN_WAIT2` timer, else the kernel's report of the socket's end, else
/// the miss (hyper-util's pool drops a connection a GOAWAY closed only at
/// its next checkout or idle check: our close then dates nothing). The
/// server's close first, still closing (`CLOSE_WAIT`, `LAST_ACK`): the
/// report, else the miss. Gone: the report, else, where the kernel
/// reports ends, the miss (the report not in yet: it ended moments ago;
/// over TLS the server's answer to our close_notify can close it first),
/// else nothing (a server's close while it idled is not taken for the
/// pool's). Alive: the miss.
fn http2_end_date(
    candidate: &ConnectionRecord,
    lookup: &KernelLookup,
    now: Instant,
    classified_at: Instant,
) -> Option<Instant> {
    let reported = || candidate.socket_end().map(|end| end.seen_at);
    let date = match lookup {
        KernelLookup::Found(facts) if facts.state == crate::TcpState::Established => {
            Some(classified_at)
        }
        KernelLookup::Found(facts) if facts.state.closed_by_us() => Some(
            facts
                .closed_ago()
                .and_then(|ago| now.checked_sub(ago))
                .map(|at| at + CLOSE_DATING_SLACK)
                .or_else(reported)
                .unwrap_or(classified_at),
        ),
        // Closing now (`CLOSE_WAIT`, `LAST_ACK`: hyper closes its side as
        // soon as it reads the server's FIN): the close came at the miss,
        // no sooner than a round trip before.
        KernelLookup::Found(_) => Some(reported().unwrap_or(classified_at)),
        // Gone: the report dates it; none yet, where the kernel reports
        // ends, it ended moments ago (reports come within a millisecond).
        KernelLookup::NotFound => {
            reported().or_else(|| candidate.end_reported().then_some(classified_at))
        }
        KernelLookup::Unavailable | KernelLookup::TimedOut => Some(classified_at),
    };
    date.map(|at| at.min(classified_at))
}

/// The miss of an HTTP/2 `candidate` hyper-util's pool expired
/// ([`http2_pool_expired_by`]), classified at `classified_at` (the pool
/// dropped it by that checkout): `idle_expired`, `previous.end =
/// idle_timeout`.
fn http2_idle_expired(candidate: &ConnectionRecord, now: Instant, classified_at: Instant) -> Miss {
    candidate.mark_named_by_miss(now);
    candidate.mark_http2_pool_expired(classified_at);
    Miss::caused_by(
        MissReason::IdleExpired,
        Previous::of(candidate, now, Some(ConnectionEnd::IdleTimeout)),
    )
}

/// The miss a close of ours (HTTP/1.1) explains, `close` being how the
/// client's pool closed it as far as its date tells (see
/// [`pool_close`]): the release race's dropped checkout (alive at the
/// miss), a limit not set through our builder (inferred), or else with the
/// idle timeout known (and not reached, row 9) the idle limit (`all_busy`),
/// and with it unknown, or the close unsure, `pool_closed`. A connection
/// hyper-util dropped at its put-back, never having carried a request
/// ([`PoolClose::DroppedAtPutBack`]), was never idle in the pool: the miss
/// names nothing, its reason as classified (`alive`).
pub(crate) fn own_close_miss(
    candidate: &ConnectionRecord,
    close: Option<PoolClose>,
    alive: Miss,
    now: Instant,
) -> Miss {
    let client = &candidate.client;
    match close {
        Some(PoolClose::DroppedAtPutBack) => {
            PoolClose::DroppedAtPutBack.mark(candidate);
            return alive;
        }
        // Alive at the miss; hyper-util closed it on its way back.
        Some(PoolClose::CheckoutDropped) => {
            return Miss::caused_by(MissReason::ReleaseRace, Previous::of(candidate, now, None));
        }
        // A limit not set through our builder: the dated close names it.
        Some(close) => {
            if let Some(miss) = inferred_close(candidate, close, now) {
                return miss;
            }
        }
        None => {}
    }
    // Dated at least the idle timeout set through our builder after its
    // release (to within the timer's dating): that timeout closed it (row
    // 9; a close at release on a starved task can come later than
    // `CLOSED_AT_RELEASE`, never that late).
    if let Some(PoolClose::Expired { idle }) = close
        && client.idle_timeout_known
        && client
            .idle_timeout
            .is_some_and(|t| idle + CLOSE_DATING_SLACK >= t)
    {
        candidate.infer_end(ConnectionEnd::IdleTimeout);
        return Miss::caused_by(
            MissReason::IdleExpired,
            Previous::of(candidate, now, Some(ConnectionEnd::IdleTimeout)),
        );
    }
    let unsure = matches!(close, Some(PoolClose::Unsure | PoolClose::InDoubt));
    let (reason, end) = if client.idle_timeout_known && !unsure {
        (MissReason::AllBusy, ConnectionEnd::IdleLimit)
    } else {
        (MissReason::PoolClosed, ConnectionEnd::PoolClosed)
    };
    let miss = Miss::caused_by(reason, Previous::of(candidate, now, Some(end)));
    if client.limits_known() {
        miss
    } else {
        miss.limits_unknown()
    }
}

/// How long `candidate` (HTTP/1.1) had sat idle at a miss classified at
/// `classified_at` with nothing else to the host in flight (`alone`), when
/// that is long enough that the miss's checkout found it expired, the
/// close of ours the kernel dates after the miss being that checkout's
/// drop (hyper-util's checkout drops an expired idle connection itself,
/// whenever its idle check last ran): with nothing else in flight, an idle
/// connection alive at the miss would have served it, so the checkout
/// passed it over. Long enough: [`OWN_CLOSE_WINDOW`] (1 s) or more, which
/// no put-back of hyper-util's takes, or at least the idle timeout
/// inferred so far. Below that the release race (the put-back still on
/// its way) is not ruled out: `None`.
pub(crate) fn expired_at_checkout(
    candidate: &ConnectionRecord,
    alone: bool,
    classified_at: Instant,
) -> Option<std::time::Duration> {
    if !alone || candidate.http2() || candidate.in_use() > 0 {
        return None;
    }
    let idle = classified_at.saturating_duration_since(candidate.put_back_from()?);
    let inferred = candidate.client.inferred.idle_timeout();
    (idle >= OWN_CLOSE_WINDOW || inferred.is_some_and(|t| idle >= t)).then_some(idle)
}

/// `alive` for a candidate whose close of ours the kernel dates after the
/// miss, unless the miss's checkout found it expired
/// ([`expired_at_checkout`]): then the expiry's miss.
pub(crate) fn alive_unless_expired_at_checkout(
    candidate: &ConnectionRecord,
    alone: bool,
    alive: Miss,
    classified_at: Instant,
    now: Instant,
) -> Miss {
    expired_at_checkout(candidate, alone, classified_at).map_or(alive, |idle| {
        own_close_miss(candidate, Some(PoolClose::Expired { idle }), alive, now)
    })
}

/// How long a miss whose HTTP/1.1 candidate the kernel shows closed waits
/// for a response on that candidate, when other requests to the host were
/// in flight without one ([`response_may_explain_end`]): 250 ms. Such a
/// response is already read by then (its connection closed after it);
/// what it waits for is its request's task to be polled, milliseconds even
/// on a loaded machine. Only the miss's span waits (it ends when its
/// reason is known), never a request.
pub(crate) const RESPONSE_IN_FLIGHT_WAIT: std::time::Duration =
    std::time::Duration::from_millis(250);

/// Whether the kernel's answer that `candidate`'s socket is closed (by
/// either side, or gone) may describe its later life rather than the
/// miss's cause: HTTP/1.1, other requests to the host were in flight
/// without a response at the miss (`others_in_flight`), and none has come
/// on `candidate` since (`requests_seen`). hyper-util hands a connection
/// out at the request's start and its response shows it only later, so
/// one of those requests may hold the candidate, its response announcing
/// the close the kernel already shows (a server's request limit:
/// `Connection: close` on the last response; then the server's FIN, or
/// hyper's own close once it has read that response). The miss is then
/// decided after [`RESPONSE_IN_FLIGHT_WAIT`], once such a response has had
/// time to show. A candidate whose last body was dropped before its end
/// too: hyper keeps a connection whose body it had read all (a redirect's
/// small 3xx body the middleware drops), and a request in flight may hold
/// it; with none, the kernel's view decides as row 5b.
pub(crate) fn response_may_explain_end(
    candidate: &ConnectionRecord,
    lookup: &KernelLookup,
    requests_seen: u64,
    others_in_flight: bool,
) -> bool {
    lookup.shows_closed()
        && others_in_flight
        && !candidate.http2()
        && !candidate.said_connection_close()
        && candidate.requests.load(Ordering::Relaxed) == requests_seen
}

/// Who took an HTTP/1.1 candidate that was alive at a miss, as far as its
/// request count since the miss (`requests_seen` then) shows (row 10e's
/// release race, [`rider_since`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Rider {
    /// No request has been counted on it since the miss.
    NoneYet,
    /// The first request after the miss started before it: a request in
    /// flight at the miss held it (or waited and was handed it).
    InFlightAtMiss,
    /// The only request counted since started after the miss: nothing in
    /// flight at the miss took it, so it was on its way back to the pool
    /// (hyper-util returns a connection on a task of its own), idle and
    /// alive, when the miss connected.
    AfterMiss,
    /// More than one request counted since, the latest started after the
    /// miss: the first one's start is not kept.
    Unknown,
}

/// Row 10e's release race: whether the request that took `candidate`
/// after the miss classified at `missed_at` (its request count
/// `requests_seen` and its latest release `released` then) was in flight
/// at the miss. Only a candidate released at most [`CLOSED_AT_RELEASE`]
/// before the miss is asked about (an older release was back in the pool
/// by the miss, so a request in flight held it); others are
/// [`Rider::Unknown`].
pub(crate) fn rider_since(
    candidate: &ConnectionRecord,
    requests_seen: u64,
    released: Option<Instant>,
    missed_at: Instant,
) -> Rider {
    let recent = released.is_some_and(|released| {
        released <= missed_at && missed_at.saturating_duration_since(released) <= CLOSED_AT_RELEASE
    });
    if candidate.http2() || !recent {
        return Rider::Unknown;
    }
    let count = candidate.requests.load(Ordering::Acquire);
    let started = candidate.latest_request_started();
    match count.saturating_sub(requests_seen) {
        0 => Rider::NoneYet,
        _ if started.is_some_and(|s| s <= missed_at) => Rider::InFlightAtMiss,
        1 => Rider::AfterMiss,
        _ => Rider::Unknown,
    }
}

/// Whether a close of ours dated after a miss that named `candidate`
/// (HTTP/1.1) may be its client's pool closing it at its release rather
/// than hyper-util dropping it with the miss's checkout: the idle limit is
/// not ours to count, the pool has never handed a connection out again
/// (its limit may be 0: hyper-util then closes every connection on its own
/// task once its response ends, which can come after the next request's
/// miss), and the close comes within [`CLOSED_AT_RELEASE`] of the release.
/// Such a close is judged by the pool's history
/// ([`pool::inferred`](crate::pool::inferred)).
pub(crate) fn unsure_pool_closed_at_release(
    candidate: &ConnectionRecord,
    closed: Option<Instant>,
) -> bool {
    let client = &candidate.client;
    !client.max_idle_known
        && !client.inferred.keeps_idle()
        && closed
            .zip(candidate.last_released())
            .is_some_and(|(closed, released)| closed <= released + CLOSED_AT_RELEASE)
}

/// When to ask the kernel again about a miss's HTTP/1.1 candidate it shows
/// alive (`lookup`), if at all: nothing else was in flight (`alive` is the
/// release race), the client's idle limit is not ours to count and its
/// pool has never handed a connection out again, and the candidate has
/// carried no response since the miss. It is then on its way back into
/// the pool (the release race) or about to be closed by a pool that keeps
/// none (hyper-util closes it on its own task once its response ends):
/// looked at again every [`LOOK_AGAIN_EVERY`] until [`CLOSED_AT_RELEASE`]
/// after its release, when a pool that closes it at release has done so.
/// Likewise a close of ours no timer dates yet (until
/// [`UNDATED_CLOSE_WAIT`] after the miss), and one counting other
/// connections idle at the release (until [`CLOSED_AT_RELEASE`] after it:
/// their closes, once seen, lower that count).
pub(crate) fn look_again_at(
    candidate: &ConnectionRecord,
    lookup: &KernelLookup,
    now: Instant,
    alive: &Miss,
    requests_seen: u64,
    classified_at: Instant,
) -> Option<Instant> {
    let client = &candidate.client;
    // HTTP/1.1 over TLS, gone or in TIME_WAIT: the kernel's report of its
    // socket's end, on its way (sent as the full socket is freed: on
    // entering TIME_WAIT, or when hyper's task closes the descriptor, if
    // later), tells who closed it (`reported_end`, `tls_time_wait_is_ours`).
    let report_on_its_way = candidate.awaits_socket_end() && closed_first_by_tls_server(candidate);
    let report_until = classified_at + END_REPORT_WAIT;
    let wait_for_report = (now < report_until).then(|| (now + LOOK_AGAIN_EVERY).min(report_until));
    let facts = match lookup {
        KernelLookup::NotFound if report_on_its_way => return wait_for_report,
        KernelLookup::Found(facts) => facts,
        _ => return None,
    };
    if candidate.is_dropped_early()
        && facts.state == crate::TcpState::Established
        && !candidate.http2()
    {
        // Row 5b: a body dropped before its end, the connection still
        // established. hyper reads what has arrived once its task sees the
        // drop, and keeps the connection if that was the whole body (a
        // redirect's small 3xx body, dropped by the middleware), else
        // closes it: the kernel shows which once that task ran. Nothing
        // unread in the socket is no answer yet: hyper may hold the rest
        // in its buffer, or the rest may not have arrived (a tester saw
        // such a connection, closed moments later, read `release_race`,
        // 2 of 46 loaded runs).
        let until = classified_at + UNDATED_CLOSE_WAIT;
        return (now < until).then(|| (now + LOOK_AGAIN_EVERY).min(until));
    }
    // In TIME_WAIT past the wait: as any close of ours below.
    if facts.state == crate::TcpState::TimeWait && report_on_its_way && wait_for_report.is_some() {
        return wait_for_report;
    }
    if matches!(
        facts.state,
        crate::TcpState::FinWait1 | crate::TcpState::FinWait2
    ) && closed_first_by_tls_server(candidate)
    {
        // HTTP/1.1 over TLS, our FIN sent, the server's end not here yet:
        // its FIN (TIME_WAIT: its close_notify came first, we answered it)
        // or its close_notify resetting our closed socket (gone: we closed
        // first) tells who closed; a loaded server sends either late.
        let until = classified_at + UNDATED_CLOSE_WAIT;
        return (now < until).then(|| (now + LOOK_AGAIN_EVERY).min(until));
    }
    if facts.state.closed_by_us()
        && facts.closed_ago().is_none()
        && !candidate.http2()
        && !client.limits_known()
    {
        // Our close is under way and no timer dates it yet: `FIN_WAIT1`,
        // our FIN not yet acknowledged (a server may delay that ACK), or
        // `FIN_WAIT2` with the socket not yet closed by the application
        // (its write side shut first): the timer starts soon.
        let until = classified_at + UNDATED_CLOSE_WAIT;
        return (now < until).then(|| (now + LOOK_AGAIN_EVERY).min(until));
    }
    let first_reuse_unseen = !candidate.http2()
        && !client.max_idle_known
        && !client.inferred.keeps_idle()
        && !candidate.is_dropped_early();
    if facts.state.closed_by_us()
        && first_reuse_unseen
        && candidate.idle_others_at_release().is_some_and(|k| k > 0)
    {
        // Closed, counting other connections idle at its release: some may
        // be on their way to the same close, not idle (a pool that keeps
        // none closes each on its own task once its response ends). Their
        // closes, once seen, lower the count (`uncount_closed`).
        let until = candidate.last_released()? + CLOSED_AT_RELEASE;
        return (now < until).then(|| (now + LOOK_AGAIN_EVERY).min(until));
    }
    if facts.state != crate::TcpState::Established
        || candidate.http2()
        || !(alive.reason == MissReason::ReleaseRace || may_wait_for_pool_off(candidate, alive))
        || client.max_idle_known
        || client.inferred.keeps_idle()
        || candidate.is_dropped_early()
        || candidate.requests.load(Ordering::Relaxed) != requests_seen
    {
        return None;
    }
    let until = candidate.last_released()? + CLOSED_AT_RELEASE;
    (now < until).then(|| (now + LOOK_AGAIN_EVERY).min(until))
}

/// Whether a miss with other requests to the host in flight (`alive` is
/// `all_busy`, naming nothing), whose HTTP/1.1 candidate the kernel shows
/// still established just after its release, waits for the candidate's
/// fate ([`look_again_at`]): its client's pool may keep no idle connection
/// (reqwest's `pool_max_idle_per_host(0)`, which this crate cannot read)
/// and close it on hyper-util's own task, which the client's other
/// connections may show meanwhile
/// ([`PoolHistory::shows_pool_off`]). The
/// idle limit is not ours to count, the pool has never handed a
/// connection out again, nor closed one for its idle timeout. Unless that
/// is shown by the end of the wait, the miss is `alive`, as at the first
/// answer.
///
/// [`PoolHistory::shows_pool_off`]: crate::pool::model::PoolHistory::shows_pool_off
pub(crate) fn may_wait_for_pool_off(candidate: &ConnectionRecord, alive: &Miss) -> bool {
    let client = &candidate.client;
    alive.reason == MissReason::AllBusy
        && alive.previous.is_none()
        && !candidate.http2()
        && !client.max_idle_known
        && !client.inferred.keeps_idle()
        && client.inferred.idle_timeout().is_none()
}

/// How long after a miss [`look_again_at`] waits for the kernel's report
/// of a gone TLS candidate's end: the broadcast is sent from a kernel work
/// queue once the socket is freed, and read on a thread of ours.
pub(crate) const END_REPORT_WAIT: std::time::Duration = std::time::Duration::from_millis(100);

/// How often [`look_again_at`] asks again.
pub(crate) const LOOK_AGAIN_EVERY: std::time::Duration = std::time::Duration::from_millis(5);

/// How long after a miss [`look_again_at`] waits for a close of ours to be
/// dated by a timer: the server's ACK of our FIN, which a Linux server
/// delays by its delayed-ACK timer, typically 40 ms (`TCP_ATO_MIN`), or the
/// application's close of a socket whose write side it shut first; plus
/// room for the lookups themselves.
pub(crate) const UNDATED_CLOSE_WAIT: std::time::Duration = std::time::Duration::from_millis(50);

/// Whether nothing but the kernel's view of a gone socket says how
/// `record` ended: no end its traffic showed, and none inferred but
/// `peer_closed` (a gone socket is the server's close only for want of a
/// better reading: an earlier lookup may have found it gone too late after
/// its release to read it as ours).
pub(crate) fn gone_with_no_end_shown(record: &ConnectionRecord) -> bool {
    record.seen_end().is_none()
        && record
            .end()
            .is_none_or(|end| end == ConnectionEnd::PeerClosed)
}

/// Whether `record`, found gone at `now`, was closed by its client's pool
/// at its release: HTTP/1.1 over TLS (over plain TCP our close leaves
/// `TIME_WAIT`: [`gone_may_be_ours`]), idle in the pool, no end shown or inferred
/// (its traffic showed no close of hyper's own nor the server's; a close
/// of ours seen before, undated, is none), found gone no more than
/// [`CLOSED_AT_RELEASE`] after its release, and not dated by the kernel's
/// report before the caller's late read of its body
/// ([`closed_before_late_read`]). A close of
/// ours that the server answers with data (a TLS server's close_notify)
/// makes the kernel reset the socket (see [`gone_after_own_close`]); a
/// server's idle close comes after its keep-alive timeout.
pub(crate) fn gone_at_release(record: &ConnectionRecord, now: Instant) -> bool {
    !record.http2()
        && gone_may_be_ours(record)
        && record.in_use() == 0
        && record.end().is_none()
        && !record.is_dropped_early()
        && !record.is_discarded()
        && !record.said_connection_close()
        && !closed_before_late_read(record)
        && record
            .last_released()
            .is_some_and(|t| now.saturating_duration_since(t) <= CLOSED_AT_RELEASE)
}

/// Whether `candidate` (HTTP/1.1) was released no more than
/// [`CLOSED_AT_RELEASE`] before the miss at `miss`: within the time
/// hyper-util's pool takes to put it back, or to close it there. Counted
/// from hyper-util's put-back as early as it may have come
/// ([`ConnectionRecord::idle_since`]): a body the caller read late had
/// been back in the pool since hyper read it.
pub(crate) fn released_just_before(candidate: &ConnectionRecord, miss: Instant) -> bool {
    !candidate.http2()
        && candidate
            .put_back_from()
            .is_some_and(|from| miss.saturating_duration_since(from) <= CLOSED_AT_RELEASE)
}

/// Whether `record`'s socket in `TIME_WAIT` (asked at `now`), HTTP/1.1
/// over TLS idle in the pool, was the server's close all the same: its
/// close_notify came before our FIN and we only answered it (the kernel's
/// report of the socket's end does not show a close of ours,
/// [`tls_time_wait_is_ours`]), and the close is not the pool's own at the
/// release ([`closed_at_release`], `alone` as there, unless the release
/// was within an idle limit set through our builder: a server closing just
/// after a response; or the report dates it before the caller's late read
/// of the body, [`closed_before_late_read`]).
/// Row 10c of the decision table (docs/REFERENCE.md section 14); a close
/// the kernel view applies off a miss reads the same (seen: a TLS server's
/// close_notify and FIN 300 ms after a response taken for an idle timeout
/// of 300 ms, and that close's end named `idle_timeout` on the next miss).
pub(crate) fn tls_time_wait_is_servers(
    record: &ConnectionRecord,
    facts: &TcpFacts,
    now: Instant,
    alone: bool,
) -> bool {
    facts.state == crate::TcpState::TimeWait
        && closed_first_by_tls_server(record)
        && !tls_time_wait_is_ours(record, facts, now)
        && (released_within_idle_limit(record)
            || closed_before_late_read(record)
            || !closed_at_release(record, facts, now, alone))
}

/// Whether the kernel dates the close of `record`'s socket (asked at
/// `now`) at hyper-util's put-back, or maybe there ([`close_timing`],
/// `alone` as there): its client's pool closed it there, not a server's idle close
/// (which comes after its keep-alive timeout), even over TLS in
/// `TIME_WAIT` (the server answered our close with its FIN alone).
pub(crate) fn closed_at_release(
    record: &ConnectionRecord,
    facts: &TcpFacts,
    now: Instant,
    alone: bool,
) -> bool {
    facts
        .closed_ago()
        .and_then(|ago| now.checked_sub(ago))
        .and_then(|closed| close_timing(record, closed, alone))
        .is_some_and(|timing| timing != CloseTiming::Later)
}

/// Whether `lookup` (asked at `now`) shows `candidate`'s socket (HTTP/1.1)
/// closed by the server: its FIN arrived (`CLOSE_WAIT`, `LAST_ACK`), or it
/// is gone where a close of ours would have left it (plain TCP:
/// `TIME_WAIT`) or the kernel's report of its end names the server, or,
/// over TLS in `TIME_WAIT`, we only answered its close_notify (row 10c,
/// [`tls_time_wait_is_servers`], `alone` as there).
fn servers_close_shown(
    candidate: &ConnectionRecord,
    lookup: &KernelLookup,
    now: Instant,
    alone: bool,
) -> bool {
    match lookup {
        KernelLookup::Found(facts) => {
            facts.state.closed_by_peer() || tls_time_wait_is_servers(candidate, facts, now, alone)
        }
        KernelLookup::NotFound => {
            !gone_may_be_ours(candidate) || reported_end(candidate) == Some(ReportedEnd::Server)
        }
        KernelLookup::Unavailable | KernelLookup::TimedOut => false,
    }
}

/// Whether our close of `candidate`'s socket, dated `closed`, came after the
/// miss decided at `classified_at` (beyond [`CLOSE_DATING_SLACK`]) and cannot
/// be the pool's close at the release ([`unsure_pool_closed_at_release`]):
/// the candidate was still open when the miss was decided.
fn closed_after_the_miss(
    candidate: &ConnectionRecord,
    closed: Option<Instant>,
    classified_at: Instant,
) -> bool {
    closed.is_some_and(|at| at > classified_at + CLOSE_DATING_SLACK)
        && !unsure_pool_closed_at_release(candidate, closed)
}

/// Whether the kernel dates our close of a socket (asked at `now`) after
/// `instant`, beyond [`CLOSE_DATING_SLACK`].
pub(crate) fn closed_after(facts: &TcpFacts, now: Instant, instant: Instant) -> bool {
    facts.closed_ago().is_some_and(|ago| {
        now.checked_sub(ago)
            .is_some_and(|closed| closed > instant + CLOSE_DATING_SLACK)
    })
}

/// The miss `close`, by the client's own pool, explains, when it names a
/// limit this crate could not read (see
/// [`inferred`](crate::pool::inferred)); the bound it gives is kept on the
/// client.
pub(crate) fn inferred_close(
    candidate: &ConnectionRecord,
    close: PoolClose,
    now: Instant,
) -> Option<Miss> {
    let client = &candidate.client;
    if client.limits_known() {
        return None;
    }
    client.inferred.observe(close);
    let (reason, end) = match close {
        PoolClose::AtRelease { idle_others } if !client.max_idle_known => (
            over_limit_reason(idle_others, &client.inferred),
            ConnectionEnd::IdleLimit,
        ),
        PoolClose::Expired { .. } if !client.idle_timeout_known => {
            (MissReason::IdleExpired, ConnectionEnd::IdleTimeout)
        }
        _ => return None,
    };
    close.mark(candidate);
    let mut miss =
        Miss::caused_by(reason, Previous::of(candidate, now, Some(end))).limits_inferred();
    if reason == MissReason::IdleExpired {
        miss.inferred_idle_timeout = client.inferred.idle_timeout();
    }
    Some(miss)
}
