//! The `http.connection_setup` span and its phase children, emitted with the
//! exact boundaries the hooks recorded.

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use opentelemetry::global::BoxedTracer;
use opentelemetry::trace::{
    Link, Span as _, SpanBuilder, SpanContext, SpanKind, Status, TraceContextExt, Tracer,
};
use opentelemetry::{Array, Context, KeyValue, StringValue, Value};

use crate::connect::address;
use crate::connect::attempt::{ConnectAttempt, DnsPhase, Phases};
use crate::connect::peer::Peer;
use crate::connect::proxy::{Evidence, ProxyRoute};
use crate::connect::tcp::TcpSpanEnd;
use crate::error::ProxyRefusal;
use crate::export::phases::{ConnectionPhases, PhaseRecord, SetupSpanEnd};
use crate::export::report::{ConnectionSetup, TlsVersion};
use crate::handle::Inner;
use crate::semconv;

/// Facts about a finished connect read from reqwest's `Connected`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Established {
    pub(crate) local: Option<SocketAddr>,
    pub(crate) remote: Option<SocketAddr>,
    pub(crate) http2: bool,
    pub(crate) proxied: bool,
}

impl Established {
    /// A connection with no socket addresses, not through a proxy: a local
    /// transport (reqwest's `unix_socket`: a Unix domain socket; a named
    /// pipe on Windows).
    pub(crate) fn local_transport(&self) -> bool {
        self.local.is_none() && self.remote.is_none() && !self.proxied
    }
}

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

/// `http.connection.proxy.address` / `.port` of `route`, those known.
fn proxy_attributes(route: &ProxyRoute) -> impl Iterator<Item = KeyValue> {
    let host = route
        .host
        .clone()
        .map(|h| KeyValue::new(semconv::HTTP_CONNECTION_PROXY_ADDRESS, h));
    let port = route
        .port
        .map(|p| KeyValue::new(semconv::HTTP_CONNECTION_PROXY_PORT, i64::from(p)));
    host.into_iter().chain(port)
}

/// What a failed connect's error showed (see `proxy`).
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct FailureFacts {
    /// The proxy refused the `CONNECT` (the error came from its answer).
    pub(crate) refusal: Option<ProxyRefusal>,
    /// hyper-util's `CONNECT` tunnel failed.
    pub(crate) tunnel_failed: bool,
    /// The address a refused TCP connect went to.
    pub(crate) refused_at: Option<SocketAddr>,
}

fn network_type(addr: &SocketAddr) -> &'static str {
    if addr.is_ipv4() { "ipv4" } else { "ipv6" }
}

/// `network.peer.address` and `network.peer.port` of `peer`.
fn peer_attributes(peer: &SocketAddr) -> [KeyValue; 2] {
    [
        KeyValue::new(semconv::NETWORK_PEER_ADDRESS, peer.ip().to_string()),
        KeyValue::new(semconv::NETWORK_PEER_PORT, i64::from(peer.port())),
    ]
}

fn dns_skipped(
    attempt: &ConnectAttempt,
    phases: &Phases,
    local_transport: bool,
    route: Option<&ProxyRoute>,
) -> Option<&'static str> {
    if phases.dns.is_some() {
        return None;
    }
    if local_transport {
        return Some(semconv::DNS_SKIPPED_LOCAL_TRANSPORT);
    }
    // Through a proxy the connector resolves the proxy's host, not the
    // target's (a proxy whose host nothing showed: not judged).
    let host = match route {
        Some(r) => r.host.as_deref()?,
        None => &attempt.trigger.as_ref()?.host.host,
    };
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    Some(if bare.parse::<std::net::IpAddr>().is_ok() {
        semconv::DNS_SKIPPED_IP_LITERAL
    } else {
        semconv::DNS_SKIPPED_OVERRIDE
    })
}

