//! A request that failed: the connection it failed on, when one existed
//! (its own connect's, the HTTP/2 connection it was multiplexed onto, or
//! the idle HTTP/1.1 connection hyper-util most likely handed it), and how
//! that connection ended when the failure says the server ended it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use opentelemetry::KeyValue;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use crate::export::clock::secs;
use crate::export::report::ConnectionUse;
use crate::handle::Inner;
use crate::miss::ConnectionEnd;
use crate::pool::record::{ConnectionRecord, Pair};
use crate::request::attribution::{set_attributes, socket_attributes};
use crate::request::stall_evidence::{Quiet, ask_kernel_evidence};
use crate::request::state::RequestState;
use crate::semconv;

/// What a failed request's error says of the connection it failed on.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct FailureEvidence {
    /// The connection, as hyper-util's error names it (its socket pair,
    /// local and remote; see
    /// [`failed_connection_pair`](crate::error::failed_connection_pair)).
    pub(crate) connection: Option<Pair>,
    /// It closed with the server's FIN before the response was complete
    /// (hyper's incomplete message), not a reset: the connection ended
    /// `peer_fin` (a server closing after reading the request, or its
    /// idle close crossing the request on the wire).
    pub(crate) peer_fin: bool,
    /// hyper cancelled the request as the connection's task ended (see
    /// [`closed_under_request`](crate::error::closed_under_request)):
    /// the connection closed, how is not said.
    pub(crate) closed_under: bool,
    /// The server reset the request's HTTP/2 stream after taking it in
    /// (see [`stream_reset_by_server`](crate::error::stream_reset_by_server)):
    /// the server counted the request.
    pub(crate) reset_by_server: bool,
}

