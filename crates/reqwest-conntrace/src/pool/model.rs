//! Each client's connections per host, as far as this handle saw them: what
//! a pool miss's reason is read from when reqwest calls the connector.
//!
//! hyper-util's pool is invisible from outside, so this is a model of it,
//! kept true by what the handle observes: connections established (connector
//! layer), taken and released by responses (middleware and body wrapper),
//! dropped early (HTTP/1.1 body dropped: closed only if hyper had not read it
//! all), ended by `Connection: close`, over the idle limit at release
//! (`pool_max_idle_per_host`), idle past the pool's idle timeout, ended by
//! the server (a request failing on it, or the kernel's view through
//! sock_diag). [`PoolHistory::classify_miss`] and [`decide_from_kernel`]
//! are the decision table of docs/REFERENCE.md section 14, row by row; the
//! connection a miss blames is its [`Previous`].

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use crate::kernel::{KernelLookup, TcpFacts};
use crate::pool::client::{ClientState, NEW_CLIENT_WINDOW};
use crate::pool::host::HostKey;
use crate::pool::inferred::{PoolClose, RELEASE_ORDER_UNSURE, over_limit_reason, pool_close};
use crate::pool::miss::{ConnectionEnd, MissReason};
use crate::pool::registry::ConnectionRecord;
use crate::pool::slot::{Miss, Previous};
use crate::semconv;

/// Connections remembered per host: past it, a closed one is forgotten
/// first, then one the pool has closed as far as the history knows (over
/// the idle limit, idle past the idle timeout, ended); when all are open,
/// the oldest is, and the host's misses are
/// untracked from then on (`http.connection.untracked = pool_history`).
pub(crate) const CONNECTIONS_PER_HOST: usize = 64;

/// Default of [`ConnTraceBuilder::pool_history_hosts`](crate::ConnTraceBuilder::pool_history_hosts):
/// the most hosts whose connections the pool history (what miss reasons are
/// read from) remembers at once.
pub const DEFAULT_POOL_HISTORY_HOSTS: usize = 1024;

#[derive(Debug)]
struct HostHistory {
    connections: VecDeque<Arc<ConnectionRecord>>,
    last_used: Instant,
    /// An open connection was forgotten (more than
    /// [`CONNECTIONS_PER_HOST`] open at once): the history is incomplete.
    forgot_open: bool,
}

impl HostHistory {
    /// Nothing left that a miss could be blamed on: every connection is
    /// closed, or idle past its client's idle timeout.
    fn is_dead(&self, now: Instant) -> bool {
        self.connections.iter().all(|r| {
            r.is_closed()
                || (r.in_use() == 0
                    && r.client
                        .idle_timeout
                        .is_some_and(|t| now.saturating_duration_since(r.last_activity()) >= t))
        })
    }
}

/// Every client's connections by host.
#[derive(Debug)]
pub(crate) struct PoolHistory {
    hosts: Mutex<HashMap<HostKey, HostHistory>>,
    /// Most hosts remembered ([`DEFAULT_POOL_HISTORY_HOSTS`]).
    capacity: usize,
    /// The "pool history full" warning was logged.
    full_logged: std::sync::atomic::AtomicBool,
}

impl Default for PoolHistory {
    fn default() -> Self {
        Self::new(DEFAULT_POOL_HISTORY_HOSTS)
    }
}

// Read from the registry's record, so it lives with the model, not in `slot`.
impl Previous {
    fn of(record: &ConnectionRecord, now: Instant, end: Option<ConnectionEnd>) -> Self {
        Self {
            id: record.id(),
            idle: now.saturating_duration_since(record.last_activity()),
            request_count: record.requests.load(Ordering::Relaxed),
            end,
        }
    }
}

/// What the history says about a pool miss.
#[derive(Debug, Clone)]
pub(crate) enum MissVerdict {
    /// The reason is known from the history alone.
    Decided(Miss),
    /// Known from the history, and it shows `record` closed (hyper closed
    /// it after its body was dropped early).
    Closed {
        miss: Miss,
        record: Arc<ConnectionRecord>,
    },
    /// The most recent idle connection should still be in the pool: the
    /// kernel's view of its socket decides ([`decide_from_kernel`]).
    AskKernel {
        local: SocketAddr,
        remote: SocketAddr,
        candidate: Arc<ConnectionRecord>,
        /// When the kernel shows the socket alive (HTTP/1.1), or gives no
        /// answer.
        alive: Miss,
    },
}

