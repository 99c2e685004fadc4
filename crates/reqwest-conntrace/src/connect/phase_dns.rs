//! The `dns.lookup` phase (the resolver call, its answers, when the lookup
//! really began), and why a connect that had none skipped it
//! (`http.connection.dns_skipped`).

use std::time::{Duration, Instant};

use opentelemetry::{Array, KeyValue, StringValue, Value};

use crate::connect::attempt::{ConnectAttempt, Phases};
use crate::connect::phase::PhaseScope;
use crate::connect::proxy::ProxyRoute;
use crate::export::phases::PhaseRecord;
use crate::semconv;

/// The DNS phase's timing, for the phases after it and the report.
#[derive(Debug, Clone, Copy)]
pub(crate) struct DnsTiming {
    /// When the phase ended: the resolver's answer, else the connect's end
    /// (monotonic). The TCP phase starts there.
    pub(crate) end: Instant,
    /// From the resolver call to `end`.
    pub(crate) duration: Duration,
    /// The lookup failed or never answered: no TCP phase follows.
    pub(crate) failed: bool,
}

/// Emits the `dns.lookup` phase (a child of the setup span, when it
/// records) of a connect that asked the resolver, and returns its timing;
/// `None` when it did not ask.
pub(crate) fn emit_dns_phase(scope: &PhaseScope<'_>) -> Option<DnsTiming> {
    let inner = scope.inner;
    let dns = scope.phases.dns.as_ref()?;
    let dns_end = dns.answered.unwrap_or(scope.end);
    let failed = dns.error.is_some() || dns.answered.is_none();
    if let Some(tracer) = scope.tracer {
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
            scope.setup,
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
            let (t, m) = scope.failure.or_cancel();
            phase.fail(t, &m);
        }
        phase.end(inner.clock.wall(dns_end));
    }
    Some(DnsTiming {
        end: dns_end,
        duration: dns_end.saturating_duration_since(dns.asked),
        failed,
    })
}

/// Why a connect had no DNS phase (`http.connection.dns_skipped`): a local
/// transport, an IP literal, or a resolver override; `None` when it had
/// one, or when the host it would have resolved is unknown.
pub(crate) fn dns_skipped(
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
