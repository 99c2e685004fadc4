//! The `reqwest_middleware::Middleware` that opens the request span and
//! attributes each response to the connection that carried it.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, LazyLock};
use std::task::{Context, Poll};
use std::time::Instant;

use http::Extensions;
use opentelemetry::KeyValue;
use opentelemetry::trace::TraceContextExt;
use pin_project_lite::pin_project;
use reqwest::{Request, Response, ResponseBuilderExt};
use reqwest_middleware::{Middleware, Next, Result};
use tracing::Instrument;
use tracing::field::Empty;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use crate::error::{classify, error_chain_text};
use crate::handle::ConnTrace;
use crate::handle::Inner;
use crate::miss::ConnectionEnd;
use crate::pool::host::HostKey;
use crate::pool::slot::MissSlot;
use crate::request::attribution::attribute_response;
use crate::request::body::TracedBody;
use crate::request::end::{EndKind, RequestEnd};
use crate::request::failure::attribute_failure;
use crate::request::method::{is_known_method, method_attribute};
use crate::request::redirect::{HopScope, HopSlot};
use crate::request::state::{RequestScope, RequestState};
use crate::semconv;

/// Makes the span a request's pool attributes land on.
///
/// [`DefaultMakeRequestSpan`] opens a client span per request;
/// [`UseCurrentSpan`] reuses the span an outer middleware opened (e.g.
/// `reqwest_tracing::TracingMiddleware`). Closures `Fn(&Request) -> Span`
/// implement it too.
pub trait MakeRequestSpan: Send + Sync + 'static {
    /// The span for `request`. It must be a new span or the current one; the
    /// middleware runs the rest of the request inside it.
    fn make_span(&self, request: &Request) -> tracing::Span;

    /// Whether the middleware records the HTTP client attributes
    /// (`http.request.method`, `url.*`, `server.*`,
    /// `http.response.status_code`) on the span. `false` when another
    /// middleware already records them on the same span. Default: `true`.
    fn records_http_attributes(&self) -> bool {
        true
    }
}

/// Opens an `INFO` client span named by the HTTP method (HTTP client span
/// conventions, semconv v1.42.0: `{method}`, or `HTTP` for a method outside
/// the known set, whose `http.request.method` is then `_OTHER` with
/// `http.request.method_original` holding the method sent).
///
/// The `tracing` span declares a pool hit's attributes as empty fields;
/// they are never recorded through `tracing` (the middleware sets them on
/// the OpenTelemetry span), declared only so that `tracing-opentelemetry`
/// sizes the span's attribute list for them.
#[derive(Debug, Clone, Copy, Default)]
pub struct DefaultMakeRequestSpan;

impl MakeRequestSpan for DefaultMakeRequestSpan {
    fn make_span(&self, request: &Request) -> tracing::Span {
        let method = request.method().as_str();
        let name = if is_known_method(method) {
            method
        } else {
            "HTTP"
        };
        // The attributes a pool hit's span gets, declared empty: they are
        // set on the OpenTelemetry span directly, never recorded through
        // `tracing`, but `tracing-opentelemetry` (0.34) sizes the span's
        // attribute list by the declared fields, and a list sized for two
        // grew four times (a reallocation and copy each) per request. 18
        // fields hold a hit's 17 attributes in 1008 bytes (glibc's
        // per-thread cache serves up to 1032).
        tracing::info_span!(
            target: "reqwest_conntrace",
            "HTTP request",
            otel.name = name,
            otel.kind = "client",
            http.request.method = Empty,
            url.full = Empty,
            url.scheme = Empty,
            server.address = Empty,
            server.port = Empty,
            http.response.status_code = Empty,
            network.protocol.version = Empty,
            network.peer.address = Empty,
            network.peer.port = Empty,
            network.local.port = Empty,
            http.connection.reused = Empty,
            http.connection.id = Empty,
            http.connection.wait_time = Empty,
            http.connection.request_count = Empty,
            http.connection.age = Empty,
            http.connection.idle_time = Empty,
        )
    }
}

/// Uses the current span: place [`ConnTraceMiddleware`] after
/// `reqwest_tracing::TracingMiddleware` so the pool attributes land on
/// reqwest-tracing's span and no second span is opened.
#[derive(Debug, Clone, Copy, Default)]
pub struct UseCurrentSpan;

impl MakeRequestSpan for UseCurrentSpan {
    fn make_span(&self, _request: &Request) -> tracing::Span {
        tracing::Span::current()
    }

