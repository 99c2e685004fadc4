//! Why a request was not served by an idle pooled connection: the
//! `http.connection.miss_reason` values and the fix each one calls for.

use crate::semconv;

/// Why a request did not get an idle pooled connection
/// (`http.connection.miss_reason`). Present on every request that was not an
/// idle hit: pool misses and hits that had to wait for a busy connection.
///
/// The set follows how connection pools lose connections, one fix per
/// reason: never had one (`Cold`, `NewClient`), keep none on purpose
/// (`PoolDisabled`), had them all in use or over the idle limit
/// (`AllBusy`), lost the idle one to the client's idle timeout
/// (`IdleExpired`), to the server's idle close (`ClosedByPeer`), to the
/// server's request limit (`RequestLimit`), to the client's own
/// `Connection: close` (`ClientClose`), to an unread body (`Discarded`)
/// or to a request that gave up on its response (`Abandoned`), or asked
/// in the instant hyper-util was still putting it back (`ReleaseRace`). The decision table is in docs/REFERENCE.md
/// section 14. Go's `httptrace.GotConnInfo` only reports `Reused` /
/// `WasIdle`; OkHttp's `EventListener` and .NET's connection spans do not
/// say why a connection was missing either.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum MissReason {
    /// `cold`: this client's pool for the host was never warm: no
    /// connection to it had been established, or none had finished a
    /// response yet (first contact, or a concurrent first burst: all its
    /// requests are cold). Expected once per host and burst.
    Cold,
    /// `all_busy`: the client's pool for the host had been warm, and every
    /// established connection was in use, or the ones freed earlier were
    /// closed because the pool already held `pool_max_idle_per_host` idle
    /// connections. A connection the server's `Connection: close` ended,
    /// not named by another miss yet, is named instead (`RequestLimit`).
    AllBusy,
    /// `idle_expired`: the most recent idle connection had sat in the pool
    /// longer than the client's pool idle timeout, so the pool dropped it
    /// (the timeout configured, or inferred from that close:
    /// `http.connection.pool.limits = inferred`).
    IdleExpired,
    /// `closed_by_peer`: the most recent idle connection was closed by the
    /// server while idle (the kernel shows the socket in CLOSE_WAIT /
    /// LAST_ACK or gone; for HTTP/2, GOAWAY and close after idling) before
    /// this request could use it: usually the server's keep-alive timeout;
    /// or the server cut the response it carried short (FIN or RST
    /// mid-body: that request's span has `error.type` `incomplete_body` or
    /// `connection_reset` after its headers). `http.connection.previous.end`
    /// says how.
    ClosedByPeer,
    /// `request_limit`: the server ended the most recent connection on
    /// purpose with its last response (`Connection: close`, HTTP/1.0
    /// without `Connection: keep-alive`, or an HTTP/2 GOAWAY that reached
    /// the client within 75 ms of that response's end), as servers do when
    /// a connection reached its request limit (nginx `keepalive_requests`);
    /// each such close is named by one miss of a burst that found the other
    /// connections busy.
    /// docs/REFERENCE.md section 14 says how the GOAWAY is dated.
    RequestLimit,
    /// `pool_disabled`: the client keeps no idle connection on purpose
    /// (`pool_max_idle_per_host(0)`), so every request after the first
    /// opens its own connection.
    PoolDisabled,
    /// `release_race`: the most recent HTTP/1.1 connection had finished its
    /// response and was alive, but hyper-util had not yet put it back into
    /// its pool: it does that on a background task once the connection has
    /// read the end of the body, and a request sent in that instant
    /// (typically the next one of a sequential loop on a busy runtime) opens
    /// a connection instead. With other requests in flight, told from
    /// `all_busy` by the first request the connection carries next: it
    /// started after the miss (docs/REFERENCE.md row 10e).
    ReleaseRace,
    /// `pool_closed`: the client's own pool closed the most recent idle
    /// connection (the kernel shows our side closed it), and which limit
    /// did is unknown: its `pool_idle_timeout` did not come through this
    /// crate's builder (reqwest's builder cannot be read), and the kernel
    /// could not date the close (which would have inferred the limit), so
    /// it may have expired, or it was released over
    /// `pool_max_idle_per_host`; or the close came at the miss and nothing
    /// yet tells the idle limit's close from hyper-util's release race
    /// (the first such close of a client whose pool never handed a
    /// connection out again). The span also carries `http.connection.pool.limits = unknown`.
    PoolClosed,
    /// `discarded`: the previous response on the most recent connection was
    /// dropped before its body was read to the end (or its body failed on
    /// the client's side, say undecodable), so HTTP/1.1 could not return
    /// the connection to the pool. A body the server cut short is
    /// `ClosedByPeer`; one that timed out, `Abandoned`.
    Discarded,
    /// `client_close`: the client itself asked the server to close the
    /// most recent connection: its request sent `Connection: close`, so
    /// the connection ended with that response (as a server's request
    /// limit would end it, but the fix is the client's). A `Connection:
    /// close` from reqwest's `default_headers` is added after the
    /// middleware and not seen: that close reads `RequestLimit`.
    ClientClose,
    /// `abandoned`: a request on the most recent HTTP/1.1 connection
    /// failed or was cancelled before its response ended (a timeout before
    /// the headers or while the body was read, a dropped future); HTTP/1.1 cannot reuse a connection that still owes
    /// a response, so hyper closed it. That request's span names the
    /// connection, with the kernel's evidence of a stall.
    Abandoned,
    /// `new_client`: this client instance, built moments ago, had no
    /// connection to the host, but an earlier client of the same
    /// [`ConnTrace`](crate::ConnTrace) handle had one: a new client per
    /// request (or per task) throws the pool and the TLS session cache away.
    NewClient,
}

