//! The kernel's evidence for a request that gave up on its connection:
//! data left unacknowledged, time since the last receive, retransmits, and
//! `stalled` when nothing came back (`tcp.*` attributes on the request
//! span), read from the socket or, once hyper has closed it, from the
//! report of its end.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing_opentelemetry::OpenTelemetrySpanExt;

use crate::export::clock::secs;
use crate::handle::Inner;
use crate::kernel::{KernelLookup, SocketEnd};
use crate::pool::record::ConnectionRecord;
use crate::request::state::RequestState;
use crate::semconv;

/// Asks the kernel for the state of `record`'s socket, on which the
/// request of `span` failed; the answer lands on the span
/// ([`FailureEvidence`]; `timed_out_after`: a give-up, a timeout or a
/// dropped future, and how long nothing had arrived for the request when
/// it came). The span stays open until the kernel answers (a flush waits
/// for it like for `tcp.connect`, `wait_for_pending_spans`); the request
/// does not wait. `held`, a response body that timed out, is dropped once
/// the kernel has answered (see [`RequestEnd::hold_until_kernel_answers`]).
///
/// [`RequestEnd::hold_until_kernel_answers`]: crate::request::end::RequestEnd::hold_until_kernel_answers
pub(crate) fn ask_kernel_evidence(
    inner: &Arc<Inner>,
    span: tracing::Span,
    record: Arc<ConnectionRecord>,
    timed_out_after: Option<Quiet>,
    held: Option<Box<dyn Send + Sync>>,
) {
    let (Some(local), Some(remote)) = (record.setup.local_addr, record.setup.peer_addr) else {
        return;
    };
    let failed_at = Instant::now();
    let evidence = FailureEvidence {
        inner: Arc::downgrade(inner),
        span,
        record,
        timed_out_after,
        failed_at,
        _held: held,
        _pending: crate::export::pending::PendingEnd::new(),
    };
    inner
        .kernel
        .lookup_then(local, remote, move |lookup| evidence.answer(lookup));
}

/// How long a failed request's span waits for the kernel's report of its
/// socket's end when the socket is closed by the time the kernel is asked
/// (an HTTP/1.1 request that gave up: hyper closes the connection as its
/// future is dropped): 100 ms, looked at again every 5 ms. The report
/// (sock_diag's destroy broadcast, `kernel::watch_end`) comes as the full
/// socket is freed: at once for a reset, on entering `FIN_WAIT2` /
/// `TIME_WAIT` for a close of ours.
pub(crate) const END_REPORT_WAIT: Duration = Duration::from_millis(100);

/// How often a failed request's span looks again for its socket's end
/// report while it waits ([`END_REPORT_WAIT`]).
pub(crate) const END_REPORT_LOOK_EVERY: Duration = Duration::from_millis(5);

/// How long a request that gave up had waited for an answer that could
/// have come (see [`of_request`](Self::of_request)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Quiet {
    /// Since the request could first have been answered (or, for a body,
    /// since its last bytes).
    pub(crate) waited: Duration,
    /// The server's post-handshake TLS 1.3 messages may have arrived a
    /// round trip into the wait.
    pub(crate) after_tls13_handshake: bool,
}

impl Quiet {
    /// The wait of `state`'s request, the `request_count`th `record`
    /// carried, that gave up at `now`, counted from when it could first
    /// have been answered: nothing answers a request before it was
    /// written, and what the connection received before that (its TLS
    /// handshake, the previous response on an HTTP/1.1 connection it
    /// waited for) is no answer. So from the latest of the request's
    /// start, the connection's ready time and, over HTTP/1.1, the end of
    /// the response before it (a cold request's own connect received its
    /// handshake after the request started: a tester saw cold TLS stalls
    /// flagged only when the handshake took under about 4 ms). The first
    /// request on a TLS 1.3 connection also allows for the server's
    /// post-handshake messages (NewSessionTicket, RFC 8446 section 4.6.1),
    /// which arrive after it was written.
    pub(crate) fn of_request(
        state: &RequestState,
        record: &ConnectionRecord,
        request_count: u64,
        now: Instant,
    ) -> Self {
        let written_from = if record.http2() {
            record.ready_at()
        } else {
            record.last_activity()
        };
        Self {
            waited: now.saturating_duration_since(state.started.max(written_from)),
            after_tls13_handshake: request_count <= 1
                && record.setup.tls_version == Some(crate::TlsVersion::Tls13),
        }
    }

    /// A wait of `waited` with nothing but data owed expected.
    pub(crate) fn plain(waited: Duration) -> Self {
        Self {
            waited,
            after_tls13_handshake: false,
        }
    }
}

/// The kernel's evidence for a request that failed on a connection, on its
/// way to the request's span ([`record_kernel_evidence`]).
pub(crate) struct FailureEvidence {
    inner: std::sync::Weak<Inner>,
    span: tracing::Span,
    record: Arc<ConnectionRecord>,
    timed_out_after: Option<Quiet>,
    /// When the failure was seen.
    failed_at: Instant,
    /// A response body that timed out, held unread until the answer.
    _held: Option<Box<dyn Send + Sync>>,
    /// Keeps a flush waiting until the span has its evidence.
    _pending: crate::export::pending::PendingEnd,
}