    /// reqwest-tracing records them already; recording them twice would
    /// export duplicate keys.
    fn records_http_attributes(&self) -> bool {
        false
    }
}

impl<F> MakeRequestSpan for F
where
    F: Fn(&Request) -> tracing::Span + Send + Sync + 'static,
{
    fn make_span(&self, request: &Request) -> tracing::Span {
        self(request)
    }
}

/// Middleware recording, per request: the HTTP client span attributes
/// (`http.request.method`, `url.full` redacted, `url.scheme`,
/// `server.address`, `server.port`, `http.response.status_code`,
/// `network.protocol.version`, `network.peer.*`, `network.local.port`,
/// `error.type`) and the pool attributes (`http.connection.reused`, `.id`,
/// `.wait_time`, `.request_count`, `.age`, `.idle_time`), plus a link to the
/// serving connection's setup span when another request paid for it.
///
/// The span ends when the response body is read to its end or dropped
/// (`http.response.body.size` then holds the bytes read), or when the
/// request fails or is cancelled. The request's result passes through
/// unchanged; nothing here can fail a request.
#[derive(Clone)]
pub struct ConnTraceMiddleware<M = DefaultMakeRequestSpan> {
    trace: ConnTrace,
    make_span: Arc<M>,
}

impl<M> std::fmt::Debug for ConnTraceMiddleware<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnTraceMiddleware")
            .finish_non_exhaustive()
    }
}

impl ConnTraceMiddleware {
    /// Middleware recording into `trace`, opening its own request spans.
    pub fn new(trace: ConnTrace) -> Self {
        Self {
            trace,
            make_span: Arc::new(DefaultMakeRequestSpan),
        }
    }
}

impl<M> ConnTraceMiddleware<M> {
    /// Replaces how the request span is made. Default: [`DefaultMakeRequestSpan`].
    pub fn make_span<N: MakeRequestSpan>(self, make_span: N) -> ConnTraceMiddleware<N> {
        ConnTraceMiddleware {
            trace: self.trace,
            make_span: Arc::new(make_span),
        }
    }
}

impl ConnTrace {
    /// The middleware for a `reqwest_middleware::ClientBuilder`.
    pub fn middleware(&self) -> ConnTraceMiddleware {
        ConnTraceMiddleware::new(self.clone())
    }
}

pin_project! {
    /// Polls the rest of the stack with the request set as current, so a
    /// connect started inside knows its trigger.
    struct Scoped<F> {
        #[pin]
        inner: F,
        state: Arc<RequestState>,
        hop: Arc<HopSlot>,
    }
}

impl<F: Future> Future for Scoped<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.project();
        this.state.note_poll();
        let _scope = RequestScope::enter(this.state);
        let _hop = HopScope::enter(this.hop);
        this.inner.poll(cx)
    }
}

/// The `url.full` of a request nobody records: one shared empty string.
static NO_URL: LazyLock<Arc<str>> = LazyLock::new(|| Arc::from(""));

fn default_port(scheme: &str) -> u16 {
    match scheme {
        "https" => 443,
        _ => 80,
    }
}

/// Physical requests this middleware has sent for one call, kept in the
/// call's `Extensions`: a middleware placed before this one that sends the
/// request again (a retry, e.g. reqwest-retry's
/// `RetryTransientMiddleware`) hands the same `Extensions` to each attempt,
/// so each attempt's first request continues the count
/// (`http.request.resend_count`: "the ordinal number of request resending
/// attempt (for any reason, including redirects)", semconv v1.42.0).
#[derive(Debug, Clone, Copy)]
struct Sent(usize);

impl Sent {
    /// The requests sent before this one for the call; counts this one.
    fn count_one(extensions: &mut Extensions) -> usize {
        let before = extensions.get::<Sent>().map_or(0, |s| s.0);
        extensions.insert(Sent(before.saturating_add(1)));
        before
    }
}