/// The `dns.lookup` phase of `dns` (under the setup span in `cx`), ended
/// at `dns_end`.
fn emit_dns_phase(
    inner: &Inner,
    tracer: &BoxedTracer,
    dns: &DnsPhase,
    cx: &Context,
    dns_end: Instant,
    failure_type: &Option<&'static str>,
    failure_message: &Option<String>,
) {
    let mut attrs = vec![
        KeyValue::new(semconv::DNS_QUESTION_NAME, dns.name.clone()),
        KeyValue::new(semconv::HTTP_CONNECTION_ADDRESS_ORDER, dns.order.as_str()),
    ];
    if !dns.answers.is_empty() {
        let answers: Vec<StringValue> = dns
            .answers
            .iter()
            .map(|a| StringValue::from(a.ip().to_string()))
            .collect();
        attrs.push(KeyValue::new(
            semconv::DNS_ANSWERS,
            Value::Array(Array::String(answers)),
        ));
    }
    let mut phase = PhaseRecord::start(
        tracer,
        inner.phases,
        cx,
        semconv::DNS_LOOKUP_SPAN,
        inner.clock.wall(dns.asked),
        attrs,
    );
    if let Some(began) = dns.began
        && began > dns.asked
    {
        phase.add_event(
            semconv::EVENT_DNS_LOOKUP_BEGAN,
            inner.clock.wall(began),
            vec![],
        );
    }
    if let Some((error_type, message)) = &dns.error {
        phase.fail(error_type, message);
    } else if dns.answered.is_none() {
        let (t, m) = failure_or_cancel(failure_type, failure_message);
        phase.fail(t, &m);
    }
    phase.end(inner.clock.wall(dns_end));
}

/// How a connect ended, for the phase that was running.
pub(crate) enum Ending<'a> {
    Ready(&'a Established),
    Failed {
        error_type: &'static str,
        message: String,
        /// What the error showed.
        facts: FailureFacts,
        /// The address TCP connected to, when the handshake after it failed.
        peer: Peer,
    },
}