impl FailureEvidence {
    /// Records `lookup` on the span, unless the socket is closed with no
    /// `tcp_info` left (gone, or a time-wait mini socket) and the kernel's
    /// report of its end is still on its way: then asks again shortly, up
    /// to [`END_REPORT_WAIT`] after the failure.
    fn answer(self, lookup: KernelLookup) {
        let no_info = match &lookup {
            KernelLookup::NotFound => true,
            KernelLookup::Found(facts) => facts.info.is_none(),
            KernelLookup::Unavailable | KernelLookup::TimedOut => false,
        };
        let now = Instant::now();
        let until = self.failed_at + END_REPORT_WAIT;
        if no_info
            && self.record.awaits_socket_end()
            && now < until
            && let (Some(inner), Some(local), Some(remote)) = (
                self.inner.upgrade(),
                self.record.setup.local_addr,
                self.record.setup.peer_addr,
            )
        {
            let due = (now + END_REPORT_LOOK_EVERY).min(until);
            inner
                .kernel
                .lookup_at(local, remote, due, move |lookup| self.answer(lookup));
            return;
        }
        record_kernel_evidence(
            &self.span,
            &self.record,
            &lookup,
            self.timed_out_after,
            self.failed_at,
        );
    }
}

/// The kernel's view of the socket a request failed on (at `failed_at`),
/// on its span; a request that gave up on its response (timeout or
/// dropped future) after `timed_out_after`, with nothing received from
/// the peer for that long (since the request started, or since its body's
/// last bytes), marks the connection stalled. A wait no longer than a
/// round trip (plus the counter's resolution) shows nothing: no answer
/// could have come yet. A socket closed by the time the kernel was asked
/// (`tcp.state` as found: `gone`, or a closing state with no `tcp_info`
/// left) is judged from the kernel's report of its end, when it came: its
/// last `tcp_info`, with the time since the last data received counted
/// back to the failure from when the report was read (no earlier than the
/// end: so no longer than it was, never a stall that was not).
pub(crate) fn record_kernel_evidence(
    span: &tracing::Span,
    record: &ConnectionRecord,
    lookup: &KernelLookup,
    timed_out_after: Option<Quiet>,
    failed_at: Instant,
) {
    let state = match lookup {
        KernelLookup::Found(facts) => facts.state.as_str(),
        KernelLookup::NotFound => "gone",
        KernelLookup::Unavailable | KernelLookup::TimedOut => return,
    };
    span.set_attribute(semconv::HTTP_CONNECTION_TCP_STATE, state);
    let Some(evidence) = SocketEvidence::of(lookup, record.socket_end(), failed_at) else {
        return;
    };
    span.set_attribute(
        semconv::HTTP_CONNECTION_TCP_UNACKED,
        i64::from(evidence.unacked),
    );
    span.set_attribute(
        semconv::HTTP_CONNECTION_TCP_SINCE_LAST_RECEIVE,
        secs(evidence.since_last_receive),
    );
    span.set_attribute(
        semconv::HTTP_CONNECTION_TCP_RETRANSMITS,
        i64::from(evidence.retransmits),
    );
    if evidence.shows_stall(timed_out_after) {
        record.mark_stalled();
        span.set_attribute(semconv::HTTP_CONNECTION_STALLED, true);
    }
}

/// The kernel's evidence about the socket a request failed on.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct SocketEvidence {
    /// Segments sent and not acknowledged (`tcpi_unacked`).
    unacked: u32,
    /// Time since data last arrived from the peer, at the failure.
    since_last_receive: Duration,
    /// Segments retransmitted over the socket's life.
    retransmits: u32,
    /// The smoothed round-trip time.
    rtt: Duration,
}

impl SocketEvidence {
    /// From `lookup`'s `tcp_info`, else (the socket closed with none left,
    /// or gone) from the kernel's report of its end, `end`: the time since
    /// the last data received counted back to the failure at `failed_at`
    /// from when the report was read (no earlier than the end, so no
    /// longer than it was).
    fn of(lookup: &KernelLookup, end: Option<SocketEnd>, failed_at: Instant) -> Option<Self> {
        match lookup {
            KernelLookup::Found(crate::TcpFacts {
                info: Some(info), ..
            }) => Some(Self {
                unacked: info.unacked,
                since_last_receive: info.since_last_receive,
                retransmits: info.total_retransmits,
                rtt: info.rtt,
            }),
            KernelLookup::Found(_) | KernelLookup::NotFound => end.map(|end| Self {
                unacked: end.unacked,
                since_last_receive: end
                    .since_last_receive
                    .saturating_sub(end.seen_at.saturating_duration_since(failed_at)),
                retransmits: end.retransmits,
                rtt: end.rtt,
            }),
            KernelLookup::Unavailable | KernelLookup::TimedOut => None,
        }
    }

