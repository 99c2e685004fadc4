//! The metrics of one finished connect: `http.client.connection.setup.duration`,
//! `dns.lookup.duration` and `http.client.connections.opened`.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use opentelemetry::KeyValue;

use crate::connect::attempt::{ConnectAttempt, Phases};
use crate::connect::attributes::network_type;
use crate::export::report::TlsVersion;
use crate::handle::Inner;
use crate::semconv;

/// What the metrics of one finished connect are recorded from.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SetupMetrics<'a> {
    /// The connect (its start, its target).
    pub(crate) attempt: &'a ConnectAttempt,
    /// The boundaries its hooks recorded (its DNS phase).
    pub(crate) phases: &'a Phases,
    /// The DNS phase's duration, when it had one.
    pub(crate) dns_duration: Option<Duration>,
    /// The `error.type` of a failed connect (`None`: ready).
    pub(crate) failed: Option<&'static str>,
    /// When the connect ended (monotonic).
    pub(crate) end: Instant,
    /// The negotiated TLS version, when known.
    pub(crate) tls_version: Option<TlsVersion>,
    /// Whether a ready connect's handshake resumed a session.
    pub(crate) tls_resumed: Option<bool>,
    /// The peer, when known.
    pub(crate) remote: Option<SocketAddr>,
}

/// Records `http.client.connection.setup.duration` and
/// `dns.lookup.duration` (seconds) and `http.client.connections.opened`
/// (a ready connect) for one finished connect.
pub(crate) fn record_setup_metrics(inner: &Inner, m: &SetupMetrics<'_>) {
    let metrics = &inner.metrics;
    if let (Some(dns), Some(d)) = (&m.phases.dns, m.dns_duration) {
        let mut attributes = vec![KeyValue::new(semconv::DNS_QUESTION_NAME, dns.name.clone())];
        match (&dns.error, dns.answered) {
            (Some((error_type, _)), _) => {
                attributes.push(KeyValue::new(semconv::ERROR_TYPE, *error_type));
            }
            (None, None) => {
                attributes.push(KeyValue::new(
                    semconv::ERROR_TYPE,
                    m.failed.unwrap_or(semconv::ERROR_TYPE_CANCELLED),
                ));
            }
            (None, Some(_)) => {}
        }
        metrics.dns_duration.record(d.as_secs_f64(), &attributes);
    }
    // `http.client.connections.opened`'s attributes first: they are the
    // start of the setup duration's (an attribute set has no order).
    let mut attributes = Vec::with_capacity(7);
    if let Some(t) = &m.attempt.trigger {
        attributes.extend(t.host.attributes());
    }
    if let Some(r) = m.tls_resumed {
        attributes.push(KeyValue::new(semconv::TLS_RESUMED, r));
    }
    if m.failed.is_none() {
        metrics.connections_opened.add(1, &attributes);
    }
    if let Some(r) = m.remote {
        attributes.push(KeyValue::new(semconv::NETWORK_TYPE, network_type(&r)));
    }
    if let Some(v) = m.tls_version {
        attributes.push(KeyValue::new(semconv::TLS_PROTOCOL_VERSION, v.as_str()));
    }
    if let Some(error_type) = m.failed {
        attributes.push(KeyValue::new(semconv::ERROR_TYPE, error_type));
    }
    metrics.setup_duration.record(
        m.end
            .saturating_duration_since(m.attempt.started)
            .as_secs_f64(),
        &attributes,
    );
}