/// Emits the phase spans (children of the setup span in `cx`) and returns the
/// setup report. Does not end the setup span.
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
    let (failure_type, failure_message, facts, peer) = match ending {
        Ending::Ready(_) => (None, None, FailureFacts::default(), &Peer::Unknown),
        Ending::Failed {
            error_type,
            message,
            facts,
            peer,
        } => (Some(*error_type), Some(message.clone()), *facts, peer),
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

    // DNS
    let mut tcp_start = attempt.started;
    let mut dns_duration = None;
    let mut dns_failed = false;
    if let Some(dns) = &phases.dns {
        let dns_end = dns.answered.unwrap_or(end);
        dns_failed = dns.error.is_some() || dns.answered.is_none();
        if let Some(tracer) = &tracer {
            emit_dns_phase(
                inner,
                tracer,
                dns,
                cx,
                dns_end,
                &failure_type,
                &failure_message,
            );
        }
        dns_duration = Some(dns_end.saturating_duration_since(dns.asked));
        tcp_start = dns_end;
    }
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

    // TCP (then, through a CONNECT proxy, the tunnel). The tunnel starts
    // with the poll before the one that began TLS (or, when the proxy
    // refused, before the one that read its answer): that poll completed the
    // TCP connect and sent the CONNECT request. When one poll did it all
    // (the answer was already there), it starts with that poll; and when
    // that poll began before the proxy's name was resolved (the poll before
    // was the lookup's), no earlier than the lookup's answer: TCP took no
    // time of its own there.
    let tunneled = route.is_some_and(|r| r.tunnel);
    // A proxy that answered the CONNECT (a refusal) was connected to: its
    // address when only one was possible (an IP literal, or its name's one
    // answer), as `tcp.connect`'s peer.
    let remote = remote.or_else(|| {
        refusal?;
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
    });
    let polls = match (phases.tls_started, refusal) {
        (Some(_), _) => [phases.tunnel_started, phases.tls_poll_started],
        (None, Some(_)) => [phases.previous_poll_started, phases.poll_started],
        (None, None) => [None, None],
    };
    let tunnel_start = polls
        .into_iter()
        .flatten()
        .find(|t| *t >= tcp_start)
        .or_else(|| polls.iter().any(Option::is_some).then_some(tcp_start))
        .filter(|_| tunneled);
    let tunnel_end = phases.tls_started.unwrap_or(end);
    let mut tcp_duration = std::time::Duration::ZERO;
    let mut address_fallback = false;
    let mut address_known = false;
    let mut tcp_pending = None;
    // Kept for the connection's report only: nothing per connection otherwise.
    let tcp_facts = inner
        .on_request_end
        .is_some()
        .then(|| Arc::new(OnceLock::new()));
    if !dns_failed {
        let tcp_end = tunnel_start.or(phases.tls_started).unwrap_or(end);
        tcp_duration = tcp_end.saturating_duration_since(tcp_start);
        let connect_order = phases
            .dns
            .as_ref()
            .map(|d| d.connect_order.as_slice())
            .filter(|order| !order.is_empty());
        let choice = match (connect_order, remote) {
            (Some(order), Some(r)) if !tunneled => {
                address::explain_choice(order, r, tcp_duration, attempt.connect_timeout)
            }
            _ => None,
        };
        if let Some(c) = &choice {
            address_known = true;
            address_fallback = c.index > 0;
        }
        // Only a connect that used its first address started its SYN clock
        // at the phase start.
        let syn_retransmits = if address_fallback {
            0
        } else {
            address::syn_retransmits_by_timing(tcp_duration)
        };
        let tcp_phase = match &tracer {
            Some(tracer) => {
                let mut attrs = vec![KeyValue::new(
                    semconv::NETWORK_TRANSPORT,
                    transport(local_transport),
                )];
                if let Some(r) = remote {
                    attrs.extend(peer_attributes(&r));
                    attrs.push(KeyValue::new(semconv::NETWORK_TYPE, network_type(&r)));
                }
                if let Peer::Ambiguous(candidates) = peer {
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
                if let Some(c) = &choice {
                    attrs.push(KeyValue::new(
                        semconv::HTTP_CONNECTION_ADDRESS_INDEX,
                        c.index as i64,
                    ));
                    attrs.push(KeyValue::new(
                        semconv::HTTP_CONNECTION_ADDRESS_FALLBACK,
                        address_fallback,
                    ));
                }
                let mut phase = PhaseRecord::start(
                    tracer,
                    inner.phases,
                    cx,
                    semconv::TCP_CONNECT_SPAN,
                    inner.clock.wall(tcp_start),
                    attrs,
                );
                if let Some(c) = &choice {
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
                                KeyValue::new(
                                    semconv::NETWORK_PEER_ADDRESS,
                                    skipped.addr.ip().to_string(),
                                ),
                                KeyValue::new(
                                    semconv::NETWORK_PEER_PORT,
                                    i64::from(skipped.addr.port()),
                                ),
                                KeyValue::new(
                                    semconv::HTTP_CONNECTION_ADDRESS_OUTCOME,
                                    skipped.outcome,
                                ),
                            ],
                        );
                    }
                }
                if phases.tls_started.is_none() && tunnel_start.is_none() && established.is_none() {
                    let (t, m) = failure_or_cancel(&failure_type, &failure_message);
                    phase.fail(t, &m);
                }
                phase
            }
            // No span: the kernel's facts, if asked for, only fill the report.
            None => PhaseRecord::Span(Context::new()),
        };
        let mut ending = TcpSpanEnd {
            phase: tcp_phase,
            start: inner.clock.wall(tcp_start),
            end: inner.clock.wall(tcp_end),
            syn_by_timing: syn_retransmits,
            facts: tcp_facts.clone(),
            setup_end: None,
            _pending: crate::export::pending::PendingEnd::new(),
        };
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
                    cx.clone(),
                    inner.clock.wall(end),
                )));
            }
            tcp_pending = Some(ending);
        } else {
            ending.finish(None);
        }
    }

    // CONNECT tunnel through the proxy
    let mut tunnel_duration = None;
    if let Some(start) = tunnel_start {
        if let Some(tracer) = &tracer {
            let mut attrs = Vec::new();
            if let Some(t) = &attempt.trigger {
                attrs.extend(crate::export::metrics::host_attributes(
                    &t.host.host,
                    t.host.port,
                ));
            }
            if let Some(r) = remote {
                attrs.extend(peer_attributes(&r));
            }
            attrs.extend(route.into_iter().flat_map(proxy_attributes));
            if let Some(status) = refusal.and_then(|r| r.status) {
                attrs.push(KeyValue::new(
                    semconv::HTTP_RESPONSE_STATUS_CODE,
                    i64::from(status),
                ));
            }
            let mut phase = PhaseRecord::start(
                tracer,
                inner.phases,
                cx,
                semconv::PROXY_CONNECT_SPAN,
                inner.clock.wall(start),
                attrs,
            );
            if phases.tls_started.is_none() {
                let (t, m) = failure_or_cancel(&failure_type, &failure_message);
                phase.fail(t, &m);
            }
            phase.end(inner.clock.wall(tunnel_end));
        }
        tunnel_duration = Some(tunnel_end.saturating_duration_since(start));
    }

    // TLS
    let mut tls_duration = None;
    let mut tls_resumed = None;
    let mut tls_version = phases.tls_version;
    if let Some(tls_start) = phases.tls_started {
        let resumed = phases.resumption_offered
            && phases.cert_verified.is_none()
            && phases.cert_verify_started.is_none();
        if established.is_some() {
            tls_resumed = Some(resumed);
            if tls_version.is_none() && resumed {
                // A resumed 1.2 session logs CLIENT_RANDOM (seen by the key
                // log hook); a resumed 1.3 one derives the handshake secret.
                tls_version = phases.server_hello.map(|_| TlsVersion::Tls13);
            }
        }
        if let Some(tracer) = &tracer {
            let sni = attempt
                .trigger
                .as_ref()
                .map(|t| t.host.host.to_string())
                .or_else(|| phases.dns.as_ref().map(|d| d.name.clone()));
            let mut attrs = vec![
                KeyValue::new(semconv::TLS_PROTOCOL_NAME, "tls"),
                KeyValue::new(
                    semconv::HTTP_CONNECTION_TLS_RESUMPTION_OFFERED,
                    phases.resumption_offered,
                ),
            ];
            if let Some(name) = &sni {
                attrs.push(KeyValue::new(semconv::SERVER_ADDRESS, name.clone()));
            }
            if phases.cert_verification_skipped {
                attrs.push(KeyValue::new(
                    semconv::HTTP_CONNECTION_TLS_VERIFICATION_SKIPPED,
                    true,
                ));
            }
            if let Some(e) = established {
                attrs.push(KeyValue::new(semconv::TLS_RESUMED, resumed));
                attrs.push(KeyValue::new(
                    semconv::TLS_NEXT_PROTOCOL,
                    if e.http2 { "h2" } else { "http/1.1" },
                ));
            }
            if let Some(v) = tls_version {
                attrs.push(KeyValue::new(semconv::TLS_PROTOCOL_VERSION, v.as_str()));
            }
            let mut phase = PhaseRecord::start(
                tracer,
                inner.phases,
                cx,
                semconv::TLS_HANDSHAKE_SPAN,
                inner.clock.wall(tls_start),
                attrs,
            );
            if let Some(t) = phases.server_hello {
                phase.add_event(semconv::EVENT_TLS_SERVER_HELLO, inner.clock.wall(t), vec![]);
            }
            match &phases.cert_verified {
                Some((_, None)) if phases.cert_verification_skipped => {}
                Some((t, None)) => phase.add_event(
                    semconv::EVENT_TLS_CERTIFICATE_VERIFIED,
                    inner.clock.wall(*t),
                    vec![],
                ),
                Some((t, Some(message))) => phase.add_event(
                    semconv::EVENT_TLS_CERTIFICATE_REJECTED,
                    inner.clock.wall(*t),
                    vec![
                        KeyValue::new(semconv::ERROR_TYPE, semconv::ERROR_TYPE_TLS_CERTIFICATE),
                        KeyValue::new(semconv::EXCEPTION_MESSAGE, message.clone()),
                    ],
                ),
                // A user's own rustls config: only the start of verification
                // is seen; the handshake's outcome tells the verifier's answer.
                None => match (phases.cert_verify_started, &failure_message) {
                    (Some(t), _) if established.is_some() => phase.add_event(
                        semconv::EVENT_TLS_CERTIFICATE_VERIFIED,
                        inner.clock.wall(t),
                        vec![],
                    ),
                    (Some(t), Some(message))
                        if failure_type == Some(semconv::ERROR_TYPE_TLS_CERTIFICATE) =>
                    {
                        phase.add_event(
                            semconv::EVENT_TLS_CERTIFICATE_REJECTED,
                            inner.clock.wall(t),
                            vec![
                                KeyValue::new(
                                    semconv::ERROR_TYPE,
                                    semconv::ERROR_TYPE_TLS_CERTIFICATE,
                                ),
                                KeyValue::new(semconv::EXCEPTION_MESSAGE, message.clone()),
                            ],
                        )
                    }
                    _ => {}
                },
            }
            if let Some(t) = phases.server_finished {
                phase.add_event(
                    semconv::EVENT_TLS_SERVER_FINISHED,
                    inner.clock.wall(t),
                    vec![],
                );
            }
            if established.is_none() {
                let (t, m) = failure_or_cancel(&failure_type, &failure_message);
                phase.fail(t, &m);
            }
            phase.end(inner.clock.wall(end));
        }
        tls_duration = Some(end.saturating_duration_since(tls_start));
    }

    // Setup span attributes.
    if recording {
        for kv in route.into_iter().flat_map(proxy_attributes) {
            setup_span.set_attribute(kv);
        }
        if let Some(e) = established {
            if let Some(r) = e.remote {
                for kv in peer_attributes(&r) {
                    setup_span.set_attribute(kv);
                }
                setup_span.set_attribute(KeyValue::new(semconv::NETWORK_TYPE, network_type(&r)));
            }
            if let Some(l) = e.local {
                setup_span.set_attribute(KeyValue::new(
                    semconv::NETWORK_LOCAL_ADDRESS,
                    l.ip().to_string(),
                ));
                setup_span.set_attribute(KeyValue::new(
                    semconv::NETWORK_LOCAL_PORT,
                    i64::from(l.port()),
                ));
            }
            setup_span.set_attribute(KeyValue::new(
                semconv::NETWORK_PROTOCOL_VERSION,
                if e.http2 { "2" } else { "1.1" },
            ));
            if route.is_some() {
                setup_span.set_attribute(KeyValue::new(semconv::HTTP_CONNECTION_PROXIED, true));
            }
            if address_fallback {
                setup_span.set_attribute(KeyValue::new(
                    semconv::HTTP_CONNECTION_ADDRESS_FALLBACK,
                    true,
                ));
            }
            if let Some(v) = tls_version {
                setup_span.set_attribute(KeyValue::new(semconv::TLS_PROTOCOL_VERSION, v.as_str()));
            }
            if let Some(r) = tls_resumed {
                setup_span.set_attribute(KeyValue::new(semconv::TLS_RESUMED, r));
            }
        } else {
            if route.is_some() {
                setup_span.set_attribute(KeyValue::new(semconv::HTTP_CONNECTION_PROXIED, true));
            }
            // Named from the kernel or the only candidate (see `peer`).
            if let Some(r) = remote {
                for kv in peer_attributes(&r) {
                    setup_span.set_attribute(kv);
                }
                setup_span.set_attribute(KeyValue::new(semconv::NETWORK_TYPE, network_type(&r)));
            }
            if address_fallback {
                setup_span.set_attribute(KeyValue::new(
                    semconv::HTTP_CONNECTION_ADDRESS_FALLBACK,
                    true,
                ));
            }
            let (t, m) = failure_or_cancel(&failure_type, &failure_message);
            setup_span.set_attribute(KeyValue::new(semconv::ERROR_TYPE, t));
            setup_span.set_attribute(KeyValue::new(
                semconv::HTTP_CONNECTION_SETUP_OUTCOME,
                if t == semconv::ERROR_TYPE_CANCELLED {
                    semconv::SETUP_OUTCOME_CANCELLED
                } else {
                    semconv::SETUP_OUTCOME_FAILED
                },
            ));
            setup_span.set_status(Status::error(m));
        }
    }

    let failed = established
        .is_none()
        .then(|| failure_or_cancel(&failure_type, &failure_message).0);
    record_metrics(
        inner,
        attempt,
        &phases,
        dns_duration,
        failed,
        end,
        tls_version,
        tls_resumed,
        remote,
    );

    let setup = ConnectionSetup {
        id: attempt.id,
        started: attempt.started,
        local_addr: established.and_then(|e| e.local),
        peer_addr: remote,
        dns: dns_duration,
        dns_skipped: skipped,
        dns_answers: phases
            .dns
            .as_mut()
            .map(|d| std::mem::take(&mut d.answers))
            .unwrap_or_default(),
        tcp: tcp_duration,
        tls: tls_duration,
        total: end.saturating_duration_since(attempt.started),
        tls_version,
        tls_resumed,
        http2: established.is_some_and(|e| e.http2),
        proxied: route.is_some(),
        proxy_address: route.and_then(|r| r.host.clone()),
        proxy_port: route.and_then(|r| r.port),
        proxy_connect: tunnel_duration,
        address_fallback: address_known.then_some(address_fallback),
        tcp_facts,
    };
    (setup, tcp_pending)
}