    /// Whether a request that gave up after waiting `quiet` had received
    /// nothing for that long: longer than a round trip plus the counter's
    /// resolution (`tcpi_last_data_recv` counts jiffies, 1 to 10 ms,
    /// `CONFIG_HZ`), else no answer could have come yet. After a TLS 1.3
    /// handshake the server's session tickets may land a round trip into
    /// the wait, and a second ticket written apart from the first waits
    /// for its ACK under Nagle's algorithm (RFC 896), which the client's
    /// delayed ACK holds back up to Linux's `TCP_DELACK_MIN` (40 ms): so
    /// up to a round trip, 40 ms and a jiffy are allowed for (a tester's
    /// OpenSSL server without `TCP_NODELAY`: its second ticket 48 ms
    /// in). No answer to the request could come that soon either, but a
    /// partial one: a server that sent a few bytes that soon and then
    /// stalled still reads stalled.
    fn shows_stall(&self, quiet: Option<Quiet>) -> bool {
        let jiffy = Duration::from_millis(10);
        let delayed_ack = Duration::from_millis(40);
        quiet.is_some_and(|quiet| {
            let tickets = if quiet.after_tls13_handshake {
                self.rtt + delayed_ack + jiffy
            } else {
                Duration::ZERO
            };
            let t = quiet.waited;
            t > self.rtt + jiffy && self.since_last_receive + jiffy + tickets >= t
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A socket closed by the time the kernel was asked (gone, or a closing
    /// state with no `tcp_info` left: hyper closes an HTTP/1.1 connection
    /// as a timed-out request's future drops) is judged from the report of
    /// its end, counted back to the failure from when the report was read:
    /// 330 ms quiet at an end read 20 ms after a 300 ms timeout is a stall;
    /// data 100 ms before the failure is none. No report, no evidence.
    #[test]
    fn a_closed_sockets_end_report_keeps_a_stalls_evidence() {
        let t0 = Instant::now();
        let ms = |n| Duration::from_millis(n);
        let report = |quiet| SocketEnd {
            seen_at: t0 + ms(20),
            since_last_receive: ms(quiet),
            since_last_send: ms(300),
            since_last_ack: ms(quiet),
            acknowledged: crate::kernel::Acknowledged::DataAndFin,
            unread: 0,
            rtt: Duration::from_micros(100),
            unacked: 1,
            retransmits: 2,
        };
        let closed = KernelLookup::Found(crate::TcpFacts {
            state: crate::TcpState::FinWait2,
            info: None,
            receive_queue: 0,
            time_wait_left: None,
            fin_wait2_left: Some(ms(59_990)),
        });
        for lookup in [KernelLookup::NotFound, closed] {
            let stalled = SocketEvidence::of(&lookup, Some(report(330)), t0).expect("evidence");
            assert_eq!(
                (
                    stalled.since_last_receive,
                    stalled.unacked,
                    stalled.retransmits
                ),
                (ms(310), 1, 2)
            );
            assert!(
                stalled.shows_stall(Some(Quiet::plain(ms(300)))),
                "{lookup:?}"
            );
            let answered = SocketEvidence::of(&lookup, Some(report(120)), t0).expect("evidence");
            assert_eq!(answered.since_last_receive, ms(100));
            assert!(
                !answered.shows_stall(Some(Quiet::plain(ms(300)))),
                "{lookup:?}"
            );
            assert_eq!(SocketEvidence::of(&lookup, None, t0), None);
        }
        assert_eq!(
            SocketEvidence::of(&KernelLookup::Unavailable, Some(report(330)), t0),
            None
        );
    }

    /// The first request on a TLS 1.3 connection waited 300 ms; the
    /// server's session tickets landed 70 ms in (a 20 ms round trip, a
    /// second ticket held 40 ms by Nagle and the delayed ACK, a jiffy's
    /// rounding): still a stall, as no answer could come that soon.
    /// Without the handshake behind it, 230 ms quiet of 300 is data that
    /// came: no stall; nor with the handshake when the data came 100 ms in.
    #[test]
    fn tls13_tickets_a_round_trip_into_the_wait_are_no_answer() {
        let ms = |n| Duration::from_millis(n);
        let quiet = |since_last_receive| SocketEvidence {
            unacked: 1,
            since_last_receive,
            retransmits: 0,
            rtt: ms(20),
        };
        let after_handshake = Quiet {
            waited: ms(300),
            after_tls13_handshake: true,
        };
        assert!(quiet(ms(230)).shows_stall(Some(after_handshake)));
        assert!(!quiet(ms(230)).shows_stall(Some(Quiet::plain(ms(300)))));
        assert!(!quiet(ms(200)).shows_stall(Some(after_handshake)));
        assert!(quiet(ms(295)).shows_stall(Some(Quiet::plain(ms(300)))));
    }
}
