//! The end of a request's life: [`RequestEnd`], the guard that records
//! the outcome once (response read to its end, failure, drop), the miss
//! reason that waited on the kernel, and the request's [`RequestReport`].

use std::sync::Arc;
use std::time::Instant;

use opentelemetry::KeyValue;
use opentelemetry::trace::Status;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use crate::export::report::{ConnectionUse, DecidingMiss, RequestReport};
use crate::handle::Inner;
use crate::miss::{ConnectionEnd, MissReason};
use crate::pool::record::ConnectionRecord;
use crate::pool::slot::MissSlot;
use crate::request::attribution::{add_pool_advice_event, record_miss};
use crate::request::failure::{attribute_failure, ended_by_server, server_end_of_failure};
use crate::request::put_back::PutBackBound;
use crate::request::stall_evidence::ask_kernel_evidence;
use crate::request::state::{Fate, RequestState};
use crate::semconv;

/// How many attributes [`RequestEnd`]'s `base_attributes` start with.
pub(crate) const BASE_ATTRIBUTES: usize = 4;

/// Everything needed to end a request: held by the middleware until the
/// response headers, then by the response body until its end or drop.
/// Dropping it unfinished ends the request as cancelled.
pub(crate) struct RequestEnd {
    pub(crate) inner: Arc<Inner>,
    pub(crate) state: Arc<RequestState>,
    pub(crate) span: tracing::Span,
    pub(crate) method: http::Method,
    /// `url.full`, redacted (shared with the span's attribute); empty when
    /// neither a span nor a report wants it.
    pub(crate) url: Arc<str>,
    pub(crate) headers_at: Option<Instant>,
    pub(crate) status: Option<u16>,
    pub(crate) error_type: Option<String>,
    pub(crate) connection: Option<(ConnectionUse, Arc<ConnectionRecord>)>,
    /// A failed request: the connection it was sent on, as its span names
    /// it ([`attribute_failure`]); it served no response.
    pub(crate) failed_on: Option<ConnectionUse>,
    pub(crate) body_size: u64,
    /// When the latest bytes of the response body were read.
    pub(crate) body_progress_at: Option<Instant>,
    /// The longest pause between the response's headers and its body's
    /// bytes, or between two reads of them, so far: how the transfer
    /// flowed (see [`note_body_progress`](Self::note_body_progress)).
    longest_body_pause: std::time::Duration,
    /// When hyper may have finished reading the response, as the body's
    /// reads show: where hyper-util's idle clock may have started.
    pub(crate) put_back: PutBackBound,
    /// A response body that timed out, held (unread) until the kernel has
    /// looked at its socket: see [`hold_until_kernel_answers`](Self::hold_until_kernel_answers).
    held_body: Option<Box<dyn Send + Sync>>,
    /// Redirect hops sent before this request for the same call.
    pub(crate) resend_count: u32,
    /// `network.protocol.version` of the response.
    pub(crate) protocol_version: Option<&'static str>,
    /// The miss whose reason was not known when the response arrived
    /// (this request's, or an HTTP/2 waiter's connection's), or the miss of
    /// a request that failed before a response or whose redirect the limit
    /// refused: its reason is recorded at the end (see
    /// [`attribute_response`]).
    ///
    /// [`attribute_response`]: crate::request::attribution::attribute_response
    pub(crate) miss_deferred: Option<MissSlot>,
    /// A request that failed with no connection to name after it missed:
    /// its miss reason, for its report
    /// ([`RequestReport::failed_miss_reason`]).
    failed_miss_reason: Option<MissReason>,
    /// The span records (an OpenTelemetry span, sampled): span attributes
    /// are built only then. Default: `true`.
    pub(crate) recording: bool,
    /// `http.request.method`, `server.address`, `server.port`, `url.scheme`
    /// ([`BASE_ATTRIBUTES`]), then the end's at the end.
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
        url: Arc<str>,
    ) -> Self {
        // Room for the method here and the four `record_metrics` adds at
        // the end: one allocation for both.
        let mut base_attributes = Vec::with_capacity(BASE_ATTRIBUTES + 4);
        base_attributes.extend(state.host.attributes());
        base_attributes.push(KeyValue::new(
            semconv::HTTP_REQUEST_METHOD,
            crate::request::method::method_attribute(&method),
        ));
        inner.metrics.active_requests.add(1, &base_attributes);
        if !inner.load.request_started(&state.host, state.started) {
            inner.note_untracked(&span, &state.host, semconv::UNTRACKED_POOL_ADVICE);
        }
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
            failed_on: None,
            body_size: 0,
            body_progress_at: None,
            longest_body_pause: std::time::Duration::ZERO,
            put_back: PutBackBound::default(),
            held_body: None,
            protocol_version: None,
            resend_count: 0,
            miss_deferred: None,
            failed_miss_reason: None,
            recording: true,
            base_attributes,
            finished: false,
        }
    }

    /// Body bytes were read at `now`: the pause since the previous ones
    /// (or the headers) counts toward the longest so far.
    pub(crate) fn note_body_progress(&mut self, now: Instant) {
        if let Some(previous) = self.body_progress_at.or(self.headers_at) {
            self.longest_body_pause = self
                .longest_body_pause
                .max(now.saturating_duration_since(previous));
        }
        self.body_progress_at = Some(now);
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

    /// Keeps `body`, the response body that timed out, until the kernel
    /// has answered about its socket ([`finish`](Self::finish) asks): hyper
    /// closes an HTTP/1.1 connection (h2 resets the stream) when the body
    /// is dropped, which the caller does as soon as it has the error; a
    /// kernel asked after that close would describe our own close
    /// (`fin_wait*`, no `tcp_info`), not the stall. The caller does not
    /// wait: the socket is closed at most the kernel's answer later.
    pub(crate) fn hold_until_kernel_answers(&mut self, body: Box<dyn Send + Sync>) {
        self.held_body = Some(body);
    }

    /// Ends the request once: releases the connection to the registry's
    /// view, records the body size and hands the report to the callback.
    pub(crate) fn finish(&mut self, kind: EndKind) {
        if self.finished {
            return;
        }
        self.finished = true;
        let now = Instant::now();
        let held_body = self.held_body.take();
        if self.headers_at.is_none() {
            if kind == EndKind::Dropped {
                // Its future was dropped while the response was owed (e.g.
                // `tokio::time::timeout`): it gave up on its response as a
                // reqwest timeout does, and names the connection it was
                // sent on the same way.
                let none = tracing::Span::none();
                self.failed_on = attribute_failure(
                    &self.inner,
                    &self.state,
                    if self.recording { &self.span } else { &none },
                    semconv::ERROR_TYPE_CANCELLED,
                    true,
                    // Dropped: no error to read the connection from.
                    Default::default(),
                );
                self.fail(
                    semconv::ERROR_TYPE_CANCELLED,
                    "request dropped before its response arrived".to_owned(),
                );
            }
            let _ = self.state.finish(Fate::NoResponse, None);
            // It missed the pool (triggered a connect) and failed before a
            // response: still a miss, recorded below with its failure.
            self.miss_deferred = self.state.miss();
        } else if self.recording {
            self.span
                .set_attribute(semconv::HTTP_RESPONSE_BODY_SIZE, self.body_size as i64);
        }
        if let Some(slot) = self.miss_deferred.take() {
            // Recorded when the kernel answers (at once if it has): the span
            // stays open until then (its end waits, the caller does not), and
            // a flush waits for it like for `tcp.connect`.
            let span = if self.recording {
                self.span.clone()
            } else {
                tracing::Span::none()
            };
            let (inner, state) = (self.inner.clone(), self.state.clone());
            let idle_limit = self
                .connection
                .as_ref()
                .and_then(|(_, record)| record.client.idle_limit());
            let pending = crate::export::pending::PendingEnd::new();
            // The connection it was served on, or, failed, the one its
            // span names.
            let served_by = self
                .connection
                .as_ref()
                .map(|(usage, _)| usage)
                .or(self.failed_on.as_ref())
                .map(|usage| (usage.id, usage.request_count));
            // A request that failed before its response: its miss is
            // counted with its `error.type`, and gets no pool advice (the
            // advice weighs responses).
            let failed = self
                .headers_at
                .is_none()
                .then(|| self.error_type.clone())
                .flatten();
            let answered = self.connection.is_some();
            // The report's reason is the one the span records, whenever
            // that is (after the kernel's answer, maybe after responses in
            // flight too); until then the fallback, as the span's would be.
            let fallback = served_by.map_or(slot.get(), |(id, n)| slot.get().served_by(id, n));
            let deciding = DecidingMiss::new((!fallback.untracked).then_some(fallback.reason));
            let late = deciding.late();
            // The kernel's answer comes on the kernel view's thread: a wait
            // for responses in flight then runs on the request's runtime,
            // when that has worker threads (a current-thread runtime runs a
            // task only while its owner awaits: the span's end would wait on
            // the application; there the reason is recorded at once).
            let runtime = tokio::runtime::Handle::try_current()
                .ok()
                .filter(|r| r.runtime_flavor() != tokio::runtime::RuntimeFlavor::CurrentThread);
            // The span may close there: its parents close through the
            // thread's default subscriber (tracing-subscriber's registry),
            // which must be the request's (a scoped one is not the kernel
            // thread's).
            let dispatch = tracing::dispatcher::get_default(|d| d.clone());
            slot.when_settled(move |miss| {
                let _default = tracing::dispatcher::set_default(&dispatch);
                let miss = served_by.map_or(miss, |(id, n)| miss.served_by(id, n));
                let runtime = runtime.as_ref();
                // The report's side was handed out with `deciding`.
                let _ = record_miss(
                    &inner,
                    &state,
                    &span,
                    &miss,
                    Some(deciding),
                    runtime,
                    failed.as_deref(),
                );
                // Forced only now that the reason is known.
                if answered
                    && miss.reason == MissReason::AllBusy
                    && !miss.untracked
                    && let Some(advice) =
                        inner
                            .load
                            .on_response(&state.host, idle_limit, true, Instant::now())
                {
                    add_pool_advice_event(&span, &advice);
                }
                // The span ends first: a flush waiting for the pending ends
                // then finds it exported.
                drop(span);
                drop(pending);
            });
            // The report gets what is known now: the span's reason or,
            // when it is not recorded yet, the fallback.
            let usage = match &mut self.connection {
                Some((usage, _)) => Some(usage),
                None => self.failed_on.as_mut(),
            };
            if let Some(usage) = usage {
                match late.get() {
                    Some(reason) => usage.miss_reason = reason,
                    None => {
                        usage.miss_reason = (!fallback.untracked).then_some(fallback.reason);
                        usage.settling = Some(late);
                    }
                }
            } else {
                // Failed with no connection to name: the report keeps the
                // reason its span records (as known now).
                self.failed_miss_reason = late
                    .get()
                    .unwrap_or((!fallback.untracked).then_some(fallback.reason));
            }
        }
        if let Some((_, record)) = &self.connection {
            record.give_back();
            match kind {
                // `Connection: close`: hyper closes it after this response.
                // Released (and closed) once hyper had read the response,
                // which a caller reading the body late follows: the
                // previous connection's idle time counts from there.
                EndKind::Complete | EndKind::Dropped
                    if !record.http2() && record.said_connection_close() =>
                {
                    let put_back_from = self.put_back.earliest(self.headers_at, now);
                    record.mark_released_put_back_from(now, put_back_from);
                    record.set_end(record.announced_close_end());
                    self.inner.connection_closed(record, now);
                }
                // HTTP/1.1: hyper-util put it back once hyper had read the
                // response, which a caller reading the body late follows.
                EndKind::Complete => {
                    let put_back_from = if record.http2() {
                        now
                    } else {
                        self.put_back.earliest(self.headers_at, now)
                    };
                    record.mark_released_put_back_from(now, put_back_from);
                    self.released_to_pool(record, now);
                }
                EndKind::Failed => self.body_failed(record, now, held_body),
                // An HTTP/1.1 body dropped before its end: hyper closes the
                // connection unless it had already read the whole body, in
                // which case the connection is back in the pool already. Not
                // known here: a later response on it, or a miss (`discarded`)
                // or the kernel, tells.
                EndKind::Dropped if !record.http2() => {
                    record.mark_dropped_early(now);
                    self.released_to_pool(record, now);
                }
                // HTTP/2 dropped early: h2 resets the stream (RST_STREAM
                // CANCEL) unless END_STREAM had arrived with data left
                // unread, which hyper does not expose (`is_end_stream` is
                // true only once that data is read too): counted as a
                // possible reset. The connection lives on.
                EndKind::Dropped => {
                    self.count_stream_reset(record);
                    record.mark_released(now);
                    self.released_to_pool(record, now);
                }
            }
        }
        self.record_metrics(now);
        if let Some(callback) = &self.inner.on_request_end {
            callback.on_request_end(&self.report(kind, now));
        }
        // tracing-opentelemetry (0.34) stamps a span's end at its last
        // exit, which was when the headers arrived: enter it once more so
        // the exported end is now (the end of the body). Then release our
        // handle so the span closes now, not when the response is dropped.
        // A span that does not record exports nothing: no enter.
        if self.recording {
            self.span.in_scope(|| ());
        }
        self.span = tracing::Span::none();
    }

    /// The [`RequestReport`] of the request ending at `now`.
    fn report(&self, kind: EndKind, now: Instant) -> RequestReport {
        RequestReport {
            method: self.method.clone(),
            url: self.url.to_string(),
            started: self.state.started,
            status: self.status,
            error_type: self.error_type.clone(),
            time_to_first_byte: self
                .headers_at
                .map(|h| h.saturating_duration_since(self.state.started)),
            total: now.saturating_duration_since(self.state.started),
            body_size: self.headers_at.map(|_| self.body_size),
            body_complete: kind == EndKind::Complete,
            connection: self
                .connection
                .as_ref()
                .map(|(u, _)| u.clone())
                .or_else(|| self.failed_on.clone()),
            resend_count: self.resend_count,
            connects: self.state.connects(),
            protocol_version: self.protocol_version,
            failed_connect: self.state.failed_connect(),
            failed_miss_reason: self.failed_miss_reason,
        }
    }
}

