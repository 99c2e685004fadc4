//! Per-request and per-connection reports handed to [`OnRequestEnd`]: the
//! same facts the spans carry, as plain Rust values (what `conntrace probe`
//! prints its table from).

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll, Waker};

use crate::kernel::TcpFacts;
use std::time::{Duration, Instant};

/// A negotiated TLS protocol version (RFC 5246 / RFC 8446).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum TlsVersion {
    /// TLS 1.2 (RFC 5246): a full handshake costs 2 round trips.
    Tls12,
    /// TLS 1.3 (RFC 8446): a full handshake costs 1 round trip.
    Tls13,
}

impl TlsVersion {
    /// The `tls.protocol.version` value: `"1.2"` or `"1.3"`.
    pub fn as_str(self) -> &'static str {
        match self {
            TlsVersion::Tls12 => "1.2",
            TlsVersion::Tls13 => "1.3",
        }
    }
}

/// What one new connection cost, phase by phase. Durations are wall time
/// measured with a monotonic clock.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ConnectionSetup {
    /// Process-unique connection id (`http.connection.id`).
    pub id: u64,
    /// When the connector was called (start of the `http.connection_setup` span).
    pub started: Instant,
    /// The client's socket address.
    pub local_addr: Option<SocketAddr>,
    /// The peer's socket address (the proxy's when proxied).
    pub peer_addr: Option<SocketAddr>,
    /// DNS lookup time; `None` when DNS was skipped (see `dns_skipped`).
    pub dns: Option<Duration>,
    /// Why DNS was skipped: `"ip_literal"` or `"override"`.
    pub dns_skipped: Option<&'static str>,
    /// Addresses the resolver returned, in its order.
    pub dns_answers: Vec<SocketAddr>,
    /// TCP connect time: DNS answer (or connect start) to TLS start (or ready).
    pub tcp: Duration,
    /// TLS handshake time; `None` for plain HTTP.
    pub tls: Option<Duration>,
    /// Connect call to connection ready.
    pub total: Duration,
    /// Negotiated TLS version, when known.
    pub tls_version: Option<TlsVersion>,
    /// Whether the TLS session was resumed; `None` for plain HTTP.
    pub tls_resumed: Option<bool>,
    /// HTTP/2 was negotiated via ALPN.
    pub http2: bool,
    /// The connection goes through an HTTP proxy.
    pub proxied: bool,
    /// CONNECT round trip through the proxy (`proxy.connect` span); `None`
    /// when not tunneled.
    pub proxy_connect: Option<Duration>,
    /// Whether the address that connected was not the first one tried
    /// (`http.connection.address_fallback`); `None` when the connector's
    /// address list is unknown (DNS skipped: an IP literal or a reqwest
    /// `resolve` override; a proxy; a failed connect).
    pub address_fallback: Option<bool>,
    /// Filled when the kernel answers (see [`tcp_facts`](Self::tcp_facts));
    /// `None` when no report wants them (nothing kept per connection).
    pub(crate) tcp_facts: Option<Arc<OnceLock<TcpFacts>>>,
}

#[cfg(test)]
impl ConnectionSetup {
    /// A plain HTTP/1.1 connection `id` to an IP literal, started at
    /// `started`, with no phases, addresses or kernel facts (unit tests).
    pub(crate) fn for_test(id: u64, started: Instant) -> Self {
        Self {
            id,
            started,
            local_addr: None,
            peer_addr: None,
            dns: None,
            dns_skipped: None,
            dns_answers: Vec::new(),
            tcp: Duration::ZERO,
            tls: None,
            total: Duration::ZERO,
            tls_version: None,
            tls_resumed: None,
            http2: false,
            proxied: false,
            proxy_connect: None,
            address_fallback: None,
            tcp_facts: None,
        }
    }
}

impl ConnectionSetup {
    /// The kernel's view of the socket right after the connection became
    /// ready (Linux sock_diag; the same values as the `tcp.connect` span's
    /// `http.connection.tcp.*` attributes). `None` where the kernel view is
    /// unavailable, or until the kernel has answered (within milliseconds of
    /// the connect).
    pub fn tcp_facts(&self) -> Option<&TcpFacts> {
        self.tcp_facts.as_ref().and_then(|f| f.get())
    }
}

/// How a request got its connection: the pool attribution.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ConnectionUse {
    /// The serving connection's id.
    pub id: u64,
    /// Pool hit: the connection was ready before the request started.
    pub reused: bool,
    /// Time the request waited for a connection (0 on an idle hit; 0, not
    /// measured, on a failed request).
    pub wait: Duration,
    /// Requests this connection has carried, this one included (a failed
    /// request: the responses it carried before, this one not included).
    pub request_count: u64,
    /// Connection ready to request start (0 if it became ready later).
    pub age: Duration,
    /// Idle time in the pool before this request (hits on an idle connection only).
    pub idle: Option<Duration>,
    /// This request's own pool miss started the connect that served it.
    pub paid_by_this_request: bool,
    /// Why the request was not an idle hit (`http.connection.miss_reason`);
    /// `None` on an idle hit, and on a failed request. The reason known
    /// when the request ended: a miss whose reason waits for the kernel's
    /// view of the previous connection (a second look up to 75 ms after its
    /// release, or 250 ms for a response in flight on a closed candidate)
    /// may not be decided yet, and this holds the reason it falls back to;
    /// [`settled_miss_reason`](Self::settled_miss_reason) waits for the
    /// one the request span records.
    pub miss_reason: Option<crate::MissReason>,
    /// The serving connection's setup.
    pub setup: Arc<ConnectionSetup>,
    /// The miss still being decided when the request ended.
    pub(crate) settling: Option<Arc<dyn SettlingMiss>>,
}

