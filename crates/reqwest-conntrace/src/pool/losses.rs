//! Losses of a connection known without the kernel (rows 4 to 7 of the
//! miss-reason decision table, docs/REFERENCE.md section 14): a body that
//! failed or was dropped, a request that gave up on its response, an
//! announced close (`Connection: close`), a reset or GOAWAY. Each loss is
//! named by one miss.

use std::sync::Arc;
use std::time::Instant;

use crate::miss::{ConnectionEnd, MissReason};
use crate::pool::record::ConnectionRecord;
use crate::pool::slot::{Miss, Previous};

/// The miss `record`'s announced close caused (row 6): its last exchange
/// said `Connection: close`, the server's (`request_limit`) or the
/// request's own (`client_close`).
pub(crate) fn announced_close_miss(record: &ConnectionRecord, now: Instant) -> Miss {
    let end = record.announced_close_end();
    record.set_end(end);
    let reason = if end == ConnectionEnd::ClientClose {
        MissReason::ClientClose
    } else {
        MissReason::RequestLimit
    };
    Miss::caused_by(reason, Previous::of(record, now, Some(end)))
}

/// How `record` (HTTP/1.1) is known lost without the kernel's view: its
/// last exchange announced its close (row 6: `connection_close` /
/// `client_close`), a request on it gave up on its response (row 5c:
/// `abandoned`), or its body failed (row 5: `discarded`). hyper closes such
/// a connection: each costs the pool one connection, so it explains one
/// miss.
pub(crate) fn known_loss(record: &ConnectionRecord) -> Option<ConnectionEnd> {
    if record.http2() {
        None
    } else if record.said_connection_close() {
        Some(record.announced_close_end())
    } else if record.seen_end() == Some(ConnectionEnd::Abandoned) {
        Some(ConnectionEnd::Abandoned)
    } else if record.is_discarded() {
        Some(ConnectionEnd::Discarded)
    } else {
        None
    }
}

/// Whether a miss named `record` (HTTP/1.1) since it was last used (its
/// release, or its ready time): that miss accounts for it.
pub(crate) fn named_since_use(record: &ConnectionRecord) -> bool {
    record
        .named_by_miss_at()
        .is_some_and(|named| named >= record.last_activity())
}

/// A known loss some miss named already: no candidate any more (its loss
/// is told).
pub(crate) fn loss_told(record: &ConnectionRecord) -> bool {
    record.is_close_named() && known_loss(record).is_some()
}

/// The miss `record`'s known loss (see [`known_loss`]) caused.
pub(crate) fn known_loss_miss(record: &ConnectionRecord, now: Instant) -> Miss {
    match known_loss(record) {
        Some(end @ (ConnectionEnd::Abandoned | ConnectionEnd::Discarded)) => {
            let reason = if end == ConnectionEnd::Abandoned {
                MissReason::Abandoned
            } else {
                MissReason::Discarded
            };
            Miss::caused_by(reason, Previous::of(record, now, Some(end)))
        }
        _ => announced_close_miss(record, now),
    }
}

/// Names, for a miss, the connection among `connections()` known lost
/// (see [`known_loss`]) that no miss named yet, the most recently lost
/// first (see [`ConnectionRecord::idle_or_closed_since`]): each such loss cost the pool one connection,
/// so it explains one miss (a burst after several connections reached the
/// server's request limit, or after requests timed out on every pooled
/// connection, names each once). Not one another miss is asking the kernel
/// about since its last use (a body dropped early, found closed while that
/// miss waits): that miss names it when the kernel answers. `None` when
/// there is none.
pub(crate) fn name_next_known_loss<'a, I>(
    connections: impl Fn() -> I,
) -> Option<&'a Arc<ConnectionRecord>>
where
    I: Iterator<Item = &'a Arc<ConnectionRecord>>,
{
    name_next_loss(None, connections)
}