impl MissReason {
    /// The `http.connection.miss_reason` value.
    pub fn as_str(self) -> &'static str {
        match self {
            MissReason::Cold => semconv::MISS_REASON_COLD,
            MissReason::AllBusy => semconv::MISS_REASON_ALL_BUSY,
            MissReason::IdleExpired => semconv::MISS_REASON_IDLE_EXPIRED,
            MissReason::ClosedByPeer => semconv::MISS_REASON_CLOSED_BY_PEER,
            MissReason::Discarded => semconv::MISS_REASON_DISCARDED,
            MissReason::NewClient => semconv::MISS_REASON_NEW_CLIENT,
            MissReason::RequestLimit => semconv::MISS_REASON_REQUEST_LIMIT,
            MissReason::PoolDisabled => semconv::MISS_REASON_POOL_DISABLED,
            MissReason::ReleaseRace => semconv::MISS_REASON_RELEASE_RACE,
            MissReason::PoolClosed => semconv::MISS_REASON_POOL_CLOSED,
            MissReason::ClientClose => semconv::MISS_REASON_CLIENT_CLOSE,
            MissReason::Abandoned => semconv::MISS_REASON_ABANDONED,
        }
    }

    /// One line saying what to change when this reason is frequent.
    pub fn fix(self) -> &'static str {
        match self {
            MissReason::Cold => {
                "expected on first contact; if frequent, connections are not kept: check the other reasons, or warm the pool at start-up"
            }
            MissReason::AllBusy => {
                "raise pool_max_idle_per_host to at least the peak number of concurrent requests to the host"
            }
            MissReason::IdleExpired => {
                "raise the client's pool_idle_timeout above the usual gap between requests (but keep it under the server's keep-alive timeout)"
            }
            MissReason::ClosedByPeer => {
                "lower the client's pool_idle_timeout under the server's keep-alive timeout, so the client closes idle connections first"
            }
            MissReason::Discarded => {
                "read response bodies to the end (or drain them) before dropping them, so HTTP/1.1 connections go back to the pool"
            }
            MissReason::NewClient => {
                "build one reqwest::Client and share it (it is an Arc inside); do not build a client per request"
            }
            MissReason::RequestLimit => {
                "the server closes connections after a number of requests: raise its per-connection request limit (nginx keepalive_requests); no client setting helps (unless the client sends Connection: close through reqwest's default_headers, which this crate cannot see: remove it)"
            }
            MissReason::PoolDisabled => {
                "the idle pool is off (pool_max_idle_per_host(0)): set it above 0 if connections should be reused"
            }
            MissReason::ReleaseRace => {
                "nothing to tune: the extra connection joins the pool; yield once (tokio::task::yield_now) between a body's end and the next request if it matters"
            }
            MissReason::PoolClosed => {
                "set pool_max_idle_per_host and pool_idle_timeout on InstrumentedClientBuilder instead of reqwest's builder, so the limit that closed it can be named"
            }
            MissReason::ClientClose => {
                "stop sending Connection: close on requests, so connections go back to the pool"
            }
            MissReason::Abandoned => {
                "the previous request on that connection timed out or was cancelled before its response: see its span (http.connection.stalled and the kernel's evidence), then fix the slow server or raise that request's timeout"
            }
        }
    }

    /// Every reason, in documentation order.
    pub const ALL: [MissReason; 12] = [
        MissReason::Cold,
        MissReason::AllBusy,
        MissReason::IdleExpired,
        MissReason::ClosedByPeer,
        MissReason::Discarded,
        MissReason::NewClient,
        MissReason::RequestLimit,
        MissReason::PoolDisabled,
        MissReason::ReleaseRace,
        MissReason::PoolClosed,
        MissReason::ClientClose,
        MissReason::Abandoned,
    ];
}

