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
    /// The connection goes through an HTTP proxy (judged from where its
    /// socket went, see `http.connection.proxied`).
    pub proxied: bool,
    /// The proxy's host (`http.connection.proxy.address`: as configured, a
    /// name or an IP literal; else the name resolved or the IP connected
    /// to); `None` when not proxied or not known.
    pub proxy_address: Option<String>,
    /// The proxy's port (`http.connection.proxy.port`).
    pub proxy_port: Option<u16>,
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
            proxy_address: None,
            proxy_port: None,
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
    /// Requests this connection has carried, this one included (as
    /// `http.connection.request_count`). A request that gave up on its
    /// response (timeout, dropped future) counts; one that failed
    /// otherwise (reset, HTTP/2 GOAWAY or error), or gave up before hyper
    /// wrote it (`http.connection.unsent`), does not: there, the requests
    /// the connection carried before.
    pub request_count: u64,
    /// Connection ready to request start (0 if it became ready later).
    pub age: Duration,
    /// Idle time in the pool before this request (hits on an idle connection only).
    pub idle: Option<Duration>,
    /// This request's own pool miss started the connect that served it.
    pub paid_by_this_request: bool,
    /// Why the request was not an idle hit (`http.connection.miss_reason`);
    /// `None` on an idle hit, and on a failed request that triggered no
    /// connect (one that did has its connect's miss). The reason known
    /// when the request ended: a miss decided later may not be decided
    /// yet, and this holds the reason it falls back to. Decided later are
    /// a miss that waits for the kernel's view of the previous connection
    /// (a second look up to 75 ms after its release, or 250 ms for a
    /// response in flight on a closed candidate), and one naming an HTTP/2
    /// connection the server ended while responses to the host were still
    /// on their way (up to 250 ms: they may date its GOAWAY at the request
    /// limit). [`settled_miss_reason`](Self::settled_miss_reason) waits for
    /// the one the request span records.
    pub miss_reason: Option<crate::MissReason>,
    /// The serving connection's setup.
    pub setup: Arc<ConnectionSetup>,
    /// The miss still being decided when the request ended: filled with
    /// the reason its span records.
    pub(crate) settling: Option<Arc<LateMissReason>>,
}

/// A request's miss reason decided after the request ended, as its span
/// records it (`None`: the span records none, the host untracked). Filled
/// once, by the [`DecidingMiss`] that records the span's reason; read by
/// [`ConnectionUse::settled_miss_reason`].
#[derive(Debug, Default)]
pub(crate) struct LateMissReason {
    state: Mutex<Late>,
}

/// What [`LateMissReason`] holds: the reason once decided, and the tasks
/// waiting for it until then.
#[derive(Debug, Default)]
struct Late {
    reason: Option<Option<crate::MissReason>>,
    wakers: Vec<Waker>,
}

impl LateMissReason {
    /// The reason, once decided.
    pub(crate) fn get(&self) -> Option<Option<crate::MissReason>> {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).reason
    }

    /// Decides the reason (the first call wins) and wakes its waiters.
    fn set(&self, reason: Option<crate::MissReason>) {
        let wakers = {
            let mut late = self.state.lock().unwrap_or_else(|e| e.into_inner());
            if late.reason.is_some() {
                return;
            }
            late.reason = Some(reason);
            std::mem::take(&mut late.wakers)
        };
        for waker in wakers {
            waker.wake();
        }
    }
}

/// The side of a [`LateMissReason`] that decides it: held by whatever
/// records the span's miss reason after the request ended (the kernel's
/// answer, the wait for responses in flight), and handed on from one to
/// the next. Dropped undecided (that answer or task lost, say with its
/// runtime), it decides the fallback the report already holds, so a
/// waiting [`SettledMissReason`] always ends.
#[derive(Debug)]
pub(crate) struct DecidingMiss {
    late: Arc<LateMissReason>,
    fallback: Option<crate::MissReason>,
}

impl DecidingMiss {
    /// A reason to decide later; `fallback` is the report's reason until
    /// then.
    pub(crate) fn new(fallback: Option<crate::MissReason>) -> Self {
        Self {
            late: Arc::default(),
            fallback,
        }
    }

