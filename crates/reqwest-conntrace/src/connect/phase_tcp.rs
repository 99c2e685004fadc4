//! The `tcp.connect` phase: from the DNS answer (or the connect's start) to
//! the tunnel, TLS or the connect's end; its peer, the addresses hyper-util
//! tried in order, the winner's index, and a `tcp.address_skipped` event
//! per address passed over (Happy Eyeballs). Its end waits for the
//! kernel's facts (see `tcp`).

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use opentelemetry::global::BoxedTracer;
use opentelemetry::{Array, Context, KeyValue, StringValue, Value};

use crate::connect::address::{self, AddressChoice};
use crate::connect::attributes::{network_type, peer_attributes};
use crate::connect::peer::Peer;
use crate::connect::phase::PhaseScope;
use crate::connect::tcp::TcpSpanEnd;
use crate::export::phases::{ConnectionPhases, PhaseRecord, SetupSpanEnd};
use crate::kernel::TcpFacts;
use crate::semconv;

/// `network.transport` of a connection: `tcp`, or, for a local transport,
/// `unix` (`pipe` on Windows), as semantic conventions 1.37 name them.
fn transport(local_transport: bool) -> &'static str {
    if !local_transport {
        "tcp"
    } else if cfg!(windows) {
        "pipe"
    } else {
        "unix"
    }
}

/// What the TCP phase is emitted from, besides the [`PhaseScope`].
#[derive(Debug)]
pub(crate) struct TcpPhase<'a> {
    /// When the phase began: the DNS answer, else the connect's start
    /// (monotonic).
    pub(crate) start: Instant,
    /// When the `CONNECT` tunnel began, through a proxy (the phase ends
    /// there; monotonic).
    pub(crate) tunnel_start: Option<Instant>,
    /// The connect went through a `CONNECT` tunnel: the address it reached
    /// is the proxy's, no choice among the resolved ones is judged.
    pub(crate) tunneled: bool,
    /// A Unix domain socket (or named pipe), not TCP.
    pub(crate) local_transport: bool,
    /// The address TCP connected to, when known.
    pub(crate) remote: Option<SocketAddr>,
    /// The connected peer as the kernel or the candidates named it.
    pub(crate) peer: &'a Peer,
    /// Where the kernel's facts go for the connection's report, when a
    /// report wants them.
    pub(crate) facts: Option<Arc<OnceLock<TcpFacts>>>,
}

/// What the TCP phase leaves for the setup span and the report.
#[derive(Debug, Default)]
pub(crate) struct TcpOutcome {
    /// From the phase's start to its end.
    pub(crate) duration: Duration,
    /// The winner was not the first address tried.
    pub(crate) address_fallback: bool,
    /// The winner's index among the addresses tried is known.
    pub(crate) address_known: bool,
    /// The phase's end when it waits for the kernel's facts about the
    /// connected socket (ended by the caller, off this task).
    pub(crate) pending: Option<TcpSpanEnd>,
}

/// Emits the `tcp.connect` phase: starts it (when the setup span records)
/// with its attributes and skipped-address events, then ends it now, or
/// hands its end back in [`TcpOutcome::pending`] when the kernel is to be
/// asked about the connected socket first.
pub(crate) fn emit_tcp_phase(scope: &PhaseScope<'_>, tcp: TcpPhase<'_>) -> TcpOutcome {
    let inner = scope.inner;
    let phases = scope.phases;
    let established = scope.established;
    let end = scope.end;
    let recording = scope.tracer.is_some();
    let tcp_start = tcp.start;
    let tcp_end = tcp.tunnel_start.or(phases.tls_started).unwrap_or(end);
    let duration = tcp_end.saturating_duration_since(tcp_start);
    let connect_order = phases
        .dns
        .as_ref()
        .map(|d| d.connect_order.as_slice())
        .filter(|order| !order.is_empty());
    let choice = match (connect_order, tcp.remote) {
        (Some(order), Some(r)) if !tcp.tunneled => {
            address::explain_choice(order, r, duration, scope.attempt.connect_timeout)
        }
        _ => None,
    };
    let address_known = choice.is_some();
    let address_fallback = choice.as_ref().is_some_and(|c| c.index > 0);
    // Only a connect that used its first address started its SYN clock
    // at the phase start; through a proxy that neither began TLS nor
    // refused, the phase's time may be the wait for the proxy's answer
    // to `CONNECT` as well as the TCP connect: no retransmit is told.
    let syn_retransmits = if address_fallback || (tcp.tunneled && tcp.tunnel_start.is_none()) {
        0
    } else {
        address::syn_retransmits_by_timing(duration)
    };
    let phase = match scope.tracer {
        Some(tracer) => {
            start_tcp_record(scope, tracer, &tcp, connect_order, choice.as_ref(), tcp_end)
        }
        // No span: the kernel's facts, if asked for, only fill the report.
        None => PhaseRecord::Span(Context::new()),
    };
    let mut ending = TcpSpanEnd {
        phase,
        start: inner.clock.wall(tcp_start),
        end: inner.clock.wall(tcp_end),
        syn_by_timing: syn_retransmits,
        facts: tcp.facts,
        setup_end: None,
        _pending: crate::export::pending::PendingEnd::new(),
    };
    let mut pending = None;
    // A connected socket is looked up in the kernel before the span
    // ends (by the caller, off this task), when anyone reads the
    // answer (a recorded span, a report); anything else ends now.
    if established.is_some_and(|e| e.local.is_some() && e.remote.is_some())
        && inner.kernel.is_available()
        && (recording || inner.on_request_end.is_some())
    {
        // The `tcp.connect` event is written when the kernel answers:
        // the setup span ends once it is (and its trigger's outcome is
        // known), at its own end time.
        if recording && matches!(inner.phases, ConnectionPhases::Events) {
            ending.setup_end = Some(Arc::new(SetupSpanEnd::new(
                scope.setup.clone(),
                inner.clock.wall(end),
            )));
        }
        pending = Some(ending);
    } else {
        ending.finish(None);
    }
    TcpOutcome {
        duration,
        address_fallback,
        address_known,
        pending,
    }
}

