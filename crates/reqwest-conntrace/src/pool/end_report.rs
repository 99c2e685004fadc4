//! The kernel's report of a connection's socket end (sock_diag's destroy
//! broadcast, with the socket's last `tcp_info`): whose close it was over
//! TLS, ours or the server's, when the socket itself no longer tells (gone,
//! or in `TIME_WAIT`; rows 10b and 10c of the miss-reason decision table,
//! docs/REFERENCE.md section 14), and over plain TCP how the server closed
//! a socket found gone, FIN or RST ([`peer_close_kind`]).

use std::time::Instant;

use crate::kernel::{Acknowledged, KernelLookup, TcpFacts};
use crate::miss::ConnectionEnd;
use crate::pool::inferred::{
    CLOSE_DATING_SLACK, CLOSED_AT_RELEASE, OWN_CLOSE_WINDOW, PoolClose, pool_close_after,
    released_within_idle_limit,
};
use crate::pool::record::ConnectionRecord;

/// Whether `record`'s socket, found gone (no `TIME_WAIT` or `FIN_WAIT2`
/// left) at `now`, was closed by our side first: an HTTP/1.1 connection
/// the kernel already showed closed by us (closed with no end its traffic
/// showed), or one whose release was (or may have been) over the idle
/// limit, within [`OWN_CLOSE_WINDOW`] of that release, or one gone no
/// more than [`CLOSED_AT_RELEASE`] after its release with no end shown
/// (the time hyper-util's pool takes to close it there, or to drop it with
/// a checkout whose connect won; a server's idle close comes after its
/// keep-alive timeout, and a close it announces is an end shown). A server
/// that writes after reading our FIN (a TLS server sending close_notify, as
/// rustls-based servers do) makes the kernel reset the socket we had closed
/// (`TCPAbortOnData`, net/ipv4/tcp_input.c), so it is gone at once, as
/// after a server's close.
pub(crate) fn gone_after_own_close(record: &ConnectionRecord, now: Instant) -> bool {
    if let Some(end) = reported_end(record) {
        return matches!(end, ReportedEnd::Ours { .. });
    }
    !record.http2()
        && ((record.end().is_none()
            && (record.is_closed()
                || gone_may_be_ours(record)
                    && record
                        .last_released()
                        .is_some_and(|t| now.saturating_duration_since(t) <= CLOSED_AT_RELEASE)))
            || (gone_may_be_ours(record)
                && (record.is_over_idle_limit_unsure() || record.is_over_idle_limit())
                && record
                    .last_released()
                    .is_some_and(|t| now.saturating_duration_since(t) < OWN_CLOSE_WINDOW)))
}

/// How the server closed `record` (HTTP/1.1), whose socket the kernel found
/// gone (`peer_closed`: hyper closed its side at once, and Linux freed the
/// socket), as the report of its end tells:
/// - our FIN acknowledged (`Acknowledged::DataAndFin`): the server's FIN
///   came first, hyper answered it with ours, and the server's closing
///   socket acknowledged it; or our last data never acknowledged
///   (`NotAllData`): it met the server's socket already closed (over TLS our
///   close_notify answering the server's, which its closed socket answers
///   with a reset): `peer_fin`;
/// - no FIN of ours acknowledged, and no segment acknowledged anything
///   since the last data received (`tcpi_last_ack_recv` no later than
///   `tcpi_last_data_recv`: a FIN would have, net/ipv4/tcp_input.c
///   `tcp_ack`; an RST acknowledges nothing and the socket it kills sends
///   no FIN or data): the server's reset, `peer_reset`.
///
/// Over TLS only when the report reads the close as the server's
/// ([`reported_end`]: after a close of ours, the server's close_notify
/// draws a reset too). `None` without the report (not come yet, or the
/// broadcast unavailable), over HTTP/2, or for any other reading. Measured
/// against Python servers closing idle connections with FIN (with and
/// without close_notify over TLS) and with RST (`SO_LINGER` 0), and the lab
/// server plain and TLS: each reading as above, in every report.
pub(crate) fn peer_close_kind(record: &ConnectionRecord) -> Option<ConnectionEnd> {
    if record.http2()
        || (record.setup.tls.is_some() && reported_end(record) != Some(ReportedEnd::Server))
    {
        return None;
    }
    let end = record.socket_end()?;
    match end.acknowledged {
        Acknowledged::DataAndFin | Acknowledged::NotAllData => Some(ConnectionEnd::PeerFin),
        Acknowledged::Data if end.since_last_ack >= end.since_last_receive => {
            Some(ConnectionEnd::PeerReset)
        }
        _ => None,
    }
}