    /// The side a report reads ([`ConnectionUse`]'s `settling`).
    pub(crate) fn late(&self) -> Arc<LateMissReason> {
        self.late.clone()
    }

    /// The reason the span recorded.
    pub(crate) fn decide(self, reason: Option<crate::MissReason>) {
        self.late.set(reason);
    }
}

impl Drop for DecidingMiss {
    fn drop(&mut self) {
        self.late.set(self.fallback);
    }
}

impl ConnectionUse {
    /// The miss reason the request span records (`http.connection.miss_reason`):
    /// [`miss_reason`](Self::miss_reason) once a miss decided after the
    /// request's end is decided. Ready at once for an idle hit, a failed
    /// request and a miss decided by the request's end; otherwise when the
    /// span's reason is recorded: the kernel's answer (within about 250 ms;
    /// a lookup queued for more than 1 s is given up, and the fallback is
    /// the answer), then, for an HTTP/2 connection the server ended, no
    /// response to the host left unattributed (at most 250 ms more). Never
    /// waits on the request's own path: await it after the request, e.g.
    /// in a tool that collects reports.
    pub fn settled_miss_reason(&self) -> SettledMissReason {
        SettledMissReason {
            fallback: self.miss_reason,
            late: self.settling.clone(),
        }
    }
}

/// The future [`ConnectionUse::settled_miss_reason`] returns: the miss
/// reason the request span records (`None` on an idle hit or a failed
/// request).
#[derive(Debug)]
#[must_use = "a future does nothing unless awaited"]
pub struct SettledMissReason {
    fallback: Option<crate::MissReason>,
    late: Option<Arc<LateMissReason>>,
}

impl Future for SettledMissReason {
    type Output = Option<crate::MissReason>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let Some(late) = &self.late else {
            return Poll::Ready(self.fallback);
        };
        let mut state = late.state.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(reason) = state.reason {
            return Poll::Ready(reason);
        }
        if !state.wakers.iter().any(|w| w.will_wake(cx.waker())) {
            state.wakers.push(cx.waker().clone());
        }
        Poll::Pending
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
    /// Response body bytes the caller read (`http.response.body.size`);
    /// `None` when no response arrived (refused connect, TLS handshake
    /// rejected, timed out before the headers): there was no body.
    pub body_size: Option<u64>,
    /// The body was read to its end (false: dropped early, failed, or cancelled).
    pub body_complete: bool,
    /// Which connection served it and how; `None` when the connection is
    /// unknown to this handle, or the request failed before it had one
    /// (refused connect, failed TLS handshake, ...): such a request's miss
    /// reason is in [`failed_miss_reason`](Self::failed_miss_reason).
    ///
    /// A request that failed on a connection (reset, HTTP/2 GOAWAY or
    /// error, timeout, future dropped: `status` is `None`) carries the connection its span
    /// names (`http.connection.id`, `reused`, `idle_time`): the one its own
    /// connect made, else the HTTP/2 connection it was multiplexed onto,
    /// else the host's most recently released idle HTTP/1.1 connection. It
    /// served no response, so there [`ConnectionUse::wait`] is zero (not
    /// measured), [`ConnectionUse::request_count`] counts this request
    /// only when it gave up on its response (see there), and
    /// [`ConnectionUse::miss_reason`] is its own miss's reason when it
    /// triggered a connect (as its span says), else `None`.
    pub connection: Option<ConnectionUse>,
    /// `http.request.resend_count`: physical requests sent before this one
    /// for the same call (0 for the first request): redirect hops, and
    /// attempts of a retry middleware placed before the
    /// [`ConnTraceMiddleware`](crate::ConnTraceMiddleware). Each hop and
    /// each attempt is a request with its own report.
    pub resend_count: u32,
    /// Connections this request's pool checkouts opened: 0 when a pooled
    /// connection served it, 1 when it paid for a new one; 2 or more mean a
    /// middleware placed after the
    /// [`ConnTraceMiddleware`](crate::ConnTraceMiddleware) (a retry) sent
    /// requests no report shows (`http.connection.connects` on the span).
    pub connects: u32,
    /// `network.protocol.version` of the response (`"1.1"`, `"2"`); `None`
    /// when the request failed before a response.
    pub protocol_version: Option<&'static str>,
    /// The setup of a connect this request triggered that failed or was
    /// abandoned (the last one): where it stopped and, through a proxy,
    /// which proxy ([`ConnectionSetup::proxy_address`]). `None` when no
    /// connect of its own failed.
    pub failed_connect: Option<Arc<ConnectionSetup>>,
    /// A request that missed the pool (triggered a connect) and failed
    /// before it had a connection to name ([`connection`](Self::connection)
    /// is `None`: its connect refused, its TLS handshake rejected, or it
    /// gave up while connecting): why it missed, as its span's
    /// `http.connection.miss_reason` says (counted in
    /// `http.client.pool.misses` with its `error.type`). The reason known
    /// when the request ended: one that waits for the kernel's view of
    /// the previous connection holds its fallback here. `None` otherwise
    /// (a request with a connection has it in
    /// [`ConnectionUse::miss_reason`]).
    pub failed_miss_reason: Option<crate::MissReason>,
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

#[cfg(test)]
mod tests {
    use std::task::{Context, Poll, Waker};

