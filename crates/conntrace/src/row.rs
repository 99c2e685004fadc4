//! One finished request as a flat, serializable row: what the probe table
//! and `--json` show, built from the library's `RequestReport`.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::capture::Outcome;
use crate::error::request_failure;
use crate::stats::ms;
use reqwest_conntrace::RequestReport;

/// What the serving connection's setup cost (internal, for totals).
#[derive(Debug, Clone, Copy)]
pub(crate) struct SetupCost {
    /// When the connect started.
    pub(crate) started: Instant,
    /// Connect call to connection ready.
    pub(crate) total: Duration,
    /// DNS lookup (`None` when skipped).
    pub(crate) dns: Option<Duration>,
    /// TCP connect.
    pub(crate) tcp: Duration,
    /// TLS handshake (`None` for plain HTTP).
    pub(crate) tls: Option<Duration>,
    /// Proxy CONNECT round trip (`None` when not tunneled).
    pub(crate) proxy: Option<Duration>,
    /// Whether the TLS session was resumed.
    pub(crate) tls_resumed: Option<bool>,
    /// The address that connected was not the first one tried.
    pub(crate) address_fallback: bool,
}

/// One request. Connection fields describe the connection that served it;
/// the phase fields (`connect_ms`, `dns_ms`, `tcp_ms`, `tls_ms`) are set only
/// on a pool miss, i.e. when the request waited for a new connection.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct RequestRow {
    /// 1-based request number within its mode (the hops of one redirect
    /// chain share it).
    pub(crate) index: usize,
    /// `http.request.resend_count`: redirect hops sent before this one for
    /// the same request (0: the request as sent).
    pub(crate) resend_count: u32,
    /// `fresh` or `reuse`.
    pub(crate) mode: &'static str,
    /// Start of the request, ms after the start of its mode.
    pub(crate) start_ms: f64,
    /// HTTP status the server sent; `null` when no response arrived. A
    /// request that failed after the headers (its body cut or timed out)
    /// keeps it: [`error`](Self::error) says whether a request failed.
    pub(crate) status: Option<u16>,
    /// Why the request failed (one line); `null` on success.
    pub(crate) error: Option<String>,
    /// The library's `error.type` (also set for 4xx/5xx statuses).
    pub(crate) error_type: Option<String>,
    /// The serving connection existed before the request started (the
    /// library's `http.connection.reused`); not the same as a pool hit: a
    /// request that waited for a busy connection is reused but a miss (see
    /// [`pool_outcome`](Self::pool_outcome)).
    pub(crate) reused: Option<bool>,
    /// Why the request was not an idle hit (`http.connection.miss_reason`);
    /// `null` on an idle hit or when no response arrived.
    pub(crate) miss_reason: Option<&'static str>,
    /// The serving connection's id (`http.connection.id`); for a failed
    /// request, the connection it was sent on, when its span names one.
    pub(crate) connection_id: Option<u64>,
    /// This request's own pool miss opened the connection that served it.
    pub(crate) paid_for_connection: Option<bool>,
    /// Requests the serving connection has carried, this one included;
    /// `null` when no response arrived.
    pub(crate) connection_request_count: Option<u64>,
    /// Time waited for a connection; `null` when no response arrived.
    pub(crate) wait_ms: Option<f64>,
    /// Connection setup total (misses only).
    pub(crate) connect_ms: Option<f64>,
    /// DNS lookup (misses only; `null` also when DNS was skipped).
    pub(crate) dns_ms: Option<f64>,
    /// Why DNS was skipped: `ip_literal` or `override` (misses only).
    pub(crate) dns_skipped: Option<&'static str>,
    /// TCP connect (misses only).
    pub(crate) tcp_ms: Option<f64>,
    /// TLS handshake (misses on https only).
    pub(crate) tls_ms: Option<f64>,
    /// The connect fell back to a later resolved address (misses only;
    /// `None` also when no address list was known: an IP literal, or a
    /// connect whose address choice the library could not explain).
    pub(crate) address_fallback: Option<bool>,
    /// Request start to response headers.
    pub(crate) ttfb_ms: Option<f64>,
    /// Request start to end of body (or failure).
    pub(crate) total_ms: f64,
    /// Serving connection's TLS version, `1.2` or `1.3`.
    pub(crate) tls_version: Option<&'static str>,
    /// Serving connection's handshake resumed a TLS session.
    pub(crate) tls_resumed: Option<bool>,
    /// HTTP version of the response: `1.1` or `2` (null when it failed).
    pub(crate) http_version: Option<&'static str>,
    /// Serving connection negotiated HTTP/2 via ALPN.
    pub(crate) http2: Option<bool>,
    /// Client's local port of the serving connection.
    pub(crate) local_port: Option<u16>,
    /// Client's local address (`ip:port`).
    pub(crate) local_address: Option<String>,
    /// Peer address (`ip:port`; IPv6 in brackets).
    pub(crate) peer_address: Option<String>,
    /// Response body bytes read; `None` when no response arrived.
    pub(crate) body_bytes: Option<u64>,
    /// The serving connection's setup cost (not serialized).
    #[serde(skip)]
    pub(crate) setup: Option<SetupCost>,
    /// Connects this request's pool checkouts started (the library's
    /// `RequestReport::connects`: 0 on an idle hit, 1 on a miss, whether
    /// its own connection served it or landed unused); not serialized.
    #[serde(skip)]
    pub(crate) connects: u32,
    /// Of those, connects that failed or were abandoned (the library's
    /// `RequestReport::failed_connect`, the last one): they opened no
    /// connection; not serialized.
    #[serde(skip)]
    pub(crate) failed_connects: u32,
}

