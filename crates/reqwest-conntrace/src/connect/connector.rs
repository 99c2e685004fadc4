//! The tower layer around reqwest's connector: one `http.connection_setup`
//! span per connect, phase spans from the hooks, and the connection's entry
//! in the registry.

use std::borrow::Borrow;
use std::error::Error as StdError;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use hyper_util::client::legacy::connect::{Connection, HttpInfo};
use pin_project_lite::pin_project;
use tower_layer::Layer;
use tower_service::Service;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use crate::connect::attempt::{AttemptScope, ConnectAttempt};
use crate::connect::outcome::{Ending, Established, FailureFacts};
use crate::connect::peer::{Peer, PeerLookup};
use crate::connect::proxy::ProxyRules;
use crate::connect::setup;
use crate::error::{
    classify, connect_error_address, error_chain_text, proxy_refusal, tunnel_failed,
};
use crate::handle::{ConnTrace, Inner};
use crate::pool::client::ClientState;
use crate::pool::record::ConnectionRecord;
use crate::request::pending_setup::PendingSetup;
use crate::request::state::{self as request};
use crate::semconv;

/// Tower layer for `reqwest::ClientBuilder::connector_layer`: wraps reqwest's
/// connector so that every new connection gets an `http.connection_setup`
/// span (child of the request whose pool miss triggered it) with
/// `dns.lookup`, `tcp.connect` and `tls.handshake` children.
///
/// Usually installed by [`ConnTrace::instrument_client`]; add it by hand only
/// together with [`TracedResolver`](crate::TracedResolver) and the TLS
/// configuration from [`TlsSettings`](crate::TlsSettings), or the phases
/// cannot be split.
///
/// One layer value stands for one client: its connections are told apart
/// from other clients' for the `cold` / `new_client` miss reasons. Build a
/// new layer per client.
#[derive(Clone, Debug)]
pub struct ConnectorLayer {
    trace: ConnTrace,
    client: Arc<ClientState>,
    connect_timeout: Option<Duration>,
    proxy: Arc<OnceLock<ProxyRules>>,
    http2_prior_knowledge: bool,
}

impl ConnectorLayer {
    /// A layer recording into `trace`'s registry and tracer, for a client
    /// whose pool settings this crate does not know: they are inferred from
    /// the closes its pool makes, never assumed to be reqwest's defaults.
    pub fn new(trace: ConnTrace) -> Self {
        Self::for_client(trace, Arc::new(ClientState::unknown_settings()))
    }

    pub(crate) fn for_client(trace: ConnTrace, client: Arc<ClientState>) -> Self {
        Self {
            trace,
            client,
            connect_timeout: None,
            proxy: Arc::new(OnceLock::new()),
            http2_prior_knowledge: false,
        }
    }

    /// The client speaks HTTP/2 without negotiating it
    /// (`ClientBuilder::http2_prior_knowledge`): every connection is HTTP/2
    /// although ALPN says nothing. Default: false.
    pub fn http2_prior_knowledge(mut self, on: bool) -> Self {
        self.http2_prior_knowledge = on;
        self
    }

    /// Where the client's proxy rules go once reqwest has built the client
    /// (they are read from it; see `proxy`).
    pub(crate) fn proxy_rules(&self) -> Arc<OnceLock<ProxyRules>> {
        self.proxy.clone()
    }

    /// The client's connect timeout, so that a connect abandoned at that
    /// deadline is reported as `error.type = timeout` rather than
    /// `cancelled`. Default: none.
    pub fn connect_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.connect_timeout = timeout;
        self
    }
}

impl<S> Layer<S> for ConnectorLayer {
    type Service = ConnectService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        ConnectService {
            inner: Arc::new(inner),
            shared: Arc::new(Shared {
                trace: self.trace.clone(),
                client: self.client.clone(),
                connect_timeout: self.connect_timeout,
                proxy: self.proxy.clone(),
                http2_prior_knowledge: self.http2_prior_knowledge,
            }),
        }
    }
}

/// What every clone of a [`ConnectService`] shares. One `Arc`: hyper-util
/// clones the connector for every request, pool hits included, so a clone
/// is one reference count, not one per field.
#[derive(Debug)]
struct Shared {
    trace: ConnTrace,
    client: Arc<ClientState>,
    connect_timeout: Option<Duration>,
    proxy: Arc<OnceLock<ProxyRules>>,
    http2_prior_knowledge: bool,
}