/// Who closed an HTTP/1.1 connection over TLS whose socket is gone, as
/// the kernel's report of the socket's end tells ([`reported_end`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum ReportedEnd {
    /// Our side, `idle` after the last response (the client's pool).
    Ours { idle: std::time::Duration },
    /// The server.
    Server,
}

/// How soon before its end an HTTP/1.1 socket over TLS whose data, but not
/// our FIN, the server acknowledged received the server's last data, for
/// that data to be taken as its answer to our close_notify (see
/// [`reported_end`]): 100 ms. A server's reset after its idle timeout
/// comes seconds after the last data it sent (nginx `keepalive_timeout`,
/// 75 s by default).
pub(crate) const ANSWERED_CLOSE_WINDOW: std::time::Duration = std::time::Duration::from_millis(100);

/// How much later than the socket's end its report may be read (the
/// broadcast's work queue, then the watch thread's wake-up on a loaded
/// machine), and our release time after the response's last data: 100 ms.
/// Data received more than this after the response is the server's (its
/// close_notify); a server's idle timeout is seconds (nginx
/// `keepalive_timeout`, 75 s by default).
pub(crate) const END_REPORT_SLACK: std::time::Duration = std::time::Duration::from_millis(100);

/// Who closed `record`, an HTTP/1.1 connection over TLS idle in the pool
/// with no close of hyper's own shown by its traffic, from the kernel's
/// report of its socket's end (`None` until it came, and for any other
/// connection). A socket found gone is no evidence either way over TLS: a
/// server sends close_notify before it closes (RFC 8446 section 6.1), so
/// after a close of ours its close_notify reaches our socket, and the
/// kernel resets it (`TCPAbortOnData` once we closed it; unread data when
/// we close it after), as a server's reset, or our answer to its close
/// reaching its closed socket, would. The report carries the socket's last
/// `tcp_info`:
/// - the server acknowledged our FIN (and all our data), and our last
///   data came after its last data, or its last data came less than
///   [`ANSWERED_CLOSE_WINDOW`] after ours (its answer to our
///   close_notify; within the same jiffy, whose order `tcp_info` does not
///   keep, only when that data was never read
///   ([`SocketEnd::unread`](crate::kernel::SocketEnd::unread)) or was the
///   response: else it is a server's close_notify that hyper read and
///   answered at once; and, for the response, only when the server's last
///   acknowledgement came with it, not [`CLOSE_ANSWER_WINDOW`] and a
///   round trip later: a server closing without close_notify after an
///   idle timeout sends its FIN, and acknowledges our answering one, that
///   late): it was still reading when we closed, so we closed
///   first (a server that closes first has no socket left to acknowledge
///   our answer: it resets; its close_notify long after our last data,
///   with no answer from us, is its close),
///   unless our close_notify answered data received more than
///   [`END_REPORT_SLACK`] after the response (the server's close_notify:
///   its FIN then left our socket in `TIME_WAIT`, since expired);
/// - it acknowledged our data, not a FIN, and its last data came after
///   ours, less than [`ANSWERED_CLOSE_WINDOW`] before the end: its answer
///   to our close_notify (our FIN not acknowledged yet); ours too;
/// - else (our last data unacknowledged, or nothing sent after the
///   response and the server's last data long before the end: its reset):
///   the server's.
///
/// Our close came `idle` after the last response: the time between the
/// last data received and our close_notify when that was the last data
/// received (the server's answer was refused); else from our release to
/// our close_notify, as the report's arrival dates it (later than the end
/// by the broadcast's and the watch thread's delays).
pub(crate) fn reported_end(record: &ConnectionRecord) -> Option<ReportedEnd> {
    use crate::kernel::Acknowledged;
    if !closed_first_by_tls_server(record) {
        return None;
    }
    let end = record.socket_end()?;
    let received = end.since_last_receive;
    let sent = end.since_last_send;
    // Data received more than END_REPORT_SLACK after the response: not
    // the response (the server's close_notify, or its answer to ours). The
    // response as hyper read it (`idle_since`): a body the caller read
    // late came long before that read, and a server's close_notify between
    // the two comes after it (a body's end that arrived late, which the
    // caller's reads cannot show, is taken for such data).
    let after_response = end
        .seen_at
        .checked_sub(received)
        .is_some_and(|at| at > record.idle_since() + END_REPORT_SLACK);
    // The server's last data came after ours, soon after: its answer to
    // our close_notify, when it came more than END_REPORT_SLACK after the
    // response (else it may be the response itself, our last data the
    // request: a server that closed without close_notify while the pool
    // kept the connection, as below; a tester's server closing idle
    // connections after 300 ms read `all_busy` / `idle_limit`, 9 of 9
    // runs). Within the same jiffy the order is not known: a
    // server's close_notify that hyper read and answered at once looks the
    // same, unless the data was never read (hyper stops reading once it
    // shuts the connection down: data it read is what made it close) or it
    // was the response itself (a close at release), when the pool may have
    // closed it there (not `released_within_idle_limit`). Within the
    // limit the pool keeps it: a
    // server that closes without close_notify just after a response (our
    // last data the request, in the same jiffy) looks the same, and is
    // that server's close (a tester's server read `release_race`). With
    // the limit unknown, a server closing without close_notify long after
    // the response differs in one thing: its FIN, and its acknowledgement
    // of ours, came long after its last data
    // (`acknowledged_long_after_data`), where the server's answer to our
    // close at release came with or just after that data (a tester's
    // server closing 300 ms after each response read `pool_disabled`, 15
    // of 15 misses, before). A rule requiring our last data, or the
    // server's, to have come just before the end misread our closes at
    // release in a loaded fan-out, whose ends came late; the gap between
    // two of the report's ages does not move with that lateness.
    let may_close_at_release = !released_within_idle_limit(record);
    let answered = sent >= received
        && sent - received < ANSWERED_CLOSE_WINDOW
        && (end.has_unread_data()
            || (sent > received && after_response)
            || (!after_response && may_close_at_release && !acknowledged_long_after_data(&end)));
    let ours = match end.acknowledged {
        Acknowledged::DataAndFin => sent < received || answered,
        Acknowledged::Data => answered && received < ANSWERED_CLOSE_WINDOW,
        // Our last data unacknowledged: the server's reset, unless data
        // lay unread when the socket went. hyper reads an idle
        // connection's socket as data comes (a server's close_notify, or
        // its reset, is seen at once), so unread data means our side had
        // stopped reading: it closed the socket, and closing one with
        // unread data sends a reset instead of a FIN (net/ipv4/tcp.c,
        // `tcp_close`: "data was unread"), which leaves our last data
        // unacknowledged (a tester: spares hyper-util dropped at their
        // put-back, the server's session tickets unread, read
        // `closed_by_peer`, 7 of 24 misses).
        Acknowledged::NotAllData => end.has_unread_data(),
    };
    // Our close_notify after data received more than END_REPORT_SLACK
    // after the response: that data was the server's close_notify, which
    // we answered (its FIN then left our socket in TIME_WAIT, expired
    // since).
    let answered_server = sent < received && after_response;
    if !ours || answered_server {
        return Some(ReportedEnd::Server);
    }
    let idle = if sent < received {
        received - sent
    } else {
        end.seen_at
            .checked_sub(sent)
            .map_or(std::time::Duration::ZERO, |at| {
                at.saturating_duration_since(record.idle_since())
            })
    };
    Some(ReportedEnd::Ours { idle })
}