impl RequestRow {
    /// Builds the row of request `index` of `mode` started after `mode_start`.
    pub(crate) fn new(
        index: usize,
        mode: &'static str,
        mode_start: Instant,
        outcome: &Outcome,
    ) -> Self {
        let report = outcome.report.as_ref();
        let mut row = Self::of_report(index, mode, mode_start, outcome, report);
        match &outcome.result {
            Ok(f) => {
                row.status = Some(f.status);
                row.body_bytes = Some(f.body_bytes);
                row.http_version = Some(f.version);
                // Nothing of what was asked was probed: a failure, as a TLS
                // server that fails the request instead makes it.
                if f.port_speaks_tls {
                    row.error = Some(format!(
                        "HTTP {} from the server: the plain HTTP request reached its TLS port; fix: use https://",
                        f.status
                    ));
                }
            }
            Err(e) => {
                // The proxy its own failed connect went to (as the
                // library judged it from the connect), named in the line.
                let proxy = report
                    .and_then(|r| r.failed_connect.as_ref())
                    .filter(|s| s.proxied)
                    .map(|s| match (&s.proxy_address, s.proxy_port) {
                        (Some(a), Some(p)) if a.contains(':') => format!("[{a}]:{p}"),
                        (Some(a), Some(p)) => format!("{a}:{p}"),
                        (Some(a), None) => a.clone(),
                        (None, _) => "(address not known)".to_owned(),
                    });
                row.error = Some(request_failure(
                    e,
                    row.error_type.as_deref(),
                    proxy.as_deref(),
                ));
            }
        }
        row
    }

    /// One row per physical request of `outcome`: its redirect hops (from
    /// their reports), then the request that gave the result.
    pub(crate) fn physical(
        index: usize,
        mode: &'static str,
        mode_start: Instant,
        outcome: &Outcome,
    ) -> Vec<Self> {
        let mut rows: Vec<Self> = outcome
            .hops
            .iter()
            .map(|hop| Self::of_report(index, mode, mode_start, outcome, Some(hop)))
            .collect();
        rows.push(Self::new(index, mode, mode_start, outcome));
        rows
    }

