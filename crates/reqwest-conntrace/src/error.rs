//! Errors of this crate's own API, and the `error.type` classification of
//! the errors it observes.

use std::error::Error as StdError;
use std::io;
use std::net::SocketAddr;

use crate::semconv;

/// Why an instrumented client could not be built.
///
/// Returned by [`InstrumentedClientBuilder::build`](crate::InstrumentedClientBuilder::build).
/// Building is the only place this crate can fail; once a client exists,
/// instrumentation problems only ever reduce telemetry.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BuildError {
    /// A certificate or key given to [`TlsSettings`](crate::TlsSettings)
    /// could not be parsed (bad PEM, no certificate in the file).
    #[error("invalid certificate or key: {0}")]
    InvalidCertificate(String),
    /// rustls rejected the TLS settings (e.g. a minimum version above the
    /// maximum, or a client key that does not match its certificate).
    #[error("TLS configuration rejected: {0}")]
    Tls(#[from] rustls::Error),
    /// The certificate verifier could not be built (e.g. no usable roots).
    #[error("certificate verifier: {0}")]
    Verifier(String),
    /// A TLS option was set on reqwest's `ClientBuilder`, where the
    /// instrumented rustls configuration would silently replace it. Set it
    /// through [`TlsSettings`](crate::TlsSettings) instead.
    #[error(
        "the TLS option `{0}` was set on reqwest::ClientBuilder; set it through reqwest_conntrace::TlsSettings so it is not lost"
    )]
    TlsOptionOnReqwestBuilder(&'static str),
    /// The proxy URL given to
    /// [`InstrumentedClientBuilder::proxy`](crate::InstrumentedClientBuilder::proxy)
    /// is not an `http://host[:port]` URL (credentials redacted).
    #[error("invalid proxy URL `{0}`: expected http://host[:port]")]
    InvalidProxy(String),
    /// reqwest refused to build the client. The message is the error's
    /// chain through the crate's redaction (reqwest's own text may carry a
    /// URL with credentials); the error is kept for inspection and is not
    /// exposed as `source()`, so chain printers do not print it unredacted.
    #[error("reqwest: {}", crate::redact::UrlRedaction::standard().error_text(.0))]
    Reqwest(reqwest::Error),
}

impl From<reqwest::Error> for BuildError {
    fn from(err: reqwest::Error) -> Self {
        Self::Reqwest(err)
    }
}