impl std::fmt::Display for MissReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How a connection ended, as far as this crate could tell
/// (`http.connection.previous.end` on the request whose miss it caused).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum ConnectionEnd {
    /// `connection_close`: its last response carried `Connection: close`
    /// (or was HTTP/1.0 without `Connection: keep-alive`).
    ConnectionClose,
    /// `goaway`: HTTP/2; the server ended it (GOAWAY, then close).
    GoAway,
    /// `peer_fin`: the kernel showed the server's FIN (CLOSE_WAIT / LAST_ACK,
    /// or the report of a gone socket's end), or a response body ended by
    /// it (`incomplete_body`).
    PeerFin,
    /// `peer_reset`: a request (or its response body) on it failed with the
    /// connection reset, or the report of a gone socket's end shows the
    /// server's reset.
    PeerReset,
    /// `peer_closed`: gone from the kernel's table without our close: the
    /// server closed it, FIN or RST not told (without the report of the
    /// socket's end, or over TLS where it does not read the close as the
    /// server's).
    PeerClosed,
    /// `http2_error`: an HTTP/2 connection error ended it.
    Http2Error,
    /// `idle_timeout`: the client's pool idle timeout elapsed.
    IdleTimeout,
    /// `idle_limit`: released while the idle pool was full; hyper closed it.
    IdleLimit,
    /// `pool_closed`: the client's pool closed it (the kernel shows our
    /// side's close), under pool limits this crate could not read.
    PoolClosed,
    /// `discarded`: a response body was dropped before its end; hyper closed it.
    Discarded,
    /// `client_close`: its last request sent `Connection: close`.
    ClientClose,
    /// `abandoned`: HTTP/1.1, a request on it failed or was cancelled
    /// before its response ended; hyper closed it.
    Abandoned,
}

impl ConnectionEnd {
    /// The server ended it (as opposed to this client's pool).
    pub(crate) fn by_server(self) -> bool {
        matches!(
            self,
            ConnectionEnd::ConnectionClose
                | ConnectionEnd::GoAway
                | ConnectionEnd::PeerFin
                | ConnectionEnd::PeerReset
                | ConnectionEnd::PeerClosed
                | ConnectionEnd::Http2Error
        )
    }

    /// The `http.connection.previous.end` value.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            ConnectionEnd::ConnectionClose => semconv::CONNECTION_END_CONNECTION_CLOSE,
            ConnectionEnd::GoAway => semconv::CONNECTION_END_GOAWAY,
            ConnectionEnd::PeerFin => semconv::CONNECTION_END_PEER_FIN,
            ConnectionEnd::PeerReset => semconv::CONNECTION_END_PEER_RESET,
            ConnectionEnd::PeerClosed => semconv::CONNECTION_END_PEER_CLOSED,
            ConnectionEnd::Http2Error => semconv::CONNECTION_END_HTTP2_ERROR,
            ConnectionEnd::IdleTimeout => semconv::CONNECTION_END_IDLE_TIMEOUT,
            ConnectionEnd::IdleLimit => semconv::CONNECTION_END_IDLE_LIMIT,
            ConnectionEnd::PoolClosed => semconv::CONNECTION_END_POOL_CLOSED,
            ConnectionEnd::Discarded => semconv::CONNECTION_END_DISCARDED,
            ConnectionEnd::ClientClose => semconv::CONNECTION_END_CLIENT_CLOSE,
            ConnectionEnd::Abandoned => semconv::CONNECTION_END_ABANDONED,
        }
    }
}