#[async_trait::async_trait]
impl<M: MakeRequestSpan> Middleware for ConnTraceMiddleware<M> {
    /// Sends the request; when the instrumented builder took over redirect
    /// following (see `redirect`), sends each hop as its own physical
    /// request with its own span, `http.request.resend_count` from the
    /// second on. A call resent by a middleware placed before this one
    /// (with the same `Extensions`, as retry middlewares do) continues the
    /// count: its second attempt's span has `http.request.resend_count`
    /// one more than the first attempt's last hop.
    async fn handle(
        &self,
        req: Request,
        extensions: &mut Extensions,
        next: Next<'_>,
    ) -> Result<Response> {
        let mut req = req;
        let mut followed = 0;
        // The call's own request (its URL names a later hop's failure).
        let mut first: Option<Arc<HopSlot>> = None;
        loop {
            let hop = Arc::new(HopSlot::new(&req, followed));
            let resend_count = Sent::count_one(extensions);
            let response = match self
                .send_one(req, extensions, next.clone(), &hop, resend_count)
                .await
            {
                Ok(response) => response,
                Err(error) => {
                    return Err(match &first {
                        Some(first) => first.as_reqwest_reports(error),
                        None => error,
                    });
                }
            };
            let next_request = hop.next_request(response.status());
            first.get_or_insert(hop);
            let Some(next_request) = next_request else {
                return Ok(response);
            };
            // Like reqwest, the redirect's body is not waited for, but what
            // has already arrived is read: a body already complete then
            // ends as read, not as a drop (over HTTP/2 a possible stream
            // reset, over HTTP/1.1 a connection maybe discarded), and
            // nothing on the wire changes (h2 sends no RST_STREAM for a
            // stream whose END_STREAM came; hyper keeps an HTTP/1.1
            // connection whose body it read). A tester saw every HTTP/2
            // hop counted as a stream reset, nginx having sent each 3xx in
            // full. One still arriving is dropped unread, as reqwest does.
            let _ = futures_util::FutureExt::now_or_never(response.bytes());
            req = next_request;
            followed += 1;
        }
    }
}