/// The reason for a miss whose candidate (the most recently released idle
/// connection, not known closed, not expired) the kernel shows as
/// `lookup`. See the decision table in docs/REFERENCE.md section 14.
pub(crate) fn decide_from_kernel(
    candidate: &ConnectionRecord,
    lookup: &KernelLookup,
    now: Instant,
    alive: Miss,
) -> Miss {
    let server_end = if candidate.http2() {
        ConnectionEnd::GoAway
    } else {
        ConnectionEnd::PeerFin
    };
    match lookup {
        KernelLookup::Found(facts) if facts.state.closed_by_peer() => {
            candidate.set_end(server_end);
            Miss::caused_by(
                MissReason::ClosedByPeer,
                Previous::of(candidate, now, Some(server_end)),
            )
        }
        KernelLookup::NotFound => {
            let end = if candidate.http2() {
                ConnectionEnd::GoAway
            } else {
                ConnectionEnd::PeerClosed
            };
            candidate.set_end(end);
            Miss::caused_by(
                MissReason::ClosedByPeer,
                Previous::of(candidate, now, Some(end)),
            )
        }
        // HTTP/2: after the server's GOAWAY the client may close first.
        KernelLookup::Found(facts) if facts.state.closed_by_us() && candidate.http2() => {
            candidate.set_end(ConnectionEnd::GoAway);
            Miss::caused_by(
                MissReason::ClosedByPeer,
                Previous::of(candidate, now, Some(ConnectionEnd::GoAway)),
            )
        }
        // Our side closed it and nothing we saw explains why: hyper-util's
        // pool dropped it, at release over its idle limit or past its idle
        // timeout. With the idle timeout known and not reached (row 9; our
        // release time is no later than hyper-util's), the idle limit did
        // it: `all_busy`, inferred when that limit is unknown. With the
        // idle timeout unknown, either may have (our release model can miss
        // a release over the limit): `pool_closed`.
        KernelLookup::Found(facts) if facts.state.closed_by_us() => {
            let client = &candidate.client;
            // A limit not set through our builder: the dated close names it.
            if let Some(miss) = inferred_close(candidate, facts, now) {
                return miss;
            }
            let (reason, end) = if client.idle_timeout_known {
                (MissReason::AllBusy, ConnectionEnd::IdleLimit)
            } else {
                (MissReason::PoolClosed, ConnectionEnd::PoolClosed)
            };
            let miss = Miss::caused_by(reason, Previous::of(candidate, now, Some(end)));
            if client.limits_known() {
                miss
            } else {
                miss.limits_unknown()
            }
        }
        // Alive and free, yet the checkout failed. HTTP/2: the server sent
        // GOAWAY and has not closed the socket yet. HTTP/1.1: `alive`
        // (another request holds it, or hyper-util had not put it back).
        KernelLookup::Found(_) if candidate.http2() => {
            candidate.set_end(ConnectionEnd::GoAway);
            Miss::caused_by(
                MissReason::ClosedByPeer,
                Previous::of(candidate, now, Some(ConnectionEnd::GoAway)),
            )
        }
        KernelLookup::Found(_) => alive,
        KernelLookup::Unavailable | KernelLookup::TimedOut => alive,
    }
}

/// The miss a close by the client's own pool explains, when it is dated
/// (see [`inferred`](crate::pool::inferred)) and names a limit this crate
/// could not read; the bound it gives is kept on the client.
fn inferred_close(candidate: &ConnectionRecord, facts: &TcpFacts, now: Instant) -> Option<Miss> {
    let client = &candidate.client;
    if client.limits_known() {
        return None;
    }
    let close = pool_close(candidate, facts, now)?;
    client.inferred.observe(close);
    let (reason, end) = match close {
        PoolClose::AtRelease { idle_others } if !client.max_idle_known => {
            (over_limit_reason(idle_others), ConnectionEnd::IdleLimit)
        }
        PoolClose::Expired { .. } if !client.idle_timeout_known => {
            (MissReason::IdleExpired, ConnectionEnd::IdleTimeout)
        }
        _ => return None,
    };
    close.mark(candidate);
    let mut miss =
        Miss::caused_by(reason, Previous::of(candidate, now, Some(end))).limits_inferred();
    if reason == MissReason::IdleExpired {
        miss.inferred_idle_timeout = client.inferred.idle_timeout();
    }
    Some(miss)
}