/// A miss decided after its request's end (implemented by the request
/// side over the pool model's shared slot).
pub(crate) trait SettlingMiss: Send + Sync {
    /// The reason, if decided.
    fn reason_now(&self) -> Option<crate::MissReason>;
    /// Runs `then` with the reason once decided (at once if it is).
    fn when_settled(&self, then: Box<dyn FnOnce(crate::MissReason) + Send>);
}

impl std::fmt::Debug for dyn SettlingMiss {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SettlingMiss")
            .field("reason_now", &self.reason_now())
            .finish()
    }
}

impl ConnectionUse {
    /// The miss reason the request span records (`http.connection.miss_reason`):
    /// [`miss_reason`](Self::miss_reason) once the kernel's answer it may
    /// wait for has come. Ready at once for an idle hit, a failed request
    /// and a miss decided by the request's end; otherwise when the kernel
    /// view answers (within about 250 ms; a lookup queued for more than 1 s
    /// is given up, and the fallback is the answer). Never waits on the
    /// request's own path: await it after the request, e.g. in a tool that
    /// collects reports.
    pub fn settled_miss_reason(&self) -> SettledMissReason {
        let shared = Arc::new(Mutex::new(Settled {
            reason: None,
            waker: None,
        }));
        if let Some(settling) = &self.settling {
            let answer = shared.clone();
            settling.when_settled(Box::new(move |reason| {
                let waker = {
                    let mut settled = answer.lock().unwrap_or_else(|e| e.into_inner());
                    settled.reason = Some(reason);
                    settled.waker.take()
                };
                if let Some(waker) = waker {
                    waker.wake();
                }
            }));
        }
        SettledMissReason {
            fallback: self.miss_reason,
            waiting: self.settling.is_some(),
            shared,
        }
    }
}

/// What [`SettledMissReason`] waits on.
#[derive(Debug)]
struct Settled {
    reason: Option<crate::MissReason>,
    waker: Option<Waker>,
}

/// The future [`ConnectionUse::settled_miss_reason`] returns: the miss
/// reason the request span records (`None` on an idle hit or a failed
/// request).
#[derive(Debug)]
#[must_use = "a future does nothing unless awaited"]
pub struct SettledMissReason {
    fallback: Option<crate::MissReason>,
    waiting: bool,
    shared: Arc<Mutex<Settled>>,
}

impl Future for SettledMissReason {
    type Output = Option<crate::MissReason>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        if !self.waiting {
            return Poll::Ready(self.fallback);
        }
        let mut settled = self.shared.lock().unwrap_or_else(|e| e.into_inner());
        match settled.reason {
            Some(reason) => Poll::Ready(Some(reason)),
            None => {
                settled.waker = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}

/// Everything known about one finished request. Handed to
/// [`OnRequestEnd::on_request_end`] when the response body was read to the
/// end or dropped, or when the request failed or was cancelled.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RequestReport {
    /// The HTTP method.
    pub method: http::Method,
    /// `url.full`, redacted.
    pub url: String,
    /// When the middleware saw the request.
    pub started: Instant,
    /// Response status; `None` when the request failed.
    pub status: Option<u16>,
    /// `error.type` when the request failed (or the status was 4xx/5xx).
    pub error_type: Option<String>,
    /// Request start to response headers.
    pub time_to_first_byte: Option<Duration>,
    /// Request start to end of body (or failure, or cancellation).
    pub total: Duration,
    /// Response body bytes the caller read.
    pub body_size: u64,
    /// The body was read to its end (false: dropped early, failed, or cancelled).
    pub body_complete: bool,
    /// Which connection served it and how; `None` when the connection is
    /// unknown to this handle, or the request failed before it had one
    /// (refused connect, failed TLS handshake, ...).
    ///
    /// A request that failed on a connection (reset, HTTP/2 GOAWAY or
    /// error, timeout: `status` is `None`) carries the connection its span
    /// names (`http.connection.id`, `reused`, `idle_time`): the one its own
    /// connect made, else the HTTP/2 connection it was multiplexed onto,
    /// else the host's most recently released idle HTTP/1.1 connection. It
    /// served no response, so there [`ConnectionUse::wait`] is zero (not
    /// measured), [`ConnectionUse::request_count`] counts the responses
    /// the connection had carried before (not this request), and
    /// [`ConnectionUse::miss_reason`] is `None`.
    pub connection: Option<ConnectionUse>,
    /// `http.request.resend_count`: redirect hops sent before this one for
    /// the same call (0 for the first request). Each hop is a request with
    /// its own report.
    pub resend_count: u32,
    /// `network.protocol.version` of the response (`"1.1"`, `"2"`); `None`
    /// when the request failed before a response.
    pub protocol_version: Option<&'static str>,
}

/// Called once per request when it ends. Implemented for closures
/// `Fn(&RequestReport)`; [`DefaultOnRequestEnd`] does nothing.
///
/// Runs on the task that finished the request: keep it short and never block.
pub trait OnRequestEnd: Send + Sync + 'static {
    /// Receives the finished request's report.
    fn on_request_end(&self, report: &RequestReport);
}

/// The default [`OnRequestEnd`]: does nothing.
#[derive(Debug, Clone, Copy, Default)]
pub struct DefaultOnRequestEnd;

impl OnRequestEnd for DefaultOnRequestEnd {
    fn on_request_end(&self, _report: &RequestReport) {}
}

impl<F> OnRequestEnd for F
where
    F: Fn(&RequestReport) + Send + Sync + 'static,
{
    fn on_request_end(&self, report: &RequestReport) {
        self(report)
    }
}
