//! The `http.connection_setup` span's own attributes once its phases are
//! emitted: the proxy, the peer and local addresses, the protocol, the
//! address fallback, TLS; or, for a failed connect, its error and outcome.

use std::net::SocketAddr;

use opentelemetry::KeyValue;
use opentelemetry::trace::{SpanRef, Status};

use crate::connect::attributes::{network_type, peer_attributes, proxy_attributes};
use crate::connect::outcome::{Established, Failure};
use crate::connect::proxy::ProxyRoute;
use crate::export::report::TlsVersion;
use crate::semconv;

/// What the setup span's own attributes are set from.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SetupAttributes<'a> {
    /// The proxy the connect went through.
    pub(crate) route: Option<&'a ProxyRoute>,
    /// reqwest's facts about the connection, when the connect was ready.
    pub(crate) established: Option<&'a Established>,
    /// The peer of a failed connect, when named (by the kernel, the only
    /// candidate, or the refusing proxy).
    pub(crate) remote: Option<SocketAddr>,
    /// The winner was not the first address tried.
    pub(crate) address_fallback: bool,
    /// The negotiated TLS version, when known.
    pub(crate) tls_version: Option<TlsVersion>,
    /// Whether a ready connect's handshake resumed a session.
    pub(crate) tls_resumed: Option<bool>,
    /// The error a failed connect ended with.
    pub(crate) failure: &'a Failure,
}

/// Sets the setup span's own attributes (and a failed connect's error
/// status) on `span`, in this order: proxy, then for a ready connect peer,
/// local address, protocol version, proxied, fallback, TLS; for a failed
/// one proxied, peer, fallback, error type and outcome.
pub(crate) fn set_setup_attributes(span: &SpanRef<'_>, a: &SetupAttributes<'_>) {
    for kv in a.route.into_iter().flat_map(proxy_attributes) {
        span.set_attribute(kv);
    }
    if let Some(e) = a.established {
        if let Some(r) = e.remote {
            for kv in peer_attributes(&r) {
                span.set_attribute(kv);
            }
            span.set_attribute(KeyValue::new(semconv::NETWORK_TYPE, network_type(&r)));
        }
        if let Some(l) = e.local {
            span.set_attribute(KeyValue::new(
                semconv::NETWORK_LOCAL_ADDRESS,
                l.ip().to_string(),
            ));
            span.set_attribute(KeyValue::new(
                semconv::NETWORK_LOCAL_PORT,
                i64::from(l.port()),
            ));
        }
        span.set_attribute(KeyValue::new(
            semconv::NETWORK_PROTOCOL_VERSION,
            if e.http2 { "2" } else { "1.1" },
        ));
        if a.route.is_some() {
            span.set_attribute(KeyValue::new(semconv::HTTP_CONNECTION_PROXIED, true));
        }
        if a.address_fallback {
            span.set_attribute(KeyValue::new(
                semconv::HTTP_CONNECTION_ADDRESS_FALLBACK,
                true,
            ));
        }
        if let Some(v) = a.tls_version {
            span.set_attribute(KeyValue::new(semconv::TLS_PROTOCOL_VERSION, v.as_str()));
        }
        if let Some(r) = a.tls_resumed {
            span.set_attribute(KeyValue::new(semconv::TLS_RESUMED, r));
        }
    } else {
        if a.route.is_some() {
            span.set_attribute(KeyValue::new(semconv::HTTP_CONNECTION_PROXIED, true));
        }
        // Named from the kernel or the only candidate (see `peer`).
        if let Some(r) = a.remote {
            for kv in peer_attributes(&r) {
                span.set_attribute(kv);
            }
            span.set_attribute(KeyValue::new(semconv::NETWORK_TYPE, network_type(&r)));
        }
        if a.address_fallback {
            span.set_attribute(KeyValue::new(
                semconv::HTTP_CONNECTION_ADDRESS_FALLBACK,
                true,
            ));
        }
        let (t, m) = a.failure.or_cancel();
        span.set_attribute(KeyValue::new(semconv::ERROR_TYPE, t));
        span.set_attribute(KeyValue::new(
            semconv::HTTP_CONNECTION_SETUP_OUTCOME,
            if t == semconv::ERROR_TYPE_CANCELLED {
                semconv::SETUP_OUTCOME_CANCELLED
            } else {
                semconv::SETUP_OUTCOME_FAILED
            },
        ));
        span.set_status(Status::error(m));
    }
}
