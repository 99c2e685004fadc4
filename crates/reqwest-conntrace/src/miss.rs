//! Why a request was not served by an idle pooled connection: the
//! `http.connection.miss_reason` values and the fix each one calls for.

use crate::semconv;

/// Why a request did not get an idle pooled connection
/// (`http.connection.miss_reason`). Present on every request that was not an
/// idle hit: pool misses and hits that had to wait for a busy connection.
///
/// The set follows how connection pools lose connections: never had one
/// (`Cold`, `NewClient`), had them all in use or over the idle limit
/// (`AllBusy`), lost the idle one to the client's idle timeout
/// (`IdleExpired`), to the server (`ClosedByPeer`) or to an unread body
/// (`Discarded`). Go's `httptrace.GotConnInfo` only reports `Reused` /
/// `WasIdle`; OkHttp's `EventListener` and .NET's connection spans do not
/// say why a connection was missing either.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum MissReason {
    /// `cold`: this client had no connection to the host yet (first
    /// contact, or the first concurrent burst). Expected once per host.
    Cold,
    /// `all_busy`: the client had connections to the host, but all were in
    /// use, or the ones freed earlier were closed because the pool already
    /// held `pool_max_idle_per_host` idle connections.
    AllBusy,
    /// `idle_expired`: the most recent idle connection had sat in the pool
    /// longer than the client's pool idle timeout, so the pool dropped it.
    IdleExpired,
    /// `closed_by_peer`: the most recent idle connection was closed by the
    /// server (the kernel shows the socket in CLOSE_WAIT / LAST_ACK or gone)
    /// before this request could use it.
    ClosedByPeer,
    /// `discarded`: the previous response on the most recent connection was
    /// dropped before its body was read to the end, so HTTP/1.1 could not
    /// return the connection to the pool.
    Discarded,
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
        }
    }

    /// Every reason, in documentation order.
    pub const ALL: [MissReason; 6] = [
        MissReason::Cold,
        MissReason::AllBusy,
        MissReason::IdleExpired,
        MissReason::ClosedByPeer,
        MissReason::Discarded,
        MissReason::NewClient,
    ];
}

impl std::fmt::Display for MissReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}