/// Starts the `tcp.connect` phase at `tcp.start` with its attributes
/// (transport, peer, candidates, addresses tried, the winner's index), adds
/// a `tcp.address_skipped` event per address passed over (no later than
/// `tcp_end`), and marks it failed when the connect ended in it.
fn start_tcp_record(
    scope: &PhaseScope<'_>,
    tracer: &BoxedTracer,
    tcp: &TcpPhase<'_>,
    connect_order: Option<&[SocketAddr]>,
    choice: Option<&AddressChoice>,
    tcp_end: Instant,
) -> PhaseRecord {
    let inner = scope.inner;
    let tcp_start = tcp.start;
    let mut attrs = vec![KeyValue::new(
        semconv::NETWORK_TRANSPORT,
        transport(tcp.local_transport),
    )];
    if let Some(r) = tcp.remote {
        attrs.extend(peer_attributes(&r));
        attrs.push(KeyValue::new(semconv::NETWORK_TYPE, network_type(&r)));
    }
    if let Peer::Ambiguous(candidates) = tcp.peer {
        attrs.push(KeyValue::new(
            semconv::HTTP_CONNECTION_PEER_CANDIDATES,
            Value::Array(Array::String(
                candidates
                    .iter()
                    .map(|a| StringValue::from(a.ip().to_string()))
                    .collect(),
            )),
        ));
    }
    if let Some(order) = connect_order {
        attrs.push(KeyValue::new(
            semconv::HTTP_CONNECTION_ADDRESSES,
            Value::Array(Array::String(
                order
                    .iter()
                    .map(|a| StringValue::from(a.ip().to_string()))
                    .collect(),
            )),
        ));
    }
    if let Some(c) = choice {
        attrs.push(KeyValue::new(
            semconv::HTTP_CONNECTION_ADDRESS_INDEX,
            c.index as i64,
        ));
        attrs.push(KeyValue::new(
            semconv::HTTP_CONNECTION_ADDRESS_FALLBACK,
            c.index > 0,
        ));
    }
    let mut phase = PhaseRecord::start(
        tracer,
        inner.phases,
        scope.setup,
        semconv::TCP_CONNECT_SPAN,
        inner.clock.wall(tcp_start),
        attrs,
    );
    if let Some(c) = choice {
        for skipped in &c.skipped {
            let at = match (skipped.outcome, skipped.gave_up_after) {
                (_, Some(after)) => tcp_start + after,
                (semconv::ADDRESS_OUTCOME_OUTRACED, _) => tcp_end,
                _ => tcp_start,
            };
            phase.add_event(
                semconv::EVENT_TCP_ADDRESS_SKIPPED,
                inner.clock.wall(at.min(tcp_end)),
                vec![
                    KeyValue::new(semconv::NETWORK_PEER_ADDRESS, skipped.addr.ip().to_string()),
                    KeyValue::new(semconv::NETWORK_PEER_PORT, i64::from(skipped.addr.port())),
                    KeyValue::new(semconv::HTTP_CONNECTION_ADDRESS_OUTCOME, skipped.outcome),
                ],
            );
        }
    }
    if scope.phases.tls_started.is_none()
        && tcp.tunnel_start.is_none()
        && scope.established.is_none()
    {
        let (t, m) = scope.failure.or_cancel();
        phase.fail(t, &m);
    }
    phase
}