/// As [`name_next_known_loss`], for the miss that asked the kernel about
/// the connection `asked` (its candidate): that one's loss is among those
/// this miss may name.
pub(crate) fn name_next_known_loss_for<'a, I>(
    asked: u64,
    connections: impl Fn() -> I,
) -> Option<&'a Arc<ConnectionRecord>>
where
    I: Iterator<Item = &'a Arc<ConnectionRecord>>,
{
    name_next_loss(Some(asked), connections)
}

/// [`name_next_known_loss`], the connection `asked` (if any) among those
/// it may name although a miss (the one calling) is asking about it.
fn name_next_loss<'a, I>(
    asked: Option<u64>,
    connections: impl Fn() -> I,
) -> Option<&'a Arc<ConnectionRecord>>
where
    I: Iterator<Item = &'a Arc<ConnectionRecord>>,
{
    loop {
        let next = connections()
            .filter(|r| {
                known_loss(r).is_some()
                    && !r.is_close_named()
                    && (!named_since_use(r) || asked == Some(r.id()))
            })
            .max_by_key(|r| r.idle_or_closed_since())?;
        // Another miss may name it meanwhile: then the next one.
        if next.name_close() {
            return Some(next);
        }
    }
}

/// The miss for a candidate known lost (`candidate` in rows 5, 5c, 6):
/// the most recently lost connection of `connections()` no miss named yet
/// (see [`name_next_known_loss`]; the candidate's own loss when it is
/// that one), else its own again. hyper-util hands out no connection
/// known lost, so the candidate is no better a cause than another unnamed
/// loss; the latest is the one the next miss met.
pub(crate) fn name_loss<'a, I>(
    candidate: &'a Arc<ConnectionRecord>,
    connections: impl Fn() -> I,
    now: Instant,
) -> Miss
where
    I: Iterator<Item = &'a Arc<ConnectionRecord>>,
{
    let ended = name_next_known_loss(connections).unwrap_or(candidate);
    known_loss_miss(ended, now)
}

/// How much later than a spare HTTP/2 connection the pool's may have been
/// ready by our clock, and still have gone into hyper-util's pool first:
/// 75 ms. Our ready time is the connector's end; hyper-util makes the h2
/// handshake and puts the connection in its pool after it, on tasks a
/// loaded runtime may poll in the other order. Seen against nginx: of two
/// connections of one burst, the one ready 0.2 ms earlier served only its
/// own request and was closed by the client, the later one served the
/// others (3 of 16 runs of waves of 4 beside two CPU burners, where the
/// earlier one then read as the pool's, ended by a `request_limit`).
pub(crate) const HTTP2_POOLED_ORDER_SLACK: std::time::Duration =
    std::time::Duration::from_millis(75);

/// Whether `record` is a spare HTTP/2 connection of its client: hyper-util's
/// pool keeps one HTTP/2 connection per host (its `put` drops the pool's
/// share of a newer one while one is idle) and shares it with every
/// request, so one that a concurrent connect made while another one was
/// pooled serves at most the request whose connect made it, then the
/// client closes it. Told by its traffic: it served no request but that
/// one, while another connection of `connections()` that served other
/// requests (the pool's) was ready before it, or no more than
/// [`HTTP2_POOLED_ORDER_SLACK`] after it, and not known ended then (its end
/// dated later, or, undated, it served a response after), nor expired by
/// the pool's idle timeout by then (a miss found it dropped: a stream
/// still running on it kept it open, not in the pool).
pub(crate) fn http2_spare<'a, I>(record: &ConnectionRecord, connections: impl Fn() -> I) -> bool
where
    I: Iterator<Item = &'a Arc<ConnectionRecord>>,
{
    let ready = record.ready_at();
    record.http2()
        && !record.is_shared()
        && connections().any(|pooled| {
            pooled.id() != record.id()
                && pooled.http2()
                && pooled.is_shared()
                && pooled.ready_at() <= ready + HTTP2_POOLED_ORDER_SLACK
                && pooled.http2_pool_expired_at().is_none_or(|at| at > ready)
                && match pooled.server_end_by() {
                    Some(by) => by > ready,
                    // Ended, undated: alive while it was still serving.
                    None => pooled.end().is_none() || pooled.last_activity() > ready,
                }
        })
}