impl RequestEnd {
    /// The response body failed (`error_type` recorded): what that did to
    /// its connection. The server ended it (HTTP/1.1: a FIN mid-body,
    /// `incomplete_body`, or a reset; HTTP/2: GOAWAY, a connection
    /// error): `peer_fin` / `peer_reset` / `goaway` / `http2_error`, not the
    /// client's doing. A timeout: HTTP/1.1 gave up on a response still
    /// owed, hyper closes the connection (`abandoned`, row 5c), and for
    /// either version the kernel's view of the socket lands on the span, as
    /// for a timeout before the headers. Any other failure (say, a body
    /// reqwest could not decode) drops an HTTP/1.1 body unread:
    /// `discarded`. HTTP/2 without a server end: the stream ended, the
    /// connection lives on.
    fn body_failed(
        &self,
        record: &Arc<ConnectionRecord>,
        now: Instant,
        held_body: Option<Box<dyn Send + Sync>>,
    ) {
        let error_type = self.error_type.as_deref().unwrap_or_default();
        let timed_out = error_type == semconv::ERROR_TYPE_TIMEOUT;
        let http2 = record.http2();
        if let Some(end) = server_end_of_failure(error_type, http2) {
            // Its response ended there, as far as the pool goes (the pool
            // had been warm). Not for a GOAWAY: a response ending at it
            // would date it as the server's request limit, which lets the
            // streams it covers finish (this one it cut short).
            if end != ConnectionEnd::GoAway {
                record.mark_released(now);
            }
            ended_by_server(&self.inner, record, end, now);
        } else if timed_out && !http2 {
            record.mark_released(now);
            record.set_end(ConnectionEnd::Abandoned);
            self.inner.connection_closed(record, now);
        } else if !http2 {
            record.mark_discarded(now);
            self.inner.connection_closed(record, now);
        } else {
            // HTTP/2 without a server end (a timeout, a body reqwest could
            // not decode): the body is dropped unfinished, so h2 resets its
            // stream (RST_STREAM CANCEL), as for a body dropped early (a
            // tester: timed-out bodies counted no reset, nginx logged each
            // stream cut).
            self.count_stream_reset(record);
            record.mark_released(now);
            self.released_to_pool(record, now);
        }
        if timed_out {
            // Nothing arrived for the body since its last bytes (or the
            // headers): a kernel that saw nothing either shows a stall,
            // when that silence is more than twice the longest pause the
            // transfer had before. A flowing transfer pauses between its
            // bursts (a rate-limited download, a trickle): a deadline
            // landing in such a pause is no stall (a tester: nginx still
            // sending at `limit_rate 1m` read stalled, 6 of 6 runs, on a
            // 30 ms pause of a 500 ms wait), while a transfer that flowed
            // and then went silent is one (`read_timeout` fires on such a
            // silence; a rule weighing it against the whole body's time
            // missed it, a tester: 3 of 3).
            let quiet_since = self.body_progress_at.or(self.headers_at);
            let quiet = quiet_since
                .map(|t| now.saturating_duration_since(t))
                .filter(|quiet| *quiet > self.longest_body_pause * 2)
                .map(crate::request::stall_evidence::Quiet::plain);
            ask_kernel_evidence(
                &self.inner,
                self.span.clone(),
                Arc::clone(record),
                quiet,
                held_body,
            );
        }
    }