/// The socket pair (local, remote) of the connection a request failed on,
/// as hyper-util attaches it to its error (`Error::connect_info`, whose
/// extras hold the connection's `HttpInfo`): present when the request had
/// a connection when it failed (a send error, or a request cancelled on a
/// connection that hyper-util did not resend: its last attempt's). `None`
/// for a failed connect, and for errors from elsewhere (a body, a
/// middleware).
pub(crate) fn failed_connection_pair(
    err: &(dyn StdError + 'static),
) -> Option<(SocketAddr, SocketAddr)> {
    use hyper_util::client::legacy::connect::HttpInfo;
    let mut current: Option<&(dyn StdError + 'static)> = Some(err);
    while let Some(e) = current {
        if let Some(connected) = e
            .downcast_ref::<hyper_util::client::legacy::Error>()
            .and_then(hyper_util::client::legacy::Error::connect_info)
        {
            let mut extensions = http::Extensions::new();
            connected.get_extras(&mut extensions);
            return extensions
                .get::<HttpInfo>()
                .map(|info| (info.local_addr(), info.remote_addr()));
        }
        current = e.source();
    }
    None
}

/// hyper's "dispatch task is gone" (`User::DispatchGone`, which hyper 1.x
/// exposes no predicate for; its `Display` is the description alone): the
/// connection's task ended while the request waited on it, a request of
/// an HTTP/2 connection that closed after a GOAWAY or an error.
fn is_dispatch_gone(error: &hyper::Error) -> bool {
    error.is_user() && error.to_string() == "dispatch task is gone"
}

/// Whether `err`'s chain holds hyper's word that the connection's task
/// ended under a request it had not sent or not answered (cancelled:
/// "connection closed", or "dispatch task is gone"): it says the
/// connection closed, not how (an HTTP/2 connection's graceful close
/// after a GOAWAY cancels its queued requests so).
pub(crate) fn closed_under_request(err: &(dyn StdError + 'static)) -> bool {
    let mut current: Option<&(dyn StdError + 'static)> = Some(err);
    while let Some(e) = current {
        if e.downcast_ref::<hyper::Error>()
            .is_some_and(|h| h.is_canceled() || is_dispatch_gone(h))
        {
            return true;
        }
        current = e.source();
    }
    false
}

/// Whether `err`'s chain holds the server's reset of the request's HTTP/2
/// stream (RST_STREAM received) after it took the stream in: any reason
/// but `REFUSED_STREAM`, which says the server processed nothing of it
/// (RFC 9113 section 8.7). The server saw such a request, and counted it.
pub(crate) fn stream_reset_by_server(err: &(dyn StdError + 'static)) -> bool {
    let mut current: Option<&(dyn StdError + 'static)> = Some(err);
    while let Some(e) = current {
        if let Some(h) = e.downcast_ref::<h2::Error>() {
            return h.is_reset() && h.is_remote() && h.reason() != Some(h2::Reason::REFUSED_STREAM);
        }
        current = e.source();
    }
    false
}

/// Whether the connection closed (the peer's FIN: hyper read the end of
/// the stream) before the response was complete: hyper's "connection
/// closed before message completed" in the chain, or, over TLS, an I/O
/// `UnexpectedEof` and no reset (rustls read the FIN with no close_notify
/// before it: hyper reports that I/O error instead). A reset is an I/O
/// `ConnectionReset` instead.
pub(crate) fn closed_before_response(err: &(dyn StdError + 'static)) -> bool {
    let mut current: Option<&(dyn StdError + 'static)> = Some(err);
    while let Some(e) = current {
        if e.downcast_ref::<hyper::Error>()
            .is_some_and(hyper::Error::is_incomplete_message)
        {
            return true;
        }
        current = e.source();
    }
    ends_with_eof(err)
}

/// Classifies an error chain into a low-cardinality `error.type` value (one
/// of the `semconv::ERROR_TYPE_*` constants), looking at every source in the
/// chain: I/O error kinds, rustls errors, and reqwest's own predicates.
pub(crate) fn classify(err: &(dyn StdError + 'static)) -> &'static str {
    let mut current: Option<&(dyn StdError + 'static)> = Some(err);
    let mut fallback = semconv::ERROR_TYPE_OTHER;
    while let Some(e) = current {
        if let Some(r) = e.downcast_ref::<reqwest::Error>()
            && r.is_timeout()
        {
            return semconv::ERROR_TYPE_TIMEOUT;
        }
        if let Some(r) = e.downcast_ref::<reqwest_middleware::Error>()
            && let reqwest_middleware::Error::Reqwest(r) = r
            && r.is_timeout()
        {
            return semconv::ERROR_TYPE_TIMEOUT;
        }
        if let Some(t) = e.downcast_ref::<rustls::Error>() {
            return match t {
                rustls::Error::InvalidCertificate(_) => semconv::ERROR_TYPE_TLS_CERTIFICATE,
                _ => semconv::ERROR_TYPE_TLS,
            };
        }
        if let Some(io) = e.downcast_ref::<io::Error>() {
            // rustls errors travel inside (nested) io::Errors from
            // tokio-rustls, and io::Error::source skips the wrapped error.
            if let Some(inner) = io.get_ref() {
                let inner: &(dyn StdError + 'static) = inner;
                let nested = classify(inner);
                if nested != semconv::ERROR_TYPE_OTHER {
                    return nested;
                }
            }
            match io.kind() {
                io::ErrorKind::TimedOut => return semconv::ERROR_TYPE_TIMEOUT,
                io::ErrorKind::ConnectionRefused => return semconv::ERROR_TYPE_CONNECTION_REFUSED,
                io::ErrorKind::ConnectionReset
                | io::ErrorKind::ConnectionAborted
                | io::ErrorKind::BrokenPipe
                | io::ErrorKind::UnexpectedEof => return semconv::ERROR_TYPE_CONNECTION_RESET,
                _ => {}
            }
        }
        // h2's I/O errors (its socket closed or reset under a stream: "stream
        // closed because of a broken pipe") are not its `source()`.
        if let Some(io) = e.downcast_ref::<h2::Error>().and_then(h2::Error::get_io) {
            let nested = classify(io);
            if nested != semconv::ERROR_TYPE_OTHER {
                return nested;
            }
        }
        // HTTP/2 (h2, under hyper): the server's GOAWAY, a reset stream, a
        // connection error. A GOAWAY h2 sent itself, on a protocol error it
        // detected (an HTTP/1.1 server answering prior knowledge with a
        // 400: "frame with invalid size"), is no GOAWAY of the server's.
        if let Some(h) = e.downcast_ref::<h2::Error>()
            && !h.is_io()
        {
            return if h.is_go_away() && h.is_remote() {
                semconv::ERROR_TYPE_HTTP2_GOAWAY
            } else if h.is_reset() {
                semconv::ERROR_TYPE_HTTP2_STREAM_RESET
            } else {
                semconv::ERROR_TYPE_HTTP2_ERROR
            };
        }
        // hyper: the connection closed under the request (a pooled
        // connection the server had just closed, mid-response EOF; its
        // dispatch task ended with the request queued or unanswered).
        if let Some(h) = e.downcast_ref::<hyper::Error>()
            && (h.is_incomplete_message()
                || h.is_closed()
                || h.is_canceled()
                || is_dispatch_gone(h))
        {
            return semconv::ERROR_TYPE_CONNECTION_RESET;
        }
        let text = e.to_string();
        if text.contains("dns error") || text.contains("failed to lookup address") {
            fallback = semconv::ERROR_TYPE_DNS;
        } else if fallback == semconv::ERROR_TYPE_OTHER
            && (text.contains("timed out") || text.contains("deadline has elapsed"))
        {
            fallback = semconv::ERROR_TYPE_TIMEOUT;
        }
        current = e.source();
    }
    fallback
}

/// Classifies an error that ended a response body (see [`classify`]),
/// telling the server's FIN from its RST: an I/O `UnexpectedEof` in the
/// chain (hyper's "IncompleteBody": the connection reached its end with
/// body bytes still owed; rustls's close without `close_notify`) is
/// `incomplete_body`, where [`classify`] says `connection_reset` for both.
pub(crate) fn classify_body(err: &(dyn StdError + 'static)) -> &'static str {
    let class = classify(err);
    if class == semconv::ERROR_TYPE_CONNECTION_RESET && ends_with_eof(err) {
        semconv::ERROR_TYPE_INCOMPLETE_BODY
    } else {
        class
    }
}

/// Whether `err`'s chain (through nested `io::Error`s) holds an I/O
/// `UnexpectedEof` and no reset.
fn ends_with_eof(err: &(dyn StdError + 'static)) -> bool {
    let mut current: Option<&(dyn StdError + 'static)> = Some(err);
    while let Some(e) = current {
        if let Some(io) = e.downcast_ref::<io::Error>() {
            match io.kind() {
                io::ErrorKind::UnexpectedEof => return true,
                io::ErrorKind::ConnectionReset
                | io::ErrorKind::ConnectionAborted
                | io::ErrorKind::BrokenPipe => return false,
                _ => {}
            }
            if let Some(inner) = io.get_ref() {
                let inner: &(dyn StdError + 'static) = inner;
                return ends_with_eof(inner);
            }
        }
        current = e.source();
    }
    false
}

/// The full text of an error and its sources, `": "`-joined and redacted
/// with `redaction` (reqwest errors rebuilt from their redacted URL), for
/// `exception.message` and span status descriptions.
pub(crate) fn error_chain_text(
    redaction: &crate::redact::UrlRedaction,
    err: &(dyn StdError + 'static),
) -> String {
    redaction.error_text(err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nested_io_errors_carrying_rustls_errors_are_tls_certificate_errors() {
        let rustls_err = rustls::Error::InvalidCertificate(rustls::CertificateError::BadSignature);
        let inner = io::Error::new(io::ErrorKind::InvalidData, rustls_err);
        let outer = io::Error::other(inner);
        assert_eq!(classify(&outer), semconv::ERROR_TYPE_TLS_CERTIFICATE);
    }

    /// hyper's word that a connection's task ended under a request (the
    /// task aborted with the request queued on it, as an HTTP/2
    /// connection's close after a GOAWAY ends it) is a connection closed
    /// under the request (`connection_reset`), and says so.
    #[tokio::test]
    async fn a_request_whose_connection_task_ended_is_closed_under_it() {
        let (io, _peer) = tokio::io::duplex(1024);
        let (mut sender, connection) =
            hyper::client::conn::http1::handshake::<_, String>(hyper_util::rt::TokioIo::new(io))
                .await
                .expect("handshake");
        let task = tokio::spawn(connection);
        let response = sender.send_request(http::Request::new(String::new()));
        task.abort();
        let _ = task.await;
        let error = response.await.expect_err("its connection's task ended");
        assert!(closed_under_request(&error), "{error:?}");
        assert_eq!(classify(&error), semconv::ERROR_TYPE_CONNECTION_RESET);
        let other = io::Error::other("no hyper error");
        assert!(!closed_under_request(&other));
    }

    #[test]
    fn http2_errors_are_classified_by_kind() {
        // A bare reason (no RST_STREAM / GOAWAY frame: h2's public
        // constructor) is a protocol error of the connection.
        let reason = h2::Error::from(h2::Reason::PROTOCOL_ERROR);
        assert_eq!(classify(&reason), semconv::ERROR_TYPE_HTTP2_ERROR);
        let wrapped = io::Error::other(h2::Error::from(h2::Reason::ENHANCE_YOUR_CALM));
        assert_eq!(classify(&wrapped), semconv::ERROR_TYPE_HTTP2_ERROR);
    }

    #[test]
    fn a_body_cut_by_fin_is_incomplete_and_by_rst_a_reset() {
        let fin = io::Error::new(io::ErrorKind::UnexpectedEof, "IncompleteBody");
        assert_eq!(classify_body(&fin), semconv::ERROR_TYPE_INCOMPLETE_BODY);
        assert_eq!(classify(&fin), semconv::ERROR_TYPE_CONNECTION_RESET);
        let rst = io::Error::other(io::Error::from(io::ErrorKind::ConnectionReset));
        assert_eq!(classify_body(&rst), semconv::ERROR_TYPE_CONNECTION_RESET);
        let timeout = io::Error::from(io::ErrorKind::TimedOut);
        assert_eq!(classify_body(&timeout), semconv::ERROR_TYPE_TIMEOUT);
    }

    /// Over TLS rustls reports the server's FIN without close_notify as an
    /// `UnexpectedEof` (wrapped by hyper): a close before the response,
    /// as hyper's incomplete message is over plain TCP; a reset is not.
    #[test]
    fn an_unexpected_eof_before_the_response_is_the_servers_close() {
        let fin = io::Error::other(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "peer closed connection without sending TLS close_notify",
        ));
        assert!(closed_before_response(&fin));
        let rst = io::Error::other(io::Error::from(io::ErrorKind::ConnectionReset));
        assert!(!closed_before_response(&rst));
    }

    #[test]
    fn refused_connections_are_classified() {
        let e = io::Error::from(io::ErrorKind::ConnectionRefused);
        assert_eq!(classify(&e), semconv::ERROR_TYPE_CONNECTION_REFUSED);
    }
}

/// How a proxy refused: the `error.type` and, when known, the status code
/// of its answer to `CONNECT`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ProxyRefusal {
    pub(crate) error_type: &'static str,
    pub(crate) status: Option<u16>,
}

/// Recognises hyper-util's tunnel errors in `err`'s chain (its
/// `TunnelError` is private; its `Debug` names the variant): `407` is
/// `proxy_auth_required` with that status; any other non-2xx answer is
/// `proxy_connect_refused` (hyper-util 0.1.21 keeps no status code for
/// it); an answer cut short or too large is `proxy_connect_failed`.
pub(crate) fn proxy_refusal(err: &(dyn StdError + 'static)) -> Option<ProxyRefusal> {
    let mut current = Some(err);
    while let Some(e) = current {
        let debug = format!("{e:?}");
        let found = |error_type, status| Some(ProxyRefusal { error_type, status });
        if debug.starts_with("ProxyAuthRequired") {
            return found(semconv::ERROR_TYPE_PROXY_AUTH_REQUIRED, Some(407));
        }
        if debug.starts_with("TunnelUnsuccessful") {
            return found(semconv::ERROR_TYPE_PROXY_CONNECT_REFUSED, None);
        }
        if debug.starts_with("TunnelUnexpectedEof") || debug.starts_with("ProxyHeadersTooLong") {
            return found(semconv::ERROR_TYPE_PROXY_CONNECT_FAILED, None);
        }
        current = e.source();
    }
    None
}

/// Whether `err`'s chain holds an error of hyper-util's `CONNECT` tunnel
/// (its `TunnelError`, private, always displayed as `tunnel error: ...`):
/// the connect went through a proxy, and failed connecting to it or on
/// its answer.
pub(crate) fn tunnel_failed(err: &(dyn StdError + 'static)) -> bool {
    let mut current = Some(err);
    while let Some(e) = current {
        if e.to_string().starts_with("tunnel error: ") {
            return true;
        }
        current = e.source();
    }
    false
}

/// The address a refused (or failed) TCP connect went to, from
/// hyper-util's `ConnectError` in `err`'s chain (private fields; its
/// `Debug` is `ConnectError("tcp connect error", ADDR, cause)`): the first
/// address hyper-util failed on.
pub(crate) fn connect_error_address(err: &(dyn StdError + 'static)) -> Option<SocketAddr> {
    let mut current = Some(err);
    while let Some(e) = current {
        let debug = format!("{e:?}");
        if let Some(rest) = debug.strip_prefix("ConnectError(\"") {
            return rest
                .split_once("\", ")?
                .1
                .split([',', ')'])
                .next()?
                .parse()
                .ok();
        }
        current = e.source();
    }
    None
}
