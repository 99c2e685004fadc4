//! The `http.connection_setup` span, and the sequence of its phase
//! children (or events) emitted with the exact boundaries the hooks
//! recorded: `phase_dns`, `phase_tcp`, `phase_tunnel`, `phase_tls`, then
//! the span's own attributes (`setup_attributes`), the metrics
//! (`setup_metrics`) and the report.

use std::sync::{Arc, OnceLock};
use std::time::Instant;

use opentelemetry::trace::{
    Link, Span as _, SpanBuilder, SpanContext, SpanKind, TraceContextExt, Tracer,
};
use opentelemetry::{Context, KeyValue};

use crate::connect::attempt::ConnectAttempt;
use crate::connect::outcome::{Ending, Failure, FailureFacts};
use crate::connect::peer::Peer;
use crate::connect::phase::PhaseScope;
use crate::connect::phase_dns::{dns_skipped, emit_dns_phase};
use crate::connect::phase_tcp::{TcpOutcome, TcpPhase, emit_tcp_phase};
use crate::connect::phase_tls::emit_tls_phase;
use crate::connect::phase_tunnel::{
    TunnelPhase, answering_proxy_address, emit_tunnel_phase, tunnel_start,
};
use crate::connect::proxy::Evidence;
use crate::connect::setup_attributes::{SetupAttributes, set_setup_attributes};
use crate::connect::setup_metrics::{SetupMetrics, record_setup_metrics};
use crate::connect::tcp::TcpSpanEnd;
use crate::export::report::ConnectionSetup;
use crate::handle::Inner;
use crate::semconv;

/// Starts the setup span as a child of `parent` (the triggering request's
/// span context), stamped with the attempt's start time.
pub(crate) fn start_setup_span(
    inner: &Inner,
    attempt: &ConnectAttempt,
    parent: &Context,
) -> Context {
    let tracer = inner.tracer();
    let mut attributes = vec![KeyValue::new(
        semconv::HTTP_CONNECTION_ID,
        attempt.id as i64,
    )];
    if let Some(t) = &attempt.trigger {
        attributes.extend(t.host.attributes());
    }
    let builder = SpanBuilder::from_name(semconv::CONNECTION_SETUP_SPAN)
        .with_kind(SpanKind::Internal)
        .with_start_time(inner.clock.wall(attempt.started))
        .with_attributes(attributes);
    // A request that is not sampled: the setup is the root of its own
    // trace, linked to the request, so a sampler can keep every setup while
    // sampling requests (`KeepConnectionSetups`, see `sampling`).
    let request = parent.span().span_context().clone();
    if request.is_valid() && !request.is_sampled() {
        let root = Context::new();
        let span =
            tracer.build_with_context(builder.with_links(vec![Link::with_context(request)]), &root);
        return root.with_span(span);
    }
    let span = tracer.build_with_context(builder, parent);
    // A span that neither records nor carries a valid context (nothing
    // installed: the no-op tracer under no request span) is the empty
    // context's own: no context built around it (two more allocations).
    if !span.is_recording() && !span.span_context().is_valid() {
        return Context::new();
    }
    parent.with_span(span)
}

