//! Pool attribution of one response, and the end of a request's life: the
//! facts that land on the request span and in its [`RequestReport`].

use std::sync::Arc;
use std::time::{Duration, Instant};

use hyper_util::client::legacy::connect::HttpInfo;
use opentelemetry::KeyValue;
use opentelemetry::trace::Status;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use crate::export::clock::secs;
use crate::export::report::{ConnectionUse, DecidingMiss, LateMissReason, RequestReport};
use crate::handle::Inner;
use crate::kernel::{KernelLookup, SocketEnd};
use crate::miss::{ConnectionEnd, MissReason};
use crate::pool::host::HostKey;
use crate::pool::registry::ConnectionRecord;
use crate::pool::slot::Miss;
use crate::request::pending_setup::SetupReason;
use crate::request::state::{Fate, RequestState};
use crate::semconv;

/// Attributes `response` to the connection that carried it and records the
/// pool attributes on `span`. Returns `None` when the connection is unknown
/// to this handle (or, for a response with no `HttpInfo`, over a local
/// transport, not the only one that could have carried it). The response's
/// version and headers tell `HTTP/1.0`, `Connection: close` and
/// `Keep-Alive: timeout=N`; `attributes`, the response's own span
/// attributes, are set with the connection's in one call.
///
/// Never waits: when this request's miss reason still waits on the kernel's
/// answer (was the idle connection closed by the server?), `miss_deferred`
/// is set and the reason is recorded when the request ends
/// ([`RequestEnd::finish`]).
pub(crate) fn attribute_response(
    inner: &Arc<Inner>,
    state: &RequestState,
    span: &tracing::Span,
    response: &reqwest::Response,
    mut attributes: Vec<KeyValue>,
    miss_deferred: &mut bool,
) -> Option<(ConnectionUse, Arc<ConnectionRecord>)> {
    let info = response.extensions().get::<HttpInfo>();
    let (version, headers) = (response.version(), response.headers());
    let recording = !span.is_none();
    let record = match info {
        Some(info) => {
            let (local, remote) = (info.local_addr(), info.remote_addr());
            if recording {
                attributes.reserve(9);
                attributes.extend(socket_attributes(local, remote));
            }
            inner
                .registry
                .get(local, remote)
                .ok_or(semconv::UNTRACKED_CONNECTION_REGISTRY)
        }
        // No socket addresses: a local transport (reqwest's `unix_socket`).
        // Its connection is known only when it was the only one free.
        None => inner
            .pools
            .sole_free_local_connection(&state.host)
            .ok_or(semconv::UNTRACKED_LOCAL_TRANSPORT),
    };
    let record = match record {
        Ok(record) => record,
        Err(table) => {
            set_attributes(span, attributes);
            // Every connection of an instrumented client went through the
            // connector layer: one the registry lacks was refused at its
            // cap (or closed before the registry's most recent closes).
            inner.note_untracked(span, &state.host, table);
            let _ = state.finish(Fate::NoResponse);
            return None;
        }
    };
    // In use first, its count last: a miss classified meanwhile either
    // sees it busy, or sees its count grow before the kernel's answer about
    // it is applied (`decide_from_kernel`), so a close announced by this
    // response is never read as the kernel's news.
    record.take();
    // A response arrived: the pool had kept the connection whatever we
    // believed (an early-dropped body, the idle limit), and it is not stalled.
    record.mark_alive();
    if record.clear_over_idle_limit() {
        // Believed closed at its release over the idle limit, yet kept: a
        // connection counted idle then was not in the pool's idle list.
        inner.recheck_believed_idle(&record);
    }
    // Counted before its close is announced: a miss that reads the close
    // names it with this request counted.
    let request_count = record.count_request(state.started);
    // A `Connection: close` either side sent ends an HTTP/1.1 connection
    // with this response (RFC 9112 §9.6); whose it was names the fix.
    let asked_close = state.asked_close(&record.client);
    record
        .set_connection_close(!record.http2() && (asked_close || server_closes(version, headers)));
    record.set_client_asked_close(asked_close);
    let start = state.started;
    let ready = record.ready_at();
    // The end of the previous response on the connection (or its ready time).
    let last_quiet = record.last_activity();
    // When the connection was free for this request: ready, and for HTTP/1.1
    // (one request at a time) also released by the previous response.
    let available = if record.http2() { ready } else { last_quiet };
    let reused = ready <= start;
    // A request that never called the connector got its connection from
    // hyper-util's pool at once (an idle hit), even where our release time
    // is later: hyper-util returns a connection whose body it has read
    // before the caller has read it.
    // A miss that named this very connection as ended was wrong about it
    // (it came back to this request's checkout): said as it was.
    let own_miss = state
        .miss()
        .map(|m| m.get().served_by(record.id(), request_count));
    let idle_hit = reused && own_miss.is_none();
    // An HTTP/1.1 connection serving again went through the pool (an idle
    // hit, or handed to a waiting checkout): the pool is on.
    if (idle_hit || request_count > 1) && !record.http2() && !record.client.max_idle_known {
        record.client.inferred.note_reuse();
    }
    let wait = if idle_hit {
        Duration::ZERO
    } else {
        available.saturating_duration_since(start)
    };
    // Idle since the connection last finished a response (or became ready).
    // For HTTP/2 other streams may still have been open at that moment.
    let idle = (idle_hit || (reused && available <= start))
        .then(|| start.saturating_duration_since(last_quiet));
    let age = start.saturating_duration_since(ready);
    let paid = record.trigger_id == Some(state.id);
    if !paid {
        record.mark_shared();
    }
    let now = Instant::now();
    if let Some(batch) = &state.batch {
        batch.record(reused, wait);
    }
    // Not an idle hit: say why. A request that triggered a connect carries
    // that connect's miss (even when a freed connection served it first);
    // one served by a connection set up for another request (HTTP/2
    // waiters) carries that connection's miss.
    *miss_deferred = state.miss().is_some_and(|m| !m.is_settled());
    let miss = (!idle_hit).then(|| {
        own_miss
            .or_else(|| record.miss.as_ref().map(|m| m.get()))
            .unwrap_or(Miss::new(MissReason::Cold))
    });
    let mut miss_reason = miss.filter(|m| !m.untracked).map(|m| m.reason);

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
    // A reason recorded later (responses to the host in flight) reaches
    // the report through `settling`.
    let settling = match miss {
        Some(miss) if !*miss_deferred => match record_miss(inner, state, span, &miss, None, None) {
            // The report says what the span says (an HTTP/2 `closed_by_peer`
            // read again as `request_limit`, say).
            MissRecorded::Now(recorded) => {
                miss_reason = recorded;
                None
            }
            MissRecorded::Later(late) => Some(late),
        },
        // An idle hit: no reason of its own (a setup span it held, not
        // expected, carries its own).
        None => {
            state.miss_recorded(None);
            None
        }
        Some(_) => None,
    };
    record_server_keep_alive(span, &record, headers);
    if reused && record.is_dns_stale() {
        span.set_attribute(semconv::HTTP_CONNECTION_DNS_STALE, true);
    }
    let resets = record.stream_resets();
    if resets > 0 {
        span.set_attribute(semconv::HTTP_CONNECTION_STREAM_RESETS, resets as i64);
    }
    // A reason still waiting for the kernel is counted as forced, with its
    // advice event, when it settles (`RequestEnd::finish`).
    if let Some(advice) = inner.load.on_response(
        &state.host,
        record.client.idle_limit(),
        miss_reason == Some(MissReason::AllBusy) && !*miss_deferred,
        now,
    ) {
        add_pool_advice_event(span, &advice);
    }
    if !paid && recording {
        span.add_link_with_attributes(
            record.setup_span(),
            vec![
                KeyValue::new(semconv::HTTP_CONNECTION_ID, record.id() as i64),
                KeyValue::new(semconv::HTTP_CONNECTION_WAIT_TIME, secs(wait)),
            ],
        );
    }
    for unused in state.finish(Fate::ServedBy {
        connection_id: record.id(),
        http2: record.http2(),
    }) {
        let release = inner
            .pools
            .on_pooled_unused(&unused, now, inner.load.in_flight(&state.host));
        inner.confirm_unsure_release(&unused);
        for other in &release.made_unsure {
            inner.confirm_unsure_release(other);
        }
    }
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
        settling,
    };
    Some((usage, record))
}