/// How long after the server's last data its last acknowledgement may
/// come, beyond a round trip, for that acknowledgement to be its answer
/// to a close of ours made as that data (the response) arrived: 100 ms.
/// Our close_notify and FIN leave one round trip after the response and
/// the server's kernel acknowledges them at once, its close_notify follows
/// as soon as the server runs (a loaded 2-core machine's TLS fan-out:
/// within 8 ms in 6,476 such ends). A server that closes an idle
/// connection without close_notify sends its FIN, acknowledging nothing
/// new, and acknowledges our answering FIN, after its idle timeout.
pub(crate) const CLOSE_ANSWER_WINDOW: std::time::Duration = std::time::Duration::from_millis(100);

/// Whether the server's last acknowledgement came more than
/// [`CLOSE_ANSWER_WINDOW`] plus a round trip (`tcpi_rtt`, smoothed: on a
/// loaded loopback it carries delayed acknowledgements, tens of
/// milliseconds; two of them misread a server closing 150 ms after its
/// response, 4 of 23 runs) after its last data
/// (`tcpi_last_data_recv` less `tcpi_last_ack_recv`, both counted from
/// the same end, so their difference does not depend on when the report
/// was made): the server ended the connection later, on its own (its FIN
/// without close_notify after an idle timeout), not in answer to a close
/// of ours made as that data arrived.
fn acknowledged_long_after_data(end: &crate::kernel::SocketEnd) -> bool {
    end.since_last_receive
        .saturating_sub(end.since_last_ack)
        .saturating_sub(end.rtt)
        > CLOSE_ANSWER_WINDOW
}