/// Records `http.client.connection.setup.duration`, `dns.lookup.duration`
/// and `http.client.connections.opened` for one finished connect.
#[allow(clippy::too_many_arguments)]
fn record_metrics(
    inner: &Inner,
    attempt: &ConnectAttempt,
    phases: &Phases,
    dns_duration: Option<std::time::Duration>,
    failed: Option<&'static str>,
    end: Instant,
    tls_version: Option<TlsVersion>,
    tls_resumed: Option<bool>,
    remote: Option<SocketAddr>,
) {
    let metrics = &inner.metrics;
    if let (Some(dns), Some(d)) = (&phases.dns, dns_duration) {
        let mut attributes = vec![KeyValue::new(semconv::DNS_QUESTION_NAME, dns.name.clone())];
        match (&dns.error, dns.answered) {
            (Some((error_type, _)), _) => {
                attributes.push(KeyValue::new(semconv::ERROR_TYPE, *error_type));
            }
            (None, None) => {
                attributes.push(KeyValue::new(
                    semconv::ERROR_TYPE,
                    failed.unwrap_or(semconv::ERROR_TYPE_CANCELLED),
                ));
            }
            (None, Some(_)) => {}
        }
        metrics.dns_duration.record(d.as_secs_f64(), &attributes);
    }
    // `http.client.connections.opened`'s attributes first: they are the
    // start of the setup duration's (an attribute set has no order).
    let mut attributes = Vec::with_capacity(7);
    if let Some(t) = &attempt.trigger {
        attributes.extend(t.host.attributes());
    }
    if let Some(r) = tls_resumed {
        attributes.push(KeyValue::new(semconv::TLS_RESUMED, r));
    }
    if failed.is_none() {
        metrics.connections_opened.add(1, &attributes);
    }
    if let Some(r) = remote {
        attributes.push(KeyValue::new(semconv::NETWORK_TYPE, network_type(&r)));
    }
    if let Some(v) = tls_version {
        attributes.push(KeyValue::new(semconv::TLS_PROTOCOL_VERSION, v.as_str()));
    }
    if let Some(error_type) = failed {
        attributes.push(KeyValue::new(semconv::ERROR_TYPE, error_type));
    }
    metrics.setup_duration.record(
        end.saturating_duration_since(attempt.started).as_secs_f64(),
        &attributes,
    );
}

fn failure_or_cancel(t: &Option<&'static str>, m: &Option<String>) -> (&'static str, String) {
    match (t, m) {
        (Some(t), Some(m)) => (t, m.clone()),
        (Some(t), None) => (t, (*t).to_owned()),
        _ => (
            semconv::ERROR_TYPE_CANCELLED,
            "connect abandoned before it finished".to_owned(),
        ),
    }
}

/// The span context of the setup span in `cx`, for links and the registry.
pub(crate) fn span_context(cx: &Context) -> SpanContext {
    cx.span().span_context().clone()
}