/// The service [`ConnectorLayer`] produces. Generic over reqwest's sealed
/// connector types: it only needs the response to implement hyper-util's
/// [`Connection`].
#[derive(Clone, Debug)]
pub struct ConnectService<S> {
    /// reqwest's connector below this layer, shared by the clones until
    /// one of them is polled or called (then copied, once, for that one).
    /// hyper-util and reqwest clone the connector several times per
    /// request, pool hits included, and reqwest's connector stack below a
    /// layer is boxed: each copy costs allocations, a shared one a
    /// reference count.
    inner: Arc<S>,
    shared: Arc<Shared>,
}

impl<S, R> Service<R> for ConnectService<S>
where
    S: Service<R> + Clone,
    S::Response: Connection,
    S::Error: Borrow<dyn StdError + Send + Sync + 'static>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = ConnectFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // This clone's own copy from now on: `call` uses the one polled.
        Arc::make_mut(&mut self.inner).poll_ready(cx)
    }

    fn call(&mut self, req: R) -> Self::Future {
        // The connect's start: the miss is classified as of this moment and
        // the setup span starts at it, however long the classification
        // takes on a busy machine (a tester saw setup spans start 3 to 20 ms
        // after the in-flight count their miss was decided from).
        let called = Instant::now();
        let shared = &*self.shared;
        let inner = shared.trace.inner().clone();
        let trigger = request::current();
        // reqwest calls the connector when hyper-util's pool checkout found
        // no usable idle connection: classify that miss now.
        let mut trigger_miss = false;
        let miss = trigger.as_ref().map(|t| {
            let slot = inner.miss_slot(&t.host, &shared.client, called);
            trigger_miss = t.note_miss(slot.clone());
            slot
        });
        let proxies = match (shared.proxy.get(), &trigger) {
            (Some(rules), Some(t)) => rules.candidates(&t.host),
            _ => crate::connect::proxy::Candidates::unknown(),
        };
        let mut attempt = ConnectAttempt::new(
            inner.next_connection_id(),
            called,
            trigger,
            shared.client.clone(),
            miss,
            shared.connect_timeout,
            proxies,
        );
        attempt.trigger_miss = trigger_miss;
        let attempt = Arc::new(attempt);
        // reqwest calls the connector inside the request's poll, so the
        // current span is the request span the middleware instrumented.
        let parent = tracing::Span::current().context();
        let cx = setup::start_setup_span(&inner, &attempt, &parent);
        let future = {
            let _scope = AttemptScope::enter(&attempt);
            Arc::make_mut(&mut self.inner).call(req)
        };
        ConnectFuture {
            inner: future,
            guard: ConnectGuard {
                state: Some(InFlight {
                    counted: InFlightCount::new(inner.clone()),
                    attempt,
                    cx,
                    inner,
                    peer: None,
                }),
                connect_timeout: shared.connect_timeout,
                http2_prior_knowledge: shared.http2_prior_knowledge,
            },
        }
    }
}

pin_project! {
    /// Future of [`ConnectService`]: polls reqwest's connect with the attempt
    /// set as current (for the DNS and TLS hooks) and records the outcome.
    /// Dropped before completion, it ends the spans as cancelled (or
    /// `timeout` at the configured connect timeout).
    pub struct ConnectFuture<F> {
        #[pin]
        inner: F,
        guard: ConnectGuard,
    }
}

impl<F> std::fmt::Debug for ConnectFuture<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnectFuture").finish_non_exhaustive()
    }
}

struct InFlight {
    attempt: Arc<ConnectAttempt>,
    cx: opentelemetry::Context,
    inner: Arc<Inner>,
    /// The peer, asked once the TLS handshake began (see `peer`); `Some`
    /// once asked.
    peer: Option<Option<Arc<PeerLookup>>>,
    /// Counts the connect in [`connects_in_flight`] until its spans are out.
    counted: InFlightCount,
}

impl InFlight {
    /// Asks for the peer after the poll that began the TLS handshake (TCP
    /// is connected and its socket open), when a span will show it.
    fn ask_peer_once_tls_began(&mut self) {
        use opentelemetry::trace::TraceContextExt;
        if self.peer.is_none()
            && self.cx.span().is_recording()
            && self.attempt.phases().tls_started.is_some()
        {
            self.peer = Some(PeerLookup::start(&self.inner, &self.attempt));
        }
    }
}

/// Connects started in this process whose spans are not emitted yet.
static IN_FLIGHT: AtomicUsize = AtomicUsize::new(0);