/// Whether `record` (HTTP/1.1 over TLS, idle in the pool), its socket in
/// `TIME_WAIT` at `now` as `facts` show, was closed by our pool, as the
/// kernel's report of the socket's end tells: the last data it received
/// was the response (no later than [`END_REPORT_SLACK`] after hyper read
/// it, [`ConnectionRecord::idle_since`]), and ours came after it (our close_notify), so the server
/// answered our close with its FIN alone (nginx sends no close_notify back
/// to one it read). A server's close_notify before our FIN is data
/// received after the response (its keep-alive timeout later), which we
/// answered, often within the same jiffy: the order of the two last data
/// does not tell, their time does. Data never read
/// ([`SocketEnd::unread`](crate::kernel::SocketEnd::unread) above one,
/// the FIN counting one) came after hyper shut the connection down: the
/// server's answer to our close_notify, so ours whatever the times. The
/// report's ages count from when the descriptor was closed (the full
/// socket is freed then), which a starved task can make later than the
/// close itself (hyper shuts the write side first), so only their
/// difference is used: the last data received came that long before our
/// last data (our close_notify, sent as we closed), and our close is dated
/// by the `TIME_WAIT` timer less the round trip (`tcpi_rtt`: the server's
/// FIN answers ours a round trip after it), else by when the report was
/// read. `false` without a report, or when nothing was sent after the last
/// data received.
pub(crate) fn tls_time_wait_is_ours(
    record: &ConnectionRecord,
    facts: &TcpFacts,
    now: Instant,
) -> bool {
    if !closed_first_by_tls_server(record) {
        return false;
    }
    let Some(end) = record.socket_end() else {
        return false;
    };
    if end.has_unread_data() {
        // The server's answer to our close_notify.
        return true;
    }
    let Some(sent_after) = end
        .since_last_receive
        .checked_sub(end.since_last_send)
        .filter(|gap| !gap.is_zero())
    else {
        return false;
    };
    let closed = facts
        .closed_ago()
        .and_then(|ago| now.checked_sub(ago + end.rtt))
        .map_or(end.seen_at, |at| at.min(end.seen_at));
    closed
        .checked_sub(sent_after)
        .is_some_and(|received_at| received_at <= record.idle_since() + END_REPORT_SLACK)
}

/// Whether `record`, an HTTP/1.1 connection over TLS idle in the pool,
/// found closed (by either side, or gone) at `now` no more than
/// [`CLOSED_AT_RELEASE`] after its release, was closed then: a server's
/// idle close comes after its keep-alive timeout, so this is its client's
/// pool closing it at release. Over TLS the TCP states do not tell who
/// closed first: our close_notify draws the server's close_notify and FIN
/// before our own FIN (`CLOSE_WAIT` / `LAST_ACK`), or resets our closed
/// socket (gone). Not one the kernel's report dates closed before the
/// caller's late read of the body ([`closed_before_late_read`]).
pub(crate) fn tls_closed_at_release(
    record: &ConnectionRecord,
    lookup: &KernelLookup,
    now: Instant,
) -> bool {
    lookup.shows_closed()
        && closed_first_by_tls_server(record)
        && !closed_before_late_read(record)
        && record
            .last_released()
            .is_some_and(|t| now.saturating_duration_since(t) <= CLOSED_AT_RELEASE)
}

/// Whether the caller read `record`'s latest body late (its end more than
/// [`CLOSED_AT_RELEASE`] after hyper may have read it,
/// [`ConnectionRecord::idle_since`]) and the kernel's report of the
/// socket's end dates the server's last acknowledgement (its FIN, or its
/// answer to ours: the connection's close) more than [`END_REPORT_SLACK`]
/// before that read and more than `END_REPORT_SLACK` after hyper's read.
/// The connection had closed before its release as this crate dates it,
/// and not at hyper-util's put-back (where its pool closes a connection
/// over its idle limit: the server acknowledges that close a round trip
/// later), so a close found moments after that release was not made
/// there. Whose close it was, the report tells ([`reported_end`]). The
/// report's ages count from the socket's end and are read against when
/// the report arrived, later: `END_REPORT_SLACK` on both sides. A
/// tester's servers idle-closing while the caller slept before reading,
/// over TLS, before the pool had handed a connection out again, read as a
/// pool that keeps none, 28 of 33 misses; dated by our last data instead,
/// a server's FIN without close_notify (our last data the request) was not
/// seen, and dated without the bound from hyper's read, a wave's late
/// readers over reqwest's `pool_max_idle_per_host(1)` read
/// `closed_by_peer`, 22 of 45.
pub(crate) fn closed_before_late_read(record: &ConnectionRecord) -> bool {
    let Some(released) = record.last_released() else {
        return false;
    };
    let put_back = record.idle_since();
    released.saturating_duration_since(put_back) > CLOSED_AT_RELEASE
        && record.socket_end().is_some_and(|end| {
            end.seen_at
                .checked_sub(end.since_last_ack)
                .is_some_and(|acked_at| {
                    acked_at > put_back + END_REPORT_SLACK && acked_at + END_REPORT_SLACK < released
                })
        })
}