    /// HTTP/2: this request's stream was (or may have been) reset by h2 as
    /// its body was dropped unfinished: counted on `record`
    /// (`http.connection.stream_resets` of later requests), with the
    /// `http.connection.stream_reset` event on this request's span.
    fn count_stream_reset(&self, record: &ConnectionRecord) {
        let resets = record.count_stream_reset();
        self.span.add_event(
            semconv::EVENT_STREAM_RESET,
            vec![KeyValue::new(
                semconv::HTTP_CONNECTION_STREAM_RESETS,
                resets as i64,
            )],
        );
    }

    /// The connection carries no request any more (HTTP/1.1: its response
    /// ended; HTTP/2: its last open stream did): it goes back to the pool,
    /// unless the client's idle pool for the host is full, in which case
    /// hyper-util closes it. That stays a belief (the release order hyper
    /// saw may differ) until the kernel confirms it or a response proves it
    /// wrong.
    fn released_to_pool(&self, record: &Arc<ConnectionRecord>, now: Instant) {
        if record.in_use() == 0
            && let Some(host) = &record.host
        {
            let release = self.inner.pools.on_released(
                host,
                record,
                now,
                self.state.started,
                self.inner.load.in_flight(&self.state.host),
            );
            self.inner.confirm_unsure_release(record);
            for other in &release.made_unsure {
                self.inner.confirm_unsure_release(other);
            }
        }
    }

    fn record_metrics(&mut self, now: Instant) {
        let metrics = &self.inner.metrics;
        metrics.active_requests.add(-1, &self.base_attributes);
        self.inner
            .load
            .request_ended(&self.state.host, self.state.started);
        // The end's attributes go after the base ones, in the room left
        // for them (no allocation; nothing reads the base ones after this).
        let attributes = &mut self.base_attributes;
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
            attributes,
        );
    }
}

impl Drop for RequestEnd {
    fn drop(&mut self) {
        self.finish(EndKind::Dropped);
    }
}