/// One connect counted in [`IN_FLIGHT`] and in its handle's count until
/// dropped.
struct InFlightCount(Arc<Inner>);

impl InFlightCount {
    fn new(inner: Arc<Inner>) -> Self {
        IN_FLIGHT.fetch_add(1, Ordering::SeqCst);
        inner.connects_in_flight.fetch_add(1, Ordering::SeqCst);
        InFlightCount(inner)
    }
}

impl Drop for InFlightCount {
    fn drop(&mut self) {
        self.0.connects_in_flight.fetch_sub(1, Ordering::SeqCst);
        IN_FLIGHT.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Connects started by instrumented clients in this process (any handle)
/// that have not finished yet: still resolving, connecting or handshaking,
/// including the connects hyper-util's pool lets finish in the background
/// after their request was served by another connection (a pool race's
/// loser). A connect leaves the count once its `http.connection_setup`
/// phase spans are emitted (succeeded, failed or dropped). Poll it before
/// reading back spans or counting a server's accepted connections after a
/// batch of requests; then [`wait_for_pending_spans`](crate::wait_for_pending_spans)
/// for the `tcp.connect` spans that wait on the kernel. One handle's:
/// [`ConnTrace::connects_in_flight`]. Never blocks.
pub fn connects_in_flight() -> usize {
    IN_FLIGHT.load(Ordering::SeqCst)
}

/// Ends the spans of a connect that never completed.
struct ConnectGuard {
    state: Option<InFlight>,
    connect_timeout: Option<Duration>,
    /// Every connection is HTTP/2 (prior knowledge), whatever ALPN says.
    http2_prior_knowledge: bool,
}

impl Drop for ConnectGuard {
    fn drop(&mut self) {
        if let Some(InFlight {
            attempt,
            cx,
            inner,
            peer,
            counted,
        }) = self.state.take()
        {
            let now = Instant::now();
            let timed_out = self.connect_timeout.is_some_and(|t| {
                now.saturating_duration_since(attempt.started) + Duration::from_millis(2) >= t
            });
            let (error_type, message) = if timed_out {
                (
                    semconv::ERROR_TYPE_TIMEOUT,
                    "connect timeout elapsed".to_owned(),
                )
            } else {
                (
                    semconv::ERROR_TYPE_CANCELLED,
                    "connect abandoned: its request was dropped or timed out".to_owned(),
                )
            };
            finish_failed(
                &inner,
                &attempt,
                &cx,
                error_type,
                message,
                FailureFacts::default(),
                peer,
                now,
            );
            drop(counted);
        }
    }
}

/// Ends the spans of a failed connect, with its peer when known (see
/// `peer`).
#[allow(clippy::too_many_arguments)]
fn finish_failed(
    inner: &Inner,
    attempt: &ConnectAttempt,
    cx: &opentelemetry::Context,
    error_type: &'static str,
    message: String,
    facts: FailureFacts,
    peer: Option<Option<Arc<PeerLookup>>>,
    now: Instant,
) {
    let peer = peer.flatten().map_or(Peer::Unknown, |p| p.settle());
    end_failed(inner, attempt, cx, error_type, message, facts, peer, now);
}

#[allow(clippy::too_many_arguments)]
fn end_failed(
    inner: &Inner,
    attempt: &ConnectAttempt,
    cx: &opentelemetry::Context,
    error_type: &'static str,
    message: String,
    facts: FailureFacts,
    peer: Peer,
    now: Instant,
) {
    use opentelemetry::trace::TraceContextExt;
    let (report, tcp_pending) = setup::emit_phases(
        inner,
        attempt,
        cx,
        &Ending::Failed {
            error_type,
            message,
            facts,
            peer,
        },
        now,
    );
    // Only a connected socket is left for the kernel: never here.
    if let Some(pending) = tcp_pending {
        pending.finish(None);
    }
    if let Some(trigger) = &attempt.trigger {
        trigger.connect_failed(Arc::new(report));
    }
    cx.span().end_with_timestamp(inner.clock.wall(now));
}

impl<F, T, E> Future for ConnectFuture<F>
where
    F: Future<Output = Result<T, E>>,
    T: Connection,
    E: Borrow<dyn StdError + Send + Sync + 'static>,
{
    type Output = Result<T, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        if let Some(s) = &this.guard.state {
            s.attempt.mark_poll(Instant::now());
        }
        let result = {
            let _scope = this
                .guard
                .state
                .as_ref()
                .map(|s| AttemptScope::enter(&s.attempt));
            match this.inner.poll(cx) {
                Poll::Pending => {
                    if let Some(s) = &mut this.guard.state {
                        s.ask_peer_once_tls_began();
                    }
                    return Poll::Pending;
                }
                Poll::Ready(r) => r,
            }
        };
        if let Some(InFlight {
            attempt,
            cx: span_cx,
            inner,
            peer,
            counted,
        }) = this.guard.state.take()
        {
            let now = Instant::now();
            match &result {
                Ok(conn) => {
                    // The connection tells its own peer: the kernel need not.
                    if let Some(Some(p)) = &peer {
                        p.settle();
                    }
                    on_connected(
                        &inner,
                        attempt,
                        span_cx,
                        conn,
                        this.guard.http2_prior_knowledge,
                        now,
                    )
                }
                Err(e) => {
                    let e: &(dyn StdError + Send + Sync + 'static) = e.borrow();
                    let refusal = proxy_refusal(e);
                    let error_type = refusal.map_or_else(|| classify(e), |r| r.error_type);
                    let message = error_chain_text(&inner.redaction, e);
                    let facts = FailureFacts {
                        refusal,
                        tunnel_failed: tunnel_failed(e),
                        refused_at: connect_error_address(e),
                    };
                    finish_failed(
                        &inner, &attempt, &span_cx, error_type, message, facts, peer, now,
                    );
                }
            }
            drop(counted);
        }
        Poll::Ready(result)
    }
}

fn on_connected<T: Connection>(
    inner: &Arc<Inner>,
    attempt: Arc<ConnectAttempt>,
    cx: opentelemetry::Context,
    conn: &T,
    http2_prior_knowledge: bool,
    now: Instant,
) {
    use opentelemetry::trace::TraceContextExt;
    let connected = conn.connected();
    let mut extensions = http::Extensions::new();
    connected.get_extras(&mut extensions);
    let info = extensions.get::<HttpInfo>();
    let established = Established {
        local: info.map(|i| i.local_addr()),
        remote: info.map(|i| i.remote_addr()),
        http2: connected.is_negotiated_h2() || http2_prior_knowledge,
        proxied: connected.is_proxied(),
    };
    // The resolver's newest answer for the host, which the connection is
    // judged by (`dns_stale`; not through a proxy, see `is_dns_stale`).
    let newest_answer = attempt
        .phases()
        .dns
        .as_mut()
        .and_then(|d| d.newest.take())
        .filter(|_| !established.proxied);
    let (report, tcp_pending) =
        setup::emit_phases(inner, &attempt, &cx, &Ending::Ready(&established), now);
    let report = Arc::new(report);
    let setup_end = tcp_pending.as_ref().and_then(|p| p.setup_end.clone());
    if let (Some(pending), Some(local), Some(remote)) =
        (tcp_pending, established.local, established.remote)
    {
        inner
            .kernel
            .lookup_batched(local, remote, move |lookup| pending.finish(Some(&lookup)));
    }
    let end = inner.clock.wall(now);
    let host = attempt
        .trigger
        .as_ref()
        .map(|t| inner.pools.shared_key(&t.host));
    let record = Arc::new(
        ConnectionRecord::new(
            report,
            setup::span_context(&cx),
            attempt.trigger.as_ref().map(|t| t.id),
            attempt.client.clone(),
            host.clone(),
            attempt.miss.clone(),
        )
        .with_newest_answer(newest_answer),
    );
    if record.pair().is_some() {
        inner.register(record.clone(), now);
    }
    if let Some(host) = host {
        inner.pools.record_connection(host, record.clone());
    }
    match &attempt.trigger {
        Some(trigger) => {
            if let Some(unused) = trigger.connect_ready(
                PendingSetup {
                    record,
                    cx,
                    end,
                    setup_end,
                    trigger_miss: attempt.trigger_miss,
                },
                &inner.kernel,
            ) {
                let in_flight = unused.host.as_ref().map_or(0, |h| inner.load.in_flight(h));
                let release = inner.pools.on_pooled_unused(&unused, now, in_flight);
                inner.confirm_unsure_release(&unused);
                for other in &release.made_unsure {
                    inner.confirm_unsure_release(other);
                }
            }
        }
        None => match setup_end {
            Some(setup_end) => setup_end.arrive(),
            None => cx.span().end_with_timestamp(end),
        },
    }
}