/// Whether `record` (HTTP/2) was replaced in hyper-util's pool: a miss found
/// the pool had expired it (its idle timeout), and another HTTP/2 connection
/// of `connections()` ready since has carried a request (the pool's now).
/// Until then, every miss of the wave that met the expiry names it (one
/// HTTP/2 connection serves them all); after, it is no candidate, even
/// while a stream still runs on it (a long request keeps it open, out of
/// the pool).
pub(crate) fn http2_replaced<'a, I>(record: &ConnectionRecord, connections: impl Fn() -> I) -> bool
where
    I: Iterator<Item = &'a Arc<ConnectionRecord>>,
{
    let Some(expired) = record.http2_pool_expired_at() else {
        return false;
    };
    connections().any(|next| {
        next.id() != record.id()
            && next.http2()
            && next.ready_at() >= expired
            && (next.in_use() > 0 || next.last_released().is_some())
    })
}

/// The miss the server's end of `candidate` caused, `end` being how it
/// ended; for HTTP/2 that end had reached us by `by`. See
/// [`server_end_reason`].
pub(crate) fn ended_by_server(
    candidate: &ConnectionRecord,
    now: Instant,
    end: Option<ConnectionEnd>,
    by: Instant,
) -> Miss {
    if candidate.http2() {
        candidate.note_server_end_by(by);
    }
    Miss::caused_by(
        server_end_reason(candidate, end),
        Previous::of(candidate, now, end),
    )
}

/// The reason for a miss on a connection the server ended (`end`, as
/// recorded): `request_limit` for an HTTP/2 GOAWAY that came with the
/// connection's latest response (see
/// [`ConnectionRecord::ended_with_last_response`]), as the server's
/// per-connection request limit sends it; `closed_by_peer` otherwise (an
/// idle close, or an end not dated).
pub(crate) fn server_end_reason(
    candidate: &ConnectionRecord,
    end: Option<ConnectionEnd>,
) -> MissReason {
    if candidate.http2()
        && end == Some(ConnectionEnd::GoAway)
        && candidate.ended_with_last_response()
    {
        MissReason::RequestLimit
    } else {
        MissReason::ClosedByPeer
    }
}

/// The reason for a miss decided as `decided` whose previous connection
/// `record` (HTTP/2) the server ended, read again once the responses it
/// carried are counted: a GOAWAY that had looked late for its last response
/// counted then came with a later one (see
/// [`ConnectionRecord::ended_with_last_response`]): `request_limit`.
pub(crate) fn ended_http2_reason(record: &ConnectionRecord, decided: MissReason) -> MissReason {
    if decided == MissReason::ClosedByPeer {
        server_end_reason(record, record.end())
    } else {
        decided
    }
}

/// Whether `record` (HTTP/1.1, released) was closed for a reason that says
/// nothing of its client's idle pool
/// ([`PoolHistory::shows_pool_off`]): a
/// close of hyper's own its traffic showed (an announced close, a dropped
/// or failed body, a request that gave up on it), or a close of ours no
/// timer dated. A close the kernel showed as the server's, looked at too
/// late to date it, is not: the pool may have kept the connection idle
/// until the server's idle close.
///
/// [`PoolHistory::shows_pool_off`]: crate::pool::model::PoolHistory::shows_pool_off
pub(crate) fn closed_on_its_own(record: &ConnectionRecord) -> bool {
    if record.http2() {
        return false;
    }
    if known_loss(record).is_some() || record.is_dropped_early() {
        return true;
    }
    record.is_closed() && record.end().is_none()
}