/// Emits the phase spans (children of the setup span in `cx`; or events on
/// it), sets the setup span's attributes, records the metrics and returns
/// the setup report, with the `tcp.connect` phase's end when it waits for
/// the kernel. Does not end the setup span.
pub(crate) fn emit_phases(
    inner: &Inner,
    attempt: &ConnectAttempt,
    cx: &Context,
    ending: &Ending<'_>,
    end: Instant,
) -> (ConnectionSetup, Option<TcpSpanEnd>) {
    // The hooks are done with the attempt: its phases move here (a DNS
    // phase's name and address lists are not copied).
    let mut phases = std::mem::take(&mut *attempt.phases());
    let setup_span = cx.span();
    // A setup span that does not record (nothing installed, or a sampler
    // that dropped it): its phase spans, events and attributes would be
    // built for no one, so only the report and the metrics are.
    let recording = setup_span.is_recording();
    let tracer = recording.then(|| inner.tracer());
    let (failure, facts, peer) = match ending {
        Ending::Ready(_) => (Failure::default(), FailureFacts::default(), &Peer::Unknown),
        Ending::Failed {
            error_type,
            message,
            facts,
            peer,
        } => (
            Failure {
                error_type: Some(*error_type),
                message: Some(message.clone()),
            },
            *facts,
            peer,
        ),
    };
    let refusal = facts.refusal;
    let established = match ending {
        Ending::Ready(e) => Some(*e),
        Ending::Failed { .. } => None,
    };
    let remote = established.and_then(|e| e.remote).or(match peer {
        Peer::Named(addr) => Some(*addr),
        _ => None,
    });
    let scope = PhaseScope {
        inner,
        tracer: tracer.as_deref(),
        setup: cx,
        attempt,
        phases: &phases,
        established,
        failure: &failure,
        end,
    };

    // DNS
    let dns = emit_dns_phase(&scope);
    let tcp_start = dns.map_or(attempt.started, |d| d.end);
    // A ready connect of a request through our middleware: its span ends
    // once that request's fate is known, with the reason then known
    // (`request::state::finish_setup`). Any other ends now.
    let ends_with_trigger = established.is_some() && attempt.trigger.is_some();
    if let Some(miss) = attempt
        .miss
        .as_ref()
        .map(|m| m.get())
        .filter(|m| recording && !m.untracked && !ends_with_trigger)
    {
        setup_span.set_attribute(KeyValue::new(
            semconv::HTTP_CONNECTION_MISS_REASON,
            miss.reason.as_str(),
        ));
    }
    let local_transport = established.is_some_and(|e| e.local_transport());
    // The proxy, from what this connect did: where its socket went, what
    // it resolved, reqwest's mark, the tunnel's error (see `proxy`).
    let route = (!local_transport)
        .then(|| {
            Evidence {
                target: attempt.trigger.as_ref().map(|t| &t.host),
                resolved: phases
                    .dns
                    .as_ref()
                    .map(|d| (d.name.as_str(), d.connect_order.as_slice())),
                peer: remote.or(facts.refused_at),
                forwarded: established.is_some_and(|e| e.proxied),
                tunnel_failed: facts.tunnel_failed,
            }
            .route(&attempt.proxies)
        })
        .flatten();
    let route = route.as_ref();
    let skipped = dns_skipped(attempt, &phases, local_transport, route);
    if let Some(reason) = skipped.filter(|_| recording) {
        setup_span.set_attribute(KeyValue::new(semconv::HTTP_CONNECTION_DNS_SKIPPED, reason));
    }

    // TCP (then, through a CONNECT proxy, the tunnel: it starts where TCP
    // ends, see `tunnel_start`).
    let tunneled = route.is_some_and(|r| r.tunnel);
    // A proxy that answered the CONNECT (a refusal) was connected to: its
    // address, when known, is `tcp.connect`'s peer.
    let remote = remote.or_else(|| answering_proxy_address(&phases, route, refusal));
    let tunnel_start = tunnel_start(&phases, refusal, tcp_start, tunneled);
    // Kept for the connection's report only: nothing per connection otherwise.
    let tcp_facts = inner
        .on_request_end
        .is_some()
        .then(|| Arc::new(OnceLock::new()));
    let tcp = if dns.is_some_and(|d| d.failed) {
        TcpOutcome::default()
    } else {
        emit_tcp_phase(
            &scope,
            TcpPhase {
                start: tcp_start,
                tunnel_start,
                tunneled,
                local_transport,
                remote,
                peer,
                facts: tcp_facts.clone(),
            },
        )
    };

    // CONNECT tunnel through the proxy
    let tunnel_duration = tunnel_start.map(|start| {
        emit_tunnel_phase(
            &scope,
            &TunnelPhase {
                start,
                remote,
                route,
                refusal,
            },
        )
    });

    // TLS
    let tls = emit_tls_phase(&scope);

    // The setup span's own attributes.
    if recording {
        set_setup_attributes(
            &setup_span,
            &SetupAttributes {
                route,
                established,
                remote,
                address_fallback: tcp.address_fallback,
                tls_version: tls.version,
                tls_resumed: tls.resumed,
                failure: &failure,
            },
        );
    }

    let failed = established.is_none().then(|| failure.or_cancel().0);
    record_setup_metrics(
        inner,
        &SetupMetrics {
            attempt,
            phases: &phases,
            dns_duration: dns.map(|d| d.duration),
            failed,
            end,
            tls_version: tls.version,
            tls_resumed: tls.resumed,
            remote,
        },
    );

    let setup = ConnectionSetup {
        id: attempt.id,
        started: attempt.started,
        local_addr: established.and_then(|e| e.local),
        peer_addr: remote,
        dns: dns.map(|d| d.duration),
        dns_skipped: skipped,
        dns_answers: phases
            .dns
            .as_mut()
            .map(|d| std::mem::take(&mut d.answers))
            .unwrap_or_default(),
        tcp: tcp.duration,
        tls: tls.duration,
        total: end.saturating_duration_since(attempt.started),
        tls_version: tls.version,
        tls_resumed: tls.resumed,
        http2: established.is_some_and(|e| e.http2),
        proxied: route.is_some(),
        proxy_address: route.and_then(|r| r.host.clone()),
        proxy_port: route.and_then(|r| r.port),
        proxy_connect: tunnel_duration,
        address_fallback: tcp.address_known.then_some(tcp.address_fallback),
        tcp_facts,
    };
    (setup, tcp.pending)
}

/// The span context of the setup span in `cx`, for links and the registry.
pub(crate) fn span_context(cx: &Context) -> SpanContext {
    cx.span().span_context().clone()
}