/// Whether the kernel's report of `record`'s socket end (HTTP/1.1 over
/// TLS, gone: see [`reported_end`]) dates a close of ours no more than
/// [`CLOSED_AT_RELEASE`] after its release, idle in the pool: its client's
/// pool closed it at its release, however late the lookup that found it
/// gone came (under load the next miss, and the lookups it asks for, can
/// come long after an early release of a concurrent wave: the report's
/// own dating does not depend on them).
pub(crate) fn reported_closed_at_release(record: &ConnectionRecord) -> bool {
    matches!(
        reported_end(record),
        Some(ReportedEnd::Ours { idle })
            if matches!(
                pool_close_after(record, idle, false),
                Some(PoolClose::AtRelease { .. } | PoolClose::Unsure)
            )
    )
}

/// Whether `record`'s socket, found gone, may have been closed by our side
/// first: over TLS, or when the kernel showed it closed by our side
/// before ([`ConnectionRecord::is_closed`]). Otherwise over plain TCP a close of ours leaves the socket
/// in `TIME_WAIT` for 60 s (`TCP_TIMEWAIT_LEN`, include/net/tcp.h; a plain
/// HTTP/1.1 server writes nothing after our FIN that could reset it), so a
/// socket gone is the server's close (its FIN first: our answer from
/// `CLOSE_WAIT` leaves `LAST_ACK` at once) or a reset: the server's, or
/// ours over unread data (a body dropped before its end, which the record
/// tells). A server may close moments after a response without announcing
/// it, so how soon after the release the socket went does not tell. Over
/// TLS a server's close_notify after our close makes the kernel reset our
/// socket ([`gone_after_own_close`]).
pub(crate) fn gone_may_be_ours(record: &ConnectionRecord) -> bool {
    record.setup.tls.is_some() || record.is_closed()
}

/// Whether `record`, an HTTP/1.1 connection over TLS idle in the pool,
/// has nothing but its server's close to explain a close of ours: no
/// request on it, and no close of hyper's own its traffic showed (a dropped
/// or failed body, an announced close, a request that gave up on it).
pub(crate) fn closed_first_by_tls_server(record: &ConnectionRecord) -> bool {
    record.setup.tls.is_some()
        && !record.http2()
        && record.in_use() == 0
        && !record.is_discarded()
        && !record.is_dropped_early()
        && !record.said_connection_close()
        && record.seen_end().is_none()
}

/// Whether the kernel's report of `record`'s socket end (HTTP/1.1 or
/// HTTP/2, plain or TLS) dates the end while it idled, before its client's idle timeout
/// could have closed it: freed (the report's arrival, no earlier than the
/// end) more than [`CLOSED_AT_RELEASE`] after its release (a close at the
/// release is its pool's own: rows 3b and 8) and more than
/// [`CLOSE_DATING_SLACK`] before the idle timeout after that release
/// (hyper-util's idle check closes a connection no earlier than the idle
/// timeout after it was put back, `Pool::clear_expired`). The server ended
/// it: a miss past the idle timeout is not `idle_expired` (seen: a server
/// idle-closing at 300 ms, FIN or reset, under a client idle timeout of
/// 400 ms; nginx's `keepalive_timeout 2s` under 3 s, and its HTTP/2
/// idle GOAWAY after 1 s under 1.2 s). `false` without a report, an idle
/// timeout, or a release (HTTP/2: its last stream's end).
pub(crate) fn ended_before_idle_timeout(record: &ConnectionRecord) -> bool {
    let (Some(end), Some(timeout), Some(released)) = (
        record.socket_end(),
        record.client.idle_timeout,
        record.last_released(),
    ) else {
        return false;
    };
    end.seen_at > released + CLOSED_AT_RELEASE
        && end.seen_at + CLOSE_DATING_SLACK < record.idle_since() + timeout
}
