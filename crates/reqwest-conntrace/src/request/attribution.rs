//! Pool attribution of one response: the connection that carried it, its
//! request count, idle time and wait, the miss reason of a response that
//! paid for a new connection, on the request span and in its
//! [`RequestReport`].
//!
//! [`RequestReport`]: crate::RequestReport

use std::sync::Arc;
use std::time::{Duration, Instant};

use hyper_util::client::legacy::connect::HttpInfo;
use opentelemetry::KeyValue;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use crate::export::clock::secs;
use crate::export::report::{ConnectionUse, DecidingMiss, LateMissReason};
use crate::handle::Inner;
use crate::miss::MissReason;
use crate::pool::host::HostKey;
use crate::pool::record::ConnectionRecord;
use crate::pool::slot::{Miss, MissSlot};
use crate::request::connection_headers::{record_server_keep_alive, server_closes};
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
/// is set to the miss that decides it (this request's own, or, for an
/// HTTP/2 waiter served by a connection set up for another request, that
/// connection's) and the reason is recorded when the request ends
/// ([`RequestEnd::finish`]).
///
/// [`RequestEnd::finish`]: crate::request::end::RequestEnd::finish
pub(crate) fn attribute_response(
    inner: &Arc<Inner>,
    state: &RequestState,
    span: &tracing::Span,
    response: &reqwest::Response,
    mut attributes: Vec<KeyValue>,
    miss_deferred: &mut Option<MissSlot>,
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
            let _ = state.finish(Fate::NoResponse, None);
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
    let closes = !record.http2() && (asked_close || server_closes(version, headers));
    note_announced_close(&record, closes, asked_close, Instant::now());
    let start = state.started;
    let ready = record.ready_at();
    // The end of the previous response on the connection (or its ready time).
    let last_quiet = record.last_activity();
    // When the connection was free for this request: ready, and for HTTP/1.1
    // (one request at a time) also released by the previous response.
    let available = if record.http2() { ready } else { last_quiet };
    // HTTP/1.1: a request that called no connector had an idle connection
    // from its first checkout (hyper-util starts a connect whenever the
    // checkout is not ready at once), even one that became ready after the
    // request's start: the span starts before reqwest first polls the
    // checkout, and on a busy runtime another request's connect can make a
    // connection, carry a response on it and hand it back to the pool in
    // between.
    let reused = ready <= start || (!record.http2() && state.connects() == 0);
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
    // A waiter copies the connection's miss only once it is settled (its
    // trigger's reason may still wait on the kernel: its fallback then,
    // `all_busy`, is not the reason: a tester saw HTTP/2 waiters on the
    // connection that replaced one the server's GOAWAY ended read
    // `all_busy` while its trigger read `request_limit`).
    let deciding = if idle_hit {
        None
    } else {
        state.miss().or_else(|| record.miss.clone())
    };
    *miss_deferred = deciding.filter(|m| !m.is_settled());
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
        Some(miss) if miss_deferred.is_none() => {
            match record_miss(inner, state, span, &miss, None, None, None) {
                // The report says what the span says (an HTTP/2 `closed_by_peer`
                // read again as `request_limit`, say).
                MissRecorded::Now(recorded) => {
                    miss_reason = recorded;
                    None
                }
                MissRecorded::Later(late) => Some(late),
            }
        }
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
        miss_reason == Some(MissReason::AllBusy) && miss_deferred.is_none(),
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
    for unused in state.finish(
        Fate::ServedBy {
            connection_id: record.id(),
        },
        Some(&inner.kernel),
    ) {
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
pub(crate) fn socket_attributes(
    local: std::net::SocketAddr,
    remote: std::net::SocketAddr,
) -> [KeyValue; 3] {
    [
        KeyValue::new(semconv::NETWORK_PEER_ADDRESS, ip_text(remote.ip())),
        KeyValue::new(semconv::NETWORK_PEER_PORT, i64::from(remote.port())),
        KeyValue::new(semconv::NETWORK_LOCAL_PORT, i64::from(local.port())),
    ]
}

/// `ip` as text, in one allocation (`to_string` grows its string as the
/// parts are written): 39 bytes hold any IPv6 address.
pub(crate) fn ip_text(ip: std::net::IpAddr) -> String {
    use std::fmt::Write as _;
    let mut text = String::with_capacity(39);
    let _ = write!(text, "{ip}");
    text
}

/// The keep-alive mismatch event on the span of a miss whose previous
/// connection the server ended after the client's pool had kept it idle
/// past the `keep_alive` timeout the server advertised, under a client
/// idle timeout this crate could not read: the client's timeout is the
/// longer one, inferred from that (no `client_idle_timeout`, `pool.limits
/// = inferred`). Logs the client's one WARN line when `previous` says it
/// is due.
fn add_inferred_keep_alive_mismatch(
    span: &tracing::Span,
    keep_alive: Duration,
    previous: &crate::pool::slot::Previous,
) {
    span.add_event(
        semconv::EVENT_KEEP_ALIVE_MISMATCH,
        vec![
            KeyValue::new(semconv::HTTP_CONNECTION_SERVER_KEEP_ALIVE, secs(keep_alive)),
            KeyValue::new(
                semconv::HTTP_CONNECTION_POOL_LIMITS,
                semconv::POOL_LIMITS_INFERRED,
            ),
        ],
    );
    if previous.warn_keep_alive {
        tracing::warn!(
            target: "reqwest_conntrace",
            "server keep-alive {:.3} s is shorter than the client's pool idle timeout: its pool kept a connection idle past it, which the server then closed (closed_by_peer misses, connection_reset races); set pool_idle_timeout under {:.3} s (reqwest's default is 90 s)",
            keep_alive.as_secs_f64(),
            keep_alive.as_secs_f64(),
        );
    }
}

/// The `pool.advice` event on a request span that missed because every
/// connection was busy while the pool was too small (see
/// [`PoolAdvice`](crate::PoolAdvice)).
pub(crate) fn add_pool_advice_event(span: &tracing::Span, advice: &crate::PoolAdvice) {
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
pub(crate) enum MissRecorded {
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
/// view's thread); else the current one. `failed`: the `error.type` of a
/// request that missed and failed before its response (its connect
/// failed, or it gave up), which the misses counter carries too.
pub(crate) fn record_miss(
    inner: &Arc<Inner>,
    state: &RequestState,
    span: &tracing::Span,
    miss: &Miss,
    deciding: Option<DecidingMiss>,
    runtime: Option<&tokio::runtime::Handle>,
    failed: Option<&str>,
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
            let reason = record_reason(inner, &state.host, span, miss, ended.as_deref(), failed);
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
        failed: failed.map(str::to_owned),
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
pub(crate) struct RecordedWhenDropped {
    inner: Arc<Inner>,
    host: HostKey,
    /// The request's default subscriber: the span may close on a runtime
    /// worker, and its parents close through that thread's default.
    dispatch: tracing::Dispatch,
    span: tracing::Span,
    miss: Miss,
    ended: Option<Arc<ConnectionRecord>>,
    deciding: Option<DecidingMiss>,
    /// The `error.type` of a request that failed before its response.
    failed: Option<String>,
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
            self.failed.as_deref(),
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
/// miss). A miss of a request that failed before its response is counted
/// with its `error.type` (`failed`). Returns the reason recorded.
pub(crate) fn record_reason(
    inner: &Inner,
    host: &HostKey,
    span: &tracing::Span,
    miss: &Miss,
    ended: Option<&ConnectionRecord>,
    failed: Option<&str>,
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
        if let Some(keep_alive) = previous.kept_past_keep_alive {
            add_inferred_keep_alive_mismatch(span, keep_alive, previous);
        }
    }
    let mut attributes = Vec::with_capacity(6);
    attributes.extend(host.attributes());
    attributes.push(KeyValue::new(semconv::HTTP_CONNECTION_MISS_REASON, reason));
    if let Some(error_type) = failed {
        attributes.push(KeyValue::new(semconv::ERROR_TYPE, error_type.to_owned()));
    }
    if let Some(source) = miss.limits {
        attributes.push(KeyValue::new(
            semconv::HTTP_CONNECTION_POOL_LIMITS,
            source.as_str(),
        ));
    }
    inner.metrics.pool_misses.add(1, &attributes);
    decided
}

/// Records on `record` (HTTP/1.1) that a response whose headers reached
/// the caller `at` announced its connection's close (`closes`: either side
/// sent `Connection: close`, RFC 9112 §9.6; `asked_close`: the request
/// did). Only ever set: no response follows a closing one on its
/// connection, but two responses on it handled at once by a busy runtime
/// can be handled in the other order (the closing one first), and the
/// earlier one's "keep" must not hide the close.
fn note_announced_close(record: &ConnectionRecord, closes: bool, asked_close: bool, at: Instant) {
    if closes {
        record.set_connection_close(true);
        record.set_client_asked_close(asked_close);
        record.note_closing_response(at);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ConnectionSetup;
    use crate::miss::ConnectionEnd;
    use crate::pool::client::ClientState;
    use opentelemetry::trace::SpanContext;

    /// Two responses on one HTTP/1.1 connection handled in the other order
    /// (the one announcing the server's close first, as a busy runtime can
    /// run them): the close stays announced, and whose it was too (a
    /// tester's wave read a request-limit close as `discarded`).
    #[test]
    fn a_response_handled_after_the_closing_one_keeps_the_close_announced() {
        let at = Instant::now();
        let record = |id| {
            ConnectionRecord::new(
                Arc::new(ConnectionSetup::for_test(id, at)),
                SpanContext::empty_context(),
                None,
                Arc::new(ClientState::new(Some(None), None)),
                None,
                None,
            )
        };
        let closed = record(1);
        note_announced_close(&closed, true, false, at);
        note_announced_close(&closed, false, false, at);
        assert!(closed.said_connection_close());
        assert_eq!(closed.announced_close_end(), ConnectionEnd::ConnectionClose);
        assert_eq!(closed.closing_response_at(), Some(at));
        let asked = record(2);
        note_announced_close(&asked, true, true, at);
        note_announced_close(&asked, false, false, at);
        assert_eq!(asked.announced_close_end(), ConnectionEnd::ClientClose);
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
}
