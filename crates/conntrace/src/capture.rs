//! Ties each request's [`RequestReport`] (handed to the library's
//! `OnRequestEnd` callback) to the call that made it, through a tokio
//! task-local slot: the callback runs inside the polling of the request's
//! own future (response body end, failure or drop), where the slot is set.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use reqwest_conntrace::{OnRequestEnd, RequestReport};
use reqwest_middleware::ClientWithMiddleware;
use url::Url;

tokio::task_local! {
    /// Where the report of the request being polled goes.
    static SLOT: Arc<Mutex<Vec<RequestReport>>>;
}

/// The `OnRequestEnd` callback: adds the report to the slot of the call
/// being polled (one per physical request: a redirect hop has its own);
/// reports of requests made elsewhere are ignored.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct CaptureReports;

impl OnRequestEnd for CaptureReports {
    fn on_request_end(&self, report: &RequestReport) {
        let _ = SLOT.try_with(|slot| {
            if let Ok(mut s) = slot.lock() {
                s.push(report.clone());
            }
        });
    }
}

/// A response that arrived, body read to its end.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Fetched {
    /// HTTP status code.
    pub(crate) status: u16,
    /// Body bytes read.
    pub(crate) body_bytes: u64,
    /// HTTP version of the response: `1.0`, `1.1`, `2` or `3`.
    pub(crate) version: &'static str,
    /// A `400` whose body says plain HTTP was sent to a port that speaks
    /// TLS (see [`says_port_speaks_tls`]).
    pub(crate) port_speaks_tls: bool,
}

/// The `400` texts of servers that answer a plain HTTP request on their TLS
/// port instead of failing the handshake (nginx's `497` page, Apache
/// httpd's `mod_ssl`, Go's `net/http`).
const PLAIN_HTTP_TO_TLS_PORT: &[&str] = &[
    "The plain HTTP request was sent to HTTPS port",
    "speaking plain HTTP to an SSL-enabled server port",
    "Client sent an HTTP request to an HTTPS server",
];

/// Whether a response with `status` and `body` is a server saying that
/// the plain HTTP request reached its TLS port (one of
/// [`PLAIN_HTTP_TO_TLS_PORT`], in the body's first 4 KiB).
fn says_port_speaks_tls(status: u16, body: &[u8]) -> bool {
    if status != 400 {
        return false;
    }
    let head = String::from_utf8_lossy(&body[..body.len().min(4096)]);
    PLAIN_HTTP_TO_TLS_PORT.iter().any(|t| head.contains(t))
}

/// What one GET produced.
#[derive(Debug)]
pub(crate) struct Outcome {
    /// When the call started.
    pub(crate) started: Instant,
    /// Call start to body end (or failure), measured here.
    pub(crate) elapsed: Duration,
    /// The response, or why there was none.
    pub(crate) result: Result<Fetched, reqwest_middleware::Error>,
    /// The library's report of the request that gave the result (the last
    /// hop of a redirect chain; `None` only if it never ended inside this
    /// call, which the library does not do).
    pub(crate) report: Option<RequestReport>,
    /// The reports of the redirect hops before it, in order.
    pub(crate) hops: Vec<RequestReport>,
}

/// Sends `GET url` through `client`, reads the body to its end and returns
/// the outcome together with the library's report of it.
pub(crate) async fn get(client: &ClientWithMiddleware, url: &Url) -> Outcome {
    let slot = Arc::new(Mutex::new(Vec::new()));
    let started = Instant::now();
    let result = SLOT
        .scope(slot.clone(), async {
            let response = client.get(url.clone()).send().await?;
            let status = response.status().as_u16();
            let version = match response.version() {
                reqwest::Version::HTTP_09 => "0.9",
                reqwest::Version::HTTP_10 => "1.0",
                reqwest::Version::HTTP_2 => "2",
                reqwest::Version::HTTP_3 => "3",
                _ => "1.1",
            };
            let body = response.bytes().await?;
            Ok(Fetched {
                status,
                body_bytes: body.len() as u64,
                version,
                port_speaks_tls: url.scheme() == "http" && says_port_speaks_tls(status, &body),
            })
        })
        .await;
    let elapsed = started.elapsed();
    let mut hops = slot
        .lock()
        .map(|mut s| std::mem::take(&mut *s))
        .unwrap_or_default();
    let report = hops.pop();
    Outcome {
        started,
        elapsed,
        result,
        report,
        hops,
    }
}

/// Replaces each report's miss reason with the one its request span
/// records: a miss still being decided when its request ended (the kernel
/// asked about the previous connection, or responses in flight on an HTTP/2
/// connection the server ended) is awaited here, after the call,
/// so the call itself never waits (see
/// `ConnectionUse::settled_miss_reason`; within about 250 ms, 1.25 s at
/// most).
pub(crate) async fn settle_reports(outcome: &mut Outcome) {
    for report in outcome.hops.iter_mut().chain(outcome.report.as_mut()) {
        if let Some(connection) = report.connection.as_mut() {
            connection.miss_reason = connection.settled_miss_reason().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::says_port_speaks_tls;

    #[test]
    fn a_400_saying_the_port_speaks_tls_is_told() {
        let nginx = b"<html>\r\n<head><title>400 The plain HTTP request was sent to HTTPS port</title></head>";
        assert!(says_port_speaks_tls(400, nginx));
        assert!(says_port_speaks_tls(
            400,
            b"Client sent an HTTP request to an HTTPS server.\n"
        ));
        assert!(!says_port_speaks_tls(200, nginx));
        assert!(!says_port_speaks_tls(400, b"<h1>Bad Request</h1>"));
    }
}