/// `network.peer.address`, `network.peer.port` and `network.local.port` of
/// the socket `local` -> `remote`.
fn socket_attributes(local: std::net::SocketAddr, remote: std::net::SocketAddr) -> [KeyValue; 3] {
    [
        KeyValue::new(semconv::NETWORK_PEER_ADDRESS, ip_text(remote.ip())),
        KeyValue::new(semconv::NETWORK_PEER_PORT, i64::from(remote.port())),
        KeyValue::new(semconv::NETWORK_LOCAL_PORT, i64::from(local.port())),
    ]
}

/// `ip` as text, in one allocation (`to_string` grows its string as the
/// parts are written): 39 bytes hold any IPv6 address.
fn ip_text(ip: std::net::IpAddr) -> String {
    use std::fmt::Write as _;
    let mut text = String::with_capacity(39);
    let _ = write!(text, "{ip}");
    text
}

/// The `pool.advice` event on a request span that missed because every
/// connection was busy while the pool was too small (see
/// [`PoolAdvice`](crate::PoolAdvice)).
fn add_pool_advice_event(span: &tracing::Span, advice: &crate::PoolAdvice) {
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
                semconv::HTTP_CONNECTION_POOL_LIMITS,
                advice.idle_limit_source(),
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

/// What [`record_miss`] did with a miss's reason, for the request's report.
enum MissRecorded {
    /// Recorded now: the reason the span got (`None`: none, the host
    /// untracked). It can differ from the miss's own: an HTTP/2 previous
    /// connection's `closed_by_peer` is read again as it is recorded.
    Now(Option<MissReason>),
    /// Recorded once the responses in flight are counted: the report's
    /// side of it.
    Later(Arc<LateMissReason>),
}

/// The miss reason on the span and the misses counter; the previous
/// connection, when one caused the miss. `deciding`, the report's reason
/// when the request has ended already, is decided with the reason the span
/// records. Returns the reason recorded, or, when that is recorded later
/// (below), the report's side of it (a new one if none was given).
/// `runtime` is the request's, for a miss recorded off it (the kernel
/// view's thread); else the current one.
fn record_miss(
    inner: &Arc<Inner>,
    state: &RequestState,
    span: &tracing::Span,
    miss: &Miss,
    deciding: Option<DecidingMiss>,
    runtime: Option<&tokio::runtime::Handle>,
) -> MissRecorded {
    if miss.untracked {
        // The host is not in the pool history: no reason is known.
        inner.note_untracked(span, &state.host, semconv::UNTRACKED_POOL_HISTORY);
        if let Some(deciding) = deciding {
            deciding.decide(None);
        }
        state.miss_recorded(None);
        return MissRecorded::Now(None);
    }
    if let Some(source) = miss.limits {
        span.set_attribute(semconv::HTTP_CONNECTION_POOL_LIMITS, source.as_str());
    }
    if let Some(timeout) = miss.inferred_idle_timeout {
        span.set_attribute(semconv::HTTP_CONNECTION_CLIENT_IDLE_TIMEOUT, secs(timeout));
    }
    // An HTTP/2 previous connection the server ended (GOAWAY) while
    // requests to the host are in flight without an attributed response:
    // the GOAWAY comes with the request that reached the server's limit,
    // before its response, so responses on it may still be on their way to
    // their requests. They date the GOAWAY (it came while the connection
    // was serving: `request_limit`) and count in `previous.request_count`,
    // so the reason is recorded once none is left unattributed, at most
    // `RESPONSE_IN_FLIGHT_WAIT` later. Only the span's end waits (a flush
    // waits for it), never a request.
    let ended = miss
        .previous
        .and_then(|p| inner.pools.ended_http2(&state.host, &p));
    let unattributed = {
        let (inner, host) = (Arc::clone(inner), state.host.clone());
        move || inner.pools.unattributed(&host, inner.load.in_flight(&host))
    };
    let runtime = match &ended {
        Some(_) if unattributed() > 0 => runtime
            .cloned()
            .or_else(|| tokio::runtime::Handle::try_current().ok()),
        _ => None,
    };
    let runtime = match runtime {
        Some(runtime) => runtime,
        // Nothing to wait for (or no runtime to wait on): now.
        None => {
            let reason = record_reason(inner, &state.host, span, miss, ended.as_deref());
            if let Some(deciding) = deciding {
                deciding.decide(Some(reason));
            }
            state.miss_recorded(Some(reason));
            return MissRecorded::Now(Some(reason));
        }
    };
    let deciding = deciding.unwrap_or_else(|| DecidingMiss::new(Some(miss.reason)));
    let late = deciding.late();
    let later = RecordedWhenDropped {
        inner: Arc::clone(inner),
        host: state.host.clone(),
        dispatch: tracing::dispatcher::get_default(|d| d.clone()),
        span: span.clone(),
        miss: *miss,
        ended,
        deciding: Some(deciding),
        setup_reason: state.setup_reason(),
        _pending: crate::export::pending::PendingEnd::new(),
    };
    let deadline = Instant::now() + crate::pool::kernel_decision::RESPONSE_IN_FLIGHT_WAIT;
    runtime.spawn(async move {
        while unattributed() > 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        drop(later);
    });
    MissRecorded::Later(late)
}

/// A miss whose reason waits for responses in flight ([`record_miss`]):
/// recorded, and the report's reason decided, when this is dropped: after
/// the wait, or at once when its task is dropped unfinished (its runtime
/// shut down), so the span always gets its reason.
struct RecordedWhenDropped {
    inner: Arc<Inner>,
    host: HostKey,
    /// The request's default subscriber: the span may close on a runtime
    /// worker, and its parents close through that thread's default.
    dispatch: tracing::Dispatch,
    span: tracing::Span,
    miss: Miss,
    ended: Option<Arc<ConnectionRecord>>,
    deciding: Option<DecidingMiss>,
    /// The request's setup spans held for the reason.
    setup_reason: Arc<SetupReason>,
    /// Dropped after `span` (fields drop in order): a flush waiting for
    /// the pending ends then finds the span exported.
    _pending: crate::export::pending::PendingEnd,
}

impl Drop for RecordedWhenDropped {
    fn drop(&mut self) {
        let _default = tracing::dispatcher::set_default(&self.dispatch);
        let reason = record_reason(
            &self.inner,
            &self.host,
            &self.span,
            &self.miss,
            self.ended.as_deref(),
        );
        if let Some(deciding) = self.deciding.take() {
            deciding.decide(Some(reason));
        }
        self.setup_reason.record(Some(reason));
        // Closed under the request's subscriber (see `dispatch`).
        drop(std::mem::replace(&mut self.span, tracing::Span::none()));
    }
}

/// The miss reason, the previous connection and the misses counter, once
/// the responses `ended` (an HTTP/2 previous connection the server ended)
/// carried are counted: they may date its GOAWAY at its last response
/// (`request_limit`), and its count is as read now (at least as at the
/// miss). Returns the reason recorded.
fn record_reason(
    inner: &Inner,
    host: &HostKey,
    span: &tracing::Span,
    miss: &Miss,
    ended: Option<&ConnectionRecord>,
) -> MissReason {
    let decided = ended.map_or(miss.reason, |record| {
        crate::pool::losses::ended_http2_reason(record, miss.reason)
    });
    let reason = decided.as_str();
    span.set_attribute(semconv::HTTP_CONNECTION_MISS_REASON, reason);
    if let Some(previous) = &miss.previous {
        span.set_attribute(semconv::HTTP_CONNECTION_PREVIOUS_ID, previous.id as i64);
        span.set_attribute(
            semconv::HTTP_CONNECTION_PREVIOUS_IDLE_TIME,
            secs(previous.idle),
        );
        let count = ended.map_or(previous.request_count, |record| {
            record
                .requests
                .load(std::sync::atomic::Ordering::Relaxed)
                .max(previous.request_count)
        });
        span.set_attribute(
            semconv::HTTP_CONNECTION_PREVIOUS_REQUEST_COUNT,
            count as i64,
        );
        if let Some(end) = inner.pools.previous_end(host, previous) {
            span.set_attribute(semconv::HTTP_CONNECTION_PREVIOUS_END, end.as_str());
        }
    }
    let mut attributes = Vec::with_capacity(5);
    attributes.extend(host.attributes());
    attributes.push(KeyValue::new(semconv::HTTP_CONNECTION_MISS_REASON, reason));
    if let Some(source) = miss.limits {
        attributes.push(KeyValue::new(
            semconv::HTTP_CONNECTION_POOL_LIMITS,
            source.as_str(),
        ));
    }
    inner.metrics.pool_misses.add(1, &attributes);
    decided
}

/// Whether an HTTP/1.x response says the server closes the connection after
/// it: `Connection: close` (RFC 9112 §9.6), or an HTTP/1.0 response without
/// `Connection: keep-alive` (RFC 9112 §9.3; hyper's client parser decides
/// keep-alive the same way, so hyper does not pool that connection).
fn server_closes(version: http::Version, headers: &http::HeaderMap) -> bool {
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
fn keep_alive_timeout(headers: &http::HeaderMap) -> Option<Duration> {
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
fn record_server_keep_alive(
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

/// A request failed. When a connection existed that carried it, names it on
/// `span`: the one its own connect made (if that succeeded), else the
/// HTTP/2 connection it was multiplexed onto, else the HTTP/1.1 connection
/// hyper-util would have handed out (the host's most recently released idle
/// one); for an HTTP/2 error with none of those found, the host's latest
/// HTTP/2 connection. Sets `http.connection.reused`, `.id`, `.idle_time`,
/// its socket's `network.peer.address`, `network.peer.port` and
/// `network.local.port` (as a response on it would), and a link to
/// its setup span; records how the failure ended the connection
/// (`connection_reset`, HTTP/2 GOAWAY or connection error; an HTTP/1.1
/// request that gave up on its response abandons it, `abandoned`); and asks the
/// kernel for the socket's state (unacknowledged data, time since the last
/// receive, retransmits), which lands on the span when the answer arrives
/// (the span ends then, within milliseconds; the request does not wait).
/// A request that gave up on its response (`timeout`: reqwest's own
/// deadline; `cancelled`: its future was dropped, e.g. by
/// `tokio::time::timeout`) had been sent on the connection: it counts in
/// the connection's request count (`http.connection.request_count`, set
/// on the span), as the server counted it. Unless it was given up
/// unwritten: its future (`dropped`) was dropped in its first poll, before
/// hyper could write the request (see [`RequestState::given_up_unwritten`]): the server never saw it, so
/// it counts in nothing (no request count, no HTTP/2 stream reset: h2
/// opened no stream) and the span says so (`http.connection.unsent`); an
/// HTTP/1.1 connection is still ended `abandoned` (hyper closes a
/// connection whose queued request was cancelled, unwritten).
/// Returns the connection it names, for the request's report (see
/// [`RequestReport::connection`]): what the span says, no more.
pub(crate) fn attribute_failure(
    inner: &Arc<Inner>,
    state: &RequestState,
    span: &tracing::Span,
    error_type: &str,
    dropped: bool,
) -> Option<ConnectionUse> {
    // Only errors that happen on a connection (not, say, a refused
    // redirect or a request that could not be built); of those, the HTTP/2
    // layer's happen on an HTTP/2 connection.
    let http2_error = match error_type {
        semconv::ERROR_TYPE_HTTP2_GOAWAY
        | semconv::ERROR_TYPE_HTTP2_STREAM_RESET
        | semconv::ERROR_TYPE_HTTP2_ERROR => true,
        semconv::ERROR_TYPE_CONNECTION_RESET
        | semconv::ERROR_TYPE_TIMEOUT
        | semconv::ERROR_TYPE_CANCELLED => false,
        _ => return None,
    };
    // The request gave up waiting for its response: reqwest's deadline, or
    // its future dropped (the same thing from outside: reqwest's timeout
    // drops hyper's future too).
    let gave_up = matches!(
        error_type,
        semconv::ERROR_TYPE_TIMEOUT | semconv::ERROR_TYPE_CANCELLED
    );
    let record = likely_connection(inner, state);
    // An HTTP/2 error happened on an HTTP/2 connection: when none of the
    // above was found (its own connect had not finished, the connection was
    // already ended by the same GOAWAY), the host's latest one.
    let record = record.or_else(|| {
        http2_error
            .then(|| inner.pools.latest_http2(&state.host))
            .flatten()
    });
    let record = record?;
    let unsent = gave_up && dropped && state.given_up_unwritten(record.runtime);
    let now = Instant::now();
    let (reused, idle) = name_without_response(span, &record, state);
    // Sent and then given up on: the server counted it (a reset or GOAWAY
    // may mean it never saw it, so those count nothing; nor does a
    // request given up before hyper wrote it).
    if unsent {
        span.set_attribute(semconv::HTTP_CONNECTION_UNSENT, true);
    }
    let request_count = if gave_up && !unsent {
        let count = record.count_request(state.started);
        span.set_attribute(semconv::HTTP_CONNECTION_REQUEST_COUNT, count as i64);
        count
    } else {
        record.requests.load(std::sync::atomic::Ordering::Relaxed)
    };
    // HTTP/2: giving up drops h2's response future, which resets the open
    // stream (RST_STREAM CANCEL; hyper 1.x `proto/h2/client.rs` drops it
    // when the request's callback is cancelled), as a dropped body does.
    if gave_up && !unsent && record.http2() {
        let resets = record.count_stream_reset();
        span.add_event(
            semconv::EVENT_STREAM_RESET,
            vec![KeyValue::new(
                semconv::HTTP_CONNECTION_STREAM_RESETS,
                resets as i64,
            )],
        );
    }
    let usage = unanswered_use(span, &record, state, reused, request_count, idle);
    if let Some(end) = server_end_of_failure(error_type, record.http2()) {
        ended_by_server(inner, &record, end, now);
        return Some(usage);
    }
    // An HTTP/1.1 request that gave up on its response (a timeout, a
    // dropped future): the connection still owes that response, so hyper
    // closes it; so it does when the request was cancelled before it was
    // written (its dispatcher closes on a cancelled request: hyper 1.x
    // `proto/h1/dispatch.rs`, `poll_msg` "request canceled", then
    // `close()`), with the server's count one less.
    if gave_up && !record.http2() {
        record.set_end(ConnectionEnd::Abandoned);
        inner.connection_closed(&record, now);
    }
    let elapsed = now.saturating_duration_since(state.started);
    ask_kernel_evidence(
        inner,
        span.clone(),
        record,
        gave_up.then_some(elapsed),
        None,
    );
    Some(usage)
}

/// The connection a request with no response of its own to read it from
/// most likely went out on: the one its own connect made, else the HTTP/2
/// connection it was multiplexed onto, else the HTTP/1.1 one hyper-util
/// would have handed out (the host's most recently released idle one).
fn likely_connection(inner: &Inner, state: &RequestState) -> Option<Arc<ConnectionRecord>> {
    if state.miss().is_some() {
        inner.pools.made_for(&state.host, state.id)
    } else {
        inner
            .pools
            .likely_multiplexed(&state.host, state.started)
            .or_else(|| inner.pools.likely_pooled(&state.host, state.started))
    }
}

/// A redirect hop answered with a redirect the limit refused: reqwest
/// turned the response into its redirect error and dropped it, so no
/// `HttpInfo` names its connection. Names the one it most likely came on
/// (see [`likely_connection`]) as a response on it would (`reused`, `id`,
/// `request_count`, counting this request, which the server answered; the
/// socket's addresses; a link to its setup), takes it for the request
/// (the caller ends the request as a dropped response, which releases
/// it), and returns it for the request's report. No miss reason: the
/// refused hop's connect, if it made one, is not told apart here.
pub(crate) fn attribute_refused_redirect(
    inner: &Arc<Inner>,
    state: &RequestState,
    span: &tracing::Span,
) -> Option<(ConnectionUse, Arc<ConnectionRecord>)> {
    let record = likely_connection(inner, state)?;
    record.take();
    let request_count = record.count_request(state.started);
    span.set_attribute(semconv::HTTP_CONNECTION_REQUEST_COUNT, request_count as i64);
    let (reused, idle) = name_without_response(span, &record, state);
    let usage = unanswered_use(span, &record, state, reused, request_count, idle);
    Some((usage, record))
}

/// Names `record` on `span` for a request that read no response from it,
/// as a response on it would ([`attribute_response`]):
/// `http.connection.reused`, `.id`, `.idle_time` (when reused) and its
/// socket. Returns whether it was reused, and its idle time then.
fn name_without_response(
    span: &tracing::Span,
    record: &ConnectionRecord,
    state: &RequestState,
) -> (bool, Option<Duration>) {
    let reused = record.ready_at() <= state.started;
    let idle = reused.then(|| {
        state
            .started
            .saturating_duration_since(record.last_activity())
    });
    if !span.is_none() {
        let mut attributes = Vec::with_capacity(6);
        attributes.extend([
            KeyValue::new(semconv::HTTP_CONNECTION_REUSED, reused),
            KeyValue::new(semconv::HTTP_CONNECTION_ID, record.id() as i64),
        ]);
        if let Some(idle) = idle {
            attributes.push(KeyValue::new(
                semconv::HTTP_CONNECTION_IDLE_TIME,
                secs(idle),
            ));
        }
        if let Some((local, remote)) = record.pair() {
            attributes.extend(socket_attributes(local, remote));
        }
        set_attributes(span, attributes);
    }
    (reused, idle)
}

/// The report's view of `record`, the connection a request with no
/// response to read it from is named on ([`attribute_failure`],
/// [`attribute_refused_redirect`]): no wait measured, no miss reason of its
/// own; and on `span` a link to its setup, unless this request's connect
/// made it (its setup is then the span's child).
fn unanswered_use(
    span: &tracing::Span,
    record: &ConnectionRecord,
    state: &RequestState,
    reused: bool,
    request_count: u64,
    idle: Option<Duration>,
) -> ConnectionUse {
    let paid = record.trigger_id == Some(state.id);
    if !paid {
        span.add_link_with_attributes(
            record.setup_span(),
            vec![KeyValue::new(
                semconv::HTTP_CONNECTION_ID,
                record.id() as i64,
            )],
        );
    }
    ConnectionUse {
        id: record.id(),
        reused,
        wait: Duration::ZERO,
        request_count,
        age: state.started.saturating_duration_since(record.ready_at()),
        idle,
        paid_by_this_request: paid,
        miss_reason: None,
        setup: record.setup.clone(),
        settling: None,
    }
}

/// How a request failure of type `error_type` shows the server ended the
/// connection it was on (before its response or while its body was read):
/// a reset (`peer_reset`), a close mid-body (`incomplete_body`: the
/// server's FIN, `peer_fin`), an HTTP/2 GOAWAY or connection error (for
/// HTTP/2 a reset or close of the socket is a connection error). `None`
/// for failures that do not (a timeout: the client gave up; a stream reset).
fn server_end_of_failure(error_type: &str, http2: bool) -> Option<ConnectionEnd> {
    match error_type {
        semconv::ERROR_TYPE_CONNECTION_RESET | semconv::ERROR_TYPE_INCOMPLETE_BODY if http2 => {
            Some(ConnectionEnd::Http2Error)
        }
        semconv::ERROR_TYPE_CONNECTION_RESET => Some(ConnectionEnd::PeerReset),
        semconv::ERROR_TYPE_INCOMPLETE_BODY => Some(ConnectionEnd::PeerFin),
        semconv::ERROR_TYPE_HTTP2_GOAWAY => Some(ConnectionEnd::GoAway),
        semconv::ERROR_TYPE_HTTP2_ERROR => Some(ConnectionEnd::Http2Error),
        _ => None,
    }
}

/// Records that the server ended `record` (`end`, from a request's
/// failure) and counts its close.
fn ended_by_server(inner: &Inner, record: &ConnectionRecord, end: ConnectionEnd, now: Instant) {
    record.set_end(end);
    if end == ConnectionEnd::GoAway {
        // Dates the GOAWAY: responses on it ending after this show it
        // came while the connection was serving (its request limit).
        record.note_server_end_by(now);
    }
    inner.connection_closed(record, now);
}

/// Asks the kernel for the state of `record`'s socket, on which the
/// request of `span` failed; the answer lands on the span
/// ([`FailureEvidence`]; `timed_out_after`: a give-up, a timeout or a
/// dropped future, and how long nothing had arrived for the request when
/// it came). The span stays open until the kernel answers (a flush waits
/// for it like for `tcp.connect`, `wait_for_pending_spans`); the request
/// does not wait. `held`, a response body that timed out, is dropped once
/// the kernel has answered (see [`RequestEnd::hold_until_kernel_answers`]).
fn ask_kernel_evidence(
    inner: &Arc<Inner>,
    span: tracing::Span,
    record: Arc<ConnectionRecord>,
    timed_out_after: Option<Duration>,
    held: Option<Box<dyn Send + Sync>>,
) {
    let (Some(local), Some(remote)) = (record.setup.local_addr, record.setup.peer_addr) else {
        return;
    };
    let failed_at = Instant::now();
    let evidence = FailureEvidence {
        inner: Arc::downgrade(inner),
        span,
        record,
        timed_out_after,
        failed_at,
        _held: held,
        _pending: crate::export::pending::PendingEnd::new(),
    };
    inner
        .kernel
        .lookup_then(local, remote, move |lookup| evidence.answer(lookup));
}

/// How long a failed request's span waits for the kernel's report of its
/// socket's end when the socket is closed by the time the kernel is asked
/// (an HTTP/1.1 request that gave up: hyper closes the connection as its
/// future is dropped): 100 ms, looked at again every 5 ms. The report
/// (sock_diag's destroy broadcast, `kernel::watch_end`) comes as the full
/// socket is freed: at once for a reset, on entering `FIN_WAIT2` /
/// `TIME_WAIT` for a close of ours.
const END_REPORT_WAIT: Duration = Duration::from_millis(100);

/// How often a failed request's span looks again for its socket's end
/// report while it waits ([`END_REPORT_WAIT`]).
const END_REPORT_LOOK_EVERY: Duration = Duration::from_millis(5);

/// The kernel's evidence for a request that failed on a connection, on its
/// way to the request's span ([`record_kernel_evidence`]).
struct FailureEvidence {
    inner: std::sync::Weak<Inner>,
    span: tracing::Span,
    record: Arc<ConnectionRecord>,
    timed_out_after: Option<Duration>,
    /// When the failure was seen.
    failed_at: Instant,
    /// A response body that timed out, held unread until the answer.
    _held: Option<Box<dyn Send + Sync>>,
    /// Keeps a flush waiting until the span has its evidence.
    _pending: crate::export::pending::PendingEnd,
}

impl FailureEvidence {
    /// Records `lookup` on the span, unless the socket is closed with no
    /// `tcp_info` left (gone, or a time-wait mini socket) and the kernel's
    /// report of its end is still on its way: then asks again shortly, up
    /// to [`END_REPORT_WAIT`] after the failure.
    fn answer(self, lookup: KernelLookup) {
        let no_info = match &lookup {
            KernelLookup::NotFound => true,
            KernelLookup::Found(facts) => facts.info.is_none(),
            KernelLookup::Unavailable | KernelLookup::TimedOut => false,
        };
        let now = Instant::now();
        let until = self.failed_at + END_REPORT_WAIT;
        if no_info
            && self.record.awaits_socket_end()
            && now < until
            && let (Some(inner), Some(local), Some(remote)) = (
                self.inner.upgrade(),
                self.record.setup.local_addr,
                self.record.setup.peer_addr,
            )
        {
            let due = (now + END_REPORT_LOOK_EVERY).min(until);
            inner
                .kernel
                .lookup_at(local, remote, due, move |lookup| self.answer(lookup));
            return;
        }
        record_kernel_evidence(
            &self.span,
            &self.record,
            &lookup,
            self.timed_out_after,
            self.failed_at,
        );
    }
}

/// The kernel's view of the socket a request failed on (at `failed_at`),
/// on its span; a request that gave up on its response (timeout or
/// dropped future) after `timed_out_after`, with nothing received from
/// the peer for that long (since the request started, or since its body's
/// last bytes), marks the connection stalled. A wait no longer than a
/// round trip (plus the counter's resolution) shows nothing: no answer
/// could have come yet. A socket closed by the time the kernel was asked
/// (`tcp.state` as found: `gone`, or a closing state with no `tcp_info`
/// left) is judged from the kernel's report of its end, when it came: its
/// last `tcp_info`, with the time since the last data received counted
/// back to the failure from when the report was read (no earlier than the
/// end: so no longer than it was, never a stall that was not).
fn record_kernel_evidence(
    span: &tracing::Span,
    record: &ConnectionRecord,
    lookup: &KernelLookup,
    timed_out_after: Option<Duration>,
    failed_at: Instant,
) {
    let state = match lookup {
        KernelLookup::Found(facts) => facts.state.as_str(),
        KernelLookup::NotFound => "gone",
        KernelLookup::Unavailable | KernelLookup::TimedOut => return,
    };
    span.set_attribute(semconv::HTTP_CONNECTION_TCP_STATE, state);
    let Some(evidence) = SocketEvidence::of(lookup, record.socket_end(), failed_at) else {
        return;
    };
    span.set_attribute(
        semconv::HTTP_CONNECTION_TCP_UNACKED,
        i64::from(evidence.unacked),
    );
    span.set_attribute(
        semconv::HTTP_CONNECTION_TCP_SINCE_LAST_RECEIVE,
        secs(evidence.since_last_receive),
    );
    span.set_attribute(
        semconv::HTTP_CONNECTION_TCP_RETRANSMITS,
        i64::from(evidence.retransmits),
    );
    if evidence.shows_stall(timed_out_after) {
        record.mark_stalled();
        span.set_attribute(semconv::HTTP_CONNECTION_STALLED, true);
    }
}

/// The kernel's evidence about the socket a request failed on.
#[derive(Debug, Clone, Copy, PartialEq)]
struct SocketEvidence {
    /// Segments sent and not acknowledged (`tcpi_unacked`).
    unacked: u32,
    /// Time since data last arrived from the peer, at the failure.
    since_last_receive: Duration,
    /// Segments retransmitted over the socket's life.
    retransmits: u32,
    /// The smoothed round-trip time.
    rtt: Duration,
}

impl SocketEvidence {
    /// From `lookup`'s `tcp_info`, else (the socket closed with none left,
    /// or gone) from the kernel's report of its end, `end`: the time since
    /// the last data received counted back to the failure at `failed_at`
    /// from when the report was read (no earlier than the end, so no
    /// longer than it was).
    fn of(lookup: &KernelLookup, end: Option<SocketEnd>, failed_at: Instant) -> Option<Self> {
        match lookup {
            KernelLookup::Found(crate::TcpFacts {
                info: Some(info), ..
            }) => Some(Self {
                unacked: info.unacked,
                since_last_receive: info.since_last_receive,
                retransmits: info.total_retransmits,
                rtt: info.rtt,
            }),
            KernelLookup::Found(_) | KernelLookup::NotFound => end.map(|end| Self {
                unacked: end.unacked,
                since_last_receive: end
                    .since_last_receive
                    .saturating_sub(end.seen_at.saturating_duration_since(failed_at)),
                retransmits: end.retransmits,
                rtt: end.rtt,
            }),
            KernelLookup::Unavailable | KernelLookup::TimedOut => None,
        }
    }

    /// Whether a request that gave up after `timed_out_after` had received
    /// nothing for that long: longer than a round trip plus the counter's
    /// resolution (`tcpi_last_data_recv` counts jiffies, 1 to 10 ms,
    /// `CONFIG_HZ`), else no answer could have come yet.
    fn shows_stall(&self, timed_out_after: Option<Duration>) -> bool {
        let jiffy = Duration::from_millis(10);
        timed_out_after
            .is_some_and(|t| t > self.rtt + jiffy && self.since_last_receive + jiffy >= t)
    }
}

/// How many attributes [`RequestEnd`]'s `base_attributes` start with.
const BASE_ATTRIBUTES: usize = 4;

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
    /// A response body that timed out, held (unread) until the kernel has
    /// looked at its socket: see [`hold_until_kernel_answers`](Self::hold_until_kernel_answers).
    held_body: Option<Box<dyn Send + Sync>>,
    /// Redirect hops sent before this request for the same call.
    pub(crate) resend_count: u32,
    /// `network.protocol.version` of the response.
    pub(crate) protocol_version: Option<&'static str>,
    /// The miss reason was not known when the response arrived: record it
    /// at the end (see [`attribute_response`]).
    pub(crate) miss_deferred: bool,
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
            held_body: None,
            protocol_version: None,
            resend_count: 0,
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
                );
                self.fail(
                    semconv::ERROR_TYPE_CANCELLED,
                    "request dropped before its response arrived".to_owned(),
                );
            }
            let _ = self.state.finish(Fate::NoResponse);
        } else if self.recording {
            self.span
                .set_attribute(semconv::HTTP_RESPONSE_BODY_SIZE, self.body_size as i64);
        }
        if self.miss_deferred
            && let Some(slot) = self.state.miss()
        {
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
            let served_by = self
                .connection
                .as_ref()
                .map(|(usage, _)| (usage.id, usage.request_count));
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
                let _ = record_miss(&inner, &state, &span, &miss, Some(deciding), runtime);
                // Forced only now that the reason is known.
                if miss.reason == MissReason::AllBusy
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
            if let Some((usage, _)) = &mut self.connection {
                match late.get() {
                    Some(reason) => usage.miss_reason = reason,
                    None => {
                        usage.miss_reason = (!fallback.untracked).then_some(fallback.reason);
                        usage.settling = Some(late);
                    }
                }
            }
        }
        if let Some((_, record)) = &self.connection {
            record.give_back();
            match kind {
                // `Connection: close`: hyper closes it after this response.
                EndKind::Complete | EndKind::Dropped
                    if !record.http2() && record.said_connection_close() =>
                {
                    record.mark_released(now);
                    record.set_end(record.announced_close_end());
                    self.inner.connection_closed(record, now);
                }
                EndKind::Complete => {
                    record.mark_released(now);
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
                    let resets = record.count_stream_reset();
                    self.span.add_event(
                        semconv::EVENT_STREAM_RESET,
                        vec![KeyValue::new(
                            semconv::HTTP_CONNECTION_STREAM_RESETS,
                            resets as i64,
                        )],
                    );
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
            record.mark_released(now);
            self.released_to_pool(record, now);
        }
        if timed_out {
            // Nothing arrived for the body since its last bytes (or the
            // headers): a kernel that saw nothing either shows a stall.
            let quiet_since = self.body_progress_at.or(self.headers_at);
            let quiet = quiet_since.map(|t| now.saturating_duration_since(t));
            ask_kernel_evidence(
                &self.inner,
                self.span.clone(),
                Arc::clone(record),
                quiet,
                held_body,
            );
        }
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
        self.inner.load.request_ended(&self.state.host);
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A socket closed by the time the kernel was asked (gone, or a closing
    /// state with no `tcp_info` left: hyper closes an HTTP/1.1 connection
    /// as a timed-out request's future drops) is judged from the report of
    /// its end, counted back to the failure from when the report was read:
    /// 330 ms quiet at an end read 20 ms after a 300 ms timeout is a stall;
    /// data 100 ms before the failure is none. No report, no evidence.
    #[test]
    fn a_closed_sockets_end_report_keeps_a_stalls_evidence() {
        let t0 = Instant::now();
        let ms = |n| Duration::from_millis(n);
        let report = |quiet| SocketEnd {
            seen_at: t0 + ms(20),
            since_last_receive: ms(quiet),
            since_last_send: ms(300),
            acknowledged: crate::kernel::Acknowledged::DataAndFin,
            unread: 0,
            rtt: Duration::from_micros(100),
            unacked: 1,
            retransmits: 2,
        };
        let closed = KernelLookup::Found(crate::TcpFacts {
            state: crate::TcpState::FinWait2,
            info: None,
            receive_queue: 0,
            time_wait_left: None,
            fin_wait2_left: Some(ms(59_990)),
        });
        for lookup in [KernelLookup::NotFound, closed] {
            let stalled = SocketEvidence::of(&lookup, Some(report(330)), t0).expect("evidence");
            assert_eq!(
                (
                    stalled.since_last_receive,
                    stalled.unacked,
                    stalled.retransmits
                ),
                (ms(310), 1, 2)
            );
            assert!(stalled.shows_stall(Some(ms(300))), "{lookup:?}");
            let answered = SocketEvidence::of(&lookup, Some(report(120)), t0).expect("evidence");
            assert_eq!(answered.since_last_receive, ms(100));
            assert!(!answered.shows_stall(Some(ms(300))), "{lookup:?}");
            assert_eq!(SocketEvidence::of(&lookup, None, t0), None);
        }
        assert_eq!(
            SocketEvidence::of(&KernelLookup::Unavailable, Some(report(330)), t0),
            None
        );
    }

    /// A failure tells the server's end by its kind (REFERENCE row 7); a
    /// timeout or a reset stream is none (the client gave up; the
    /// connection serves on).
    #[test]
    fn a_failure_names_the_servers_end_by_its_kind() {
        for (error_type, http1, http2) in [
            (
                semconv::ERROR_TYPE_INCOMPLETE_BODY,
                Some(ConnectionEnd::PeerFin),
                Some(ConnectionEnd::Http2Error),
            ),
            (
                semconv::ERROR_TYPE_CONNECTION_RESET,
                Some(ConnectionEnd::PeerReset),
                Some(ConnectionEnd::Http2Error),
            ),
            (
                semconv::ERROR_TYPE_HTTP2_GOAWAY,
                Some(ConnectionEnd::GoAway),
                Some(ConnectionEnd::GoAway),
            ),
            (semconv::ERROR_TYPE_TIMEOUT, None, None),
            (semconv::ERROR_TYPE_HTTP2_STREAM_RESET, None, None),
            (semconv::ERROR_TYPE_OTHER, None, None),
        ] {
            assert_eq!(
                server_end_of_failure(error_type, false),
                http1,
                "{error_type}"
            );
            assert_eq!(
                server_end_of_failure(error_type, true),
                http2,
                "{error_type}"
            );
        }
    }

    #[test]
    fn ip_text_is_the_address_as_displayed() {
        for ip in [
            "127.0.0.1",
            "::1",
            "2001:db8::8a2e:370:7334",
            "::ffff:192.0.2.1",
        ] {
            let ip: std::net::IpAddr = ip.parse().expect("address");
            assert_eq!(ip_text(ip), ip.to_string());
        }
    }

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
