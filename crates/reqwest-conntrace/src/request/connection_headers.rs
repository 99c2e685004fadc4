//! What a response's headers say of its connection's future: a close
//! announced (`Connection: close`, HTTP/1.0 without keep-alive; RFC 9112
//! section 9.3) and the server's advertised idle timeout
//! (`Keep-Alive: timeout=N`, RFC 2068 section 19.7.1.1).

use std::time::Duration;

use opentelemetry::KeyValue;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use crate::export::clock::secs;
use crate::pool::record::ConnectionRecord;
use crate::semconv;

/// Whether an HTTP/1.x response says the server closes the connection after
/// it: `Connection: close` (RFC 9112 §9.6), or an HTTP/1.0 response without
/// `Connection: keep-alive` (RFC 9112 §9.3; hyper's client parser decides
/// keep-alive the same way, so hyper does not pool that connection).
pub(crate) fn server_closes(version: http::Version, headers: &http::HeaderMap) -> bool {
    let has = |name: &str| connection_token(headers, name);
    has("close") || (version < http::Version::HTTP_11 && !has("keep-alive"))
}

/// Whether the `Connection` header lists `token` (case-insensitive).
pub(crate) fn connection_token(headers: &http::HeaderMap, token: &str) -> bool {
    headers
        .get_all(http::header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| lists_token(v, token))
}

/// Whether the comma-separated header value `value` lists `token`
/// (case-insensitive), as a `Connection` header does (RFC 9110 §7.6.1).
pub(crate) fn lists_token(value: &str, token: &str) -> bool {
    value
        .split(',')
        .any(|t| t.trim().eq_ignore_ascii_case(token))
}

/// The `timeout` parameter of a `Keep-Alive` response header (RFC 2068
/// §19.7.1.1, e.g. `Keep-Alive: timeout=5, max=100`), in whole seconds.
pub(crate) fn keep_alive_timeout(headers: &http::HeaderMap) -> Option<Duration> {
    headers
        .get_all(http::HeaderName::from_static("keep-alive"))
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .find_map(|param| {
            let (name, value) = param.split_once('=')?;
            name.trim()
                .eq_ignore_ascii_case("timeout")
                .then(|| value.trim().trim_matches('"').parse::<u64>().ok())
                .flatten()
        })
        .map(Duration::from_secs)
}

/// Records the server's advertised keep-alive timeout on the connection and
/// the span; the first time a connection advertises one shorter than the
/// client's pool idle timeout, an event (and one WARN line per client).
pub(crate) fn record_server_keep_alive(
    span: &tracing::Span,
    record: &ConnectionRecord,
    headers: &http::HeaderMap,
) {
    let first = keep_alive_timeout(headers).map(|t| record.set_server_keep_alive(t));
    let Some(server) = record.server_keep_alive() else {
        return;
    };
    span.set_attribute(semconv::HTTP_CONNECTION_SERVER_KEEP_ALIVE, secs(server));
    let client = record.client.idle_timeout;
    // An idle timeout this crate could not read is not compared.
    if first != Some(true)
        || !record.client.idle_timeout_known
        || client.is_some_and(|c| c <= server)
    {
        return;
    }
    let client_secs = client.map_or(f64::INFINITY, secs);
    span.add_event(
        semconv::EVENT_KEEP_ALIVE_MISMATCH,
        vec![
            KeyValue::new(semconv::HTTP_CONNECTION_SERVER_KEEP_ALIVE, secs(server)),
            KeyValue::new(semconv::HTTP_CONNECTION_CLIENT_IDLE_TIMEOUT, client_secs),
        ],
    );
    if record.client.first_keep_alive_warning() {
        tracing::warn!(
            target: "reqwest_conntrace",
            "server keep-alive {:.3} s is shorter than the client's pool idle timeout {}: idle connections will be closed by the server first (closed_by_peer misses, connection_reset races); set pool_idle_timeout under {:.3} s",
            server.as_secs_f64(),
            client.map_or_else(
                || "inf s (pool_idle_timeout(None): kept forever)".to_owned(),
                |c| format!("{:.3} s", c.as_secs_f64()),
            ),
            server.as_secs_f64(),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> http::HeaderMap {
        let mut map = http::HeaderMap::new();
        for (k, v) in pairs {
            map.append(*k, http::HeaderValue::from_static(v));
        }
        map
    }

    #[test]
    fn connection_close_is_a_token_of_the_connection_header() {
        let closes = |pairs| server_closes(http::Version::HTTP_11, &headers(pairs));
        assert!(closes(&[("connection", "close")]));
        assert!(closes(&[("connection", "Upgrade, Close")]));
        assert!(!closes(&[("connection", "keep-alive")]));
        assert!(!closes(&[("x-connection", "close")]));
        assert!(!closes(&[]));
    }

    #[test]
    fn http10_closes_unless_it_says_keep_alive() {
        let closes = |pairs| server_closes(http::Version::HTTP_10, &headers(pairs));
        assert!(closes(&[]));
        assert!(closes(&[("connection", "close")]));
        assert!(!closes(&[("connection", "Keep-Alive")]));
        assert!(closes(&[("connection", "keep-alive, close")]));
    }

    #[test]
    fn keep_alive_timeout_is_read_from_its_parameter() {
        let t = |v| keep_alive_timeout(&headers(&[("keep-alive", v)]));
        assert_eq!(t("timeout=5, max=100"), Some(Duration::from_secs(5)));
        assert_eq!(t("max=100, Timeout=30"), Some(Duration::from_secs(30)));
        assert_eq!(t("max=100"), None);
        assert_eq!(t("timeout=soon"), None);
        assert_eq!(keep_alive_timeout(&headers(&[])), None);
    }
}
