//! The `proxy.connect` phase: the `CONNECT` tunnel through a proxy, from
//! the request sent to the proxy's answer (when TLS to the target began,
//! or the proxy refused).

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use opentelemetry::KeyValue;

use crate::connect::attempt::Phases;
use crate::connect::attributes::{peer_attributes, proxy_attributes};
use crate::connect::phase::PhaseScope;
use crate::connect::proxy::ProxyRoute;
use crate::error::ProxyRefusal;
use crate::export::phases::PhaseRecord;
use crate::semconv;

/// When the tunnel of a connect through a `CONNECT` proxy began (monotonic;
/// the TCP phase ends there), `None` when it went through no tunnel or
/// nothing timed one.
///
/// The tunnel starts with the poll before the one that began TLS (or, when
/// the proxy refused, before the one that read its answer): that poll
/// completed the TCP connect and sent the CONNECT request. When one poll
/// did it all (the answer was already there), it starts with that poll; and
/// when that poll began before the proxy's name was resolved (the poll
/// before was the lookup's), no earlier than the lookup's answer
/// (`tcp_start`): TCP took no time of its own there.
pub(crate) fn tunnel_start(
    phases: &Phases,
    refusal: Option<ProxyRefusal>,
    tcp_start: Instant,
    tunneled: bool,
) -> Option<Instant> {
    let polls = match (phases.tls_started, refusal) {
        (Some(_), _) => [phases.tunnel_started, phases.tls_poll_started],
        (None, Some(_)) => [phases.previous_poll_started, phases.poll_started],
        (None, None) => [None, None],
    };
    polls
        .into_iter()
        .flatten()
        .find(|t| *t >= tcp_start)
        .or_else(|| polls.iter().any(Option::is_some).then_some(tcp_start))
        .filter(|_| tunneled)
}

/// The address of a proxy that answered the `CONNECT` (it refused, or
/// opened the tunnel: TLS began through it), so was connected to, as
/// `tcp.connect`'s peer when the connect ended before hyper-util showed
/// it (the refusal, or TLS failing inside the tunnel): known when only one
/// was possible (an IP literal, or its name's one answer) and its port is.
pub(crate) fn answering_proxy_address(
    phases: &Phases,
    route: Option<&ProxyRoute>,
    refusal: Option<ProxyRefusal>,
) -> Option<SocketAddr> {
    if refusal.is_none() && phases.tls_started.is_none() {
        return None;
    }
    let route = route.filter(|r| r.tunnel)?;
    // The resolver answers with port 0: the proxy's port is configured.
    let ip = match phases.dns.as_ref() {
        Some(dns) => match dns.connect_order.as_slice() {
            [only] => only.ip(),
            _ => return None,
        },
        None => route
            .host
            .as_deref()?
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<std::net::IpAddr>()
            .ok()?,
    };
    Some(SocketAddr::new(ip, route.port?))
}

/// What the tunnel phase is emitted from, besides the [`PhaseScope`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct TunnelPhase<'a> {
    /// When the tunnel began (see [`tunnel_start`]; monotonic).
    pub(crate) start: Instant,
    /// The proxy's address TCP connected to, when known.
    pub(crate) remote: Option<SocketAddr>,
    /// The proxy the connect went through.
    pub(crate) route: Option<&'a ProxyRoute>,
    /// The proxy's refusal of the `CONNECT`, when it refused.
    pub(crate) refusal: Option<ProxyRefusal>,
}

/// Emits the `proxy.connect` phase (when the setup span records), ended
/// when TLS began, else at the connect's end (failed there unless TLS
/// began), and returns its duration.
pub(crate) fn emit_tunnel_phase(scope: &PhaseScope<'_>, tunnel: &TunnelPhase<'_>) -> Duration {
    let inner = scope.inner;
    let phases = scope.phases;
    let start = tunnel.start;
    let tunnel_end = phases.tls_started.unwrap_or(scope.end);
    if let Some(tracer) = scope.tracer {
        let mut attrs = Vec::new();
        if let Some(t) = &scope.attempt.trigger {
            attrs.extend(crate::export::metrics::host_attributes(
                &t.host.host,
                t.host.port,
            ));
        }
        if let Some(r) = tunnel.remote {
            attrs.extend(peer_attributes(&r));
        }
        attrs.extend(tunnel.route.into_iter().flat_map(proxy_attributes));
        if let Some(status) = tunnel.refusal.and_then(|r| r.status) {
            attrs.push(KeyValue::new(
                semconv::HTTP_RESPONSE_STATUS_CODE,
                i64::from(status),
            ));
        }
        let mut phase = PhaseRecord::start(
            tracer,
            inner.phases,
            scope.setup,
            semconv::PROXY_CONNECT_SPAN,
            inner.clock.wall(start),
            attrs,
        );
        if phases.tls_started.is_none() {
            let (t, m) = scope.failure.or_cancel();
            phase.fail(t, &m);
        }
        phase.end(inner.clock.wall(tunnel_end));
    }
    tunnel_end.saturating_duration_since(start)
}