impl FailureEvidence {
    /// What `error` says.
    pub(crate) fn of(error: &(dyn std::error::Error + 'static)) -> Self {
        Self {
            connection: crate::error::failed_connection_pair(error),
            peer_fin: crate::error::closed_before_response(error),
            closed_under: crate::error::closed_under_request(error),
            reset_by_server: crate::error::stream_reset_by_server(error),
        }
    }
}

/// A request failed. When a connection existed that carried it, names it on
/// `span` (see [`likely_connection`]): the one hyper-util's error names
/// (`evidence`), else the one its own connect made (if that succeeded; for
/// one that gave up, one returned to its waiting checkout first), else the
/// HTTP/2 connection it was multiplexed onto, else the HTTP/1.1 connection
/// hyper-util would have handed out (the host's most recently released idle
/// one); for an HTTP/2 error with none of those found, the host's latest
/// HTTP/2 connection. Sets `http.connection.reused`, `.id`, `.idle_time`,
/// its socket's `network.peer.address`, `network.peer.port` and
/// `network.local.port` (as a response on it would), and a link to
/// its setup span; records how the failure ended the connection
/// (`connection_reset`: a reset, or the server's FIN when `evidence` says
/// so; HTTP/2 GOAWAY or connection error; an HTTP/1.1
/// request that gave up on its response abandons it, `abandoned`); and asks the
/// kernel for the socket's state (unacknowledged data, time since the last
/// receive, retransmits), which lands on the span when the answer arrives
/// (the span ends then, within milliseconds; the request does not wait).
/// A request that gave up on its response (`timeout`: reqwest's own
/// deadline; `cancelled`: its future was dropped, e.g. by
/// `tokio::time::timeout`) had been sent on the connection: it counts in
/// the connection's request count (`http.connection.request_count`, set
/// on the span), as the server counted it; so does an HTTP/2 request
/// whose stream the server reset (any reason but `REFUSED_STREAM`). Unless it was given up
/// unwritten: its future (`dropped`) was dropped in its first poll, before
/// hyper could write the request (see [`RequestState::given_up_unwritten`]): the server never saw it, so
/// it counts in nothing (no request count, no HTTP/2 stream reset: h2
/// opened no stream) and the span says so (`http.connection.unsent`); an
/// HTTP/1.1 connection is still ended `abandoned` (hyper closes a
/// connection whose queued request was cancelled, unwritten).
/// Returns the connection it names, for the request's report (see
/// [`RequestReport::connection`]): what the span says, no more.
///
/// [`RequestReport::connection`]: crate::RequestReport::connection
pub(crate) fn attribute_failure(
    inner: &Arc<Inner>,
    state: &RequestState,
    span: &tracing::Span,
    error_type: &str,
    dropped: bool,
    evidence: FailureEvidence,
) -> Option<ConnectionUse> {
    // Only errors that happen on a connection (not, say, a refused
    // redirect or a request that could not be built); of those, the HTTP/2
    // layer's happen on an HTTP/2 connection.
    let http2_error = match error_type {
        semconv::ERROR_TYPE_HTTP2_GOAWAY
        | semconv::ERROR_TYPE_HTTP2_STREAM_RESET
        | semconv::ERROR_TYPE_HTTP2_ERROR => true,
        semconv::ERROR_TYPE_CONNECTION_RESET
        | semconv::ERROR_TYPE_TIMEOUT
        | semconv::ERROR_TYPE_CANCELLED => false,
        _ => return None,
    };
    // The request gave up waiting for its response: reqwest's deadline, or
    // its future dropped (the same thing from outside: reqwest's timeout
    // drops hyper's future too).
    let gave_up = matches!(
        error_type,
        semconv::ERROR_TYPE_TIMEOUT | semconv::ERROR_TYPE_CANCELLED
    );
    let record = likely_connection(
        inner,
        state,
        error_type == semconv::ERROR_TYPE_CONNECTION_RESET,
        gave_up,
        evidence.connection,
    );
    // An HTTP/2 error happened on an HTTP/2 connection: when none of the
    // above was found (its own connect had not finished, the connection was
    // already ended by the same GOAWAY), the host's latest one.
    let record = record.or_else(|| {
        http2_error
            .then(|| inner.pools.latest_http2(&state.host))
            .flatten()
    });
    let record = record?;
    let unsent = gave_up && dropped && state.given_up_unwritten(record.runtime);
    let now = Instant::now();
    let (reused, idle) = name_without_response(span, &record, state);
    // Sent and then given up on: the server counted it (a GOAWAY or a
    // refused stream may mean it never saw it, so those count nothing; nor
    // does a request given up before hyper wrote it; a stream the server
    // reset otherwise it counted, below).
    if unsent {
        span.set_attribute(semconv::HTTP_CONNECTION_UNSENT, true);
    }
    // The server reset its stream after taking it in: it counted the
    // request too (a tester's server resetting every third stream saw
    // every later count one further behind its own).
    let counted_by_server =
        error_type == semconv::ERROR_TYPE_HTTP2_STREAM_RESET && evidence.reset_by_server;
    let request_count = if (gave_up && !unsent) || counted_by_server {
        let count = record.count_request(state.started);
        span.set_attribute(semconv::HTTP_CONNECTION_REQUEST_COUNT, count as i64);
        count
    } else {
        record.requests.load(std::sync::atomic::Ordering::Relaxed)
    };
    // The server's reset ended that exchange: the connection's last
    // activity, as a response's end is (the next request's idle time
    // counts from it).
    if counted_by_server && record.http2() {
        record.mark_released(now);
    }
    // HTTP/2: giving up drops h2's response future, which resets the open
    // stream (RST_STREAM CANCEL; hyper 1.x `proto/h2/client.rs` drops it
    // when the request's callback is cancelled), as a dropped body does.
    if gave_up && !unsent && record.http2() {
        let resets = record.count_stream_reset();
        span.add_event(
            semconv::EVENT_STREAM_RESET,
            vec![KeyValue::new(
                semconv::HTTP_CONNECTION_STREAM_RESETS,
                resets as i64,
            )],
        );
    }
    let usage = unanswered_use(span, &record, state, reused, request_count, idle);
    // HTTP/2: hyper cancels the requests queued on a connection whose task
    // ended, after a GOAWAY's graceful close as after an error: no word on
    // how it ended (the GOAWAY's own failures, or the kernel at the next
    // miss, tell). A tester saw such cancels read `http2_error` on
    // connections the server had closed gracefully (9 misses in 90 runs).
    let end = server_end_of_failure(error_type, record.http2())
        .filter(|_| !(record.http2() && evidence.closed_under));
    if let Some(end) = end {
        // hyper read the server's FIN, not a reset, before the response.
        let end = match end {
            ConnectionEnd::PeerReset if evidence.peer_fin => ConnectionEnd::PeerFin,
            end => end,
        };
        ended_by_server(inner, &record, end, now);
        return Some(usage);
    }
    // An HTTP/1.1 request that gave up on its response (a timeout, a
    // dropped future): the connection still owes that response, so hyper
    // closes it; so it does when the request was cancelled before it was
    // written (its dispatcher closes on a cancelled request: hyper 1.x
    // `proto/h1/dispatch.rs`, `poll_msg` "request canceled", then
    // `close()`), with the server's count one less.
    if gave_up && !record.http2() {
        record.set_end(ConnectionEnd::Abandoned);
        inner.connection_closed(&record, now);
    }
    let quiet = gave_up.then(|| Quiet::of_request(state, &record, request_count, now));
    ask_kernel_evidence(inner, span.clone(), record, quiet, None);
    Some(usage)
}

/// The connection a request with no response of its own to read it from
/// went out on: the one hyper-util's error names (`failed_on`, the socket
/// pair of its last attempt's connection: see
/// [`failed_connection_pair`](crate::error::failed_connection_pair)), else,
/// most likely, the one its own connect made, else the HTTP/2 connection
/// it was multiplexed onto, else the HTTP/1.1 one hyper-util would have
/// handed out (the host's most recently released idle one; for a `reset`
/// failure, one whose socket the kernel reported ended since the request
/// started first: see [`PoolHistory::likely_pooled`]). The error's pair
/// matters where hyper-util resent the request: its own connect's
/// connection may have carried nothing (a tester saw HTTP/2 GOAWAY
/// failures name connections nginx never saw a request on, 113 of 149).
/// A request that `gave_up` (a timeout, a dropped future: no error names
/// its connection) after missing names an HTTP/1.1 connection released to
/// its waiting checkout before its own connect finished, when there is one
/// (see [`PoolHistory::returned_to_waiting`]).
///
/// [`PoolHistory::likely_pooled`]: crate::pool::model::PoolHistory::likely_pooled
/// [`PoolHistory::returned_to_waiting`]: crate::pool::model::PoolHistory::returned_to_waiting
pub(crate) fn likely_connection(
    inner: &Inner,
    state: &RequestState,
    reset: bool,
    gave_up: bool,
    failed_on: Option<Pair>,
) -> Option<Arc<ConnectionRecord>> {
    if let Some(record) = failed_on.and_then(|(local, remote)| {
        inner.registry.get(local, remote).or_else(|| {
            inner
                .pools
                .connection_with_pair(&state.host, (local, remote))
        })
    }) {
        // Named exactly: no request failing at once may guess it too.
        let _ = record.claim_unanswered();
        return Some(record);
    }
    if state.miss().is_some() {
        let own = inner.pools.made_for(&state.host, state.id);
        let returned = (gave_up && own.as_ref().is_none_or(|r| !r.http2()))
            .then(|| {
                let until = own.as_ref().map_or_else(Instant::now, |r| r.ready_at());
                inner.pools.returned_to_waiting(
                    &state.host,
                    state.started,
                    until,
                    own.as_ref().map(|r| r.id()),
                )
            })
            .flatten();
        returned.or(own)
    } else {
        inner
            .pools
            .likely_multiplexed(&state.host, state.started)
            .or_else(|| inner.pools.likely_pooled(&state.host, state.started, reset))
    }
}

/// A redirect hop answered with a redirect the limit refused: reqwest
/// turned the response into its redirect error and dropped it, so no
/// `HttpInfo` names its connection. Names the one it most likely came on
/// (see [`likely_connection`]) as a response on it would (`reused`, `id`,
/// `request_count`, counting this request, which the server answered; the
/// socket's addresses; a link to its setup), takes it for the request
/// (the caller ends the request as a dropped response, which releases
/// it), and returns it for the request's report. Its miss, when the hop
/// made one, the caller records as an answered request's.
pub(crate) fn attribute_refused_redirect(
    inner: &Arc<Inner>,
    state: &RequestState,
    span: &tracing::Span,
) -> Option<(ConnectionUse, Arc<ConnectionRecord>)> {
    let record = likely_connection(inner, state, false, false, None)?;
    record.take();
    let request_count = record.count_request(state.started);
    span.set_attribute(semconv::HTTP_CONNECTION_REQUEST_COUNT, request_count as i64);
    let (reused, idle) = name_without_response(span, &record, state);
    let usage = unanswered_use(span, &record, state, reused, request_count, idle);
    Some((usage, record))
}

/// Names `record` on `span` for a request that read no response from it,
/// as a response on it would ([`attribute_response`]):
/// `http.connection.reused`, `.id`, `.idle_time` (when reused) and its
/// socket. Returns whether it was reused, and its idle time then.
///
/// [`attribute_response`]: crate::request::attribution::attribute_response
pub(crate) fn name_without_response(
    span: &tracing::Span,
    record: &ConnectionRecord,
    state: &RequestState,
) -> (bool, Option<Duration>) {
    let reused = record.ready_at() <= state.started;
    let idle = reused.then(|| {
        state
            .started
            .saturating_duration_since(record.last_activity())
    });
    if !span.is_none() {
        let mut attributes = Vec::with_capacity(6);
        attributes.extend([
            KeyValue::new(semconv::HTTP_CONNECTION_REUSED, reused),
            KeyValue::new(semconv::HTTP_CONNECTION_ID, record.id() as i64),
        ]);
        if let Some(idle) = idle {
            attributes.push(KeyValue::new(
                semconv::HTTP_CONNECTION_IDLE_TIME,
                secs(idle),
            ));
        }
        if let Some((local, remote)) = record.pair() {
            attributes.extend(socket_attributes(local, remote));
        }
        set_attributes(span, attributes);
    }
    (reused, idle)
}

/// The report's view of `record`, the connection a request with no
/// response to read it from is named on ([`attribute_failure`],
/// [`attribute_refused_redirect`]): no wait measured, no miss reason of its
/// own; and on `span` a link to its setup, unless this request's connect
/// made it (its setup is then the span's child).
pub(crate) fn unanswered_use(
    span: &tracing::Span,
    record: &ConnectionRecord,
    state: &RequestState,
    reused: bool,
    request_count: u64,
    idle: Option<Duration>,
) -> ConnectionUse {
    let paid = record.trigger_id == Some(state.id);
    if !paid {
        span.add_link_with_attributes(
            record.setup_span(),
            vec![KeyValue::new(
                semconv::HTTP_CONNECTION_ID,
                record.id() as i64,
            )],
        );
    }
    ConnectionUse {
        id: record.id(),
        reused,
        wait: Duration::ZERO,
        request_count,
        age: state.started.saturating_duration_since(record.ready_at()),
        idle,
        paid_by_this_request: paid,
        miss_reason: None,
        setup: record.setup.clone(),
        settling: None,
    }
}

/// How a request failure of type `error_type` shows the server ended the
/// connection it was on (before its response or while its body was read):
/// a reset (`peer_reset`), a close mid-body (`incomplete_body`: the
/// server's FIN, `peer_fin`), an HTTP/2 GOAWAY or connection error (for
/// HTTP/2 a reset or close of the socket is a connection error). `None`
/// for failures that do not (a timeout: the client gave up; a stream reset).
pub(crate) fn server_end_of_failure(error_type: &str, http2: bool) -> Option<ConnectionEnd> {
    match error_type {
        semconv::ERROR_TYPE_CONNECTION_RESET | semconv::ERROR_TYPE_INCOMPLETE_BODY if http2 => {
            Some(ConnectionEnd::Http2Error)
        }
        semconv::ERROR_TYPE_CONNECTION_RESET => Some(ConnectionEnd::PeerReset),
        semconv::ERROR_TYPE_INCOMPLETE_BODY => Some(ConnectionEnd::PeerFin),
        semconv::ERROR_TYPE_HTTP2_GOAWAY => Some(ConnectionEnd::GoAway),
        semconv::ERROR_TYPE_HTTP2_ERROR => Some(ConnectionEnd::Http2Error),
        _ => None,
    }
}

/// Records that the server ended `record` (`end`, from a request's
/// failure) and counts its close.
pub(crate) fn ended_by_server(
    inner: &Inner,
    record: &ConnectionRecord,
    end: ConnectionEnd,
    now: Instant,
) {
    record.set_end(end);
    if end == ConnectionEnd::GoAway {
        // Dates the GOAWAY: responses on it ending after this show it
        // came while the connection was serving (its request limit).
        record.note_server_end_by(now);
    }
    inner.connection_closed(record, now);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A failure tells the server's end by its kind (REFERENCE row 7); a
    /// timeout or a reset stream is none (the client gave up; the
    /// connection serves on).
    #[test]
    fn a_failure_names_the_servers_end_by_its_kind() {
        for (error_type, http1, http2) in [
            (
                semconv::ERROR_TYPE_INCOMPLETE_BODY,
                Some(ConnectionEnd::PeerFin),
                Some(ConnectionEnd::Http2Error),
            ),
            (
                semconv::ERROR_TYPE_CONNECTION_RESET,
                Some(ConnectionEnd::PeerReset),
                Some(ConnectionEnd::Http2Error),
            ),
            (
                semconv::ERROR_TYPE_HTTP2_GOAWAY,
                Some(ConnectionEnd::GoAway),
                Some(ConnectionEnd::GoAway),
            ),
            (semconv::ERROR_TYPE_TIMEOUT, None, None),
            (semconv::ERROR_TYPE_HTTP2_STREAM_RESET, None, None),
            (semconv::ERROR_TYPE_OTHER, None, None),
        ] {
            assert_eq!(
                server_end_of_failure(error_type, false),
                http1,
                "{error_type}"
            );
            assert_eq!(
                server_end_of_failure(error_type, true),
                http2,
                "{error_type}"
            );
        }
    }
}