impl<M: MakeRequestSpan> ConnTraceMiddleware<M> {
    /// One physical request: its span, pool attribution and end.
    async fn send_one(
        &self,
        req: Request,
        extensions: &mut Extensions,
        next: Next<'_>,
        hop: &Arc<HopSlot>,
        resend_count: usize,
    ) -> Result<Response> {
        let inner = self.trace.inner().clone();
        // A resend gets a span of its own even when the first request's span
        // belongs to an outer middleware (`UseCurrentSpan`): a child of it.
        let (span, records_http) = if resend_count == 0 {
            (
                self.make_span.make_span(&req),
                self.make_span.records_http_attributes(),
            )
        } else if self.make_span.records_http_attributes() {
            (self.make_span.make_span(&req), true)
        } else {
            (DefaultMakeRequestSpan.make_span(&req), true)
        };
        let url = req.url();
        // The host as hyper-util keys its pool: IPv6 without brackets.
        let ipv6;
        let host = match url.host() {
            Some(url::Host::Ipv6(ip)) => {
                ipv6 = ip.to_string();
                ipv6.as_str()
            }
            Some(_) => url.host_str().unwrap_or_default(),
            None => "",
        };
        let key = HostKey::new(
            url.scheme(),
            host,
            url.port().unwrap_or_else(|| default_port(url.scheme())),
        );
        // Span attributes are built only for a span that records (nothing
        // installed, or not sampled: none), `url.full` also for a report.
        // The span's OpenTelemetry context, asked for once: what the
        // middleware sets on the span goes through it, not through another
        // lookup of the span in the subscriber per call.
        let cx = recording_context(&span);
        let recording = cx.is_some();
        let full: Arc<str> = if recording || inner.on_request_end.is_some() {
            inner.redaction.redact_shared(url)
        } else {
            NO_URL.clone()
        };
        if records_http && recording {
            let method = req.method().as_str();
            let mut attributes = Vec::with_capacity(6);
            if is_known_method(method) {
                attributes.push(KeyValue::new(
                    semconv::HTTP_REQUEST_METHOD,
                    method_attribute(req.method()),
                ));
            } else {
                attributes.push(KeyValue::new(semconv::HTTP_REQUEST_METHOD, "_OTHER"));
                attributes.push(KeyValue::new(
                    semconv::HTTP_REQUEST_METHOD_ORIGINAL,
                    method.to_owned(),
                ));
            }
            attributes.extend([
                KeyValue::new(semconv::URL_FULL, full.clone()),
                KeyValue::new(semconv::URL_SCHEME, key.url_scheme()),
                KeyValue::new(semconv::SERVER_ADDRESS, key.server_address()),
                KeyValue::new(semconv::SERVER_PORT, i64::from(key.port)),
            ]);
            if let Some(cx) = &cx {
                cx.span().set_attributes(attributes);
            }
        }
        if resend_count > 0 {
            span.set_attribute(semconv::HTTP_REQUEST_RESEND_COUNT, resend_count as i64);
        }

        let state = Arc::new(RequestState::new(
            inner.next_request_id(),
            key,
            req.headers()
                .contains_key(http::header::CONNECTION)
                .then(|| {
                    crate::request::connection_headers::connection_token(req.headers(), "close")
                }),
        ));
        let mut end = RequestEnd::new(
            inner.clone(),
            state.clone(),
            span.clone(),
            req.method().clone(),
            full,
        );
        end.resend_count = resend_count as u32;
        end.recording = recording;
        let result = Scoped {
            inner: next.run(req, extensions),
            state: state.clone(),
            hop: hop.clone(),
        }
        .instrument(span.clone())
        .await;
        // More connects than one physical request makes: a middleware after
        // this one sent the request again, unseen (see
        // `HTTP_CONNECTION_CONNECTS`).
        let connects = state.connects();
        if connects > 1
            && let Some(cx) = &cx
        {
            cx.span().set_attribute(KeyValue::new(
                semconv::HTTP_CONNECTION_CONNECTS,
                i64::from(connects),
            ));
            let http2 = matches!(&result, Ok(r) if r.version() == http::Version::HTTP_2);
            cx.span().add_event(
                semconv::EVENT_UNSEEN_REQUESTS,
                unseen_requests(&inner, &state, connects, http2),
            );
        }

        match result {
            Ok(response) => {
                end.headers_at = Some(Instant::now());
                // Stamped now on the wall clock, as the span's start and
                // end are: the page splits the bar at it.
                if let Some(cx) = &cx {
                    cx.span()
                        .add_event(semconv::EVENT_RESPONSE_HEADERS, Vec::new());
                }
                let status = response.status();
                end.status = Some(status.as_u16());
                // Set with the connection's attributes (up to 9), in one
                // call.
                let mut attributes = Vec::new();
                if recording {
                    attributes.reserve_exact(11);
                }
                if records_http && recording {
                    attributes.push(KeyValue::new(
                        semconv::HTTP_RESPONSE_STATUS_CODE,
                        i64::from(status.as_u16()),
                    ));
                }
                let version = match response.version() {
                    http::Version::HTTP_09 => "0.9",
                    http::Version::HTTP_10 => "1.0",
                    http::Version::HTTP_2 => "2",
                    http::Version::HTTP_3 => "3",
                    _ => "1.1",
                };
                if recording {
                    attributes.push(KeyValue::new(semconv::NETWORK_PROTOCOL_VERSION, version));
                }
                end.protocol_version = Some(version);
                if status.is_client_error() || status.is_server_error() {
                    end.fail(status.as_str(), format!("HTTP status {status}"));
                }
                // Never waits: a miss whose reason still waits on the
                // kernel's answer is recorded when the request ends.
                let none = tracing::Span::none();
                end.connection = attribute_response(
                    &inner,
                    &state,
                    if recording { &span } else { &none },
                    &response,
                    attributes,
                    &mut end.miss_deferred,
                );
                Ok(wrap_body(response, end))
            }
            Err(error) => {
                if let Some(status) = hop.refused_by_limit() {
                    // A redirect the limit refused: the hop was answered (its
                    // status is the response's) on a connection, then reqwest
                    // failed the call and dropped the response unread.
                    end.headers_at = Some(Instant::now());
                    end.status = Some(status.as_u16());
                    if records_http && recording {
                        span.set_attribute(
                            semconv::HTTP_RESPONSE_STATUS_CODE,
                            i64::from(status.as_u16()),
                        );
                    }
                    let none = tracing::Span::none();
                    end.connection = crate::request::failure::attribute_refused_redirect(
                        &inner,
                        &state,
                        if recording { &span } else { &none },
                    );
                    // Its miss, if it made one, is recorded as an answered
                    // request's, when it ends.
                    end.miss_deferred = state.miss();
                    end.fail(classify(&error), error_chain_text(&inner.redaction, &error));
                    end.finish(EndKind::Dropped);
                    return Err(error);
                }
                // A proxy that refused the CONNECT is named as such.
                let error_type = crate::error::proxy_refusal(&error)
                    .map_or_else(|| classify(&error), |r| r.error_type);
                let none = tracing::Span::none();
                end.failed_on = attribute_failure(
                    &inner,
                    &state,
                    if recording { &span } else { &none },
                    error_type,
                    // An error came back, the future was not dropped:
                    // reqwest's own deadline may fire before hyper-util had
                    // the request (a zero timeout is checked before hyper's
                    // future is polled); not told apart, assumed sent
                    // (REFERENCE section 11).
                    false,
                    crate::request::failure::FailureEvidence::of(&error),
                );
                end.fail(error_type, error_chain_text(&inner.redaction, &error));
                end.finish(EndKind::Failed);
                Err(error)
            }
        }
    }
}

