//! Pool attribution of one response, and the end of a request's life: the
//! facts that land on the request span and in its [`RequestReport`].

use std::sync::Arc;
use std::time::Instant;

use hyper_util::client::legacy::connect::HttpInfo;
use opentelemetry::KeyValue;
use opentelemetry::trace::Status;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use crate::clock::secs;
use crate::handle::Inner;
use crate::miss::MissReason;
use crate::registry::ConnectionRecord;
use crate::report::{ConnectionUse, RequestReport};
use crate::request::{Fate, RequestState};
use crate::semconv;

/// Attributes the response to the connection that carried it and records the
/// pool attributes on `span`. Returns `None` when the response carries no
/// `HttpInfo` or the connection is unknown to this handle.
///
/// Never waits: when this request's miss reason still waits on the kernel's
/// answer (was the idle connection closed by the server?), `miss_deferred`
/// is set and the reason is recorded when the request ends
/// ([`RequestEnd::finish`]).
pub(crate) fn attribute_response(
    inner: &Inner,
    state: &RequestState,
    span: &tracing::Span,
    info: Option<&HttpInfo>,
    miss_deferred: &mut bool,
) -> Option<(ConnectionUse, Arc<ConnectionRecord>)> {
    let Some(info) = info else {
        state.finish(Fate::NoResponse);
        return None;
    };
    let (local, remote) = (info.local_addr(), info.remote_addr());
    let recording = !span.is_none();
    let mut attributes = Vec::new();
    if recording {
        attributes.reserve(9);
        attributes.extend([
            KeyValue::new(semconv::NETWORK_PEER_ADDRESS, remote.ip().to_string()),
            KeyValue::new(semconv::NETWORK_PEER_PORT, i64::from(remote.port())),
            KeyValue::new(semconv::NETWORK_LOCAL_PORT, i64::from(local.port())),
        ]);
    }
    let Some(record) = inner.registry.get(local, remote) else {
        set_attributes(span, attributes);
        state.finish(Fate::NoResponse);
        return None;
    };
    let request_count = record.count_request();
    let start = state.started;
    let ready = record.ready_at();
    // The end of the previous response on the connection (or its ready time).
    let last_quiet = record.last_activity();
    // When the connection was free for this request: ready, and for HTTP/1.1
    // (one request at a time) also released by the previous response.
    let available = if record.http2() { ready } else { last_quiet };
    let reused = ready <= start;
    let wait = available.saturating_duration_since(start);
    // Idle since the connection last finished a response (or became ready).
    // For HTTP/2 other streams may still be open at that moment.
    let idle = (reused && available <= start && last_quiet <= start).then(|| start - last_quiet);
    let age = start.saturating_duration_since(ready);
    let paid = record.trigger_id == Some(state.id);
    let now = Instant::now();
    record.take();
    record.clear_over_idle_limit();
    if let Some(batch) = &state.batch {
        batch.record(reused, wait);
    }
    // Not an idle hit: say why. A request that triggered a connect carries
    // that connect's reason (even when a freed connection served it first);
    // one served by a connection set up for another request carries that
    // connection's reason; a hit that only waited found everything busy.
    // A request whose checkout failed (it called the connector) is no idle
    // hit even when a connection hyper-util was still returning to the pool
    // (on a spawned task, after the previous body ended) served it at once.
    let own_miss = state.miss();
    let idle_hit = reused && wait.is_zero() && own_miss.is_none();
    *miss_deferred = own_miss.as_ref().is_some_and(|m| !m.is_settled());
    let miss_reason = (!idle_hit).then(|| {
        own_miss
            .map(|m| m.get())
            .or_else(|| {
                (!reused)
                    .then(|| record.miss.as_ref().map(|m| m.get()))
                    .flatten()
            })
            .unwrap_or(if reused {
                MissReason::AllBusy
            } else {
                MissReason::Cold
            })
    });

    if recording {
        attributes.extend([
            KeyValue::new(semconv::HTTP_CONNECTION_REUSED, reused),
            KeyValue::new(semconv::HTTP_CONNECTION_ID, record.id() as i64),
            KeyValue::new(semconv::HTTP_CONNECTION_WAIT_TIME, secs(wait)),
            KeyValue::new(semconv::HTTP_CONNECTION_REQUEST_COUNT, request_count as i64),
            KeyValue::new(semconv::HTTP_CONNECTION_AGE, secs(age)),
        ]);
        if let Some(idle) = idle {
            attributes.push(KeyValue::new(
                semconv::HTTP_CONNECTION_IDLE_TIME,
                secs(idle),
            ));
        }
    }
    set_attributes(span, attributes);
    if let Some(reason) = miss_reason
        && !*miss_deferred
    {
        record_miss(inner, state, span, reason);
    }
    if let Some(advice) = inner.load.on_response(
        &state.host,
        record.client.max_idle_per_host,
        // A reason still waiting for the kernel is not counted as forced.
        miss_reason == Some(MissReason::AllBusy) && !*miss_deferred,
        now,
    ) {
        span.add_event(
            semconv::EVENT_POOL_ADVICE,
            vec![
                KeyValue::new(
                    semconv::HTTP_CLIENT_POOL_PEAK_IN_FLIGHT,
                    advice.peak_in_flight as i64,
                ),
                KeyValue::new(
                    semconv::HTTP_CLIENT_POOL_IDLE_LIMIT,
                    advice.idle_limit as i64,
                ),
                KeyValue::new(
                    semconv::HTTP_CONNECTION_POOL_MISSES_PER_SECOND,
                    advice.misses_per_second,
                ),
                KeyValue::new(
                    semconv::HTTP_CONNECTION_POOL_SUGGESTED_IDLE,
                    advice.peak_in_flight as i64,
                ),
            ],
        );
        if advice.log_now {
            let line = crate::advice::PoolAdvice {
                server_address: state.host.host.clone(),
                server_port: state.host.port,
                peak_in_flight: advice.peak_in_flight,
                idle_limit: advice.idle_limit,
                misses_per_second: advice.misses_per_second,
                suggested_max_idle_per_host: advice.peak_in_flight,
            };
            tracing::warn!(target: "reqwest_conntrace", "{line}");
        }
    }
    if !paid {
        span.add_link_with_attributes(
            record.setup_span.clone(),
            vec![
                KeyValue::new(semconv::HTTP_CONNECTION_ID, record.id() as i64),
                KeyValue::new(semconv::HTTP_CONNECTION_WAIT_TIME, secs(wait)),
            ],
        );
    }
    state.finish(Fate::ServedBy {
        connection_id: record.id(),
        http2: record.http2(),
    });
    let usage = ConnectionUse {
        id: record.id(),
        reused,
        wait,
        request_count,
        age,
        idle,
        paid_by_this_request: paid,
        miss_reason,
        setup: record.setup.clone(),
    };
    Some((usage, record))
}