    /// The row of `report` as the library saw it (a redirect hop's, or the
    /// final request's before the caller's view of the result is added).
    fn of_report(
        index: usize,
        mode: &'static str,
        mode_start: Instant,
        outcome: &Outcome,
        report: Option<&RequestReport>,
    ) -> Self {
        let error_type = report.and_then(|r| r.error_type.clone());
        let mut row = RequestRow {
            index,
            mode,
            resend_count: report.map_or(0, |r| r.resend_count),
            start_ms: ms(report
                .map_or(outcome.started, |r| r.started)
                .saturating_duration_since(mode_start)),
            status: report.and_then(|r| r.status),
            error: None,
            error_type,
            reused: None,
            miss_reason: None,
            connection_id: None,
            paid_for_connection: None,
            connection_request_count: None,
            wait_ms: None,
            connect_ms: None,
            dns_ms: None,
            dns_skipped: None,
            tcp_ms: None,
            tls_ms: None,
            address_fallback: None,
            ttfb_ms: report.and_then(|r| r.time_to_first_byte).map(ms),
            total_ms: ms(report.map_or(outcome.elapsed, |r| r.total)),
            tls_version: None,
            tls_resumed: None,
            http_version: None,
            http2: None,
            local_port: None,
            local_address: None,
            peer_address: None,
            body_bytes: report.and_then(|r| r.body_size),
            connects: report.map_or(0, |r| r.connects),
            failed_connects: report.map_or(0, |r| u32::from(r.failed_connect.is_some())),
            setup: None,
        };
        // A redirect hop's version (the final request's comes from the
        // caller's response in `new`).
        row.http_version = report.and_then(|r| r.protocol_version);
        // A request that failed before it had a connection to name still
        // says why it missed (its span does too).
        row.miss_reason = report
            .and_then(|r| r.failed_miss_reason)
            .map(|m| m.as_str());
        if let Some(conn) = report.and_then(|r| r.connection.as_ref()) {
            let setup = &conn.setup;
            row.reused = Some(conn.reused);
            row.miss_reason = conn.miss_reason.map(|m| m.as_str());
            row.connection_id = Some(conn.id);
            row.paid_for_connection = Some(conn.paid_by_this_request);
            // A request without a response names the connection it was
            // sent on, but no count or wait of its own, and no pool outcome
            // (see `pool_outcome`). One that failed after its headers (the
            // body cut) did take its connection: it keeps them.
            if row.status.is_some() {
                row.connection_request_count = Some(conn.request_count);
                row.wait_ms = Some(ms(conn.wait));
            }
            if !conn.reused {
                row.connect_ms = Some(ms(setup.total));
                row.dns_ms = setup.dns.map(ms);
                row.dns_skipped = setup.dns_skipped;
                row.tcp_ms = Some(ms(setup.tcp));
                row.tls_ms = setup.tls.map(ms);
                row.address_fallback = setup.address_fallback;
            }
            row.tls_version = setup.tls_version.map(|v| v.as_str());
            row.tls_resumed = setup.tls_resumed;
            row.http2 = Some(setup.http2);
            row.local_port = setup.local_addr.map(|a| a.port());
            row.local_address = setup.local_addr.map(|a| a.to_string());
            row.peer_address = setup.peer_addr.map(|a| a.to_string());
            row.setup = Some(SetupCost {
                started: setup.started,
                total: setup.total,
                dns: setup.dns,
                tcp: setup.tcp,
                tls: setup.tls,
                proxy: setup.proxy_connect,
                tls_resumed: setup.tls_resumed,
                address_fallback: setup.address_fallback == Some(true),
            });
        }
        row
    }

    /// How the request got its connection: `idle_hit` (an idle pooled
    /// connection served it at once: no wait and no miss reason),
    /// `waited_for_busy` (no idle connection: it was served by a connection
    /// that was busy or being set up by another request, after waiting for
    /// it or with a miss reason from the library, which in hyper-util's pool
    /// race also means it started a connect of its own that did not serve
    /// it (that connection may serve later requests from the idle pool); a
    /// new connection that carried another request first counts here too),
    /// `new_connection` (it was a new connection's first request); `None` when
    /// unknown (no response arrived; a request that failed after the
    /// headers has its outcome).
    pub(crate) fn pool_outcome(&self) -> Option<&'static str> {
        match (self.reused?, self.wait_ms?) {
            // A new connection that had carried another request first (a
            // burst's requests share the connections their connects made):
            // it waited for that request.
            (false, _) if self.connection_request_count.is_some_and(|n| n > 1) => {
                Some("waited_for_busy")
            }
            (false, _) => Some("new_connection"),
            (true, w) if w > 0.0 || self.miss_reason.is_some() => Some("waited_for_busy"),
            (true, _) => Some("idle_hit"),
        }
    }

    /// Whether no idle connection was free when the request started.
    pub(crate) fn pool_miss(&self) -> Option<bool> {
        self.pool_outcome().map(|o| o != "idle_hit")
    }

    /// Whether the request failed: no response, or one whose body failed
    /// (then [`status`](Self::status) is still set).
    pub(crate) fn failed(&self) -> bool {
        self.error.is_some()
    }
}

/// The distinct connections that served `rows`, by id, with their setup cost.
pub(crate) fn connections<'a>(
    rows: impl IntoIterator<Item = &'a RequestRow>,
) -> BTreeMap<u64, SetupCost> {
    rows.into_iter()
        .filter_map(|r| Some((r.connection_id?, r.setup?)))
        .collect()
}