impl PoolHistory {
    /// A history of at most `capacity` hosts.
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            hosts: Mutex::new(HashMap::new()),
            capacity,
            full_logged: std::sync::atomic::AtomicBool::new(false),
        }
    }

    fn hosts(&self) -> MutexGuard<'_, HashMap<HostKey, HostHistory>> {
        self.hosts.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Remembers a new connection to `host`, and its DNS answer as the
    /// newest for the host. When the table is full, a host whose
    /// connections are all closed (or idle-expired) is forgotten, the one
    /// unused the longest; when none is, `host` is not remembered and
    /// `false` is returned (the table is full of live hosts).
    pub(crate) fn record_connection(&self, host: HostKey, record: Arc<ConnectionRecord>) -> bool {
        let now = Instant::now();
        let mut hosts = self.hosts();
        if hosts.len() >= self.capacity && !hosts.contains_key(&host) {
            let dead = hosts
                .iter()
                .filter(|(_, h)| h.is_dead(now))
                .min_by_key(|(_, h)| h.last_used)
                .map(|(k, _)| k.clone());
            match dead {
                Some(oldest) => {
                    hosts.remove(&oldest);
                }
                None => return false,
            }
        }
        let history = hosts.entry(host).or_insert_with(|| HostHistory {
            connections: VecDeque::new(),
            last_used: now,
            forgot_open: false,
        });
        history.last_used = now;
        // A newer DNS answer: the host's older connections to an address it
        // no longer holds are stale (checked here, once per connection, so
        // a response only reads a flag).
        if !record.setup.proxied && !record.setup.dns_answers.is_empty() {
            let answer: Vec<IpAddr> = record.setup.dns_answers.iter().map(|a| a.ip()).collect();
            for older in &history.connections {
                if !older.setup.proxied
                    && older
                        .setup
                        .peer_addr
                        .is_some_and(|peer| !answer.contains(&peer.ip()))
                {
                    older.mark_dns_stale();
                }
            }
        }
        if history.connections.len() >= CONNECTIONS_PER_HOST {
            // A closed one first; then one hyper-util has closed as far as
            // the history knows (released over the idle limit, idle past
            // the idle timeout, or ended): such a one can no longer be a
            // miss's candidate. Only an open one is a loss.
            let now = Instant::now();
            let gone = |r: &Arc<ConnectionRecord>| {
                r.in_use() == 0
                    && (r.is_over_idle_limit()
                        || r.end().is_some()
                        || r.client
                            .idle_timeout
                            .is_some_and(|t| now.saturating_duration_since(r.last_activity()) >= t))
            };
            let forgettable = history
                .connections
                .iter()
                .position(|r| r.is_closed())
                .or_else(|| history.connections.iter().position(gone));
            match forgettable {
                Some(closed) => {
                    history.connections.remove(closed);
                }
                None => {
                    history.connections.pop_front();
                    history.forgot_open = true;
                }
            }
        }
        history.connections.push_back(record);
        true
    }

    /// `host` has no place in a full table of live hosts (the request's
    /// miss is untracked), checked before its connect.
    fn is_untracked(
        hosts: &HashMap<HostKey, HostHistory>,
        host: &HostKey,
        capacity: usize,
    ) -> bool {
        match hosts.get(host) {
            Some(history) => history.forgot_open,
            None => {
                let now = Instant::now();
                hosts.len() >= capacity && !hosts.values().any(|h| h.is_dead(now))
            }
        }
    }

    /// Why `client` found no idle connection to `host` at `now` (called when
    /// reqwest calls the connector: hyper-util's pool checkout just failed,
    /// or its pool is disabled). The decision table is in docs/REFERENCE.md
    /// section 14; each step below is one row.
    /// `in_flight`: requests to the host in flight now, this one included.
    pub(crate) fn classify_miss(
        &self,
        host: &HostKey,
        client: &ClientState,
        now: Instant,
        in_flight: u64,
    ) -> MissVerdict {
        let hosts = self.hosts();
        if Self::is_untracked(&hosts, host, self.capacity) {
            if !self.full_logged.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    target: "reqwest_conntrace",
                    "pool history full: {} hosts with live connections (or over {} open connections to one host); misses to further hosts are untracked ({}={}); raise ConnTraceBuilder::pool_history_hosts",
                    hosts.len(),
                    CONNECTIONS_PER_HOST,
                    semconv::HTTP_CONNECTION_UNTRACKED,
                    semconv::UNTRACKED_POOL_HISTORY,
                );
            }
            return MissVerdict::Decided(Miss::untracked());
        }
        let mine: Vec<&Arc<ConnectionRecord>> = hosts
            .get(host)
            .map(|h| {
                h.connections
                    .iter()
                    .filter(|r| r.client.id == client.id)
                    .collect()
            })
            .unwrap_or_default();
        // 1. No connection of this client to the host yet.
        if mine.is_empty() {
            let earlier_client = hosts
                .get(host)
                .is_some_and(|h| h.connections.iter().any(|r| r.client.id < client.id));
            let young = now.saturating_duration_since(client.built_at) < NEW_CLIENT_WINDOW;
            return MissVerdict::Decided(Miss::new(if earlier_client && young {
                MissReason::NewClient
            } else {
                MissReason::Cold
            }));
        }
        // 2. No idle pool on purpose: hyper-util never checks one out.
        if client.max_idle_per_host == Some(0) {
            return MissVerdict::Decided(Miss::new(MissReason::PoolDisabled));
        }
        // 3. The pool was never warm: no connection has finished a response
        //    yet (a concurrent first burst, however its connects interleave).
        if mine.iter().all(|r| r.last_released().is_none()) {
            return MissVerdict::Decided(Miss::new(MissReason::Cold));
        }
        // hyper-util hands out the most recently released idle connection
        // first: that is the one this request would have had.
        let Some(candidate) = mine
            .iter()
            .filter(|r| r.http2() || r.in_use() == 0)
            .max_by_key(|r| r.last_activity())
        else {
            // 4. Every established connection is in use.
            return MissVerdict::Decided(Miss::new(MissReason::AllBusy));
        };
        let previous = |end| Previous::of(candidate, now, Some(end));
        // 5. Its body was dropped before the end (hyper had not read it all,
        //    or the pool would have handed the connection out).
        if candidate.is_discarded() || candidate.is_dropped_early() {
            return MissVerdict::Closed {
                miss: Miss::caused_by(MissReason::Discarded, previous(ConnectionEnd::Discarded)),
                record: Arc::clone(candidate),
            };
        }
        // 6. The server said it would close it.
        if candidate.said_connection_close() {
            candidate.set_end(ConnectionEnd::ConnectionClose);
            return MissVerdict::Decided(Miss::caused_by(
                MissReason::RequestLimit,
                previous(ConnectionEnd::ConnectionClose),
            ));
        }
        // 7. Already known closed by the server (a failed request, the kernel).
        if let Some(end) = candidate.end().filter(|e| e.by_server()) {
            return MissVerdict::Decided(Miss::caused_by(MissReason::ClosedByPeer, previous(end)));
        }
        // 8. Released while the idle pool was full (an idle limit not
        //    set through our builder: inferred from the kernel's view).
        if candidate.is_over_idle_limit() {
            return MissVerdict::Decided(if client.max_idle_known {
                Miss::caused_by(MissReason::AllBusy, previous(ConnectionEnd::IdleLimit))
            } else {
                Miss::caused_by(
                    over_limit_reason(candidate.idle_others_at_release()),
                    previous(ConnectionEnd::IdleLimit),
                )
                .limits_inferred()
            });
        }
        // 9. Idle past the client's idle timeout.
        if client
            .idle_timeout
            .is_some_and(|t| now.saturating_duration_since(candidate.last_activity()) >= t)
        {
            return MissVerdict::Decided(Miss::caused_by(
                MissReason::IdleExpired,
                previous(ConnectionEnd::IdleTimeout),
            ));
        }
        // 10. Alive as far as we know: the kernel decides. If it is alive,
        //     either another request in flight to the host holds it
        //     (hyper-util hands a connection out before its response shows
        //     us who has it): `all_busy`; or nothing else is in flight, so
        //     hyper-util had not put it back yet: `release_race`.
        let attributed: u64 = hosts
            .get(host)
            .map(|h| h.connections.iter().map(|r| u64::from(r.in_use())).sum())
            .unwrap_or(0);
        let others_unattributed = in_flight.saturating_sub(1 + attributed) > 0;
        let alive = if others_unattributed || candidate.http2() {
            Miss::new(MissReason::AllBusy)
        } else {
            Miss::caused_by(MissReason::ReleaseRace, Previous::of(candidate, now, None))
        };
        match (candidate.setup.local_addr, candidate.setup.peer_addr) {
            (Some(local), Some(remote)) => MissVerdict::AskKernel {
                local,
                remote,
                candidate: Arc::clone(candidate),
                alive,
            },
            _ => MissVerdict::Decided(alive),
        }
    }

    /// The connection this request's own connect made, if it succeeded.
    pub(crate) fn made_for(
        &self,
        host: &HostKey,
        request_id: u64,
    ) -> Option<Arc<ConnectionRecord>> {
        let hosts = self.hosts();
        hosts
            .get(host)?
            .connections
            .iter()
            .rev()
            .find(|r| r.trigger_id == Some(request_id))
            .cloned()
    }

    /// The HTTP/2 connection a request that called no connector was
    /// multiplexed onto: the host's most recently active open one that was
    /// ready before `start`.
    pub(crate) fn likely_multiplexed(
        &self,
        host: &HostKey,
        start: Instant,
    ) -> Option<Arc<ConnectionRecord>> {
        let hosts = self.hosts();
        hosts
            .get(host)?
            .connections
            .iter()
            .filter(|r| r.http2() && !r.is_closed() && r.end().is_none() && r.ready_at() <= start)
            .max_by_key(|r| r.last_activity())
            .cloned()
    }

    /// The connection a request that failed without calling the connector
    /// most likely went out on: hyper-util hands out the most recently
    /// released idle connection of the host, so the one (of any client of
    /// this handle) with the latest release before `start`, not in use and
    /// not known closed.
    pub(crate) fn likely_pooled(
        &self,
        host: &HostKey,
        start: Instant,
    ) -> Option<Arc<ConnectionRecord>> {
        let hosts = self.hosts();
        hosts
            .get(host)?
            .connections
            .iter()
            .filter(|r| {
                !r.http2()
                    && r.in_use() == 0
                    && !r.is_closed()
                    && !r.is_discarded()
                    && r.end().is_none()
                    && !r.said_connection_close()
                    && r.last_released().is_some_and(|t| t <= start)
            })
            .max_by_key(|r| r.last_activity())
            .cloned()
    }

    /// `record` carries no request any more (an HTTP/1.1 body read to its
    /// end, an HTTP/2 connection's last stream ended): it goes back to the
    /// pool, unless the client's idle pool for the host is already full
    /// (`pool_max_idle_per_host`), in which case hyper-util closes it.
    /// Returns `true` when it marked the connection over the limit.
    /// `request_started`: start of the request whose end released it.
    pub(crate) fn on_released(
        &self,
        host: &HostKey,
        record: &ConnectionRecord,
        now: Instant,
        request_started: Instant,
    ) -> bool {
        let limit = record.client.max_idle_per_host;
        // Unlimited by configuration: nothing to count.
        if limit.is_none() && record.client.max_idle_known {
            return false;
        }
        let hosts = self.hosts();
        let Some(history) = hosts.get(host) else {
            return false;
        };
        let idle: Vec<&Arc<ConnectionRecord>> = history
            .connections
            .iter()
            .filter(|r| {
                r.id() != record.id()
                    && r.client.id == record.client.id
                    && r.in_use() == 0
                    && !r.is_discarded()
                    && !r.is_over_idle_limit()
                    && !r.is_closed()
                    && record
                        .client
                        .idle_timeout
                        .is_none_or(|t| now.saturating_duration_since(r.last_activity()) < t)
            })
            .collect();
        // Kept for inferring a limit this crate could not read, unless
        // another release, during this request, came so close that
        // hyper-util may have seen the two in the other order (then neither
        // count is a bound).
        if !record.client.max_idle_known {
            let mut ambiguous = false;
            for other in &idle {
                if other.last_released().is_some_and(|t| {
                    t > request_started && now.saturating_duration_since(t) < RELEASE_ORDER_UNSURE
                }) {
                    other.forget_idle_others_at_release();
                    ambiguous = true;
                }
            }
            if ambiguous {
                record.forget_idle_others_at_release();
            } else {
                record.set_idle_others_at_release(idle.len());
            }
        }
        let idle = idle.len();
        if limit.is_some_and(|limit| idle >= limit) {
            record.mark_over_idle_limit();
            return true;
        }
        false
    }

    /// `client`'s connections to `host` that are idle and not known to be
    /// closed, at most `max`, the most recently released first: the ones a
    /// dated close at release is checked against.
    pub(crate) fn idle_of_client(
        &self,
        host: &HostKey,
        client_id: u64,
        max: usize,
    ) -> Vec<Arc<ConnectionRecord>> {
        let hosts = self.hosts();
        let Some(history) = hosts.get(host) else {
            return Vec::new();
        };
        history
            .connections
            .iter()
            .rev()
            .filter(|r| {
                r.client.id == client_id
                    && r.in_use() == 0
                    && !r.is_closed()
                    && r.last_released().is_some()
            })
            .take(max)
            .cloned()
            .collect()
    }
}