/// The OpenTelemetry context of `span` when it is an OpenTelemetry span
/// that records (the `tracing-opentelemetry` layer made it and the sampler
/// kept it); `None` otherwise.
fn recording_context(span: &tracing::Span) -> Option<opentelemetry::Context> {
    if span.is_disabled() {
        return None;
    }
    let cx = span.context();
    cx.span().is_recording().then_some(cx)
}

/// Moves the response body into a [`TracedBody`] that ends the request.
fn wrap_body(response: Response, mut end: RequestEnd) -> Response {
    let url = response.url().clone();
    let response: http::Response<reqwest::Body> = response.into();
    let (mut parts, body) = response.into_parts();
    if http_body::Body::is_end_stream(&body) {
        end.finish(EndKind::Complete);
    }
    // reqwest keeps the final URL in an extension its From impl reads back;
    // the builder extension is the public way to set it. The builder gets
    // the response's own extensions (moved, not copied) and hands them back
    // with the URL added.
    let mut carrier = http::Response::builder();
    if let Some(extensions) = carrier.extensions_mut() {
        std::mem::swap(extensions, &mut parts.extensions);
    }
    if let Ok(carrier) = carrier.url(url).body(()) {
        parts.extensions = carrier.into_parts().0.extensions;
    }
    let body = reqwest::Body::wrap(TracedBody::new(body, end));
    Response::from(http::Response::from_parts(parts, body))
}

/// The `http.connection.unseen_requests` event's attributes for a call
/// that opened `connects` connections: a later connect whose miss named a
/// connection the server ended (or an HTTP/2 connection of the host whose
/// GOAWAY reached us during the call) is hyper-util's resend of a request
/// that connection refused unprocessed (`http.connection.previous.id`
/// names it); otherwise, answered over HTTP/2 (`http2`), either (that end
/// not known yet); else a middleware after this one sent the request again.
fn unseen_requests(
    inner: &Inner,
    state: &RequestState,
    connects: u32,
    http2: bool,
) -> Vec<KeyValue> {
    let later = state.later_miss();
    let ended = later
        .as_ref()
        .and_then(|slot| slot.get().previous)
        .filter(|p| p.end.is_some_and(ConnectionEnd::by_server))
        .map(|p| (p.id, p.end))
        .or_else(|| {
            // The kernel was asked about the host's HTTP/2 connection:
            // hyper-util's checkout found it unusable, so its server ended
            // it (GOAWAY; the kernel tells when, row 10d).
            later
                .as_ref()
                .and_then(MissSlot::http2_candidate)
                .map(|id| (id, Some(ConnectionEnd::GoAway)))
        })
        .or_else(|| {
            inner
                .pools
                .http2_ended_since(&state.host, state.started)
                .or_else(|| {
                    inner
                        .registry
                        .closed_http2_ended_since(&state.host, state.started)
                })
                .map(|id| (id, Some(ConnectionEnd::GoAway)))
        });
    match ended {
        Some((id, end)) => vec![
            KeyValue::new(
                semconv::EXCEPTION_MESSAGE,
                format!(
                    "this call opened {connects} connections: the server ended connection {id} ({}) during it, and hyper-util resent a request that connection refused unprocessed; no span shows that first send",
                    end.map_or("ended", ConnectionEnd::as_str)
                ),
            ),
            KeyValue::new(semconv::HTTP_CONNECTION_PREVIOUS_ID, id as i64),
        ],
        None if http2 => vec![KeyValue::new(
            semconv::EXCEPTION_MESSAGE,
            format!(
                "this call opened {connects} connections: either hyper-util resent a request that an HTTP/2 connection refused unprocessed as its server ended it (GOAWAY), or a middleware placed after ConnTraceMiddleware sent it again; which one is not known"
            ),
        )],
        None => vec![KeyValue::new(
            semconv::EXCEPTION_MESSAGE,
            format!(
                "this call opened {connects} connections; one physical request opens at most one: a middleware placed after ConnTraceMiddleware sent more requests than this span shows (add ConnTraceMiddleware after any retry middleware)"
            ),
        )],
    }
}
