//! The request handler of the test server and its response body.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::{Frame, Incoming, SizeHint};

use super::records::RequestRecord;
use super::{HEADER_CONNECTION_ID, HEADER_REMOTE_PORT, HEADER_REQUEST_INDEX, Shared};

/// The body of a `/redirect/` answer: nginx's own for a 302 (110 bytes), so
/// a client that drops redirect bodies unread meets one, as with nginx.
const REDIRECT_BODY: &[u8] = b"<html>\r\n<head><title>302 Found</title></head>\r\n<body>\r\n<center><h1>302 Found</h1></center>\r\n</body>\r\n</html>\r\n";

/// Largest body `/bytes/<n>` serves (64 MiB); larger sizes get 400.
pub(super) const MAX_BYTES_ROUTE: usize = 64 << 20;
/// Most requests one `/gate/<name>/<n>` holds.
const MAX_GATE: usize = 100_000;
/// Request-activity bookkeeping of one connection, for the idle timeout.
#[derive(Debug)]
pub(crate) struct Activity {
    in_flight: AtomicUsize,
    last: std::sync::Mutex<Instant>,
}

impl Activity {
    pub(crate) fn new() -> Self {
        Self {
            in_flight: AtomicUsize::new(0),
            last: std::sync::Mutex::new(Instant::now()),
        }
    }

    fn touch(&self) {
        if let Ok(mut last) = self.last.lock() {
            *last = Instant::now();
        }
    }

    /// Resolves once no request has been in flight for `timeout`.
    pub(crate) async fn idle_for(&self, timeout: Duration) {
        loop {
            let last = self
                .last
                .lock()
                .map(|l| *l)
                .unwrap_or_else(|_| Instant::now());
            let deadline = last + timeout;
            if self.in_flight.load(Ordering::SeqCst) == 0 && Instant::now() >= deadline {
                return;
            }
            let wake = if Instant::now() >= deadline {
                Instant::now() + timeout.min(Duration::from_millis(10))
            } else {
                deadline
            };
            tokio::time::sleep_until(wake.into()).await;
        }
    }
}

/// Marks one request in flight until dropped (when the response body is done).
struct ActivityGuard(Arc<Activity>);

impl ActivityGuard {
    fn new(activity: Arc<Activity>) -> Self {
        activity.in_flight.fetch_add(1, Ordering::SeqCst);
        activity.touch();
        Self(activity)
    }
}