/// Sets `attributes` on `span`'s OpenTelemetry span in one call (one lock
/// of the span) rather than one `set_attribute` dispatch through the
/// subscriber each. `span` is already built: the middleware asked for its
/// context to know whether it records.
pub(crate) fn set_attributes(span: &tracing::Span, attributes: Vec<KeyValue>) {
    use opentelemetry::trace::TraceContextExt;
    if span.is_none() || attributes.is_empty() {
        return;
    }
    span.context().span().set_attributes(attributes);
}

/// `http.connection.miss_reason` on the request span, and one more
/// `http.client.pool.misses`.
fn record_miss(inner: &Inner, state: &RequestState, span: &tracing::Span, reason: MissReason) {
    span.set_attribute(semconv::HTTP_CONNECTION_MISS_REASON, reason.as_str());
    let mut attributes = state.host.attributes();
    attributes.push(KeyValue::new(
        semconv::HTTP_CONNECTION_MISS_REASON,
        reason.as_str(),
    ));
    inner.metrics.pool_misses.add(1, &attributes);
}

/// A request failed with the connection closed under it (`error.type =
/// connection_reset`) without calling the connector: it went out on a pooled
/// connection, which the server had closed (a keep-alive race). Records that
/// connection as far as it can be known (the one hyper-util would have
/// handed out: the host's most recently released idle connection) on
/// `span`: `http.connection.reused = true`, `.id`, `.idle_time`, a link to
/// its setup span; and counts the connection closed by the server.
pub(crate) fn attribute_failure(inner: &Inner, state: &RequestState, span: &tracing::Span) {
    if state.miss().is_some() {
        return;
    }
    let Some(record) = inner.pools.likely_pooled(&state.host, state.started) else {
        return;
    };
    let idle = state
        .started
        .saturating_duration_since(record.last_activity());
    span.set_attribute(semconv::HTTP_CONNECTION_REUSED, true);
    span.set_attribute(semconv::HTTP_CONNECTION_ID, record.id() as i64);
    span.set_attribute(semconv::HTTP_CONNECTION_IDLE_TIME, secs(idle));
    span.add_link_with_attributes(
        record.setup_span.clone(),
        vec![KeyValue::new(
            semconv::HTTP_CONNECTION_ID,
            record.id() as i64,
        )],
    );
    record.mark_peer_closed();
    inner.connection_closed(&record, Instant::now());
}

