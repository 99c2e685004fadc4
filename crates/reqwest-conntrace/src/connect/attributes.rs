//! Attributes the phases, the setup span and the metrics of a connect
//! share: its peer, its network type, its proxy.

use std::net::SocketAddr;

use opentelemetry::KeyValue;

use crate::connect::proxy::ProxyRoute;
use crate::semconv;

/// `network.type` of `addr`: `ipv4` or `ipv6`.
pub(crate) fn network_type(addr: &SocketAddr) -> &'static str {
    if addr.is_ipv4() { "ipv4" } else { "ipv6" }
}

/// `network.peer.address` and `network.peer.port` of `peer`.
pub(crate) fn peer_attributes(peer: &SocketAddr) -> [KeyValue; 2] {
    [
        KeyValue::new(semconv::NETWORK_PEER_ADDRESS, peer.ip().to_string()),
        KeyValue::new(semconv::NETWORK_PEER_PORT, i64::from(peer.port())),
    ]
}

/// `http.connection.proxy.address` / `.port` of `route`, those known.
pub(crate) fn proxy_attributes(route: &ProxyRoute) -> impl Iterator<Item = KeyValue> {
    let host = route
        .host
        .clone()
        .map(|h| KeyValue::new(semconv::HTTP_CONNECTION_PROXY_ADDRESS, h));
    let port = route
        .port
        .map(|p| KeyValue::new(semconv::HTTP_CONNECTION_PROXY_PORT, i64::from(p)));
    host.into_iter().chain(port)
}