    use super::*;
    use crate::MissReason;

    fn usage(
        miss_reason: Option<MissReason>,
        settling: Option<Arc<LateMissReason>>,
    ) -> ConnectionUse {
        ConnectionUse {
            id: 7,
            reused: false,
            wait: Duration::ZERO,
            request_count: 1,
            age: Duration::ZERO,
            idle: None,
            paid_by_this_request: true,
            miss_reason,
            setup: Arc::new(ConnectionSetup::for_test(7, Instant::now())),
            settling,
        }
    }

    /// A report whose miss is still being decided: `miss_reason` holds the
    /// fallback, `settled_miss_reason()` is pending until the reason the
    /// span records is decided, then gives that one, also to a future
    /// asked later; a decided miss is ready at once.
    #[test]
    fn a_reports_settled_miss_reason_waits_for_the_spans() {
        let deciding = DecidingMiss::new(Some(MissReason::ClosedByPeer));
        let report = usage(Some(MissReason::ClosedByPeer), Some(deciding.late()));
        let mut settled = Box::pin(report.settled_miss_reason());
        let mut cx = Context::from_waker(Waker::noop());
        assert_eq!(settled.as_mut().poll(&mut cx), Poll::Pending);
        deciding.decide(Some(MissReason::RequestLimit));
        assert_eq!(
            settled.as_mut().poll(&mut cx),
            Poll::Ready(Some(MissReason::RequestLimit)),
            "the span's reason, not the fallback"
        );
        let mut again = Box::pin(report.settled_miss_reason());
        assert_eq!(
            again.as_mut().poll(&mut cx),
            Poll::Ready(Some(MissReason::RequestLimit))
        );
        let decided = usage(Some(MissReason::Cold), None);
        let mut now = Box::pin(decided.settled_miss_reason());
        assert_eq!(
            now.as_mut().poll(&mut cx),
            Poll::Ready(Some(MissReason::Cold))
        );
    }

    /// A decider dropped undecided (its kernel answer or task lost) decides
    /// the fallback: a waiting future ends; a later decision is ignored.
    #[test]
    fn a_lost_decider_gives_the_fallback() {
        let deciding = DecidingMiss::new(Some(MissReason::AllBusy));
        let late = deciding.late();
        let report = usage(Some(MissReason::AllBusy), Some(late.clone()));
        let mut settled = Box::pin(report.settled_miss_reason());
        let mut cx = Context::from_waker(Waker::noop());
        assert_eq!(settled.as_mut().poll(&mut cx), Poll::Pending);
        drop(deciding);
        assert_eq!(
            settled.as_mut().poll(&mut cx),
            Poll::Ready(Some(MissReason::AllBusy))
        );
        late.set(Some(MissReason::Cold));
        assert_eq!(late.get(), Some(Some(MissReason::AllBusy)), "first wins");
    }
}