/// Everything needed to end a request: held by the middleware until the
/// response headers, then by the response body until its end or drop.
/// Dropping it unfinished ends the request as cancelled.
pub(crate) struct RequestEnd {
    pub(crate) inner: Arc<Inner>,
    pub(crate) state: Arc<RequestState>,
    pub(crate) span: tracing::Span,
    pub(crate) method: http::Method,
    pub(crate) url: String,
    pub(crate) headers_at: Option<Instant>,
    pub(crate) status: Option<u16>,
    pub(crate) error_type: Option<String>,
    pub(crate) connection: Option<(ConnectionUse, Arc<ConnectionRecord>)>,
    pub(crate) body_size: u64,
    /// `network.protocol.version` of the response.
    pub(crate) protocol_version: Option<&'static str>,
    /// The miss reason was not known when the response arrived: record it
    /// at the end (see [`attribute_response`]).
    pub(crate) miss_deferred: bool,
    /// The span records (an OpenTelemetry span, sampled): span attributes
    /// are built only then. Default: `true`.
    pub(crate) recording: bool,
    /// `http.request.method`, `server.address`, `server.port`, `url.scheme`.
    base_attributes: Vec<KeyValue>,
    finished: bool,
}

impl std::fmt::Debug for RequestEnd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RequestEnd")
            .field("url", &self.url)
            .field("finished", &self.finished)
            .finish_non_exhaustive()
    }
}

/// How a request's life ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EndKind {
    /// Body read to its end.
    Complete,
    /// Body (or the request future) dropped first.
    Dropped,
    /// The request or body failed; the error is already recorded.
    Failed,
}

impl RequestEnd {
    pub(crate) fn new(
        inner: Arc<Inner>,
        state: Arc<RequestState>,
        span: tracing::Span,
        method: http::Method,
        url: String,
    ) -> Self {
        let mut base_attributes = state.host.attributes();
        base_attributes.push(KeyValue::new(
            semconv::HTTP_REQUEST_METHOD,
            crate::middleware::method_attribute(&method),
        ));
        inner.metrics.active_requests.add(1, &base_attributes);
        inner.load.request_started(&state.host, state.started);
        Self {
            inner,
            state,
            span,
            method,
            url,
            headers_at: None,
            status: None,
            error_type: None,
            connection: None,
            body_size: 0,
            protocol_version: None,
            miss_deferred: false,
            recording: true,
            base_attributes,
            finished: false,
        }
    }

    /// Records an error on the span.
    pub(crate) fn fail(&mut self, error_type: &str, message: String) {
        if self.recording {
            self.span
                .set_attribute(semconv::ERROR_TYPE, error_type.to_owned());
            self.span.set_status(Status::error(message));
        }
        self.error_type = Some(error_type.to_owned());
    }