impl Drop for ActivityGuard {
    fn drop(&mut self) {
        self.0.touch();
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The test server's response body: fixed bytes, plus a guard that marks the
/// request finished when hyper drops the body.
pub(crate) struct LabBody {
    inner: Full<Bytes>,
    _guard: ActivityGuard,
}

impl hyper::body::Body for LabBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Per-connection context shared by all requests of one connection.
#[derive(Debug)]
pub(crate) struct ConnCtx {
    pub(crate) id: u64,
    pub(crate) peer: std::net::SocketAddr,
    pub(crate) tls_resumed: Option<bool>,
    pub(crate) requests: AtomicU64,
    pub(crate) activity: Arc<Activity>,
    /// Signalled (HTTP/2) when the request limit is reached: the connection
    /// task then sends GOAWAY.
    pub(crate) limit_reached: tokio::sync::Notify,
    /// Signalled (HTTP/1, the limit unannounced) when the request limit is
    /// reached: the connection task closes the socket once that response
    /// is written.
    pub(crate) limit_reached_unannounced: tokio::sync::Notify,
}

/// Response settings that do not depend on the request.
#[derive(Debug, Clone)]
pub(crate) struct ResponseConfig {
    pub(crate) body: Bytes,
    pub(crate) delay: Duration,
    /// Requests per connection before the server ends it.
    pub(crate) max_requests: Option<u64>,
    /// HTTP/1: the last response says `Connection: close` (else the
    /// server just closes after it).
    pub(crate) announce_limit: bool,
    /// Requests after this many on a connection are never answered.
    pub(crate) stall_after: Option<u64>,
    /// `Keep-Alive: timeout=N` on HTTP/1 responses.
    pub(crate) keep_alive_header: Option<u64>,
}

/// Handles one request: records it, applies delays, builds the body.
pub(crate) async fn handle(
    req: http::Request<Incoming>,
    conn: Arc<ConnCtx>,
    shared: Arc<Shared>,
    cfg: Arc<ResponseConfig>,
) -> Result<http::Response<LabBody>, Infallible> {
    let guard = ActivityGuard::new(conn.activity.clone());
    let received_at = Instant::now();
    let request_index = conn.requests.fetch_add(1, Ordering::SeqCst) + 1;
    let method = req.method().to_string();
    let version = req.version();
    let path = req
        .uri()
        .path_and_query()
        .map(|p| p.as_str().to_owned())
        .unwrap_or_else(|| "/".to_owned());
    let body_bytes = match req.into_body().collect().await {
        Ok(collected) => collected.to_bytes().len() as u64,
        Err(_) => 0,
    };
    shared.record_request(RequestRecord {
        connection_id: conn.id,
        peer: conn.peer,
        request_index,
        method,
        path: path.clone(),
        version,
        body_bytes,
        tls_resumed: conn.tls_resumed,
        received_at,
    });

    if cfg.stall_after.is_some_and(|n| request_index > n) {
        // A stalled peer: never answer (the connection stays open).
        std::future::pending::<()>().await;
    }
    let last = cfg.max_requests.is_some_and(|n| request_index >= n);
    if last && version == http::Version::HTTP_2 {
        conn.limit_reached.notify_one();
    } else if last && !cfg.announce_limit {
        conn.limit_reached_unannounced.notify_one();
    }
    let route = path.split('?').next().unwrap_or("/");
    let mut body = cfg.body.clone();
    let mut delay = cfg.delay;
    let mut status = http::StatusCode::OK;
    let mut location = None;
    if let Some(rest) = route.strip_prefix("/redirect/") {
        // `/redirect/HOST:PORT/PATH`: 302 to `SCHEME://HOST:PORT/PATH`.
        let (authority, next) = rest.split_once('/').unwrap_or((rest, ""));
        let scheme = if conn.tls_resumed.is_some() {
            "https"
        } else {
            "http"
        };
        match http::HeaderValue::try_from(format!("{scheme}://{authority}/{next}")) {
            Ok(v) if !authority.is_empty() => {
                status = http::StatusCode::FOUND;
                // As nginx answers: a short HTML body, sent with the head.
                body = Bytes::from_static(REDIRECT_BODY);
                location = Some(v);
            }
            _ => status = http::StatusCode::BAD_REQUEST,
        }
    } else if let Some(ms) = route.strip_prefix("/delay/") {
        match ms.parse::<u64>() {
            Ok(ms) => delay += Duration::from_millis(ms),
            Err(_) => status = http::StatusCode::BAD_REQUEST,
        }
    } else if let Some(gate) = route.strip_prefix("/gate/") {
        match gate.rsplit_once('/').map(|(_, n)| n.parse::<usize>()) {
            Some(Ok(n)) if (1..=MAX_GATE).contains(&n) => {
                if let Some(barrier) = shared.gate(route, n) {
                    barrier.wait().await;
                }
            }
            _ => status = http::StatusCode::BAD_REQUEST,
        }
    } else if let Some(n) = route.strip_prefix("/bytes/") {
        match n.parse::<usize>() {
            Ok(n) if n <= MAX_BYTES_ROUTE => body = Bytes::from(vec![b'x'; n]),
            // Larger bodies would be allocated whole: refuse them.
            _ => status = http::StatusCode::BAD_REQUEST,
        }
    }
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    let mut resp = http::Response::new(LabBody {
        inner: Full::new(body),
        _guard: guard,
    });
    *resp.status_mut() = status;
    let headers = resp.headers_mut();
    headers.insert(HEADER_CONNECTION_ID, conn.id.into());
    headers.insert(HEADER_REQUEST_INDEX, request_index.into());
    headers.insert(HEADER_REMOTE_PORT, conn.peer.port().into());
    headers.insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/plain"),
    );
    if let Some(location) = location {
        headers.insert(http::header::LOCATION, location);
    }
    if let Some(secs) = cfg.keep_alive_header
        && version != http::Version::HTTP_2
        && let Ok(value) = http::HeaderValue::from_str(&format!("timeout={secs}"))
    {
        headers.insert(http::HeaderName::from_static("keep-alive"), value);
    }
    if last && version != http::Version::HTTP_2 && cfg.announce_limit {
        headers.insert(
            http::header::CONNECTION,
            http::HeaderValue::from_static("close"),
        );
    }
    Ok(resp)
}