    /// Ends the request once: releases the connection to the registry's
    /// view, records the body size and hands the report to the callback.
    pub(crate) fn finish(&mut self, kind: EndKind) {
        if self.finished {
            return;
        }
        self.finished = true;
        let now = Instant::now();
        if self.headers_at.is_none() {
            if kind == EndKind::Dropped {
                self.fail(
                    semconv::ERROR_TYPE_CANCELLED,
                    "request dropped before its response arrived".to_owned(),
                );
            }
            self.state.finish(Fate::NoResponse);
        } else if self.recording {
            self.span
                .set_attribute(semconv::HTTP_RESPONSE_BODY_SIZE, self.body_size as i64);
        }
        if self.miss_deferred
            && let Some(reason) = self.state.miss().map(|m| m.get())
        {
            // The kernel's answer, or the fallback if it has not come yet.
            let none = tracing::Span::none();
            let span = if self.recording { &self.span } else { &none };
            record_miss(&self.inner, &self.state, span, reason);
            if let Some((usage, _)) = &mut self.connection {
                usage.miss_reason = Some(reason);
            }
        }
        if let Some((_, record)) = &self.connection {
            record.give_back();
            match kind {
                EndKind::Complete => {
                    record.mark_released(now);
                    self.released_to_pool(record, now);
                }
                // An HTTP/1.1 response dropped mid-body cannot go back to the
                // pool: hyper closes the connection.
                EndKind::Dropped | EndKind::Failed if !record.http2() => {
                    record.mark_discarded(now);
                    self.inner.connection_closed(record, now);
                }
                // HTTP/2: the stream ended, the connection lives on.
                _ => {
                    record.mark_released(now);
                    self.released_to_pool(record, now);
                }
            }
        }
        self.record_metrics(now);
        if let Some(callback) = &self.inner.on_request_end {
            callback.on_request_end(&self.report(kind, now));
        }
        // Release our handle so the span ends now (end of body), not when
        // the response value is dropped later.
        self.span = tracing::Span::none();
    }

    /// The [`RequestReport`] of the request ending at `now`.
    fn report(&self, kind: EndKind, now: Instant) -> RequestReport {
        RequestReport {
            method: self.method.clone(),
            url: self.url.clone(),
            started: self.state.started,
            status: self.status,
            error_type: self.error_type.clone(),
            time_to_first_byte: self
                .headers_at
                .map(|h| h.saturating_duration_since(self.state.started)),
            total: now.saturating_duration_since(self.state.started),
            body_size: self.body_size,
            body_complete: kind == EndKind::Complete,
            connection: self.connection.as_ref().map(|(u, _)| u.clone()),
        }
    }
}

impl RequestEnd {
    /// The connection carries no request any more (HTTP/1.1: its response
    /// ended; HTTP/2: its last open stream did): it goes back to the pool,
    /// unless the client's idle pool for the host is full, in which case
    /// hyper-util closes it. That stays a belief (the release order hyper
    /// saw may differ) until the kernel confirms it or a response proves it
    /// wrong.
    fn released_to_pool(&self, record: &ConnectionRecord, now: Instant) {
        if record.in_use() == 0
            && let Some(host) = &record.host
        {
            self.inner.pools.on_released(host, record, now);
        }
    }

    fn record_metrics(&self, now: Instant) {
        let metrics = &self.inner.metrics;
        metrics.active_requests.add(-1, &self.base_attributes);
        self.inner.load.request_ended(&self.state.host);
        let mut attributes = self.base_attributes.clone();
        if let Some(status) = self.status {
            attributes.push(KeyValue::new(
                semconv::HTTP_RESPONSE_STATUS_CODE,
                i64::from(status),
            ));
        }
        if let Some(e) = &self.error_type {
            attributes.push(KeyValue::new(semconv::ERROR_TYPE, e.clone()));
        }
        if let Some(v) = self.protocol_version {
            attributes.push(KeyValue::new(semconv::NETWORK_PROTOCOL_VERSION, v));
        }
        if let Some((usage, _)) = &self.connection {
            attributes.push(KeyValue::new(semconv::HTTP_CONNECTION_REUSED, usage.reused));
        }
        metrics.request_duration.record(
            now.saturating_duration_since(self.state.started)
                .as_secs_f64(),
            &attributes,
        );
    }
}

impl Drop for RequestEnd {
    fn drop(&mut self) {
        self.finish(EndKind::Dropped);
    }
}
