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
//! sock_diag). [`PoolHistory::classify_miss`] and
//! [`decide_from_kernel`]
//! are the decision table of docs/REFERENCE.md section 14, row by row; the
//! connection a miss blames is its [`Previous`].
//!
//! [`decide_from_kernel`]: crate::pool::kernel_decision::decide_from_kernel

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use crate::miss::{ConnectionEnd, MissReason};
use crate::pool::client::{ClientState, NEW_CLIENT_WINDOW};
use crate::pool::end_report::{
    ended_before_idle_timeout, peer_close_kind, reported_closed_at_release,
};
use crate::pool::host::HostKey;
use crate::pool::in_flight::InFlight;
use crate::pool::inferred::{
    CLOSE_DATING_SLACK, CLOSED_AT_RELEASE, PoolClose, RELEASE_ORDER_UNSURE, RELEASE_REORDER_WINDOW,
    over_limit_reason,
};
use crate::pool::kernel_decision::KernelQuestion;
use crate::pool::losses::{
    closed_on_its_own, http2_replaced, http2_spare, known_loss, known_loss_miss, loss_told,
    name_loss, name_next_known_loss, name_next_known_loss_for, named_since_use, server_end_reason,
};
use crate::pool::record::ConnectionRecord;
use crate::pool::slot::{Miss, Previous};
use crate::semconv;

/// Connections remembered per host before ended ones are forgotten: past
/// it, each new connection makes the history forget its ended ones, oldest
/// first, until it is back under this (a closed one, or one the pool has
/// closed as far as the history knows: over the idle limit, idle past the
/// idle timeout, ended), but for losses no miss named yet (each explains a
/// miss to come). Those and open connections are kept past it (a host with
/// more connections in use at once than this, at peak load, keeps every
/// How long before a miss is classified its own request, and those started
/// with it, may have started: 5 ms (the connector is called right after
/// hyper-util's checkout fails; a busy runtime delays it). Requests started
/// since restarted no HTTP/2 idle clock the miss would not have seen.
const MISS_START_SLACK: std::time::Duration = std::time::Duration::from_millis(5);

/// miss attributed), up to [`OPEN_CONNECTIONS_PER_HOST`].
pub(crate) const CONNECTIONS_PER_HOST: usize = 64;

/// The most connections one host's history holds: when all of them are
/// open, the oldest is forgotten, and the host's misses are untracked from
/// then on (`http.connection.untracked = pool_history`; its history is
/// incomplete). Bounds a miss's walk over the host's connections and the
/// history's memory (8 bytes a connection, plus the records the registry
/// holds anyway).
pub(crate) const OPEN_CONNECTIONS_PER_HOST: usize = 16_384;

/// Default of [`ConnTraceBuilder::pool_history_hosts`](crate::ConnTraceBuilder::pool_history_hosts):
/// the most hosts whose connections the pool history (what miss reasons are
/// read from) remembers at once.
pub const DEFAULT_POOL_HISTORY_HOSTS: usize = 1024;

#[derive(Debug)]
struct HostHistory {
    connections: VecDeque<Arc<ConnectionRecord>>,
    last_used: Instant,
    /// An open connection was forgotten (more than
    /// [`OPEN_CONNECTIONS_PER_HOST`] open at once): the history is incomplete.
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
                        .is_some_and(|t| now.saturating_duration_since(r.idle_since()) >= t))
        })
    }
}

/// What a connection's release to the pool showed
/// ([`PoolHistory::on_released`]).
#[derive(Debug, Default)]
pub(crate) struct Release {
    /// The idle pool was surely full: hyper-util closed it.
    pub(crate) over_limit: bool,
    /// Connections released just before it whose release, believed within
    /// the limit until now, is only maybe so (hyper-util may have put them
    /// back after this one): the kernel is to confirm each.
    pub(crate) made_unsure: Vec<Arc<ConnectionRecord>>,
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

/// What the history says about a pool miss.
#[derive(Debug, Clone)]
pub(crate) enum MissVerdict {
    /// The reason is known from the history alone.
    Decided(Miss),
    /// Known from the history, and it shows `record` closed (hyper closed
    /// it after its body failed).
    Closed {
        miss: Miss,
        record: Arc<ConnectionRecord>,
    },
    /// The most recent idle connection should still be in the pool (or its
    /// body was dropped, which closed it only if hyper had not read it
    /// all): the kernel's view of its socket decides ([`decide_from_kernel`]).
    ///
    /// [`decide_from_kernel`]: crate::pool::kernel_decision::decide_from_kernel
    AskKernel(KernelQuestion),
}

/// What a client's connections show of a pool that keeps no idle
/// connection ([`PoolHistory::pool_off_evidence`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PoolOff {
    /// Shown: its idle limit is 0.
    Shown,
    /// Shown once the connections released just before close, as they
    /// would at release, by this instant.
    Pending(Instant),
    /// Not shown.
    No,
}

/// Closes at release [`PoolHistory::shows_pool_off`] needs before it
/// infers a pool that keeps no idle connection.
pub(crate) const POOL_OFF_EVIDENCE: usize = 2;

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

    /// `host` as the history's own key when it remembers the host: a
    /// connection keeps that one (its strings shared by every connection to
    /// the host) rather than its request's copy, for its lifetime.
    pub(crate) fn shared_key(&self, host: &HostKey) -> HostKey {
        self.hosts()
            .get_key_value(host)
            .map_or_else(|| host.clone(), |(key, _)| key.clone())
    }

    /// Remembers a new connection to `host`. When the table is full, a
    /// host whose connections are all closed (or idle-expired) is
    /// forgotten, the one unused the longest; when none is, `host` is not
    /// remembered and `false` is returned (the table is full of live
    /// hosts).
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
        if history.connections.len() >= CONNECTIONS_PER_HOST {
            // Closed ones first, oldest first; then ones hyper-util has
            // closed as far as the history knows (released over the idle
            // limit, idle past the idle timeout, or ended): such a one can
            // no longer be a miss's candidate. Only an open one is a loss.
            let now = Instant::now();
            let gone = |r: &Arc<ConnectionRecord>| {
                r.in_use() == 0
                    && (r.is_over_idle_limit()
                        || r.end().is_some()
                        || r.client
                            .idle_timeout
                            .is_some_and(|t| now.saturating_duration_since(r.idle_since()) >= t))
            };
            // A loss no miss named yet (see `known_loss`) is kept: a miss
            // to come is explained by it.
            let awaiting =
                |r: &Arc<ConnectionRecord>| known_loss(r).is_some() && !r.is_close_named();
            forget_oldest(&mut history.connections, |r| r.is_closed() && !awaiting(r));
            forget_oldest(&mut history.connections, |r| gone(r) && !awaiting(r));
            if history.connections.len() >= OPEN_CONNECTIONS_PER_HOST {
                match history.connections.iter().position(awaiting) {
                    Some(oldest) => {
                        history.connections.remove(oldest);
                    }
                    None => {
                        history.connections.pop_front();
                        history.forgot_open = true;
                    }
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
    /// `in_flight`: requests to the host in flight now, this one included
    /// (a count, or a count with their starts).
    pub(crate) fn classify_miss(
        &self,
        host: &HostKey,
        client: &ClientState,
        now: Instant,
        in_flight: impl Into<InFlight>,
    ) -> MissVerdict {
        let load = in_flight.into();
        let in_flight = load.count;
        let hosts = self.hosts();
        if Self::is_untracked(&hosts, host, self.capacity) {
            if !self.full_logged.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    target: "reqwest_conntrace",
                    "pool history full: {} hosts with live connections (or over {} open connections to one host); misses to further hosts are untracked ({}={}); raise ConnTraceBuilder::pool_history_hosts",
                    hosts.len(),
                    OPEN_CONNECTIONS_PER_HOST,
                    semconv::HTTP_CONNECTION_UNTRACKED,
                    semconv::UNTRACKED_POOL_HISTORY,
                );
            }
            return MissVerdict::Decided(Miss::untracked());
        }
        let history = hosts.get(host);
        // This client's connections to the host, oldest first (walked in
        // place: a miss allocates nothing here).
        let mine = || {
            history
                .into_iter()
                .flat_map(|h| h.connections.iter())
                .filter(|r| r.client.id == client.id)
        };
        // 1. No connection of this client to the host yet.
        if mine().next().is_none() {
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
        // 2. No idle pool on purpose: hyper-util never checks one out. Once
        //    warm: a concurrent first burst is cold (row 3), as with a pool.
        if client.max_idle_per_host == Some(0) && mine().any(|r| r.last_released().is_some()) {
            return MissVerdict::Decided(Miss::new(MissReason::PoolDisabled));
        }

        // 3. The pool was never warm: no connection has finished a response
        //    yet (a concurrent first burst, however its connects interleave).
        //    Unless every connection it had was given up by a request that
        //    timed out on it (row 5c): the latest of those is the cause.
        if mine().all(|r| r.last_released().is_none()) {
            let abandoned =
                |r: &&Arc<ConnectionRecord>| r.seen_end() == Some(ConnectionEnd::Abandoned);
            if mine().all(|r| abandoned(&r) || r.is_closed())
                && let Some(latest) = mine().filter(abandoned).max_by_key(|r| r.ready_at())
            {
                return MissVerdict::Decided(Miss::caused_by(
                    MissReason::Abandoned,
                    Previous::of(latest, now, Some(ConnectionEnd::Abandoned)),
                ));
            }
            return MissVerdict::Decided(Miss::new(MissReason::Cold));
        }
        // hyper-util hands out the most recently released idle connection
        // first: that is the one this request would have had. One whose
        // announced close an earlier miss named is gone, its loss told.
        // HTTP/2: a spare connection (see `http2_spare`) was never the
        // pool's, and one that never carried a request is none either; one
        // a miss found expired by the pool is the pool's no more once the
        // connection made since has carried a request (`http2_replaced`).
        // Concurrent misses (others in flight), HTTP/1.1: one connection,
        // one miss. A connection a miss named since its last use (that miss
        // is asking the kernel about it, or named its end: the server's, the
        // idle timeout's, the idle limit's)
        // explains no further miss: a burst after the server closed the
        // idle ones names each once, and the misses beyond them find every
        // connection busy (row 4). A connection believed closed at its
        // release over the idle limit was never in hyper-util's idle list:
        // a kept one is the candidate first, and only when none is left
        // does such a close (row 8). Alone, the belief is in doubt (row 8)
        // and the most recent release is the candidate.
        let concurrent = in_flight > 1;
        let eligible = |r: &&Arc<ConnectionRecord>| {
            (r.http2() || r.in_use() == 0)
                && (!r.http2() || r.in_use() > 0 || r.last_released().is_some())
                && !http2_spare(r, mine)
                && !http2_replaced(r, mine)
                && !loss_told(r)
                && (!concurrent || r.http2() || !named_since_use(r))
        };
        // HTTP/1.1: the most recently released. HTTP/2: the most recently
        // checked out (hyper-util hands its one pooled HTTP/2 connection to
        // every checkout), not the one whose stream ended last: a long
        // request on a spare, or on a connection the pool expired, ends late
        // (a tester's TLS waves beside 1 s requests named such a spare, 2 of
        // 12 runs).
        let recency = |r: &&Arc<ConnectionRecord>| {
            if r.http2() {
                r.http2_idle_since()
            } else {
                r.last_activity()
            }
        };
        let candidate = mine()
            .filter(eligible)
            .filter(|r| !concurrent || !r.is_over_idle_limit())
            .max_by_key(recency)
            .or_else(|| mine().filter(eligible).max_by_key(recency));
        // 3b. An idle pool inferred off (an idle limit of 0 from the pool's
        //     closes at release, never a connection handed out again): no
        //     connection is ever idle in it, so neither busy connections
        //     (row 4) nor a candidate's end (rows 5 on) is the cause; it
        //     closed the candidate at its release, as every one.
        if !client.max_idle_known
            && client.inferred.keeps_none()
            && candidate.is_none_or(|c| !c.http2())
        {
            // The connection it closed last, not one still carrying the
            // request its connect was made for.
            let closed = mine()
                .filter(|r| !r.http2() && r.in_use() == 0)
                .filter_map(|r| Some((r.last_released()?, r)))
                .max_by_key(|(released, _)| *released)
                .map(|(_, r)| r);
            let miss = match closed {
                Some(candidate) => {
                    candidate.infer_end(ConnectionEnd::IdleLimit);
                    Miss::caused_by(
                        MissReason::PoolDisabled,
                        Previous::of(candidate, now, Some(ConnectionEnd::IdleLimit)),
                    )
                }
                None => Miss::new(MissReason::PoolDisabled),
            };
            return MissVerdict::Decided(miss.limits_inferred());
        }
        let Some(candidate) = candidate else {
            // 4. Every established connection is in use; unless one was
            //    lost in a way known without the kernel (an announced
            //    close, a request that gave up on it, a failed body) and no
            //    miss named it yet: the pool lost it.
            return MissVerdict::Decided(
                name_next_known_loss(mine)
                    .map_or(Miss::new(MissReason::AllBusy), |r| known_loss_miss(r, now)),
            );
        };
        // Read before the rest: a response on it from now on shows it alive.
        let requests_seen = candidate.requests.load(Ordering::Relaxed);
        let previous = |end| Previous::of(candidate, now, Some(end));
        // 5. Its body failed: hyper closed it. 5c. A request on it gave up
        //    on its response (HTTP/1.1): hyper closed it (checked before
        //    5b: a body dropped earlier did not end it then). 6. The server
        //    (or the client's own request) said it would close it. Each
        //    such loss is named by one miss: when another miss named the
        //    candidate's meanwhile, the latest one no miss named yet, if
        //    any.
        if known_loss(candidate).is_some() {
            let miss = name_loss(candidate, mine, now);
            return if candidate.is_discarded()
                && miss.previous.is_some_and(|p| p.id == candidate.id())
            {
                MissVerdict::Closed {
                    miss,
                    record: Arc::clone(candidate),
                }
            } else {
                MissVerdict::Decided(miss)
            };
        }
        // 5b. Its body was dropped before the end: closed only if hyper had
        //     not read it all; the kernel tells.
        if candidate.is_dropped_early() {
            return Self::ask_kernel(&hosts, host, candidate, in_flight, now, requests_seen);
        }
        // 7. Already known closed by the server (a failed request, the kernel).
        if let Some(end) = candidate.end().filter(|e| e.by_server()) {
            // An HTTP/1.1 end only inferred from the kernel's view, while
            // other requests are in flight without a response: one of them
            // may hold it, its response announcing that close (row 6). The
            // kernel is asked again, and the miss waits for such a response
            // as row 10 does (`response_may_explain_end`).
            if !candidate.http2()
                && candidate.seen_end().is_none()
                && candidate.setup.local_addr.is_some()
                && Self::others_in_flight(&hosts, host, in_flight)
            {
                return Self::ask_kernel(&hosts, host, candidate, in_flight, now, requests_seen);
            }
            // Named once by a burst (see the candidate above).
            candidate.mark_named_by_miss(now);
            return MissVerdict::Decided(Miss::caused_by(
                server_end_reason(candidate, Some(end)),
                previous(end),
            ));
        }
        // 8. Released while the idle pool was full (an idle limit not
        //    set through our builder: inferred from the kernel's view).
        //    Not for a miss with nothing else to the host in flight: the
        //    connections idle at that release would still be in
        //    hyper-util's idle list (nothing took them), and the checkout
        //    would have had one. The count behind the belief included
        //    connections closed unbeknown to us, and the candidate may be
        //    on its way back to this very checkout (hyper-util's `put`
        //    serves a waiting checkout before it counts the limit): the
        //    kernel decides (row 10).
        //    With the limit inferred and no bound on it yet, a close that
        //    would read `all_busy` may be a pool that keeps none: the kernel
        //    path waits for that to show (row 10, *A pool that keeps none*).
        let inferred_reason = (!client.max_idle_known)
            .then(|| over_limit_reason(candidate.idle_others_at_release(), &client.inferred));
        let limit_unbounded =
            inferred_reason == Some(MissReason::AllBusy) && client.inferred.idle_limit().is_none();
        if candidate.is_over_idle_limit() && in_flight > 1 && !limit_unbounded {
            // 8b. The limit is ours to count, but the count is a belief: a
            //     request in flight whose response has not shown its
            //     connection yet may hold this one, kept after all (a
            //     release counted against a connection hyper-util had
            //     turned away unbeknown to us). The kernel tells: alive is
            //     `all_busy` naming nothing (and the miss looks past it),
            //     closed by us is the idle limit's close (row 10).
            if inferred_reason.is_none()
                && candidate.setup.local_addr.is_some()
                && Self::others_in_flight(&hosts, host, in_flight)
            {
                return Self::ask_kernel(&hosts, host, candidate, in_flight, now, requests_seen);
            }
            candidate.mark_named_by_miss(now);
            return MissVerdict::Decided(match inferred_reason {
                None => Miss::caused_by(MissReason::AllBusy, previous(ConnectionEnd::IdleLimit)),
                Some(reason) => {
                    Miss::caused_by(reason, previous(ConnectionEnd::IdleLimit)).limits_inferred()
                }
            });
        }
        // 9. Idle past the client's idle timeout. Unless the kernel's report
        //    of its socket's end dates that end before the timeout (the
        //    server's close), or an idle limit may have closed it at its
        //    release, before the timeout could (the count at a release is
        //    no proof under concurrency, see `on_released`, and a burst's
        //    first miss can come before the others count in flight): the
        //    kernel path dates the close and names those (row 10). Counted
        //    from the caller's read of the body: past the timeout only as
        //    counted from hyper's (a body read late), the kernel decides
        //    (the server may have closed it first; row 9 there).
        //    HTTP/2: hyper-util restarts a shared connection's idle clock at
        //    each checkout, not at a response's end; requests still in
        //    flight may have restarted it unseen (their starts tell). The
        //    kernel decides: a server's GOAWAY or close before the clock ran
        //    out is the server's (`kernel_decision::http2_pool_expired`).
        if candidate.http2()
            && let Some(t) = client.idle_timeout
        {
            let before = now.checked_sub(MISS_START_SLACK).unwrap_or(now);
            candidate.note_http2_clock_restart(load.http2_clock_restart(
                candidate.http2_idle_since(),
                t,
                before,
            ));
        }
        let limit_may_have_closed = candidate.is_over_idle_limit_unsure()
            || client.max_idle_per_host.is_some()
            || client.inferred.idle_limit().is_some();
        if !candidate.http2()
            && client
                .idle_timeout
                .is_some_and(|t| now.saturating_duration_since(candidate.last_activity()) >= t)
            && !ended_before_idle_timeout(candidate)
            && (!limit_may_have_closed || candidate.setup.local_addr.is_none())
        {
            candidate.mark_named_by_miss(now);
            return MissVerdict::Decided(Miss::caused_by(
                MissReason::IdleExpired,
                previous(ConnectionEnd::IdleTimeout),
            ));
        }
        // 10. Alive as far as we know: the kernel decides. Unless (9b) it
        //     never finished a response, with other requests in flight: its
        //     connect's request holds it (the kernel would show it
        //     established: `all_busy`), and a connection lost in a way known
        //     without the kernel awaiting a miss (row 4's exception) is the
        //     cause, named now. Named after the kernel's answer instead, it
        //     would go to misses that came later and were decided at once,
        //     leaving this one `all_busy`. A candidate released before may
        //     be idle and closed by the server: the kernel decides that one.
        if !candidate.http2()
            && candidate.last_released().is_none()
            && Self::others_in_flight(&hosts, host, in_flight)
            && let Some(ended) = name_next_known_loss(mine)
        {
            return MissVerdict::Decided(known_loss_miss(ended, now));
        }
        Self::ask_kernel(&hosts, host, candidate, in_flight, now, requests_seen)
    }

    /// Whether requests to `host` other than the missing one are in flight
    /// (`in_flight` counts them all) without a response that showed their
    /// connection yet: each may hold a connection the history sees free.
    fn others_in_flight(
        hosts: &HashMap<HostKey, HostHistory>,
        host: &HostKey,
        in_flight: u64,
    ) -> bool {
        Self::others_in_flight_count(hosts, host, in_flight) > 1
    }

    /// Requests to `host` in flight (`in_flight`) not attributed to a
    /// connection yet.
    fn others_in_flight_count(
        hosts: &HashMap<HostKey, HostHistory>,
        host: &HostKey,
        in_flight: u64,
    ) -> u64 {
        let attributed: u64 = hosts
            .get(host)
            .map(|h| h.connections.iter().map(|r| u64::from(r.in_use())).sum())
            .unwrap_or(0);
        in_flight.saturating_sub(attributed)
    }

    /// Row 10 (and 5, a dropped body): the kernel's view of `candidate`'s
    /// socket decides. If it is alive, either another request in flight to
    /// the host holds it (hyper-util hands a connection out before its
    /// response shows us who has it): `all_busy`; or nothing else is in
    /// flight, so hyper-util had not put it back yet: `release_race`.
    fn ask_kernel(
        hosts: &HashMap<HostKey, HostHistory>,
        host: &HostKey,
        candidate: &Arc<ConnectionRecord>,
        in_flight: u64,
        now: Instant,
        requests_seen: u64,
    ) -> MissVerdict {
        let unattributed = Self::others_in_flight_count(hosts, host, in_flight);
        let others_unattributed = unattributed > 1;
        let alive = if others_unattributed || candidate.http2() {
            Miss::new(MissReason::AllBusy)
        } else {
            Miss::caused_by(MissReason::ReleaseRace, Previous::of(candidate, now, None))
        };
        match (candidate.setup.local_addr, candidate.setup.peer_addr) {
            (Some(local), Some(remote)) => {
                candidate.mark_named_by_miss(now);
                MissVerdict::AskKernel(KernelQuestion {
                    local,
                    remote,
                    candidate: Arc::clone(candidate),
                    alive,
                    requests_seen,
                    released: candidate.last_released(),
                    classified_at: now,
                    others_in_flight: others_unattributed,
                    may_hold: unattributed.saturating_sub(1),
                })
            }
            // No socket to ask about: a dropped body is believed to have
            // closed it.
            _ if candidate.is_dropped_early() => MissVerdict::Closed {
                miss: Miss::caused_by(
                    MissReason::Discarded,
                    Previous::of(candidate, now, Some(ConnectionEnd::Discarded)),
                ),
                record: Arc::clone(candidate),
            },
            _ => MissVerdict::Decided(alive),
        }
    }

    /// The connection a miss to `host` classified at `missed_at` would have
    /// had when another request holds `held`, its candidate (row 10e: the
    /// kernel shows `held` alive while requests without a response are in
    /// flight): hyper-util hands out the most recently released idle
    /// connection first, so that request took `held` and this one found the
    /// next: the most recently released HTTP/1.1 connection of the client
    /// before `held`, idle since before the miss (its request count is the
    /// one at the miss), not named by another miss since its last use, not
    /// believed closed over the idle limit at its release (never in
    /// hyper-util's idle list), and not lost in a way known without the
    /// kernel (an announced close, a request that gave up on it, a failed
    /// body: row 4's exception names those, [`name_known_loss`](Self::name_known_loss),
    /// when the look finds nothing). Marked named by this miss, as a
    /// candidate is.
    pub(crate) fn next_candidate(
        &self,
        host: &HostKey,
        held: &ConnectionRecord,
        missed_at: Instant,
        now: Instant,
    ) -> Option<Arc<ConnectionRecord>> {
        let hosts = self.hosts();
        let next = hosts
            .get(host)?
            .connections
            .iter()
            .filter(|r| {
                r.client.id == held.client.id
                    && r.id() != held.id()
                    && !r.http2()
                    && r.in_use() == 0
                    && r.last_released().is_some()
                    && r.last_activity() <= missed_at
                    && r.last_activity() <= held.last_activity()
                    && !r.is_over_idle_limit()
                    && known_loss(r).is_none()
                    && !named_since_use(r)
            })
            .max_by_key(|r| r.last_activity())?;
        next.mark_named_by_miss(now);
        Some(Arc::clone(next))
    }

    /// An `all_busy` miss of `client` to `host` classified at `missed_at`
    /// and decided when the kernel answered about `asked` (its candidate;
    /// row 10e / 10g): when one of its connections released by the miss was
    /// known lost (see [`known_loss`]: an announced close, a request that
    /// gave up on it, a failed body) and no miss named it yet, that loss is
    /// the cause (row 4's exception), named now. `asked` is among them even
    /// though this miss asked about it (see [`name_next_known_loss_for`]).
    pub(crate) fn name_known_loss(
        &self,
        host: &HostKey,
        client_id: u64,
        asked: u64,
        missed_at: Instant,
        now: Instant,
    ) -> Option<Miss> {
        let hosts = self.hosts();
        let history = hosts.get(host)?;
        let ended = name_next_known_loss_for(asked, || {
            history.connections.iter().filter(|r| {
                r.client.id == client_id && r.last_released().is_some_and(|t| t <= missed_at)
            })
        })?;
        Some(known_loss_miss(ended, now))
    }

    /// The end to name for `previous` when its miss is recorded: the one
    /// decided, unless the connection's own traffic has since shown how the
    /// server ended it (a request on it failed with a reset, GOAWAY or an
    /// HTTP/2 error after the kernel's view decided the miss): that wins.
    /// Else a socket found gone (`peer_closed`) reads as the server's FIN or
    /// reset when the kernel's report of its end tells ([`peer_close_kind`],
    /// plain TCP). A connection that was alive at the miss (no end) stays
    /// so.
    pub(crate) fn previous_end(
        &self,
        host: &HostKey,
        previous: &Previous,
    ) -> Option<ConnectionEnd> {
        let decided = previous.end?;
        if !decided.by_server() {
            return Some(decided);
        }
        let hosts = self.hosts();
        // The previous connection is usually among the newest: from the back.
        let Some(record) = hosts
            .get(host)
            .and_then(|h| h.connections.iter().rev().find(|r| r.id() == previous.id))
        else {
            return Some(decided);
        };
        let seen = record.seen_end().filter(|e| e.by_server());
        // A socket found gone (`peer_closed`): the report of its end may
        // tell FIN from RST (plain TCP).
        let told = || {
            (decided == ConnectionEnd::PeerClosed)
                .then(|| peer_close_kind(record))
                .flatten()
        };
        Some(seen.or_else(told).unwrap_or(decided))
    }

    /// `previous` when it is an HTTP/2 connection the server ended
    /// (GOAWAY): it takes no new stream, but the responses it carried show
    /// only as their requests' tasks run, which under concurrency can be
    /// after the miss (the GOAWAY comes with the last stream's request,
    /// before its response), so its request count grows until those ran.
    pub(crate) fn ended_http2(
        &self,
        host: &HostKey,
        previous: &Previous,
    ) -> Option<Arc<ConnectionRecord>> {
        if !previous.end.is_some_and(|e| e.by_server()) {
            return None;
        }
        self.newest_connection(host, |r| r.id() == previous.id)
            .filter(|r| r.http2())
    }

    /// The HTTP/2 connection to `host` whose end by the server (GOAWAY)
    /// reached this client at or after `since` (the latest, by id), as the
    /// history knows it: hyper-util resends a request such a connection
    /// refused unprocessed on another one.
    pub(crate) fn http2_ended_since(&self, host: &HostKey, since: Instant) -> Option<u64> {
        self.newest_connection(host, |r| {
            r.http2() && r.server_end_by().is_some_and(|by| by >= since)
        })
        .map(|r| r.id())
    }

    /// The newest connection to `host` (the history keeps them in the
    /// order they were made) that `matches`.
    fn newest_connection(
        &self,
        host: &HostKey,
        matches: impl Fn(&ConnectionRecord) -> bool,
    ) -> Option<Arc<ConnectionRecord>> {
        let hosts = self.hosts();
        hosts
            .get(host)?
            .connections
            .iter()
            .rev()
            .find(|r| matches(r))
            .cloned()
    }

    /// Requests to `host` in flight (`in_flight`) whose response has not
    /// shown their connection yet.
    pub(crate) fn unattributed(&self, host: &HostKey, in_flight: u64) -> u64 {
        let hosts = self.hosts();
        Self::others_in_flight_count(&hosts, host, in_flight)
    }

    /// The connection this request's own connect made, if it succeeded.
    pub(crate) fn made_for(
        &self,
        host: &HostKey,
        request_id: u64,
    ) -> Option<Arc<ConnectionRecord>> {
        self.newest_connection(host, |r| r.trigger_id == Some(request_id))
    }

    /// The HTTP/1.1 connection hyper-util most likely handed a request that
    /// missed at `start` and gave up before its response, while its own
    /// connect (`own`, if it finished) was still running: hyper-util gives
    /// a connection coming back to its pool to a waiting checkout before
    /// it keeps it idle, so the first of the host's connections released
    /// after `start` and before `until` (its own connect's ready time, or
    /// now), not in use and not known ended, is the one its request went
    /// out on (a tester's request timed out on a connection returned to it
    /// this way and named its own connect, which carried nothing: 17 of
    /// 17 runs over TLS). Each is named by one such request after a release
    /// ([`ConnectionRecord::claim_unanswered`]).
    pub(crate) fn returned_to_waiting(
        &self,
        host: &HostKey,
        start: Instant,
        until: Instant,
        own: Option<u64>,
    ) -> Option<Arc<ConnectionRecord>> {
        let hosts = self.hosts();
        let mut returned: Vec<_> = hosts
            .get(host)?
            .connections
            .iter()
            .filter(|r| {
                !r.http2()
                    && Some(r.id()) != own
                    && r.in_use() == 0
                    && !r.is_closed()
                    && !r.is_discarded()
                    && r.end().is_none()
                    && !r.said_connection_close()
                    && r.last_released().is_some_and(|t| t > start && t <= until)
            })
            .collect();
        returned.sort_by_key(|r| r.last_released());
        returned.into_iter().find(|r| r.claim_unanswered()).cloned()
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

    /// The HTTP/2 connection a request that failed with an HTTP/2 error
    /// (GOAWAY, stream reset, connection error) when no likelier one was
    /// found went out on: the host's most recently active HTTP/2
    /// connection, even one already ended (a GOAWAY refuses a burst's
    /// streams together; the first refused request records the end), even
    /// one that became ready after the request started (a cold burst's
    /// streams ride the first connection ready).
    pub(crate) fn latest_http2(&self, host: &HostKey) -> Option<Arc<ConnectionRecord>> {
        let hosts = self.hosts();
        hosts
            .get(host)?
            .connections
            .iter()
            .filter(|r| r.http2())
            .max_by_key(|r| r.last_activity())
            .cloned()
    }

    /// The host's remembered connection whose socket pair is `pair`
    /// (local, remote): one the connection registry no longer holds (its
    /// close was observed) may still be in the host's history.
    pub(crate) fn connection_with_pair(
        &self,
        host: &HostKey,
        pair: crate::pool::record::Pair,
    ) -> Option<Arc<ConnectionRecord>> {
        self.hosts()
            .get(host)?
            .connections
            .iter()
            .rev()
            .find(|r| r.pair() == Some(pair))
            .cloned()
    }

    /// The connection a request that failed without calling the connector
    /// most likely went out on: hyper-util hands out the most recently
    /// released idle connection of the host, so the one (of any client of
    /// this handle) with the latest release before `start`, not in use and
    /// not known closed. A connection pooled after `start` comes after
    /// those: hyper-util checks its pool out a moment after the request
    /// started (its middlewares, reqwest's own preparation), and a connect
    /// that lost its pool race may land unused in the pool in between (a
    /// wave reset at once named none for the request that had such a
    /// connection, made by the previous wave, ready 0.5 ms after the
    /// request started: 3 of 40 runs under load). A connection never used
    /// counts as released when it became ready. One whose body was dropped before its end (hyper
    /// closes it unless it had read the whole body) or believed closed over
    /// the idle limit at its release is most likely not in the pool: taken
    /// only when no other one is left. Each is named by one such request
    /// after a release ([`ConnectionRecord::claim_unanswered`]): of
    /// requests failing at once, the second gets the next most recently
    /// released, as hyper-util handed them out; none when none is left.
    ///
    /// `reset`: the request failed with a reset. The kernel's report of a
    /// socket's end (`kernel::watch_end`) that came since the request
    /// started names the reset one first, when it has come: hyper-util
    /// puts connections back on tasks of their own, so under load its
    /// idle list's order can differ from our releases, and the most
    /// recently released connection may have been still on its way back,
    /// alive (a wave of four resets named one such in about 1 of 150
    /// runs under load). A live socket has no report.
    pub(crate) fn likely_pooled(
        &self,
        host: &HostKey,
        start: Instant,
        reset: bool,
    ) -> Option<Arc<ConnectionRecord>> {
        let hosts = self.hosts();
        let free = || {
            hosts
                .get(host)
                .into_iter()
                .flat_map(|h| h.connections.iter())
                .filter(|r| {
                    !r.http2()
                        && r.in_use() == 0
                        && !r.is_discarded()
                        && !r.said_connection_close()
                        && idle_since(r).is_some()
                        && ((!r.is_closed() && r.end().is_none())
                            || (reset && ended_since(r, start)))
                })
        };
        // An end only the kernel showed (none its traffic showed), seen
        // since the request started: the reset this request failed with
        // may be it. Concurrent misses' looks at the kernel can find the
        // socket reset before this request's error is read (a wave of four
        // resets named none for one of them, 1 of 40 runs under load).
        fn ended_since(r: &ConnectionRecord, start: Instant) -> bool {
            r.seen_end().is_none()
                && (r.socket_end().is_some_and(|end| end.seen_at >= start)
                    || r.closed_seen_at().is_some_and(|t| t >= start))
        }
        // Released, or (never used) ready: pooled since then, as far as we
        // know.
        fn idle_since(r: &ConnectionRecord) -> Option<Instant> {
            r.last_released()
                .or_else(|| r.never_used().then(|| r.ready_at()))
        }
        let mut likely: Vec<_> = free().collect();
        // Most likely in the pool first, then the most recently active (of
        // equals, the later remembered).
        likely.reverse();
        likely.sort_by_key(|r| {
            (
                reset && !ended_since(r, start),
                r.is_dropped_early() || r.is_over_idle_limit(),
                idle_since(r).is_some_and(|t| t > start),
                std::cmp::Reverse(r.last_activity()),
            )
        });
        likely.into_iter().find(|r| r.claim_unanswered()).cloned()
    }

    /// `record` carries no request any more (an HTTP/1.1 body read to its
    /// end, an HTTP/2 connection's last stream ended): it goes back to the
    /// pool, unless the client's idle pool for the host is already full
    /// (`pool_max_idle_per_host`), in which case hyper-util closes it.
    /// Returns `true` when it marked the connection over the limit.
    /// `request_started`: start of the request whose end released it;
    /// `in_flight`: requests to the host in flight now, that one included.
    ///
    /// Idle means released and not taken since, as far as responses show.
    /// A connection never released is not counted: it carries the request
    /// that triggered its connect (hyper-util puts it in the pool when that
    /// request's body ends), unless that request rode a connection released
    /// to its waiting checkout (then its own went to the pool unused). A
    /// request in flight whose response has not come yet may hold a
    /// connection counted idle (hyper-util hands it out at the request's
    /// start, we learn which at its response). A connection whose own
    /// release was only maybe over the limit (unsure, below) may be closed
    /// already. So the count is sure only above those requests and those
    /// unsure connections, and below the connections never released: when the limit
    /// lies between, the release is marked unsure
    /// ([`ConnectionRecord::is_over_idle_limit_unsure`]) and the kernel's
    /// view of the socket decides at a miss ([`decide_from_kernel`]).
    ///
    /// hyper-util puts a connection back on a task of its own, so two
    /// releases closer than [`RELEASE_ORDER_UNSURE`], the earlier one
    /// during this request, may have reached its pool in the other order:
    /// if the count says this one was over the limit only with such an
    /// earlier one counted idle, either may have been the one turned away,
    /// and both are unsure (the earlier ones made so are returned, for the
    /// kernel to confirm). Taken as sure, a connection the pool kept was
    /// named ended at the idle limit while it went on serving (seen once
    /// in 300 runs of 28 requests, 7 at a time, idle pool 2, over TLS,
    /// beside two CPU-burning processes).
    ///
    /// [`decide_from_kernel`]: crate::pool::kernel_decision::decide_from_kernel
    pub(crate) fn on_released(
        &self,
        host: &HostKey,
        record: &ConnectionRecord,
        now: Instant,
        request_started: Instant,
        in_flight: u64,
    ) -> Release {
        let limit = record.client.max_idle_per_host;
        // Unlimited by configuration: nothing to count.
        if limit.is_none() && record.client.max_idle_known {
            return Release::default();
        }
        let hosts = self.hosts();
        let Some(history) = hosts.get(host) else {
            return Release::default();
        };
        let order_unsure = |r: &ConnectionRecord| {
            r.last_released().is_some_and(|t| {
                t > request_started && now.saturating_duration_since(t) < RELEASE_ORDER_UNSURE
            })
        };
        // Walked in place, once: a release allocates nothing here.
        let idle = || {
            history.connections.iter().filter(|r| {
                r.id() != record.id()
                    && r.client.id == record.client.id
                    && r.in_use() == 0
                    && r.last_released().is_some()
                    && !r.is_discarded()
                    && !r.is_over_idle_limit()
                    && !r.is_closed()
                    && record
                        .client
                        .idle_timeout
                        .is_none_or(|t| now.saturating_duration_since(r.idle_since()) < t)
            })
        };
        // Kept for inferring a limit this crate could not read, unless
        // another release, during this request, came so close that
        // hyper-util may have seen the two in the other order (then neither
        // count is a bound).
        let mut counted = None;
        if !record.client.max_idle_known {
            let mut ambiguous = false;
            let mut count = 0;
            for other in idle() {
                count += 1;
                if order_unsure(other) {
                    other.forget_idle_others_at_release();
                    ambiguous = true;
                }
            }
            if ambiguous {
                record.forget_idle_others_at_release();
            } else {
                record.set_idle_others_at_release(count);
            }
            counted = Some(count);
        }
        let Some(limit) = limit else {
            return Release::default();
        };
        // A connection whose own release was only maybe over the limit
        // may be closed: idle maybe, not surely.
        let unsure = idle().filter(|r| r.is_over_idle_limit_unsure()).count();
        // One released just before, during this request: maybe put back
        // after this one.
        let reordered =
            |r: &&Arc<ConnectionRecord>| !r.is_over_idle_limit_unsure() && order_unsure(r);
        let reordered_count = idle().filter(reordered).count();
        let idle_count = counted.unwrap_or_else(|| idle().count());
        // Requests to the host in flight, other than this one, whose
        // response has not shown their connection yet: each may hold one
        // counted idle. Connections of the client never released: each
        // may be idle in the pool already (its request rode a connection
        // released to its waiting checkout, and the connect's own went to
        // the pool unused).
        let (mut attributed, mut never_released) = (0u64, 0usize);
        for r in &history.connections {
            attributed += u64::from(r.in_use());
            if r.client.id == record.client.id
                && r.id() != record.id()
                && r.in_use() == 0
                && r.last_released().is_none()
                && !r.is_closed()
            {
                never_released += 1;
            }
        }
        let holding = in_flight.saturating_sub(1 + attributed);
        let idle_in_any_order = idle_count
            .saturating_sub(unsure)
            .saturating_sub(usize::try_from(holding).unwrap_or(usize::MAX));
        let surely_idle = idle_in_any_order.saturating_sub(reordered_count);
        let maybe_idle = idle_count.saturating_add(never_released);
        record.set_over_idle_limit_unsure(maybe_idle >= limit && surely_idle < limit);
        if surely_idle >= limit {
            record.mark_over_idle_limit();
            return Release {
                over_limit: true,
                made_unsure: Vec::new(),
            };
        }
        let mut made_unsure = Vec::new();
        if idle_in_any_order >= limit {
            for other in idle().filter(reordered) {
                other.set_over_idle_limit_unsure(true);
                made_unsure.push(Arc::clone(other));
            }
        }
        Release {
            over_limit: false,
            made_unsure,
        }
    }

    /// `closed`, a connection of a client whose idle limit is not ours to
    /// count, is now known closed by that client's pool as `close` says.
    /// Until now it was believed idle, so each later release of the
    /// client's other connections to `host` counted it among the idle
    /// others (`idle_others_at_release`, what an inferred idle limit rests
    /// on). It was not idle there when the pool had closed it by then: at
    /// its own release (the idle limit's close or the release race's: it
    /// never entered the idle list), or after idling (the idle timeout's).
    /// Each such count is lowered by one.
    pub(crate) fn uncount_closed(
        &self,
        host: &HostKey,
        closed: &ConnectionRecord,
        close: PoolClose,
    ) {
        let Some(released) = closed.last_released() else {
            return;
        };
        let gone_from = match close {
            // `idle` counts from the put-back's earliest date.
            PoolClose::Expired { idle } => closed.idle_since() + idle + CLOSE_DATING_SLACK,
            _ => released,
        };
        let hosts = self.hosts();
        let Some(history) = hosts.get(host) else {
            return;
        };
        for r in &history.connections {
            if r.id() != closed.id()
                && r.client.id == closed.client.id
                && r.last_released().is_some_and(|t| t > gone_from)
            {
                r.uncount_idle_other();
            }
        }
    }

    /// `close`, by `record`'s own pool at its release (a limit not set
    /// through our builder), with its count of others idle then raised to
    /// the client's connections released no more than
    /// [`RELEASE_REORDER_WINDOW`] after it and not known closed: each may
    /// have been back in hyper-util's idle list before `record` was (see
    /// there). A pool that kept a later one and closed this one has a limit
    /// of at least 1, not 0. The raised count is kept on the record (a miss
    /// naming it reads it). Any other close is returned as it is.
    pub(crate) fn with_reordered_releases(
        &self,
        record: &ConnectionRecord,
        close: PoolClose,
    ) -> PoolClose {
        let (
            PoolClose::AtRelease {
                idle_others: Some(k),
            },
            Some(host),
        ) = (close, &record.host)
        else {
            return close;
        };
        if record.client.max_idle_known {
            return close;
        }
        let later = self.released_after_and_open(host, record);
        if later <= k {
            return close;
        }
        record.set_idle_others_at_release(later);
        PoolClose::AtRelease {
            idle_others: Some(later),
        }
    }

    /// Connections of `closed`'s client to `host` released no more than
    /// [`RELEASE_REORDER_WINDOW`] after `closed`'s release and not known
    /// closed (see [`with_reordered_releases`](Self::with_reordered_releases)).
    fn released_after_and_open(&self, host: &HostKey, closed: &ConnectionRecord) -> usize {
        let Some(released) = closed.last_released() else {
            return 0;
        };
        let hosts = self.hosts();
        let Some(history) = hosts.get(host) else {
            return 0;
        };
        history
            .connections
            .iter()
            .filter(|r| {
                r.id() != closed.id()
                    && r.client.id == closed.client.id
                    && !r.http2()
                    && !r.is_closed()
                    && r.last_released().is_some_and(|t| {
                        t > released
                            && t.saturating_duration_since(released) <= RELEASE_REORDER_WINDOW
                    })
            })
            .count()
    }

    /// Whether `client`'s pool for `host` has shown that it keeps no idle
    /// connection (an idle limit of 0 set on reqwest's builder, which this
    /// crate cannot read), under any concurrency: at least
    /// [`POOL_OFF_EVIDENCE`] of its HTTP/1.1 connections were seen closed
    /// by it within [`CLOSED_AT_RELEASE`] of their release
    /// ([`ConnectionRecord::is_closed_at_release`]), and each other one it
    /// released was closed for a reason of its own ([`closed_on_its_own`]).
    /// A pool with an idle limit of 1 or more keeps the first connection
    /// released into its empty idle list, until its idle timeout or until
    /// it hands it out again: that one, still open, closed by the server
    /// while it idled, or closed by the idle timeout, rules the inference
    /// out, as does a connection handed out again
    /// ([`InferredLimits::keeps_idle`](crate::pool::inferred::InferredLimits::keeps_idle))
    /// or an idle timeout's close seen. Two closes, not one: a pool that
    /// keeps connections closes one at release in hyper-util's release race
    /// (a checkout whose connect won), which does not happen twice in a
    /// row before the pool hands a connection out again.
    pub(crate) fn shows_pool_off(&self, host: &HostKey, client: &ClientState) -> bool {
        self.pool_off_evidence(host, client, None).0 == PoolOff::Shown
    }

    /// What `client`'s connections to `host` show of a pool that keeps
    /// no idle connection (see [`shows_pool_off`](Self::shows_pool_off)).
    /// With `pending_at: Some((now, miss))`, for a miss classified at
    /// `miss`: connections released after the miss are left out, and the
    /// ones released no more than [`CLOSED_AT_RELEASE`] before `now` whose
    /// close at release is not seen yet (still open: hyper-util closes
    /// them on its own task; or closed by us with no timer to date it yet)
    /// count as closes to come ([`PoolOff::Pending`]); those are returned,
    /// to be looked at again.
    pub(crate) fn pool_off_evidence(
        &self,
        host: &HostKey,
        client: &ClientState,
        pending_at: Option<(Instant, Instant)>,
    ) -> (PoolOff, Vec<Arc<ConnectionRecord>>) {
        let mut pending = Vec::new();
        if client.max_idle_known
            || client.inferred.keeps_idle()
            || client.inferred.idle_timeout().is_some()
        {
            return (PoolOff::No, pending);
        }
        let hosts = self.hosts();
        let Some(history) = hosts.get(host) else {
            return (PoolOff::No, pending);
        };
        let (mut closed_at_release, mut until) = (0, None);
        for r in history
            .connections
            .iter()
            .filter(|r| r.client.id == client.id)
        {
            let Some(released) = r.last_released() else {
                continue;
            };
            // Made after the miss and released since: no evidence about the
            // pool at the miss, either way. One made before it and released
            // since still counts (its release can be marked late: hyper-util
            // may have had it back, and handed it out again, before).
            if pending_at.is_some_and(|(_, miss)| released > miss && r.ready_at() > miss) {
                continue;
            }
            if (r.is_closed_at_release() || reported_closed_at_release(r)) && !r.http2() {
                closed_at_release += 1;
            } else if let Some((now, _)) = pending_at
                && !r.http2()
                && r.end().is_none()
                && known_loss(r).is_none()
                && now.saturating_duration_since(released) <= CLOSED_AT_RELEASE
            {
                closed_at_release += 1;
                until = until.max(Some(released + CLOSED_AT_RELEASE));
                pending.push(Arc::clone(r));
            } else if !closed_on_its_own(r) {
                return (PoolOff::No, Vec::new());
            }
        }
        let evidence = match until {
            _ if closed_at_release < POOL_OFF_EVIDENCE => PoolOff::No,
            Some(until) => PoolOff::Pending(until),
            None => PoolOff::Shown,
        };
        (evidence, pending)
    }

    /// The one open connection to `host` over a local transport (no socket
    /// addresses: reqwest's `unix_socket`) free to carry a response that
    /// came without `HttpInfo`; `None` when none or several are (HTTP/1.1:
    /// one not in use; HTTP/2: any).
    pub(crate) fn sole_free_local_connection(
        &self,
        host: &HostKey,
    ) -> Option<Arc<ConnectionRecord>> {
        let hosts = self.hosts();
        let mut free = hosts.get(host)?.connections.iter().filter(|r| {
            r.setup.local_addr.is_none()
                && r.setup.peer_addr.is_none()
                && !r.setup.proxied
                && !r.is_closed()
                && (r.http2() || r.in_use() == 0)
        });
        let sole = free.next()?;
        free.next().is_none().then(|| Arc::clone(sole))
    }

    /// An HTTP/1.1 connection whose connect lost to a connection freed for
    /// its trigger request went into hyper-util's pool unused at its ready
    /// time (hyper-util's connect task puts it there as its handshake
    /// ends), learned at `now` (its trigger's response, or its ready time
    /// when the trigger was served first): a release like a response's end
    /// ([`on_released`](Self::on_released); `in_flight`: requests to the
    /// host in flight now), so a full idle pool closes it at once (and the
    /// history can forget it) and an unknown idle limit counts it. Its idle
    /// time counts from its ready time: learned at a slow trigger's
    /// response, a server's idle close since read as our pool's close at
    /// release (`pool_closed`).
    ///
    /// Learned only at `now`, a connection of the client released in
    /// between may have
    /// gone back after it, and then that one was the one turned away. So a
    /// release counted over the limit is only maybe over it then (the
    /// kernel's view decides at a miss, [`decide_from_kernel`]): taken as
    /// sure, it named a busy connection `idle_limit` (seen with nginx
    /// `keepalive_requests 3`, 7 concurrent requests over TLS, idle pool
    /// 2, once in about 100 runs beside two CPU-burning processes).
    ///
    /// Returns what the release showed ([`Release`]).
    ///
    /// [`decide_from_kernel`]: crate::pool::kernel_decision::decide_from_kernel
    pub(crate) fn on_pooled_unused(
        &self,
        record: &ConnectionRecord,
        now: Instant,
        in_flight: u64,
    ) -> Release {
        let Some(host) = &record.host else {
            return Release::default();
        };
        if !record.never_used() || record.in_use() != 0 {
            return Release::default();
        }
        let put_at = record.ready_at().min(now);
        record.mark_released(put_at);
        // Requests in flight with no connection shown yet: one may be a
        // checkout waiting in hyper-util's pool, handed this one first.
        if self.unattributed(host, in_flight) > 0 {
            record.mark_pooled_unused_with_waiters();
        }
        // No request of its own releases it: every request in flight may
        // hold a connection (`on_released` counts the releasing one in
        // `in_flight`).
        let mut release = self.on_released(host, record, put_at, put_at, in_flight + 1);
        if release.over_limit && self.released_between(host, record, put_at, now) {
            record.clear_over_idle_limit();
            record.set_over_idle_limit_unsure(true);
            release.over_limit = false;
        }
        release
    }

    /// Whether a connection to `host` of `record`'s client other than
    /// `record` was last released after `from` and no later than `to`.
    fn released_between(
        &self,
        host: &HostKey,
        record: &ConnectionRecord,
        from: Instant,
        to: Instant,
    ) -> bool {
        self.hosts().get(host).is_some_and(|history| {
            history.connections.iter().any(|r| {
                r.id() != record.id()
                    && r.client.id == record.client.id
                    && r.last_released().is_some_and(|t| t > from && t <= to)
            })
        })
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

/// Forgets `connections` matching `forgettable`, oldest first, until
/// fewer than [`CONNECTIONS_PER_HOST`] are left (at least one room made
/// when any matches).
fn forget_oldest(
    connections: &mut VecDeque<Arc<ConnectionRecord>>,
    forgettable: impl Fn(&Arc<ConnectionRecord>) -> bool,
) {
    let mut excess = (connections.len() + 1).saturating_sub(CONNECTIONS_PER_HOST);
    connections.retain(|r| {
        if excess > 0 && forgettable(r) {
            excess -= 1;
            false
        } else {
            true
        }
    });
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;
    use std::time::Duration;

    use opentelemetry::trace::SpanContext;

    use super::*;
    use crate::export::report::ConnectionSetup;
    use crate::kernel::KernelLookup;
    use crate::kernel::{TcpFacts, TcpState};
    use crate::pool::end_report::{ReportedEnd, gone_after_own_close, reported_end};
    use crate::pool::inferred::OWN_CLOSE_WINDOW;
    use crate::pool::kernel_decision::{
        LOOK_AGAIN_EVERY, Rider, UNDATED_CLOSE_WAIT, decide_from_kernel, look_again_at,
        response_may_explain_end, rider_since,
    };
    use crate::pool::losses::ended_http2_reason;

    fn host() -> HostKey {
        HostKey::new("http", "127.0.0.1", 80)
    }

    /// A plain HTTP/1.1 connection (or HTTP/2 with `http2`) of `client`,
    /// ready at `at`, remembered by `pools`.
    fn connection(
        pools: &PoolHistory,
        client: &Arc<ClientState>,
        id: u64,
        at: Instant,
        http2: bool,
    ) -> Arc<ConnectionRecord> {
        let record = Arc::new(ConnectionRecord::new(
            Arc::new(ConnectionSetup {
                local_addr: Some((Ipv4Addr::LOCALHOST, 40000 + id as u16).into()),
                peer_addr: Some((Ipv4Addr::LOCALHOST, 80).into()),
                dns_skipped: Some("ip_literal"),
                http2,
                ..ConnectionSetup::for_test(id, at)
            }),
            SpanContext::empty_context(),
            None,
            Arc::clone(client),
            Some(host()),
            None,
        ));
        assert!(pools.record_connection(host(), Arc::clone(&record)));
        record
    }

    /// One exchange on `record`: a request started at `start`, its response
    /// counted, its body's end at `end` (HTTP/2 tests date the checkout).
    fn exchange(record: &ConnectionRecord, start: Instant, end: Instant) {
        record.take();
        record.count_request(start);
        record.give_back();
        record.mark_released(end);
    }

    /// One response on `record` whose body was dropped before its end at
    /// `at` (hyper may have read it all or not: the kernel tells).
    fn dropped_body(record: &ConnectionRecord, at: Instant) {
        record.take();
        record.count_request(Instant::now());
        record.give_back();
        record.mark_dropped_early(at);
    }

    /// One response on `record`, as the middleware and the body wrapper
    /// record it: headers (saying `close` or not), then the body's end at
    /// `end`.
    fn response(record: &ConnectionRecord, close: bool, end: Instant) {
        record.take();
        record.set_connection_close(close);
        record.count_request(Instant::now());
        record.give_back();
        record.mark_released(end);
        if close {
            record.set_end(record.announced_close_end());
        }
    }

    fn gone() -> KernelLookup {
        KernelLookup::NotFound
    }

    fn state(state: TcpState) -> KernelLookup {
        unread(state, 0)
    }

    fn unread(state: TcpState, receive_queue: u32) -> KernelLookup {
        KernelLookup::Found(TcpFacts {
            state,
            info: None,
            receive_queue,
            time_wait_left: None,
            fin_wait2_left: None,
        })
    }

    fn ask(verdict: MissVerdict) -> (Arc<ConnectionRecord>, Miss, u64) {
        match verdict {
            MissVerdict::AskKernel(q) => (q.candidate, q.alive, q.requests_seen),
            other => panic!("expected a kernel lookup: {other:?}"),
        }
    }

    fn decided(verdict: MissVerdict) -> Miss {
        match verdict {
            MissVerdict::Decided(miss) => miss,
            other => panic!("expected a decided miss: {other:?}"),
        }
    }

    fn client() -> Arc<ClientState> {
        // Idle timeout known (none), idle limit unlimited.
        Arc::new(ClientState::new(Some(None), None))
    }

    /// Row 3b: once the pool's closes inferred an idle limit of 0 (and it
    /// never handed a connection out again), every later miss is `pool_disabled`,
    /// inferred, naming the connection closed at release, whatever the
    /// kernel would show; a connection handed out again (an idle hit)
    /// proves the inference wrong and drops it.
    #[test]
    fn an_inferred_idle_limit_of_zero_names_every_miss_pool_disabled() {
        let t0 = Instant::now();
        let pools = PoolHistory::default();
        let client = Arc::new(ClientState::unknown_settings());
        let a = connection(&pools, &client, 1, t0, false);
        response(&a, false, t0 + Duration::from_millis(1));
        client.inferred.observe(PoolClose::AtRelease {
            idle_others: Some(0),
        });
        let at = t0 + Duration::from_millis(2);
        let miss = decided(pools.classify_miss(&host(), &client, at, 1));
        assert_eq!(miss.reason, MissReason::PoolDisabled);
        assert_eq!(
            miss.limits,
            Some(crate::pool::inferred::LimitSource::Inferred)
        );
        assert_eq!(
            miss.previous.map(|p| (p.id, p.end)),
            Some((a.id(), Some(ConnectionEnd::IdleLimit)))
        );
        client.inferred.note_reuse();
        assert_eq!(client.inferred.idle_limit(), None);
        assert!(!matches!(
            pools.classify_miss(&host(), &client, at, 1),
            MissVerdict::Decided(Miss {
                reason: MissReason::PoolDisabled,
                ..
            })
        ));
    }

    /// Row 3b comes before row 4: with the pool inferred off, a miss while
    /// every connection is in use (a concurrent wave) is `pool_disabled`,
    /// naming the connection released last, not one still carrying the
    /// request its connect was made for; never `all_busy`.
    #[test]
    fn a_pool_inferred_off_is_pool_disabled_even_with_every_connection_busy() {
        let t0 = Instant::now();
        let pools = PoolHistory::default();
        let client = Arc::new(ClientState::unknown_settings());
        let a = connection(&pools, &client, 1, t0, false);
        let b = connection(&pools, &client, 2, t0, false);
        response(&a, false, t0 + Duration::from_millis(1));
        response(&b, false, t0 + Duration::from_millis(2));
        let c = connection(&pools, &client, 3, t0 + Duration::from_millis(3), false);
        c.take();
        let at = t0 + Duration::from_millis(4);
        client.inferred.observe(PoolClose::AtRelease {
            idle_others: Some(0),
        });
        let miss = decided(pools.classify_miss(&host(), &client, at, 2));
        assert_eq!(miss.reason, MissReason::PoolDisabled);
        assert_eq!(
            miss.previous.map(|p| (p.id, p.end)),
            Some((b.id(), Some(ConnectionEnd::IdleLimit)))
        );
        // No released connection to name: still the pool's reason.
        let pools = PoolHistory::default();
        let client = Arc::new(ClientState::unknown_settings());
        let a = connection(&pools, &client, 1, t0, false);
        response(&a, false, t0 + Duration::from_millis(1));
        a.take();
        client.inferred.observe(PoolClose::AtRelease {
            idle_others: Some(0),
        });
        let miss = decided(pools.classify_miss(&host(), &client, at, 2));
        assert_eq!(miss.reason, MissReason::PoolDisabled);
        assert_eq!(miss.previous, None);
    }

    /// Our builder's `pool_max_idle_per_host(0)` (row 2) once the pool was
    /// warm; a concurrent first burst before that is `cold` (row 3).
    #[test]
    fn a_cold_burst_with_the_pool_disabled_is_cold() {
        let t0 = Instant::now();
        let pools = PoolHistory::default();
        let client = Arc::new(ClientState::new(Some(None), Some(0)));
        let a = connection(&pools, &client, 1, t0, false);
        a.take();
        let at = t0 + Duration::from_millis(1);
        assert_eq!(
            decided(pools.classify_miss(&host(), &client, at, 2)).reason,
            MissReason::Cold
        );
        a.count_request(Instant::now());
        a.give_back();
        a.mark_released(at);
        assert_eq!(
            decided(pools.classify_miss(&host(), &client, at, 1)).reason,
            MissReason::PoolDisabled
        );
    }

    /// A pool that keeps none, shown by its connections as a whole: two or
    /// more closed at release and none kept. A connection still open after
    /// its release rules it out (a pool with an idle limit keeps the first
    /// one released), unless released so recently that its close may still
    /// come (pending, to be looked at again); so do a connection handed out
    /// again and an idle timeout's close. A close of hyper's own (an
    /// announced close) says nothing either way.
    #[test]
    fn a_pool_is_shown_off_by_every_released_connection_closed_at_release() {
        let t0 = Instant::now();
        let released = |pools: &PoolHistory, client: &Arc<ClientState>, id: u64, at: u64| {
            let r = connection(pools, client, id, t0, false);
            response(&r, false, t0 + Duration::from_millis(at));
            r
        };
        let pools = PoolHistory::default();
        let client = Arc::new(ClientState::unknown_settings());
        let a = released(&pools, &client, 1, 1);
        a.mark_closed_at_release();
        assert!(!pools.shows_pool_off(&host(), &client), "one close only");
        let b = released(&pools, &client, 2, 2);
        b.mark_closed_at_release();
        assert!(pools.shows_pool_off(&host(), &client));
        // A connection the server announced it would close: neutral.
        let c = released(&pools, &client, 3, 3);
        c.set_connection_close(true);
        assert!(pools.shows_pool_off(&host(), &client));
        // One released and still open: kept by the pool, unless its close
        // may still come.
        let d = released(&pools, &client, 4, 4);
        assert!(!pools.shows_pool_off(&host(), &client));
        let soon = t0 + Duration::from_millis(30);
        let (evidence, pending) = pools.pool_off_evidence(&host(), &client, Some((soon, soon)));
        assert_eq!(
            evidence,
            PoolOff::Pending(t0 + Duration::from_millis(4) + CLOSED_AT_RELEASE)
        );
        assert_eq!(pending.iter().map(|r| r.id()).collect::<Vec<_>>(), [d.id()]);
        let late = t0 + Duration::from_millis(200);
        assert_eq!(
            pools
                .pool_off_evidence(&host(), &client, Some((late, late)))
                .0,
            PoolOff::No
        );
        // Made before the miss and released since: still this miss's
        // evidence (hyper-util may have had it back before the miss).
        let before = t0 + Duration::from_millis(3);
        assert!(matches!(
            pools
                .pool_off_evidence(&host(), &client, Some((soon, before)))
                .0,
            PoolOff::Pending(_)
        ));
        // Made and released after the miss: no evidence either way.
        {
            let pools = PoolHistory::default();
            let client = Arc::new(ClientState::unknown_settings());
            released(&pools, &client, 11, 1).mark_closed_at_release();
            released(&pools, &client, 12, 2).mark_closed_at_release();
            let late = connection(&pools, &client, 13, t0 + Duration::from_millis(10), false);
            response(&late, false, t0 + Duration::from_millis(11));
            let miss = t0 + Duration::from_millis(5);
            assert_eq!(
                pools
                    .pool_off_evidence(&host(), &client, Some((soon, miss)))
                    .0,
                PoolOff::Shown
            );
            assert!(matches!(
                pools
                    .pool_off_evidence(&host(), &client, Some((soon, soon)))
                    .0,
                PoolOff::Pending(_)
            ));
        }
        d.mark_closed_at_release();
        assert!(pools.shows_pool_off(&host(), &client));
        // Closed by the server while it idled (the kernel's view): kept.
        let e = released(&pools, &client, 5, 5);
        e.closed_by_server(true);
        assert!(!pools.shows_pool_off(&host(), &client));
        e.mark_closed_at_release();
        assert!(pools.shows_pool_off(&host(), &client));
        // Handed out again, or an idle timeout's close: the pool keeps.
        client.inferred.observe(PoolClose::Expired {
            idle: Duration::from_millis(500),
        });
        assert!(!pools.shows_pool_off(&host(), &client));
        let other = Arc::new(ClientState::unknown_settings());
        let f = released(&pools, &other, 6, 1);
        let g = released(&pools, &other, 7, 2);
        f.mark_closed_at_release();
        g.mark_closed_at_release();
        assert!(pools.shows_pool_off(&host(), &other));
        other.inferred.note_reuse();
        assert!(!pools.shows_pool_off(&host(), &other));
    }

    /// Rows 5c and 6 name whose doing the end was: a request that gave up
    /// on its response (`abandoned`), a `Connection: close` the client
    /// sent (`client_close`) or the server's (`request_limit`).
    #[test]
    fn ends_the_client_caused_name_the_clients_fix() {
        let t0 = Instant::now();
        let at = t0 + Duration::from_millis(5);
        for (case, reason, end) in [
            ("abandoned", MissReason::Abandoned, ConnectionEnd::Abandoned),
            (
                "client",
                MissReason::ClientClose,
                ConnectionEnd::ClientClose,
            ),
            (
                "server",
                MissReason::RequestLimit,
                ConnectionEnd::ConnectionClose,
            ),
        ] {
            let pools = PoolHistory::default();
            let client = client();
            let a = connection(&pools, &client, 1, t0, false);
            match case {
                "abandoned" => {
                    response(&a, false, t0 + Duration::from_millis(1));
                    a.set_end(ConnectionEnd::Abandoned);
                }
                _ => {
                    a.set_client_asked_close(case == "client");
                    response(&a, true, t0 + Duration::from_millis(1));
                }
            }
            let miss = decided(pools.classify_miss(&host(), &client, at, 1));
            assert_eq!(miss.reason, reason, "{case}");
            assert_eq!(miss.previous.and_then(|p| p.end), Some(end), "{case}");
        }
    }

    /// One response on `record` ending at `t0 + ms`, released to the pool
    /// while `in_flight` requests to the host (that one included) were in
    /// flight; whether the release marked it over the idle limit.
    fn release(
        pools: &PoolHistory,
        record: &ConnectionRecord,
        t0: Instant,
        ms: u64,
        in_flight: u64,
    ) -> bool {
        let at = t0 + Duration::from_millis(ms);
        record.take();
        record.count_request(Instant::now());
        record.give_back();
        record.mark_released(at);
        pools
            .on_released(&host(), record, at, t0, in_flight)
            .over_limit
    }

    /// Two waves of 4 concurrent requests over an idle pool of 2:
    /// hyper-util keeps the first two connections put back in each wave.
    /// A connection carrying the request that opened it is not counted
    /// idle, but may be (its request may ride another); one handed to a
    /// request whose response has not come yet may look idle; one whose
    /// own release was in doubt may have been turned away. A release is
    /// over the limit only when it is so without those, unsure when only
    /// with them.
    #[test]
    fn releases_count_only_connections_no_request_may_hold() {
        let pools = PoolHistory::default();
        let client = Arc::new(ClientState::new(Some(None), Some(2)));
        let t0 = Instant::now();
        let first: Vec<_> = (1..=4)
            .map(|id| connection(&pools, &client, id, t0, false))
            .collect();
        // Wave 1: each request rides the connection its connect made.
        let marked: Vec<bool> = first
            .iter()
            .zip([4, 3, 2, 1])
            .enumerate()
            .map(|(i, (c, in_flight))| release(&pools, c, t0, i as u64 + 1, in_flight))
            .collect();
        let unsure: Vec<bool> = first
            .iter()
            .map(|c| c.is_over_idle_limit_unsure())
            .collect();
        // The 4th release: 1, 2 and 3 look idle, but each may have been
        // turned away itself (unsure): in doubt too, not surely over.
        assert_eq!(marked, [false, false, false, false]);
        assert_eq!(unsure, [true, true, true, true]);
        // The kernel's confirmation (`Inner::confirm_unsure_release`): the
        // pool kept 1 and 2 (still established), turned 3 and 4 away.
        first[0].set_over_idle_limit_unsure(false);
        first[1].set_over_idle_limit_unsure(false);
        first[2].mark_closed();
        first[3].mark_closed();
        // Wave 2, well after wave 1 (no release order in doubt): hyper-util
        // hands 2 and 1 to two requests, two others connect (5, 6). 5's
        // response comes first: 1 and 2 look idle, but the three other
        // requests in flight may hold them.
        let (c5, c6) = (
            connection(&pools, &client, 5, t0, false),
            connection(&pools, &client, 6, t0, false),
        );
        assert!(!release(&pools, &c5, t0, 30, 4));
        assert!(c5.is_over_idle_limit_unsure());
        // The last response of the wave: nothing else in flight; 1 and 2
        // surely idle (5 maybe).
        first[1].take();
        first[1].clear_over_idle_limit();
        first[1].give_back();
        assert!(release(&pools, &c6, t0, 32, 1));
        assert!(!c6.is_over_idle_limit_unsure());
        // A response on an unsure one shows it kept.
        assert!(!first[1].is_over_idle_limit_unsure());
        // Sequential requests: nothing in doubt, the pool keeps 2.
        let pools = PoolHistory::default();
        let client = Arc::new(ClientState::new(Some(None), Some(2)));
        let marked: Vec<bool> = (1..=3)
            .map(|id| {
                let c = connection(&pools, &client, id, t0, false);
                let over = release(&pools, &c, t0, id * 30, 1);
                assert!(!c.is_over_idle_limit_unsure(), "connection {id}");
                over
            })
            .collect();
        assert_eq!(marked, [false, false, true]);
    }

    /// Three connections of a client whose idle limit is not ours to read,
    /// released 100 ms apart, that hyper-util put back last first (seen
    /// under load: the third kept, the first two closed over a limit of
    /// 1). The first close, learned while the other two are open, may have
    /// had both idle before it: a bound of 2, not the 0 our count says;
    /// the second, learned while the third is open: 1. A later release
    /// that is closed, or beyond `RELEASE_REORDER_WINDOW`, counts nothing,
    /// and a limit set through our builder is left as counted.
    #[test]
    fn a_close_at_release_counts_later_releases_still_open() {
        let t0 = Instant::now();
        let pools = PoolHistory::default();
        let client = Arc::new(ClientState::new(Some(None), None));
        let c: Vec<_> = (1..=3)
            .map(|id| connection(&pools, &client, id, t0, false))
            .collect();
        for (i, record) in c.iter().enumerate() {
            release(&pools, record, t0, 100 * i as u64 + 10, 3);
            record.set_idle_others_at_release(0);
        }
        let at_release = |k| PoolClose::AtRelease {
            idle_others: Some(k),
        };
        assert_eq!(
            pools.with_reordered_releases(&c[0], at_release(0)),
            at_release(2)
        );
        assert_eq!(c[0].idle_others_at_release(), Some(2));
        c[0].mark_closed();
        assert_eq!(
            pools.with_reordered_releases(&c[1], at_release(0)),
            at_release(1)
        );
        c[1].mark_closed();
        assert_eq!(
            pools.with_reordered_releases(&c[2], at_release(0)),
            at_release(0)
        );
        assert_eq!(c[2].idle_others_at_release(), Some(0));
        // Not an AtRelease with a count: as it was.
        assert_eq!(
            pools.with_reordered_releases(&c[2], PoolClose::Unsure),
            PoolClose::Unsure
        );

        // Beyond the window: nothing.
        let pools = PoolHistory::default();
        let client = Arc::new(ClientState::new(Some(None), None));
        let early = connection(&pools, &client, 4, t0, false);
        let late = connection(&pools, &client, 5, t0, false);
        release(&pools, &early, t0, 10, 1);
        let beyond = RELEASE_REORDER_WINDOW.as_millis() as u64 + 20;
        release(&pools, &late, t0, beyond, 1);
        assert_eq!(
            pools.with_reordered_releases(&early, at_release(0)),
            at_release(0)
        );

        // A limit set through our builder: counted as it is.
        let pools = PoolHistory::default();
        let client = Arc::new(ClientState::new(Some(None), Some(1)));
        let first = connection(&pools, &client, 6, t0, false);
        let second = connection(&pools, &client, 7, t0, false);
        release(&pools, &first, t0, 10, 2);
        release(&pools, &second, t0, 110, 2);
        assert_eq!(
            pools.with_reordered_releases(&first, at_release(0)),
            at_release(0)
        );
    }

    /// Two releases closer than `RELEASE_ORDER_UNSURE`, the earlier one
    /// during the later one's request, may have reached hyper-util's pool
    /// in the other order: when the later one is over the idle limit only
    /// with the earlier one counted, either may have been turned away, so
    /// both are unsure (the earlier one returned for the kernel to
    /// confirm). Farther apart, the count is sure.
    #[test]
    fn releases_too_close_to_order_are_over_the_limit_only_maybe() {
        let t0 = Instant::now();
        let ms = |n| t0 + Duration::from_millis(n);
        for (earlier_at, sure) in [(40, false), (10, true)] {
            let pools = PoolHistory::default();
            let client = Arc::new(ClientState::new(Some(None), Some(2)));
            let kept = connection(&pools, &client, 1, t0, false);
            let earlier = connection(&pools, &client, 2, t0, false);
            let later = connection(&pools, &client, 3, t0, false);
            for (record, at) in [(&kept, 1), (&earlier, earlier_at), (&later, 41)] {
                record.take();
                record.count_request(Instant::now());
                record.give_back();
                record.mark_released(ms(at));
            }
            let case = format!("earlier released at {earlier_at} ms, later at 41 ms");
            let first = pools.on_released(&host(), &kept, ms(1), t0, 1);
            assert!(!first.over_limit, "{case}");
            let second = pools.on_released(&host(), &earlier, ms(earlier_at), ms(5), 2);
            assert!(!second.over_limit, "{case}");
            // The kernel's confirmations: both still established.
            kept.set_over_idle_limit_unsure(false);
            earlier.set_over_idle_limit_unsure(false);
            let release = pools.on_released(&host(), &later, ms(41), ms(5), 1);
            assert_eq!(release.over_limit, sure, "{case}");
            assert_eq!(later.is_over_idle_limit_unsure(), !sure, "{case}");
            assert_eq!(earlier.is_over_idle_limit_unsure(), !sure, "{case}");
            let made_unsure: Vec<u64> = release.made_unsure.iter().map(|r| r.id()).collect();
            let expected = if sure { vec![] } else { vec![earlier.id()] };
            assert_eq!(made_unsure, expected, "{case}");
            assert!(
                !kept.is_over_idle_limit_unsure(),
                "{case}: released long before"
            );
        }
    }

    /// A connection that went into the pool unused at its ready time,
    /// learned only later: when another connection of the client was
    /// released in between, hyper-util may have turned that one away
    /// instead, so the late one is over the idle limit only maybe (the
    /// kernel decides); with no release in between, surely.
    #[test]
    fn a_connection_pooled_unused_learned_late_is_over_the_limit_only_maybe() {
        let t0 = Instant::now();
        let ms = |n| t0 + Duration::from_millis(n);
        for (released_after_ready, sure) in [(true, false), (false, true)] {
            let pools = PoolHistory::default();
            let client = Arc::new(ClientState::new(Some(None), Some(2)));
            let first = connection(&pools, &client, 1, t0, false);
            let second = connection(&pools, &client, 2, t0, false);
            let unused = connection(&pools, &client, 3, ms(5), false);
            release(&pools, &first, t0, 1, 1);
            release(
                &pools,
                &second,
                t0,
                if released_after_ready { 6 } else { 4 },
                1,
            );
            // The kernel's confirmation (`Inner::confirm_unsure_release`):
            // both still established, kept by the pool.
            first.set_over_idle_limit_unsure(false);
            second.set_over_idle_limit_unsure(false);
            pools.on_pooled_unused(&unused, ms(8), 0);
            let case =
                format!("second released after the unused one was ready: {released_after_ready}");
            assert_eq!(unused.is_over_idle_limit(), sure, "{case}");
            assert_eq!(unused.is_over_idle_limit_unsure(), !sure, "{case}");
        }
    }

    /// Row 9 with the idle timeout set through our builder: a candidate
    /// idle past it at the miss was expired, whatever the kernel shows of
    /// it since (the miss reached it past a busy one, row 10e, so the
    /// classification did not look). Found by a tester against nginx: the
    /// expiry's close, dated by the kernel, read `all_busy` / `idle_limit`
    /// (11 of 20 runs). Idle a little less than the timeout by our clock,
    /// a close the kernel dates at the miss and past the timeout still
    /// reads the timeout's.
    #[test]
    fn a_candidate_idle_past_a_known_idle_timeout_is_idle_expired() {
        let t0 = Instant::now();
        let ms = |n| Duration::from_millis(n);
        let expired = (MissReason::IdleExpired, Some(ConnectionEnd::IdleTimeout));
        for (miss_after, lookup) in [
            (700, gone()),
            (700, closed_ago(ms(250))),
            (700, state(TcpState::Established)),
            // Our clock says 398 ms idle at the miss (hyper-util's put-back
            // came after our release); the kernel dates the close 405 ms
            // after the release, at the miss to within its dating.
            (398, closed_ago(ms(0))),
        ] {
            let pools = PoolHistory::default();
            let client = Arc::new(ClientState::new(Some(Some(ms(400))), None));
            let candidate = connection(&pools, &client, 1, t0, false);
            release(&pools, &candidate, t0, 0, 1);
            let at = t0 + ms(miss_after);
            let now = if miss_after < 400 { t0 + ms(405) } else { at };
            let alive = Miss::new(MissReason::AllBusy);
            let miss = decide_from_kernel(&candidate, &lookup, now, alive, 1, at);
            let named = (miss.reason, miss.previous.and_then(|p| p.end));
            assert_eq!(named, expired, "miss after {miss_after} ms, {lookup:?}");
        }
    }

    /// Row 9 is not taken when the kernel's report of the candidate's
    /// socket end dates that end before the client's idle timeout, and
    /// later than its release: the server closed it while it idled (seen:
    /// a server idle-closing at 300 ms, FIN or reset, under an idle
    /// timeout of 400 ms set through our builder, read `idle_expired`, 8 of
    /// 8 misses). The miss asks the kernel, which finds the socket gone:
    /// the server's close. Reported after the timeout, or at the release,
    /// the end is no evidence against the expiry.
    #[test]
    fn an_end_reported_before_the_idle_timeout_is_not_idle_expired() {
        use crate::kernel::{Acknowledged, SocketEnd, SocketEndSink};
        let t0 = Instant::now();
        let ms = |n| Duration::from_millis(n);
        for (reported_after, expiry) in [(300, false), (405, true), (20, true), (0, true)] {
            let pools = PoolHistory::default();
            let client = Arc::new(ClientState::new(Some(Some(ms(400))), None));
            let candidate = connection(&pools, &client, 1, t0, false);
            release(&pools, &candidate, t0, 0, 1);
            if reported_after > 0 {
                candidate.socket_ended(SocketEnd {
                    seen_at: t0 + ms(reported_after),
                    since_last_receive: ms(reported_after),
                    since_last_send: ms(reported_after),
                    since_last_ack: ms(reported_after),
                    acknowledged: Acknowledged::DataAndFin,
                    unread: 1,
                    rtt: Duration::ZERO,
                    unacked: 0,
                    retransmits: 0,
                });
            }
            let at = t0 + ms(450);
            let case = format!("reported {reported_after} ms after the release");
            let verdict = pools.classify_miss(&host(), &client, at, 1);
            let alive = Miss::new(MissReason::ReleaseRace);
            let miss = decide_from_kernel(&candidate, &gone(), at + ms(1), alive, 1, at);
            let named = (miss.reason, miss.previous.and_then(|p| p.end));
            if expiry {
                let expired = decided(verdict);
                assert_eq!(expired.reason, MissReason::IdleExpired, "{case}");
                assert_eq!(
                    named,
                    (MissReason::IdleExpired, Some(ConnectionEnd::IdleTimeout)),
                    "{case}"
                );
            } else {
                assert!(matches!(verdict, MissVerdict::AskKernel(_)), "{case}");
                assert_eq!(
                    named,
                    (MissReason::ClosedByPeer, Some(ConnectionEnd::PeerClosed)),
                    "{case}"
                );
            }
        }
    }

    /// Row 9 with both limits set through our builder: a candidate idle
    /// past the timeout may have been closed at its release by the idle
    /// limit (the count at a release is no proof under concurrency, and a
    /// burst's first miss can come before the others count in flight), so
    /// the miss asks the kernel, whose dating tells: our close at the
    /// release is the idle limit's (`all_busy`), our close at the miss the
    /// timeout's. With no idle limit known (none inferred yet either),
    /// it is decided at once.
    /// A tester's bursts of 4 over an idle limit of 2 read `idle_expired`
    /// for the two closed at release, 6 of 6 runs.
    #[test]
    fn a_concurrent_miss_past_the_timeout_asks_whether_the_limit_closed_it_first() {
        let t0 = Instant::now();
        let ms = |n| Duration::from_millis(n);
        let pools = PoolHistory::default();
        let client = Arc::new(ClientState::new(Some(Some(ms(400))), Some(2)));
        let candidate = connection(&pools, &client, 1, t0, false);
        release(&pools, &candidate, t0, 0, 1);
        let at = t0 + ms(500);
        assert!(matches!(
            pools.classify_miss(&host(), &client, at, 4),
            MissVerdict::AskKernel(_)
        ));
        assert!(matches!(
            pools.classify_miss(&host(), &client, at, 1),
            MissVerdict::AskKernel(_)
        ));
        let limit_unread = Arc::new(ClientState::new(Some(Some(ms(400))), None));
        let other = connection(&pools, &limit_unread, 2, t0, false);
        release(&pools, &other, t0, 0, 1);
        let expired = decided(pools.classify_miss(&host(), &limit_unread, at, 4));
        assert_eq!(expired.reason, MissReason::IdleExpired);
        let alive = Miss::new(MissReason::AllBusy);
        // Our close 5 ms after the release: the idle limit's.
        let miss = decide_from_kernel(&candidate, &closed_ago(ms(495)), at, alive, 1, at);
        assert_eq!(
            (miss.reason, miss.previous.and_then(|p| p.end)),
            (MissReason::AllBusy, Some(ConnectionEnd::IdleLimit))
        );
        // Our close at the miss: the timeout's.
        let miss = decide_from_kernel(&candidate, &closed_ago(ms(0)), at, alive, 1, at);
        assert_eq!(
            (miss.reason, miss.previous.and_then(|p| p.end)),
            (MissReason::IdleExpired, Some(ConnectionEnd::IdleTimeout))
        );
    }

    /// hyper-util's checkout drops an expired idle connection itself: with
    /// nothing else in flight at the miss, a candidate alive then (our
    /// close dated after the miss) and idle 1.5 s was passed over as
    /// expired, not held by the release race (no put-back takes that
    /// long), and bounds the inferred idle timeout. Idle 200 ms, the
    /// release race is not ruled out; with another request in flight, it
    /// may have held the candidate.
    #[test]
    fn a_close_dated_after_a_lone_miss_long_after_the_release_is_the_checkouts_expiry() {
        let t0 = Instant::now();
        let ms = |n| Duration::from_millis(n);
        for (idle, alone, expired) in [(1500, true, true), (200, true, false), (1500, false, false)]
        {
            let pools = PoolHistory::default();
            let client = Arc::new(ClientState::unknown_settings());
            let candidate = connection(&pools, &client, 1, t0, false);
            release(&pools, &candidate, t0, 0, 1);
            let at = t0 + ms(idle);
            let alive = if alone {
                Miss::new(MissReason::ReleaseRace)
            } else {
                Miss::new(MissReason::AllBusy)
            };
            // Our close 20 ms after the miss, asked about 10 ms later.
            let miss =
                decide_from_kernel(&candidate, &closed_ago(ms(10)), at + ms(30), alive, 1, at);
            let named = (miss.reason, miss.previous.and_then(|p| p.end));
            let case = format!("idle {idle} ms, alone {alone}");
            if expired {
                assert_eq!(
                    named,
                    (MissReason::IdleExpired, Some(ConnectionEnd::IdleTimeout)),
                    "{case}"
                );
                assert_eq!(
                    miss.limits,
                    Some(crate::pool::inferred::LimitSource::Inferred),
                    "{case}"
                );
                assert_eq!(client.inferred.idle_timeout(), Some(ms(idle)), "{case}");
            } else {
                assert_eq!(named, (alive.reason, None), "{case}");
                assert_eq!(client.inferred.idle_timeout(), None, "{case}");
            }
        }
    }

    /// A connection that never carried a request stands for its put-back
    /// with its ready time, which hyper-util's background connect task can
    /// follow late on a loaded machine: a close of ours dated 200 ms after
    /// it, under an idle timeout not set through our builder, is no proof
    /// of an expiry (a fan-out over an idle limit read `idle_expired` for
    /// its closes at put-back beside two burners) and bounds nothing,
    /// unless a connection with a known release bounded the timeout at or
    /// below it; a used connection's is an expiry. Under an idle timeout
    /// set through our builder, a never-used connection's close before the
    /// timeout came at its put-back; after it, the timeout's.
    #[test]
    fn a_never_used_connections_late_close_is_an_expiry_only_when_something_bounds_it() {
        let t0 = Instant::now();
        let ms = |n| Duration::from_millis(n);
        let now = t0 + ms(1000);
        // Our close 200 ms (or 405 ms) after the ready time / release.
        let closed = |at: u64| closed_ago(ms(1000 - at));
        let close = |record: &ConnectionRecord, at| {
            crate::pool::inferred::pool_close(
                record,
                match &closed(at) {
                    KernelLookup::Found(facts) => facts,
                    _ => unreachable!(),
                },
                now,
                false,
            )
        };
        let pools = PoolHistory::default();
        let client = Arc::new(ClientState::unknown_settings());
        let unused = connection(&pools, &client, 1, t0, false);
        pools.on_pooled_unused(&unused, t0, 0);
        assert_eq!(close(&unused, 200), Some(PoolClose::Unsure));
        let used = connection(&pools, &client, 2, t0, false);
        release(&pools, &used, t0, 0, 1);
        assert_eq!(
            close(&used, 200),
            Some(PoolClose::Expired { idle: ms(200) })
        );
        client
            .inferred
            .observe(PoolClose::Expired { idle: ms(150) });
        assert_eq!(
            close(&unused, 200),
            Some(PoolClose::Expired { idle: ms(200) })
        );

        let pools = PoolHistory::default();
        let client = Arc::new(ClientState::new(Some(Some(ms(400))), None));
        let unused = connection(&pools, &client, 1, t0, false);
        pools.on_pooled_unused(&unused, t0, 0);
        assert!(matches!(
            close(&unused, 200),
            Some(PoolClose::AtRelease { .. })
        ));
        assert_eq!(
            close(&unused, 405),
            Some(PoolClose::Expired { idle: ms(405) })
        );
    }

    /// A connection pooled unused (its connect lost to another one) while
    /// a request to the host held no connection yet, and closed by our side
    /// at that put-back, was handed by hyper-util's pool to a waiting
    /// checkout whose own connect had won, and dropped: never idle in the
    /// pool, so a later miss names nothing and infers no limit from it
    /// (seen under load: a pool with no idle limit read as closing it at
    /// its idle limit). With every request in flight holding a connection
    /// nothing waited, and the close at the put-back is the pool's limit,
    /// as for any release.
    #[test]
    fn a_connection_dropped_at_its_put_back_to_a_waiter_is_named_by_no_miss() {
        let t0 = Instant::now();
        let ms = |n| Duration::from_millis(n);
        for waiting in [true, false] {
            let pools = PoolHistory::default();
            let client = Arc::new(ClientState::unknown_settings());
            let busy = connection(&pools, &client, 1, t0, false);
            busy.take();
            let unused = connection(&pools, &client, 2, t0, false);
            // In flight: the request on `busy`, and one still waiting.
            let in_flight = if waiting { 2 } else { 1 };
            pools.on_pooled_unused(&unused, t0 + ms(5), in_flight);
            assert_eq!(unused.pooled_unused_to_waiter(), waiting);
            let at = t0 + ms(1000);
            let alive = Miss::new(MissReason::AllBusy);
            // Our close 995 ms before the miss: at the put-back.
            let miss = decide_from_kernel(&unused, &closed_ago(ms(995)), at, alive, 0, at);
            let named = miss.previous.map(|p| (p.id, p.end));
            if waiting {
                assert_eq!((miss.reason, named), (MissReason::AllBusy, None));
                assert_eq!(unused.end(), Some(ConnectionEnd::PoolClosed));
                assert!(unused.is_close_named(), "no later miss names it");
            } else {
                assert_eq!(named, Some((unused.id(), Some(ConnectionEnd::IdleLimit))));
            }
        }
    }

    /// A socket gone at a miss (no TIME_WAIT: a TLS server answered our FIN
    /// with close_notify and the kernel reset it) is the server's close
    /// only when nothing shows our side closed it: not when its release
    /// may have been over the idle limit a moment ago, nor when the kernel
    /// showed it closed by us before; but an unsure release long ago is no
    /// excuse. With nothing else in flight at the miss, the pool held no
    /// idle connection (the checkout would have had it), so an unsure
    /// release was within the limit, and a socket gone moments after its
    /// release (no close announced) was not the server's idle close:
    /// hyper-util dropped it with the miss's checkout, alive at the miss
    /// (the release race). All this over TLS only, where a close of ours
    /// may leave no socket (the server's close_notify resets it): over
    /// plain TCP a socket gone is the server's close unless the kernel
    /// showed it closed by us before (our close leaves `TIME_WAIT`), how
    /// soon after the release it went notwithstanding (a server may close
    /// unannounced just after a response).
    #[test]
    fn a_socket_gone_after_our_close_is_not_the_servers_close() {
        let t0 = Instant::now();
        let limit = (MissReason::AllBusy, Some(ConnectionEnd::IdleLimit));
        let server = (MissReason::ClosedByPeer, Some(ConnectionEnd::PeerClosed));
        let race = (MissReason::ReleaseRace, None);
        // (unsure, closed by us, the miss at ms, requests in flight,
        // expected over TLS, expected over plain TCP)
        for (unsure, closed_by_us, asked_ms, in_flight, over_tls, expected) in [
            (true, false, 5, 2, limit, server),
            (true, false, 5, 1, race, server),
            (false, true, 5, 2, limit, limit),
            (false, true, 5, 1, race, race),
            (
                true,
                false,
                OWN_CLOSE_WINDOW.as_millis() as u64 + 5,
                2,
                server,
                server,
            ),
            (false, false, 5, 1, race, server),
            (false, false, 200, 1, server, server),
        ]
        .into_iter()
        .flat_map(|(u, c, ms, n, tls, tcp)| [(u, c, ms, n, true, tls), (u, c, ms, n, false, tcp)])
        {
            let pools = PoolHistory::default();
            let client = Arc::new(ClientState::new(Some(None), Some(2)));
            let released_at = t0 + Duration::from_millis(1);
            let a = if over_tls {
                let plain = connection(&PoolHistory::default(), &client, 1, t0, false);
                let tls = watched_over_tls(&plain, &client, released_at);
                assert!(pools.record_connection(host(), Arc::clone(&tls)));
                tls
            } else {
                let a = connection(&pools, &client, 1, t0, false);
                response(&a, false, released_at);
                a
            };
            a.set_over_idle_limit_unsure(unsure);
            if closed_by_us {
                a.mark_closed();
            }
            let at = t0 + Duration::from_millis(asked_ms);
            let (candidate, alive, seen) =
                ask(pools.classify_miss(&host(), &client, at, in_flight));
            let miss = decide_from_kernel(&candidate, &gone(), at, alive, seen, at);
            assert_eq!(
                (miss.reason, miss.previous.and_then(|p| p.end)),
                expected,
                "unsure {unsure}, closed by us {closed_by_us}, asked at {asked_ms} ms, {in_flight} in flight, over TLS {over_tls}"
            );
            assert_eq!(a.is_over_idle_limit(), unsure && expected == limit);
        }
    }

    /// Header first: the miss was classified while the connection had
    /// carried 4 (alive, not yet back in hyper-util's pool); then its 5th
    /// response said `Connection: close` and hyper closed it; only then did
    /// the kernel answer (the socket is gone). The miss is the release race
    /// it was, not `closed_by_peer`; the next miss is `request_limit`.
    #[test]
    fn connection_close_before_the_kernel_answer_wins_over_the_gone_socket() {
        let pools = PoolHistory::default();
        let client = client();
        let t0 = Instant::now();
        let a = connection(&pools, &client, 1, t0, false);
        for i in 1..=4 {
            response(&a, false, t0 + Duration::from_millis(i));
        }
        let at = t0 + Duration::from_millis(5);
        let (candidate, alive, seen) = ask(pools.classify_miss(&host(), &client, at, 1));
        assert_eq!((candidate.id(), seen), (1, 4));
        assert_eq!(alive.reason, MissReason::ReleaseRace);
        // hyper-util hands the connection to the waiting request after all:
        // its 5th response says it closes; the socket is gone by the answer.
        response(&a, true, t0 + Duration::from_millis(6));
        let miss = decide_from_kernel(&candidate, &gone(), at, alive, seen, at);
        assert_eq!(miss, alive);
        assert_eq!(miss.previous.map(|p| (p.id, p.end)), Some((1, None)));
        // The request after the 5th: `request_limit`, naming it.
        let next = decided(pools.classify_miss(&host(), &client, t0 + Duration::from_millis(7), 1));
        assert_eq!(next.reason, MissReason::RequestLimit);
        let previous = next.previous.expect("previous");
        assert_eq!(
            (previous.id, previous.request_count, previous.end),
            (1, 5, Some(ConnectionEnd::ConnectionClose))
        );
        assert_eq!(a.end(), Some(ConnectionEnd::ConnectionClose));
    }

    /// Header first, a miss classified after the 5th response's headers
    /// arrived but before its count was read (another request in flight),
    /// answered with the server's FIN: still not the kernel's news.
    #[test]
    fn a_close_announced_while_the_kernel_was_asked_is_not_closed_by_peer() {
        let pools = PoolHistory::default();
        let client = client();
        let t0 = Instant::now();
        let a = connection(&pools, &client, 1, t0, false);
        response(&a, false, t0 + Duration::from_millis(1));
        let at = t0 + Duration::from_millis(2);
        let (candidate, alive, seen) = ask(pools.classify_miss(&host(), &client, at, 2));
        assert_eq!(
            alive.reason,
            MissReason::AllBusy,
            "another request in flight"
        );
        a.take();
        a.set_connection_close(true);
        // The other request held it, and its response announced the close
        // (the server's request limit): that close is the cause, named.
        let miss = decide_from_kernel(&candidate, &state(TcpState::CloseWait), at, alive, seen, at);
        assert_eq!(miss.reason, MissReason::RequestLimit);
        let previous = miss.previous.expect("previous");
        assert_eq!(previous.id, a.id());
        assert_eq!(previous.end, Some(ConnectionEnd::ConnectionClose));
        // Named once: a second such miss is busy.
        let again = decide_from_kernel(&candidate, &gone(), at, alive, seen, at);
        assert_eq!(again, alive);
    }

    /// The close announced by a request that started after the miss is not
    /// its cause: at the miss the candidate was alive and busy with the
    /// request before it (seen with nginx `keepalive_requests 3`, 7
    /// concurrent requests over TLS: the miss named the connection's 3rd
    /// request's close, which came two responses after the miss).
    #[test]
    fn a_close_announced_by_a_request_after_the_miss_is_not_its_cause() {
        let pools = PoolHistory::default();
        let client = client();
        let t0 = Instant::now();
        let a = connection(&pools, &client, 1, t0, false);
        response(&a, false, t0 + Duration::from_millis(1));
        let at = t0 + Duration::from_millis(2);
        let (candidate, alive, seen) = ask(pools.classify_miss(&host(), &client, at, 2));
        assert_eq!(alive.reason, MissReason::AllBusy);
        // The request holding it at the miss ends without a close; the
        // next one on it announces the close.
        response(&a, false, t0 + Duration::from_millis(3));
        response(&a, true, t0 + Duration::from_millis(4));
        assert_eq!(a.requests.load(Ordering::Relaxed), seen + 2);
        let miss = decide_from_kernel(&candidate, &gone(), at, alive, seen, at);
        assert_eq!(miss, alive);
        // The close is still told, by the next miss.
        let next = decided(pools.classify_miss(&host(), &client, at, 1));
        assert_eq!(next.reason, MissReason::RequestLimit);
        assert_eq!(
            next.previous.map(|p| (p.id, p.request_count)),
            Some((a.id(), 3))
        );
        // One response since the miss, but its request started after the
        // miss: the connection was on its way back to the pool at the miss,
        // not ended (a redirect chain against nginx's request limit named
        // a connection whose 5th request started 0.3 ms after the miss).
        let pools = PoolHistory::default();
        let b = connection(&pools, &client, 2, t0, false);
        response(&b, false, t0 + Duration::from_millis(1));
        let (candidate, alive, seen) = ask(pools.classify_miss(&host(), &client, at, 2));
        assert_eq!(alive.reason, MissReason::AllBusy);
        b.take();
        b.set_connection_close(true);
        b.count_request(at + Duration::from_millis(1));
        b.give_back();
        assert_eq!(b.requests.load(Ordering::Relaxed), seen + 1);
        let miss = decide_from_kernel(&candidate, &gone(), at, alive, seen, at);
        assert_eq!(miss, alive);
    }

    /// The kernel shows an HTTP/1.1 candidate closed (either side, or
    /// gone) while other requests to the host were in flight without a
    /// response: one of them may hold it, its response announcing that
    /// close, so the miss waits for it. Not without others in flight, not
    /// for HTTP/2, not once a response on it showed.
    #[test]
    fn a_closed_candidate_waits_for_a_response_in_flight_only_when_one_may_hold_it() {
        let pools = PoolHistory::default();
        let client = client();
        let t0 = Instant::now();
        let a = connection(&pools, &client, 1, t0, false);
        response(&a, false, t0 + Duration::from_millis(1));
        for lookup in [
            gone(),
            state(TcpState::CloseWait),
            state(TcpState::FinWait2),
        ] {
            assert!(response_may_explain_end(&a, &lookup, 1, true), "{lookup:?}");
            assert!(
                !response_may_explain_end(&a, &lookup, 1, false),
                "{lookup:?}"
            );
        }
        assert!(!response_may_explain_end(
            &a,
            &state(TcpState::Established),
            1,
            true
        ));
        assert!(!response_may_explain_end(
            &a,
            &KernelLookup::TimedOut,
            1,
            true
        ));
        response(&a, true, t0 + Duration::from_millis(2));
        assert!(!response_may_explain_end(&a, &gone(), 1, true), "shown");
        let h2 = connection(&pools, &client, 2, t0, true);
        response(&h2, false, t0 + Duration::from_millis(1));
        assert!(!response_may_explain_end(&h2, &gone(), 1, true));
    }

    /// A redirect chain's 3xx bodies, dropped by the middleware, read all
    /// by hyper: the pool kept the connection, and a request in flight at
    /// the miss held it when its last response announced the server's
    /// request limit, which the kernel showed first. The miss waits for
    /// that response and names the close with it counted (once), not a
    /// `discarded` or server close with the count before it (tester: 5 of
    /// 85 runs of a 5-host redirect chain against nginx
    /// `keepalive_requests 5`). With no response on it by then, row 5b.
    #[test]
    fn a_dropped_bodys_candidate_shown_closed_waits_for_a_response_in_flight() {
        let pools = PoolHistory::default();
        let client = client();
        let t0 = Instant::now();
        let a = connection(&pools, &client, 1, t0, false);
        let dropped = |at| {
            a.take();
            a.count_request(Instant::now());
            a.give_back();
            a.mark_dropped_early(at);
        };
        for n in 1..=4 {
            dropped(t0 + Duration::from_millis(n));
        }
        let at = t0 + Duration::from_millis(5);
        let (candidate, alive, seen) = ask(pools.classify_miss(&host(), &client, at, 2));
        assert_eq!(candidate.id(), a.id());
        for lookup in [
            gone(),
            state(TcpState::CloseWait),
            state(TcpState::TimeWait),
        ] {
            assert!(
                response_may_explain_end(&candidate, &lookup, seen, true),
                "{lookup:?}"
            );
            assert!(!response_may_explain_end(&candidate, &lookup, seen, false));
        }
        // The 5th response, in flight at the miss, says close; its body is
        // dropped too.
        a.take();
        a.set_connection_close(true);
        a.count_request(Instant::now());
        a.mark_alive();
        a.give_back();
        a.mark_dropped_early(t0 + Duration::from_millis(6));
        a.set_end(a.announced_close_end());
        let miss = decide_from_kernel(&candidate, &gone(), at, alive, seen, at);
        assert_eq!(miss.reason, MissReason::RequestLimit);
        assert_eq!(
            miss.previous.map(|p| (p.id, p.request_count)),
            Some((a.id(), 5))
        );
        // Named once: a later miss finds it told.
        let again = decide_from_kernel(&candidate, &gone(), at, alive, seen, at);
        assert_eq!(again, alive);
    }

    /// Two bodies dropped early on two connections, then a wave. The first
    /// miss asks the kernel about the latest one (row 5b); the kernel's view
    /// shows both closed before it answers (both become known losses). A
    /// second miss names the other loss, not the one asked about: the miss
    /// that asked names that one when its answer is decided. A loss another
    /// miss told all the same is not named twice: the asking miss then
    /// found every connection busy. (Tester: 14 misses naming a loss
    /// another miss had named, in 6 runs of waves mixing dropped bodies,
    /// timeouts and request-limit closes; 0 in 14 runs after.)
    #[test]
    fn a_dropped_body_asked_about_is_named_by_the_miss_that_asked() {
        let pools = PoolHistory::default();
        let client = client();
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let a = connection(&pools, &client, 1, t0, false);
        let b = connection(&pools, &client, 2, t0, false);
        dropped_body(&a, t0 + ms(1));
        dropped_body(&b, t0 + ms(2));
        let at = t0 + ms(10);
        let (candidate, alive, seen) = ask(pools.classify_miss(&host(), &client, at, 3));
        assert_eq!(candidate.id(), b.id(), "the latest release");
        for record in [&a, &b] {
            record.mark_discarded(record.last_activity());
        }
        let second = match pools.classify_miss(&host(), &client, at + ms(1), 3) {
            MissVerdict::Decided(miss) | MissVerdict::Closed { miss, .. } => miss,
            other => panic!("expected a decided miss: {other:?}"),
        };
        assert_eq!(
            (second.reason, second.previous.map(|p| p.id)),
            (MissReason::Discarded, Some(a.id())),
            "the loss no miss is asking about"
        );
        let first = decide_from_kernel(&candidate, &gone(), at, alive, seen, at);
        assert_eq!(
            (first.reason, first.previous.map(|p| p.id)),
            (MissReason::Discarded, Some(b.id()))
        );

        // A third connection's dropped body, asked about, told meanwhile.
        let c = connection(&pools, &client, 3, t0, false);
        dropped_body(&c, at + ms(5));
        let later = at + ms(10);
        let (candidate, alive, seen) = ask(pools.classify_miss(&host(), &client, later, 2));
        assert_eq!(candidate.id(), c.id());
        assert!(c.name_close(), "told by another miss");
        let miss = decide_from_kernel(&candidate, &gone(), later, alive, seen, later);
        assert_eq!(miss, Miss::new(MissReason::AllBusy));

        // A fourth, asked about and shown closed by another look; the
        // asking miss settles busy without reading its own lookup (a wait
        // for a pool that keeps none): the loss it asked about is its to
        // name.
        let d = connection(&pools, &client, 4, t0, false);
        dropped_body(&d, later + ms(5));
        let last = later + ms(10);
        let (candidate, _, _) = ask(pools.classify_miss(&host(), &client, last, 2));
        assert_eq!(candidate.id(), d.id());
        d.mark_discarded(d.last_activity());
        let named = pools
            .name_known_loss(&host(), client.id, d.id(), last, last)
            .map(|m| (m.reason, m.previous.map(|p| p.id)));
        assert_eq!(named, Some((MissReason::Discarded, Some(d.id()))));
    }

    /// Requests failing at once with no response (a server's idle close
    /// racing a wave: every request reset) each name a different idle
    /// HTTP/1.1 connection, most recently released first, as hyper-util
    /// handed them out; none when every one is named (tester: two of a
    /// wave's four resets named one connection, the one really reset then
    /// read `all_busy` / `idle_limit` at the next miss, 2 of 26 runs
    /// against nginx). A connection never used, ready after the request
    /// started, comes last (a wave of resets named none for the request
    /// that had such a connection). A release makes a connection nameable
    /// again.
    #[test]
    fn requests_failing_at_once_each_name_another_idle_connection() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let pools = PoolHistory::default();
        let client = client();
        let a = connection(&pools, &client, 1, t0, false);
        let b = connection(&pools, &client, 2, t0, false);
        response(&a, false, t0 + ms(2));
        response(&b, false, t0 + ms(1));
        let start = t0 + ms(1000);
        // A connect of an earlier wave that lost its pool race, ready (and
        // pooled unused) just after the request started, before hyper-util
        // checked its pool out: named after those released before.
        let late = connection(&pools, &client, 3, start + ms(1), false);
        let named: Vec<_> = (0..4)
            .map(|_| pools.likely_pooled(&host(), start, false).map(|r| r.id()))
            .collect();
        assert_eq!(named, [Some(a.id()), Some(b.id()), Some(late.id()), None]);
        response(&b, false, t0 + ms(3));
        assert_eq!(
            pools.likely_pooled(&host(), start, false).map(|r| r.id()),
            Some(b.id())
        );
    }

    /// A request that missed and gave up (a timeout) while its own
    /// connect ran names the connection released to its waiting checkout
    /// first: released after it started and before its own connect was
    /// ready; one released after that (its own connect won), or before it
    /// started (in the pool already: no miss), is not it. Named once.
    #[test]
    fn a_request_that_gave_up_names_the_connection_returned_to_its_checkout() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let start = t0 + ms(100);
        for (released, own_ready, named) in [
            (start + ms(10), Some(start + ms(20)), true),
            (start + ms(30), Some(start + ms(20)), false),
            (start + ms(10), None, true),
            (t0 + ms(50), None, false),
        ] {
            let pools = PoolHistory::default();
            let client = client();
            let a = connection(&pools, &client, 1, t0, false);
            response(&a, false, released);
            let own = own_ready.map(|ready| connection(&pools, &client, 2, ready, false));
            let until = own_ready.unwrap_or(start + ms(400));
            let found = pools
                .returned_to_waiting(&host(), start, until, own.as_ref().map(|r| r.id()))
                .map(|r| r.id());
            assert_eq!(
                found,
                named.then(|| a.id()),
                "released {:?}, own ready {:?}",
                released - t0,
                own_ready.map(|r| r - t0)
            );
            if named {
                assert_eq!(
                    pools
                        .returned_to_waiting(&host(), start, until, None)
                        .map(|r| r.id()),
                    None,
                    "named once"
                );
            }
        }
    }

    /// A reset failure names first the idle connection whose socket the
    /// kernel reported ended since the request started, however long ago
    /// it was released: the most recently released one may still have
    /// been on its way back to hyper-util's pool, alive. A report from
    /// before the request, or another failure, does not reorder. A close
    /// only the kernel's view showed, since the request started, does not
    /// keep a reset from naming the connection.
    #[test]
    fn a_reset_names_the_connection_the_kernel_reported_ended_first() {
        use crate::kernel::{Acknowledged, SocketEnd, SocketEndSink};
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let ended = |at| SocketEnd {
            seen_at: at,
            since_last_receive: ms(0),
            since_last_send: ms(0),
            since_last_ack: ms(0),
            acknowledged: Acknowledged::NotAllData,
            unread: 0,
            rtt: Duration::ZERO,
            unacked: 0,
            retransmits: 0,
        };
        let start = t0 + ms(1000);
        for (reported, reset, first) in [
            (Some(start + ms(1)), true, 1),
            (Some(start + ms(1)), false, 2),
            (Some(t0 + ms(500)), true, 2),
            (None, true, 2),
        ] {
            let pools = PoolHistory::default();
            let client = client();
            let a = connection(&pools, &client, 1, t0, false);
            let b = connection(&pools, &client, 2, t0, false);
            response(&a, false, t0 + ms(1));
            response(&b, false, t0 + ms(2));
            if let Some(at) = reported {
                a.socket_ended(ended(at));
            }
            let named = pools.likely_pooled(&host(), start, reset).map(|r| r.id());
            assert_eq!(named, Some(first), "{reported:?}, reset {reset}");
        }
        // The only idle connection, its close (only the kernel's view:
        // another miss's look found it reset) seen since the request
        // started: a reset names it; seen before the request started, or a
        // failure that is no reset, names none (a wave of four resets named
        // none for one of them, 1 of 40 runs under load).
        for (closed_at, reset, named) in [
            (start + ms(1), true, Some(1)),
            (start + ms(1), false, None),
            (t0 + ms(500), true, None),
        ] {
            let pools = PoolHistory::default();
            let client = client();
            let a = connection(&pools, &client, 1, t0, false);
            response(&a, false, t0 + ms(1));
            a.closed_by_server(false);
            assert!(a.mark_closed_at(closed_at));
            assert_eq!(
                pools.likely_pooled(&host(), start, reset).map(|r| r.id()),
                named,
                "closed {:?} after t0, reset {reset}",
                closed_at - t0
            );
        }
    }

    /// Row 7 with an end only the kernel's view inferred (a metrics or
    /// sweep check saw the socket gone), while another request is in
    /// flight without a response: that request may hold the candidate and
    /// its response announce the close, so the kernel is asked again (and
    /// the miss waits as row 10's). Decided at once with nothing else in
    /// flight, or when its own traffic showed the end.
    #[test]
    fn an_end_only_inferred_is_asked_again_while_a_response_may_be_in_flight() {
        let pools = PoolHistory::default();
        let client = client();
        let t0 = Instant::now();
        let a = connection(&pools, &client, 1, t0, false);
        response(&a, false, t0 + Duration::from_millis(1));
        a.closed_by_server(false);
        let at = t0 + Duration::from_millis(2);
        let (candidate, alive, seen) = ask(pools.classify_miss(&host(), &client, at, 2));
        assert_eq!(candidate.id(), a.id());
        assert!(response_may_explain_end(&candidate, &gone(), seen, true));
        // The response in flight came, saying close: named as such.
        response(&a, true, t0 + Duration::from_millis(3));
        let miss = decide_from_kernel(&candidate, &gone(), at, alive, seen, at);
        assert_eq!(miss.reason, MissReason::RequestLimit);
        assert_eq!(miss.previous.map(|p| p.request_count), Some(2));
        // Nothing else in flight: row 7 at once.
        let b = connection(&pools, &client, 2, t0, false);
        response(&b, false, t0 + Duration::from_millis(4));
        b.closed_by_server(false);
        let miss = decided(pools.classify_miss(&host(), &client, at, 1));
        assert_eq!(miss.reason, MissReason::ClosedByPeer);
        assert_eq!(miss.previous.map(|p| p.id), Some(b.id()));
    }

    /// Row 10e's look past a busy candidate: the connection the miss would
    /// have had is the most recently released HTTP/1.1 one before the
    /// candidate, idle since before the miss, not believed closed over the
    /// idle limit, not named by another miss; each is named once (a
    /// concurrent miss gets the next), and none is left after that.
    #[test]
    fn the_next_candidate_is_the_latest_idle_one_no_miss_named() {
        let pools = PoolHistory::default();
        let client = Arc::new(ClientState::new(Some(None), Some(4)));
        let t0 = Instant::now();
        let ms = |n| t0 + Duration::from_millis(n);
        let older = connection(&pools, &client, 1, t0, false);
        let next = connection(&pools, &client, 2, t0, false);
        let over = connection(&pools, &client, 3, t0, false);
        let h2 = connection(&pools, &client, 4, t0, true);
        let held = connection(&pools, &client, 5, t0, false);
        let after = connection(&pools, &client, 6, t0, false);
        response(&older, false, ms(1));
        response(&next, false, ms(2));
        response(&over, false, ms(3));
        over.mark_over_idle_limit();
        response(&h2, false, ms(4));
        response(&held, false, ms(5));
        // Released after the miss: not in the pool at its checkout.
        response(&after, false, ms(7));
        let missed_at = ms(6);
        let id = |r: Option<Arc<ConnectionRecord>>| r.map(|r| r.id());
        assert_eq!(
            id(pools.next_candidate(&host(), &held, missed_at, ms(8))),
            Some(next.id())
        );
        assert_eq!(
            id(pools.next_candidate(&host(), &held, missed_at, ms(8))),
            Some(older.id()),
            "the first one is named: a concurrent miss gets the next"
        );
        assert_eq!(
            id(pools.next_candidate(&host(), &held, missed_at, ms(8))),
            None
        );
    }

    /// Row 4's exception and row 6 under a burst: each connection ended by
    /// the server's announced close names one miss, the most recently
    /// released first; with every such close named, a miss whose
    /// connections are all busy is `all_busy`.
    #[test]
    fn each_announced_close_names_one_miss_of_a_burst() {
        let pools = PoolHistory::default();
        let client = client();
        let t0 = Instant::now();
        let a = connection(&pools, &client, 1, t0, false);
        let b = connection(&pools, &client, 2, t0, false);
        let c = connection(&pools, &client, 3, t0, false);
        response(&a, true, t0 + Duration::from_millis(1));
        response(&b, true, t0 + Duration::from_millis(2));
        response(&c, false, t0 + Duration::from_millis(1));
        // c carries a request (its response shows it): busy.
        c.take();
        let at = t0 + Duration::from_millis(3);
        let first = decided(pools.classify_miss(&host(), &client, at, 2));
        let second = decided(pools.classify_miss(&host(), &client, at, 3));
        let named = |m: &Miss| (m.reason, m.previous.map(|p| (p.id, p.end)));
        let limit = |r: &ConnectionRecord| {
            (
                MissReason::RequestLimit,
                Some((r.id(), Some(ConnectionEnd::ConnectionClose))),
            )
        };
        assert_eq!(named(&first), limit(&b));
        assert_eq!(named(&second), limit(&a));
        // Both named, so neither is a candidate any more; c is busy: row 4.
        let third = decided(pools.classify_miss(&host(), &client, at, 4));
        assert_eq!(named(&third), (MissReason::AllBusy, None));
        assert_eq!(
            pools.name_known_loss(&host(), client.id, c.id(), at, at),
            None
        );
        // A later close is named by the next miss.
        c.give_back();
        let later = t0 + Duration::from_millis(4);
        response(&c, true, later);
        let fourth = decided(pools.classify_miss(&host(), &client, later, 2));
        assert_eq!(named(&fourth), limit(&c));
    }

    /// Row 9b: with other requests in flight, a candidate that never
    /// finished a response (a connection ready after the loss whose first
    /// request has no response yet: `in_use` counts from the response) is
    /// held by its connect's request, so an announced close no miss named
    /// yet is the cause, named at once. Named after the kernel's answer instead, it
    /// went to misses that came later and were decided at once, and this
    /// one read `all_busy` (seen with a server closing after every
    /// response, 8 concurrent requests). With nothing else in flight the
    /// kernel still decides (the release race).
    #[test]
    fn a_loss_awaiting_a_miss_is_named_before_a_candidate_others_may_hold() {
        let pools = PoolHistory::default();
        let client = client();
        let t0 = Instant::now();
        let lost = connection(&pools, &client, 1, t0, false);
        response(&lost, true, t0 + Duration::from_millis(1));
        let fresh = connection(&pools, &client, 2, t0 + Duration::from_millis(2), false);
        let at = t0 + Duration::from_millis(3);
        let (candidate, alive, _) = ask(pools.classify_miss(&host(), &client, at, 1));
        assert_eq!(candidate.id(), fresh.id());
        assert_eq!(alive.reason, MissReason::ReleaseRace);
        let miss = decided(pools.classify_miss(&host(), &client, at, 2));
        assert_eq!(
            (miss.reason, miss.previous.map(|p| (p.id, p.end))),
            (
                MissReason::RequestLimit,
                Some((lost.id(), Some(ConnectionEnd::ConnectionClose)))
            )
        );
        // Named once; and the first miss is asking the kernel about
        // `fresh`: the next concurrent miss finds every connection busy.
        let miss = decided(pools.classify_miss(&host(), &client, at, 3));
        assert_eq!((miss.reason, miss.previous), (MissReason::AllBusy, None));
        // A candidate that finished a response may be idle and closed by
        // the server (an idle close after a pause): the kernel decides it,
        // even with a loss awaiting a miss.
        let later = connection(&pools, &client, 3, at, false);
        let lost_again = connection(&pools, &client, 4, at, false);
        response(&lost_again, true, at + Duration::from_millis(1));
        response(&fresh, false, at + Duration::from_millis(2));
        response(&later, false, at + Duration::from_millis(3));
        let (candidate, _, _) =
            ask(pools.classify_miss(&host(), &client, at + Duration::from_secs(2), 3));
        assert_eq!(candidate.id(), later.id());
        assert!(!lost_again.is_close_named(), "left for the next miss");
    }

    /// Kernel first: a sweep saw the socket closed by the server (its FIN)
    /// before the response that said `Connection: close` was attributed,
    /// then again (gone) before its body ended. The response's evidence
    /// replaces the kernel's inference, and the next miss is
    /// `request_limit` with `previous.end = connection_close`.
    #[test]
    fn the_kernel_view_before_the_header_yields_to_connection_close() {
        let pools = PoolHistory::default();
        let client = client();
        let t0 = Instant::now();
        let a = connection(&pools, &client, 1, t0, false);
        for i in 1..=4 {
            response(&a, false, t0 + Duration::from_millis(i));
        }
        // The server wrote its 5th response and closed: the kernel shows FIN.
        assert_eq!(a.closed_by_server(true), ConnectionEnd::PeerFin);
        a.take();
        a.set_connection_close(true);
        a.count_request(Instant::now());
        // The socket is gone before the body ends.
        assert_eq!(a.closed_by_server(false), ConnectionEnd::ConnectionClose);
        a.give_back();
        a.mark_released(t0 + Duration::from_millis(6));
        a.set_end(ConnectionEnd::ConnectionClose);
        assert_eq!(a.end(), Some(ConnectionEnd::ConnectionClose));
        let next = decided(pools.classify_miss(&host(), &client, t0 + Duration::from_millis(7), 1));
        assert_eq!(next.reason, MissReason::RequestLimit);
        assert_eq!(
            next.previous.and_then(|p| p.end),
            Some(ConnectionEnd::ConnectionClose)
        );
    }

    /// An idle close the kernel shows, then a request that failed on the
    /// connection with a reset (the keep-alive race): the reset, seen on the
    /// connection itself, names the end whichever came first.
    #[test]
    fn a_reset_seen_on_the_connection_beats_the_kernel_view_in_either_order() {
        let pools = PoolHistory::default();
        let client = client();
        let t0 = Instant::now();
        for (id, kernel_first) in [(1, true), (2, false)] {
            let r = connection(&pools, &client, id, t0, false);
            response(&r, false, t0 + Duration::from_millis(1));
            if kernel_first {
                r.closed_by_server(false);
            }
            r.set_end(ConnectionEnd::PeerReset);
            if !kernel_first {
                r.closed_by_server(true);
            }
            assert_eq!(
                r.end(),
                Some(ConnectionEnd::PeerReset),
                "kernel first: {kernel_first}"
            );
        }
    }

    /// HTTP/2: a connection error seen on a request names the end over the
    /// `goaway` the kernel's view suggests, in either order; with nothing
    /// seen on it, the kernel's `goaway` stands.
    #[test]
    fn an_http2_error_beats_the_inferred_goaway_in_either_order() {
        let pools = PoolHistory::default();
        let client = client();
        let t0 = Instant::now();
        let first = connection(&pools, &client, 1, t0, true);
        first.closed_by_server(false);
        first.set_end(ConnectionEnd::Http2Error);
        let second = connection(&pools, &client, 2, t0, true);
        second.set_end(ConnectionEnd::Http2Error);
        second.closed_by_server(false);
        assert_eq!(first.end(), Some(ConnectionEnd::Http2Error));
        assert_eq!(second.end(), Some(ConnectionEnd::Http2Error));
        let third = connection(&pools, &client, 3, t0, true);
        response(&third, false, t0 + Duration::from_millis(1));
        // Idle for a second: an idle close, not the last response's.
        let at = t0 + Duration::from_secs(1);
        let (candidate, alive, seen) = ask(pools.classify_miss(&host(), &client, at, 1));
        assert_eq!(candidate.id(), 3);
        let miss = decide_from_kernel(&candidate, &gone(), at, alive, seen, at);
        assert_eq!(miss.reason, MissReason::ClosedByPeer);
        assert_eq!(
            miss.previous.and_then(|p| p.end),
            Some(ConnectionEnd::GoAway)
        );
    }

    /// HTTP/2: a spare connection (made by a concurrent connect while
    /// another one was pooled; it serves at most its own request, then the
    /// client closes it) is never a miss's candidate, nor one that carried
    /// no request: the pooled one that served other requests is. One made
    /// after the pooled one's end was dated is the pool's, even with only
    /// its own request on it.
    #[test]
    fn a_spare_http2_connection_is_never_the_candidate() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let pools = PoolHistory::default();
        let client = client();
        let pooled = connection(&pools, &client, 1, t0, true);
        response(&pooled, false, t0 + ms(2));
        pooled.mark_shared();
        response(&pooled, false, t0 + ms(3));
        let spare = connection(&pools, &client, 2, t0 + ms(1), true);
        response(&spare, false, t0 + ms(4));
        let unused = connection(&pools, &client, 3, t0 + ms(5), true);
        let (candidate, _, seen) = ask(pools.classify_miss(&host(), &client, t0 + ms(6), 1));
        assert_eq!((candidate.id(), seen), (pooled.id(), 2));
        assert_ne!(unused.id(), candidate.id());
        // Its end dated before the next connection was ready: that one
        // went into the pool.
        pooled.note_server_end_by(t0 + ms(3));
        let next = connection(&pools, &client, 4, t0 + ms(10), true);
        response(&next, false, t0 + ms(11));
        let (candidate, _, _) = ask(pools.classify_miss(&host(), &client, t0 + ms(2000), 1));
        assert_eq!(candidate.id(), next.id());
    }

    /// Two connections of one burst: the one our clock saw ready first
    /// served only its own request, the other (ready a moment later) the
    /// rest: hyper-util pooled the later one (its h2 handshake and put
    /// came first), and the earlier is the spare the client closed, never
    /// the candidate of the next wave's miss (tester: 3 of 16 runs against
    /// nginx named it `request_limit` with one request).
    #[test]
    fn a_spare_ready_a_moment_before_the_pooled_http2_connection_is_still_a_spare() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let pools = PoolHistory::default();
        let client = client();
        let spare = connection(&pools, &client, 1, t0, true);
        let pooled = connection(&pools, &client, 2, t0 + Duration::from_micros(200), true);
        response(&pooled, false, t0 + ms(2));
        pooled.mark_shared();
        response(&pooled, false, t0 + ms(2));
        response(&pooled, false, t0 + ms(3));
        response(&spare, false, t0 + ms(4));
        let (candidate, _, _) = ask(pools.classify_miss(&host(), &client, t0 + ms(1000), 4));
        assert_eq!(candidate.id(), pooled.id());
        // One ready well after the first is no spare of it: the first had
        // ended unbeknown to us, the later one is the pool's.
        // The candidate is the one checked out last (its latest request's
        // start), here the first again.
        let pools = PoolHistory::default();
        let first = connection(&pools, &client, 3, t0, true);
        let later = connection(&pools, &client, 4, t0 + ms(500), true);
        exchange(&later, t0 + ms(500), t0 + ms(501));
        later.mark_shared();
        exchange(&later, t0 + ms(501), t0 + ms(502));
        exchange(&first, t0 + ms(599), t0 + ms(600));
        let (candidate, _, _) = ask(pools.classify_miss(&host(), &client, t0 + ms(1000), 1));
        assert_eq!(candidate.id(), first.id());
    }

    /// HTTP/2 over TLS, a 1 s request beside the short ones: its wave's twin
    /// connection carried only that request and ended late; the connection
    /// the pool handed out since (checked out for a short request long
    /// after, then expired) is the candidate, not the twin whose stream
    /// ended last (a tester: 2 of 12 runs named the twin, and the expired
    /// connection went unnamed).
    #[test]
    fn the_http2_candidate_is_the_connection_checked_out_last() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let client = Arc::new(ClientState::new(Some(Some(ms(100))), None));
        let pools = PoolHistory::default();
        let twin = connection(&pools, &client, 1, t0 + ms(313), true);
        let latest = connection(&pools, &client, 2, t0 + ms(1316), true);
        exchange(&latest, t0 + ms(1316), t0 + ms(1317));
        exchange(&twin, t0 + ms(311), t0 + ms(1322));
        let at = t0 + ms(1439);
        let (candidate, _, _) = ask(pools.classify_miss(&host(), &client, at, 2));
        assert_eq!(candidate.id(), latest.id());
    }

    /// A GOAWAY dated late for the last response counted at the miss is
    /// `request_limit` once a response on the connection that ended later
    /// is counted (its request was in flight at the miss): read again.
    #[test]
    fn a_late_counted_response_dates_the_goaway_at_the_request_limit() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let pools = PoolHistory::default();
        let client = client();
        let a = connection(&pools, &client, 1, t0, true);
        response(&a, false, t0 + ms(1));
        a.infer_end(ConnectionEnd::GoAway);
        a.note_server_end_by(t0 + ms(200));
        assert_eq!(
            ended_http2_reason(&a, MissReason::ClosedByPeer),
            MissReason::ClosedByPeer
        );
        response(&a, false, t0 + ms(190));
        assert_eq!(
            ended_http2_reason(&a, MissReason::ClosedByPeer),
            MissReason::RequestLimit
        );
        assert_eq!(
            ended_http2_reason(&a, MissReason::AllBusy),
            MissReason::AllBusy,
            "only a server's close is read again"
        );
    }

    /// HTTP/2 GOAWAY: the server's end reached the client (the miss found
    /// the connection unusable, its close of ours dated, or a request
    /// refused by it) within `ENDED_WITH_LAST_RESPONSE` of its latest
    /// response's end, or before a response that ended later: the server
    /// ended it with that response (`request_limit`); after idling longer:
    /// `closed_by_peer`. Either way `previous.end = goaway`.
    #[test]
    fn an_http2_goaway_at_the_last_response_is_the_request_limit() {
        let t0 = Instant::now();
        let released = t0 + Duration::from_millis(1);
        let ms = Duration::from_millis;
        let closed_at = |at: Duration| {
            KernelLookup::Found(TcpFacts {
                state: TcpState::TimeWait,
                info: None,
                receive_queue: 0,
                time_wait_left: Some(crate::kernel::TIME_WAIT_LENGTH - (ms(5000) - at)),
                fin_wait2_left: None,
            })
        };
        // (the miss after the release, the kernel's view, the reason)
        for (after, lookup, reason) in [
            (ms(1), gone(), MissReason::RequestLimit),
            (ms(1), state(TcpState::CloseWait), MissReason::RequestLimit),
            (
                ms(1),
                state(TcpState::Established),
                MissReason::RequestLimit,
            ),
            (ms(60), gone(), MissReason::RequestLimit),
            (ms(2000), gone(), MissReason::ClosedByPeer),
            (
                ms(2000),
                state(TcpState::Established),
                MissReason::ClosedByPeer,
            ),
            // Our close after the GOAWAY, dated 2 ms after the release,
            // found by a miss 3 s later.
            (ms(3000), closed_at(ms(3)), MissReason::RequestLimit),
            (ms(3000), closed_at(ms(1500)), MissReason::ClosedByPeer),
        ] {
            let pools = PoolHistory::default();
            let client = client();
            let a = connection(&pools, &client, 1, t0, true);
            response(&a, false, released);
            let at = released + after;
            let (candidate, alive, seen) = ask(pools.classify_miss(&host(), &client, at, 1));
            let miss = decide_from_kernel(&candidate, &lookup, t0 + ms(5000), alive, seen, at);
            assert_eq!(
                (miss.reason, miss.previous.and_then(|p| p.end)),
                (reason, Some(ConnectionEnd::GoAway)),
                "miss {after:?} after the release, {lookup:?}"
            );
            // The next miss reads the same from the history.
            let next = decided(pools.classify_miss(&host(), &client, at + ms(1), 1));
            assert_eq!(next.reason, reason, "from the history");
        }
        // A request refused by the GOAWAY while others were served on it.
        let pools = PoolHistory::default();
        let client = client();
        let a = connection(&pools, &client, 1, t0, true);
        a.set_end(ConnectionEnd::GoAway);
        a.note_server_end_by(t0 + ms(1));
        response(&a, false, t0 + ms(2));
        let next = decided(pools.classify_miss(&host(), &client, t0 + ms(3000), 1));
        assert_eq!(next.reason, MissReason::RequestLimit);
    }

    /// HTTP/2 killed with a connection error while a request was asking the
    /// kernel: the kernel's view decided `goaway` first, the failed
    /// request's `http2_error` arrived before the miss was recorded: the
    /// recorded end is the error. A miss naming a live connection keeps no
    /// end.
    #[test]
    fn an_error_seen_after_the_kernel_decided_names_the_recorded_end() {
        let pools = PoolHistory::default();
        let client = client();
        let t0 = Instant::now();
        let a = connection(&pools, &client, 1, t0, true);
        response(&a, false, t0 + Duration::from_millis(1));
        let at = t0 + Duration::from_millis(2);
        let (candidate, alive, seen) = ask(pools.classify_miss(&host(), &client, at, 1));
        let miss = decide_from_kernel(&candidate, &gone(), at, alive, seen, at);
        let previous = miss.previous.expect("previous");
        assert_eq!(
            pools.previous_end(&host(), &previous),
            Some(ConnectionEnd::GoAway)
        );
        a.set_end(ConnectionEnd::Http2Error);
        assert_eq!(
            pools.previous_end(&host(), &previous),
            Some(ConnectionEnd::Http2Error)
        );
        let b = connection(&pools, &client, 2, t0, false);
        response(&b, false, t0 + Duration::from_millis(3));
        let (candidate, alive, seen) = ask(pools.classify_miss(&host(), &client, at, 1));
        assert_eq!(candidate.id(), 2);
        let miss = decide_from_kernel(
            &candidate,
            &state(TcpState::Established),
            at,
            alive,
            seen,
            at,
        );
        assert_eq!(miss.reason, MissReason::ReleaseRace);
        b.set_end(ConnectionEnd::PeerReset);
        assert_eq!(
            pools.previous_end(&host(), &miss.previous.expect("previous")),
            None
        );
    }

    /// An HTTP/1.1 connection the server closed, found gone (`peer_closed`):
    /// the kernel's report of its socket's end tells the server's FIN (our
    /// FIN acknowledged after it, or our last data met its closed socket)
    /// from its reset (nothing acknowledged since the response, no FIN of
    /// ours), once it came; over TLS only where the report reads the close
    /// as the server's. A tester's FIN and RST idle closes both read
    /// `peer_closed`, 184 of 184.
    #[test]
    fn a_gone_sockets_end_report_tells_the_servers_fin_from_its_reset() {
        use crate::kernel::{Acknowledged, SocketEnd, SocketEndSink};
        let ms = Duration::from_millis;
        let report = |acknowledged, since_last_ack| SocketEnd {
            seen_at: Instant::now(),
            since_last_receive: ms(148),
            since_last_send: ms(148),
            since_last_ack,
            acknowledged,
            unread: 0,
            rtt: Duration::from_micros(30),
            unacked: 0,
            retransmits: 0,
        };
        for (tls, acknowledged, since_last_ack, expected) in [
            (
                false,
                Acknowledged::DataAndFin,
                ms(0),
                ConnectionEnd::PeerFin,
            ),
            // Our last data met the server's closed socket: it had closed
            // first, with a FIN (over TLS, our close_notify answering its).
            (
                false,
                Acknowledged::NotAllData,
                ms(0),
                ConnectionEnd::PeerFin,
            ),
            (false, Acknowledged::Data, ms(148), ConnectionEnd::PeerReset),
            // Our FIN sent, not acknowledged yet: not told.
            (false, Acknowledged::Data, ms(0), ConnectionEnd::PeerClosed),
            // Over TLS, with the report reading the close as the server's.
            (
                true,
                Acknowledged::DataAndFin,
                ms(0),
                ConnectionEnd::PeerFin,
            ),
            (
                true,
                Acknowledged::NotAllData,
                ms(0),
                ConnectionEnd::PeerFin,
            ),
            (true, Acknowledged::Data, ms(148), ConnectionEnd::PeerReset),
        ] {
            let pools = PoolHistory::default();
            let client = client();
            let t0 = Instant::now();
            let record = Arc::new(ConnectionRecord::new(
                Arc::new(ConnectionSetup {
                    local_addr: Some((Ipv4Addr::LOCALHOST, 40001).into()),
                    peer_addr: Some((Ipv4Addr::LOCALHOST, 443).into()),
                    tls: tls.then_some(ms(1)),
                    ..ConnectionSetup::for_test(1, t0)
                }),
                SpanContext::empty_context(),
                None,
                Arc::clone(&client),
                Some(host()),
                None,
            ));
            assert!(pools.record_connection(host(), Arc::clone(&record)));
            response(&record, false, t0 + ms(1));
            let end = record.closed_by_server(false);
            assert_eq!(end, ConnectionEnd::PeerClosed);
            let previous = Previous::of(&record, t0 + ms(300), Some(end));
            assert_eq!(
                pools.previous_end(&host(), &previous),
                Some(ConnectionEnd::PeerClosed),
                "no report yet"
            );
            record.socket_ended(report(acknowledged, since_last_ack));
            if tls {
                assert_eq!(
                    crate::pool::end_report::reported_end(&record),
                    Some(crate::pool::end_report::ReportedEnd::Server)
                );
            }
            assert_eq!(
                pools.previous_end(&host(), &previous),
                Some(expected),
                "tls {tls}, {acknowledged:?}, last ack {since_last_ack:?} before the end"
            );
        }
    }

    /// A body dropped before its end closed the connection only if hyper
    /// had not read it all: the kernel decides (gone or closed by our side:
    /// `discarded`; established with unread bytes: hyper closes it next,
    /// `discarded`; established with none: hyper-util was putting it back,
    /// the miss is the release race, once the miss looked again for up to
    /// `UNDATED_CLOSE_WAIT`), and a response on it meanwhile shows it
    /// alive.
    #[test]
    fn a_dropped_body_is_discarded_only_when_the_kernel_shows_it_closed() {
        let client = client();
        let t0 = Instant::now();
        // A history with one connection whose body was dropped: a loss is
        // named once, so each lookup below gets its own.
        let dropped = || {
            let pools = PoolHistory::default();
            let a = connection(&pools, &client, 1, t0, false);
            dropped_body(&a, t0 + Duration::from_millis(1));
            (pools, a)
        };
        let at = t0 + Duration::from_millis(2);
        for (lookup, reason) in [
            (gone(), MissReason::Discarded),
            (state(TcpState::TimeWait), MissReason::Discarded),
            (state(TcpState::Established), MissReason::ReleaseRace),
            (unread(TcpState::Established, 4096), MissReason::Discarded),
        ] {
            let (pools, _) = dropped();
            let (candidate, alive, seen) = ask(pools.classify_miss(&host(), &client, at, 1));
            let miss = decide_from_kernel(&candidate, &lookup, at, alive, seen, at);
            assert_eq!(miss.reason, reason, "{lookup:?}");
        }
        // Established is looked at again until hyper's task had time to
        // see the drop, unread bytes or none.
        let (pools, a) = dropped();
        let (candidate, alive, seen) = ask(pools.classify_miss(&host(), &client, at, 1));
        for lookup in [
            state(TcpState::Established),
            unread(TcpState::Established, 4096),
        ] {
            assert!(look_again_at(&candidate, &lookup, at, &alive, seen, at).is_some());
            let late = at + UNDATED_CLOSE_WAIT;
            assert_eq!(
                look_again_at(&candidate, &lookup, late, &alive, seen, at),
                None
            );
        }
        response(&a, false, t0 + Duration::from_millis(3));
        let miss = decide_from_kernel(&candidate, &gone(), at, alive, seen, at);
        assert_eq!(miss.reason, MissReason::ReleaseRace);
    }

    /// Our side closed the candidate. Dated after the miss (beyond the
    /// timer's slack): hyper-util dropped it on its way back to a checkout
    /// the miss's own connect had won, so it was alive at the miss: the
    /// release race; unless the pool never handed a connection out again
    /// and the close came within `CLOSED_AT_RELEASE` of the release (a
    /// pool that keeps none closes it then, on its own task): judged as a
    /// close at the miss. Dated well before the miss: the client's pool
    /// dropped it (its idle limit here). Dated within the slack of the
    /// miss: the release race when the pool has handed a connection out
    /// again (its idle limit is not 0), else unsure (`pool_closed`) until a
    /// second such close, on another connection, confirms the limit; but
    /// with the pool handing connections out again and no other idle at
    /// the release, a close before the miss had no reason in the pool: the
    /// server's (row 10).
    /// Undated (`FIN_WAIT1`): the pool's close.
    #[test]
    fn a_close_of_ours_at_the_miss_is_judged_by_the_pools_history() {
        let t0 = Instant::now();
        let now = t0 + Duration::from_millis(200);
        let closed = |at_ms: u64| {
            KernelLookup::Found(TcpFacts {
                state: TcpState::TimeWait,
                info: None,
                receive_queue: 0,
                time_wait_left: Some(
                    crate::kernel::TIME_WAIT_LENGTH - Duration::from_millis(200 - at_ms),
                ),
                fin_wait2_left: None,
            })
        };
        // (the miss at ms, the kernel's view, an idle hit before, expected
        // reason and previous end)
        let race = (MissReason::ReleaseRace, None);
        let limit = (MissReason::PoolDisabled, Some(ConnectionEnd::IdleLimit));
        let unsure = (MissReason::PoolClosed, Some(ConnectionEnd::PoolClosed));
        // Row 10: the pool keeps connections and held no other idle one,
        // so only the release race's dropped checkout closes at release,
        // which comes after the miss; closed before it (the `TIME_WAIT`
        // timer's date plus its 10 ms), the server closed it just after
        // its response.
        let server = (MissReason::ClosedByPeer, Some(ConnectionEnd::PeerClosed));
        for (miss_ms, lookup, kept, expected) in [
            (5, closed(50), false, unsure),
            (5, closed(50), true, race),
            (5, closed(150), false, race),
            (50, closed(2), false, limit),
            (50, closed(2), true, server),
            (5, closed(2), true, race),
            (5, closed(8), true, race),
            (5, closed(2), false, unsure),
            (
                5,
                state(TcpState::FinWait1),
                false,
                (MissReason::AllBusy, Some(ConnectionEnd::IdleLimit)),
            ),
        ] {
            let pools = PoolHistory::default();
            let client = client();
            if kept {
                client.inferred.note_reuse();
            }
            let a = connection(&pools, &client, 1, t0, false);
            response(&a, false, t0 + Duration::from_millis(1));
            a.set_idle_others_at_release(0);
            let at = t0 + Duration::from_millis(miss_ms);
            let (candidate, alive, seen) = ask(pools.classify_miss(&host(), &client, at, 1));
            assert_eq!(alive.reason, MissReason::ReleaseRace);
            let miss = decide_from_kernel(&candidate, &lookup, now, alive, seen, at);
            let end = miss.previous.and_then(|p| p.end);
            assert_eq!(
                (miss.reason, end),
                expected,
                "miss at {miss_ms} ms, {lookup:?}, kept {kept}"
            );
        }
        // Closed 150 ms after the release, the idle timeout not set through
        // our builder: maybe that timeout's (hyper-util's idle check), so
        // not row 10's, however early before the miss.
        let pools = PoolHistory::default();
        let unknown_limits = Arc::new(ClientState::unknown_settings());
        unknown_limits.inferred.note_reuse();
        let a = connection(&pools, &unknown_limits, 1, t0, false);
        response(&a, false, t0 + Duration::from_millis(1));
        a.set_idle_others_at_release(0);
        let at = t0 + Duration::from_millis(190);
        let (candidate, alive, seen) = ask(pools.classify_miss(&host(), &unknown_limits, at, 1));
        let miss = decide_from_kernel(&candidate, &closed(150), now, alive, seen, at);
        assert_eq!(
            (miss.reason, miss.previous.and_then(|p| p.end)),
            (MissReason::IdleExpired, Some(ConnectionEnd::IdleTimeout))
        );
        // Two unsure closes of different connections, no idle hit between:
        // the second confirms the limit (0: `pool_disabled`, inferred).
        let pools = PoolHistory::default();
        let client = client();
        for (id, reason) in [(1, MissReason::PoolClosed), (2, MissReason::PoolDisabled)] {
            let released = t0 + Duration::from_millis(id);
            let c = connection(&pools, &client, id, t0, false);
            response(&c, false, released);
            c.set_idle_others_at_release(0);
            let at = released + Duration::from_millis(1);
            let (candidate, alive, seen) = ask(pools.classify_miss(&host(), &client, at, 1));
            assert_eq!(candidate.id(), c.id());
            let lookup = closed(id + 2);
            let miss = decide_from_kernel(&candidate, &lookup, now, alive, seen, at);
            assert_eq!(miss.reason, reason, "connection {id}");
        }
        assert_eq!(client.inferred.idle_limit(), Some(0));
    }

    /// A small body the caller read 160 ms after hyper had read it
    /// (hyper-util's idle clock started at the headers): the connection
    /// sat idle in the pool from then, not from the caller's read, which
    /// the kernel's view then confirms or refutes. Under an idle timeout
    /// of 100 ms set through our builder, the miss 5 ms after that read
    /// asks the kernel (past the timeout only as counted from hyper's
    /// read): under a pool shown to keep connections, our close, or the
    /// socket alive (the checkout passed it over),
    /// is the timeout's, `idle_expired`; gone over plain TCP (the server
    /// closed it first, which leaves no `TIME_WAIT` here) is the server's.
    /// With the timeout unknown, our close the kernel dates 120 ms after
    /// hyper's read (before the caller's) is the timeout's (`idle_expired`,
    /// inferred) when the pool kept the connection at its release (no
    /// other idle then, a reuse seen); with another connection idle at
    /// that release, it may be the idle limit's close at a put-back that
    /// came later than the reads show (the body's end arriving late), or
    /// the timeout's: `pool_closed`, not known which. One dated at hyper's read stays a close there (the
    /// server's, row 10, under a pool shown to keep one). Read from the
    /// caller's read, the first was `release_race` and the second
    /// `pool_disabled` (a tester: 88 of 96 and 8 of 96 misses).
    /// Row 9, HTTP/2: hyper-util dates a shared connection at its
    /// checkout, so a stream longer than the idle timeout expires it
    /// (counted from the latest request's start, not its response's end);
    /// the kernel decides whose close it was. Our close (or the connection
    /// alive, held by a stream) once the clock ran out: `idle_expired`. Our
    /// close before: the answer to the server's GOAWAY. The server's close:
    /// its own. A request still in flight that started before the clock
    /// ran out may have restarted it (`InFlight::http2_clock_restart`); one
    /// that started after did not.
    #[test]
    fn an_http2_connection_idles_from_its_latest_checkout() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        // A 150 ms timeout; each response takes 100 ms, the next request
        // comes 80 ms after it: the clock ran out 30 ms before the miss.
        let known = Arc::new(ClientState::new(Some(Some(ms(150))), None));
        let setup = || {
            let pools = PoolHistory::default();
            let a = connection(&pools, &known, 1, t0, true);
            a.take();
            a.count_request(t0 + ms(1));
            a.give_back();
            a.mark_released(t0 + ms(101));
            (pools, a)
        };
        let at = t0 + ms(181);
        let closed = |closed_ms: u64| closed_ago(at.saturating_duration_since(t0 + ms(closed_ms)));
        let in_flight_since = |start: u64| InFlight {
            count: 2,
            starts: vec![t0 + ms(start), at],
        };
        let expired = Some((MissReason::IdleExpired, ConnectionEnd::IdleTimeout));
        let goaway = None;
        for (load, lookup, expected) in [
            // Our close at the miss's checkout, or alive (a stream held it).
            (InFlight::from(1), closed(181), expired),
            (InFlight::from(1), state(TcpState::Established), expired),
            // Our close 20 ms after the response, 30 ms before the clock
            // ran out: the answer to the server's GOAWAY.
            (InFlight::from(1), closed(121), goaway),
            // Another request in flight since 50 ms restarted the clock:
            // alive at the miss, the pool had not expired it.
            (in_flight_since(50), state(TcpState::Established), goaway),
            // One started after the clock ran out (a wave mate) did not.
            (in_flight_since(160), state(TcpState::Established), expired),
        ] {
            let (pools, a) = setup();
            let (candidate, alive, seen) =
                ask(pools.classify_miss(&host(), &known, at, load.clone()));
            assert_eq!(candidate.id(), a.id());
            let miss = decide_from_kernel(&candidate, &lookup, at, alive, seen, at);
            let seen_end = miss.previous.and_then(|p| p.end);
            match expected {
                Some((reason, end)) => {
                    assert_eq!(
                        (miss.reason, seen_end),
                        (reason, Some(end)),
                        "{load:?} {lookup:?}"
                    )
                }
                None => assert!(
                    seen_end == Some(ConnectionEnd::GoAway)
                        && miss.reason != MissReason::IdleExpired,
                    "{load:?} {lookup:?}: {miss:?}"
                ),
            }
        }
        let (pools, a) = setup();
        assert_eq!(a.http2_idle_since(), t0 + ms(1));
        ask(pools.classify_miss(&host(), &known, at, in_flight_since(50)));
        assert_eq!(a.http2_idle_since(), t0 + ms(50));
    }

    /// An HTTP/2 connection a long request holds open, expired by the pool
    /// (its clock ran from the latest checkout, a short request beside the
    /// long one): the miss names it `idle_expired`. The connection that
    /// miss made, used by its own request only, is then the pool's, not a
    /// spare: the next miss, once its clock ran out too, names it, not the
    /// held one again (tester: the held connection named by every miss
    /// until its long request ended, 3 of 9 misses per run). A miss of the
    /// first one's wave, before the new connection carried a request, met
    /// the same expiry and names the held one.
    #[test]
    fn an_http2_connection_the_pool_expired_under_a_long_stream_is_no_candidate() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let client = Arc::new(ClientState::new(Some(Some(ms(100))), None));
        let pools = PoolHistory::default();
        // `a`: its trigger (a 1 s request) still runs; a short request
        // beside it checked it out at 5 ms.
        let a = connection(&pools, &client, 1, t0, true);
        a.take();
        a.count_request(t0 + ms(5));
        a.mark_shared();
        a.give_back();
        a.mark_released(t0 + ms(6));
        let long = t0 + ms(1);
        let in_flight = |at| InFlight {
            count: 2,
            starts: vec![long, at],
        };
        let first = t0 + ms(157);
        let (candidate, alive, seen) =
            ask(pools.classify_miss(&host(), &client, first, in_flight(first)));
        assert_eq!(candidate.id(), a.id());
        let miss = decide_from_kernel(
            &candidate,
            &state(TcpState::Established),
            first,
            alive,
            seen,
            first,
        );
        assert_eq!(
            (miss.reason, miss.previous.map(|p| p.id)),
            (MissReason::IdleExpired, Some(a.id()))
        );
        // `b`: made by that miss. Until it carries a request, a miss of the
        // same wave met the same expiry: it names `a` too.
        let b = connection(&pools, &client, 2, t0 + ms(158), true);
        let wave_mate = first + ms(2);
        let (candidate, alive, seen) =
            ask(pools.classify_miss(&host(), &client, wave_mate, in_flight(wave_mate)));
        assert_eq!(candidate.id(), a.id(), "the wave met a's expiry");
        let miss = decide_from_kernel(
            &candidate,
            &state(TcpState::Established),
            wave_mate,
            alive,
            seen,
            wave_mate,
        );
        assert_eq!(
            (miss.reason, miss.previous.map(|p| p.id)),
            (MissReason::IdleExpired, Some(a.id()))
        );
        // `b` serves its request: the pool's now.
        exchange(&b, t0 + ms(158), t0 + ms(160));
        let second = t0 + ms(311);
        let (candidate, alive, seen) =
            ask(pools.classify_miss(&host(), &client, second, in_flight(second)));
        assert_eq!(candidate.id(), b.id(), "the pool's connection");
        let closed = closed_ago(second.saturating_duration_since(t0 + ms(304)));
        let miss = decide_from_kernel(&candidate, &closed, second, alive, seen, second);
        assert_eq!(
            (miss.reason, miss.previous.map(|p| (p.id, p.request_count))),
            (MissReason::IdleExpired, Some((b.id(), 1)))
        );
    }

    #[test]
    fn a_body_read_late_sat_idle_from_hypers_read() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let read_late = |pools: &PoolHistory, client: &Arc<ClientState>, others: usize| {
            let a = connection(pools, client, 1, t0, false);
            a.take();
            a.count_request(t0);
            a.give_back();
            a.mark_released_put_back_from(t0 + ms(160), t0);
            a.set_idle_others_at_release(others);
            a
        };
        let at = t0 + ms(165);
        let now = t0 + ms(200);
        let closed = |closed_ms: u64| closed_ago(now.saturating_duration_since(t0 + ms(closed_ms)));
        let expired = (MissReason::IdleExpired, Some(ConnectionEnd::IdleTimeout));
        for (lookup, expected) in [
            (closed(120), expired),
            (state(TcpState::Established), expired),
            (
                gone(),
                (MissReason::ClosedByPeer, Some(ConnectionEnd::PeerClosed)),
            ),
        ] {
            let known = Arc::new(ClientState::new(Some(Some(ms(100))), None));
            known.inferred.note_reuse();
            let pools = PoolHistory::default();
            let a = read_late(&pools, &known, 0);
            assert_eq!(a.idle_since(), t0);
            assert_eq!(a.last_activity(), t0 + ms(160));
            let (candidate, alive, seen) = ask(pools.classify_miss(&host(), &known, at, 1));
            let miss = decide_from_kernel(&candidate, &lookup, now, alive, seen, at);
            assert_eq!(
                (miss.reason, miss.previous.and_then(|p| p.end)),
                expected,
                "{lookup:?}"
            );
            if miss.reason == MissReason::IdleExpired {
                assert_eq!(miss.previous.map(|p| p.idle), Some(ms(200)));
            }
        }
        for (closed_ms, others, expected) in [
            (120, 0, expired),
            (
                120,
                1,
                (MissReason::PoolClosed, Some(ConnectionEnd::PoolClosed)),
            ),
            (
                5,
                0,
                (MissReason::ClosedByPeer, Some(ConnectionEnd::PeerClosed)),
            ),
        ] {
            let unknown = Arc::new(ClientState::unknown_settings());
            unknown.inferred.note_reuse();
            let pools = PoolHistory::default();
            read_late(&pools, &unknown, others);
            let (candidate, alive, seen) = ask(pools.classify_miss(&host(), &unknown, at, 1));
            let miss = decide_from_kernel(&candidate, &closed(closed_ms), now, alive, seen, at);
            assert_eq!(
                (miss.reason, miss.previous.and_then(|p| p.end)),
                expected,
                "closed at {closed_ms} ms, {others} other idle"
            );
        }
    }

    /// Our close of a socket, dated `ago` before the lookup.
    fn closed_ago(ago: Duration) -> KernelLookup {
        KernelLookup::Found(TcpFacts {
            state: TcpState::TimeWait,
            info: None,
            receive_queue: 0,
            time_wait_left: Some(crate::kernel::TIME_WAIT_LENGTH - ago),
            fin_wait2_left: None,
        })
    }

    /// Row 8 holds only with another request in flight, and once no
    /// connection the pool kept is left to explain the miss: with `b`
    /// (kept) free, the kernel decides about `b` first (alive: busy with
    /// the other request, `all_busy`). With `b` named by a concurrent miss,
    /// `a`'s close over the limit is the cause. With nothing else
    /// in flight, the pool held nothing idle at the miss (the checkout
    /// would have had it), so the release counted over the idle limit (the
    /// count included a connection closed unbeknown to us) was not: the
    /// kernel decides, and a candidate alive, closed by us at the miss, or
    /// gone moments after its release over TLS (a TLS server's close_notify
    /// resets our closed socket) was hyper-util's release race, never
    /// `all_busy`; gone over plain TCP, the server's close.
    #[test]
    fn a_sequential_miss_does_not_trust_a_release_counted_over_the_idle_limit() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        // The idle limit set through our builder (1); the idle timeout not.
        let client = Arc::new(ClientState::new(None, Some(1)));
        let at = t0 + ms(3);
        // `b` released, then `a`, believed over the limit of 1 (`b` idle).
        let released = || {
            let pools = PoolHistory::default();
            let b = connection(&pools, &client, 1, t0, false);
            response(&b, false, t0 + ms(1));
            let a = connection(&pools, &client, 2, t0, false);
            response(&a, false, t0 + ms(2));
            assert!(
                pools
                    .on_released(&host(), &a, t0 + ms(2), t0 + ms(1), 1)
                    .over_limit
            );
            (pools, b, a)
        };
        {
            let (pools, b, a) = released();
            let (candidate, alive, seen) = ask(pools.classify_miss(&host(), &client, at, 2));
            assert_eq!(candidate.id(), b.id());
            let miss = decide_from_kernel(
                &candidate,
                &state(TcpState::Established),
                at + ms(1),
                alive,
                seen,
                at,
            );
            assert_eq!((miss.reason, miss.previous), (MissReason::AllBusy, None));
            // A concurrent miss: `b` is being decided, `a`'s close over the
            // limit may explain it, but a request in flight may hold `a`
            // (kept after all: the count is a belief): the kernel tells.
            // Closed by us at its release: that close explains it; alive:
            // busy, naming nothing.
            let (candidate, alive, seen) = ask(pools.classify_miss(&host(), &client, at, 3));
            assert_eq!(candidate.id(), a.id());
            let named = |m: Miss| (m.reason, m.previous.map(|p| (p.id, p.end)));
            let miss =
                decide_from_kernel(&candidate, &closed_ago(ms(2)), at + ms(1), alive, seen, at);
            assert_eq!(
                named(miss),
                (
                    MissReason::AllBusy,
                    Some((a.id(), Some(ConnectionEnd::IdleLimit)))
                )
            );
            let miss = decide_from_kernel(
                &candidate,
                &state(TcpState::Established),
                at + ms(1),
                alive,
                seen,
                at,
            );
            assert_eq!(named(miss), (MissReason::AllBusy, None));
        }
        for (lookup, in_flight, expected) in [
            (
                Some(state(TcpState::Established)),
                1,
                (MissReason::ReleaseRace, None),
            ),
            (Some(closed_ago(ms(1))), 1, (MissReason::ReleaseRace, None)),
            // Gone over plain TCP: not our close, which leaves TIME_WAIT.
            (
                Some(gone()),
                1,
                (MissReason::ClosedByPeer, Some(ConnectionEnd::PeerClosed)),
            ),
        ] {
            let (pools, _, a) = released();
            let verdict = pools.classify_miss(&host(), &client, at, in_flight);
            let miss = match lookup {
                None => decided(verdict),
                Some(lookup) => {
                    let (candidate, alive, seen) = ask(verdict);
                    assert_eq!(candidate.id(), a.id());
                    decide_from_kernel(&candidate, &lookup, at + ms(1), alive, seen, at)
                }
            };
            assert_eq!(
                (miss.reason, miss.previous.and_then(|p| p.end)),
                expected,
                "{in_flight} in flight"
            );
            assert_eq!(miss.previous.map(|p| p.id), Some(a.id()));
        }
    }

    /// A connection believed idle and then found closed by its client's
    /// pool was not idle at the later releases that counted it (closed at
    /// its own release: it never entered the idle list; after idling: not
    /// after that close): their idle counts are lowered, never below 0.
    #[test]
    fn a_close_learned_late_is_uncounted_from_the_releases_after_it() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let pools = PoolHistory::default();
        let client = Arc::new(ClientState::unknown_settings());
        let a = connection(&pools, &client, 1, t0, false);
        response(&a, false, t0 + ms(1));
        let mut later = Vec::new();
        for (id, released) in [(2, 30), (3, 100)] {
            let r = connection(&pools, &client, id, t0, false);
            response(&r, false, t0 + ms(released));
            pools.on_released(&host(), &r, t0 + ms(released), t0 + ms(released - 1), 1);
            later.push(r);
        }
        let counts = || {
            later
                .iter()
                .map(|r| r.idle_others_at_release())
                .collect::<Vec<_>>()
        };
        assert_eq!(counts(), [Some(1), Some(2)], "each counted those before");
        // `a` closed by the pool after idling 50 ms: idle at 30 ms, not at 100.
        pools.uncount_closed(&host(), &a, PoolClose::Expired { idle: ms(50) });
        assert_eq!(counts(), [Some(1), Some(1)]);
        // `later[0]` closed at its own release: never idle after it.
        pools.uncount_closed(&host(), &later[0], PoolClose::Unsure);
        assert_eq!(counts(), [Some(1), Some(0)]);
        pools.uncount_closed(&host(), &later[0], PoolClose::Unsure);
        assert_eq!(counts(), [Some(1), Some(0)], "never below 0");
    }

    /// The kernel is asked again about a candidate whose fate was still
    /// being decided, under an idle limit not ours to count and a pool that
    /// never handed a connection out again: alive with nothing else in
    /// flight, until `CLOSED_AT_RELEASE` after its release (a pool that
    /// keeps none has closed it by then); our FIN not yet acknowledged,
    /// (or `FIN_WAIT2` with no timer yet), until `UNDATED_CLOSE_WAIT` after
    /// the miss; closed while counting other
    /// connections idle at its release (their closes may lower the count),
    /// until `CLOSED_AT_RELEASE` after it; alive with another request in
    /// flight, until `CLOSED_AT_RELEASE` after its release too (for a pool
    /// that keeps none to show), unless the pool closed a connection for
    /// its idle timeout. Never once the pool has handed a connection out
    /// again.
    #[test]
    fn a_candidate_whose_fate_is_pending_is_looked_at_again() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let pools = PoolHistory::default();
        let client = Arc::new(ClientState::unknown_settings());
        let other = connection(&pools, &client, 1, t0, false);
        response(&other, false, t0 + ms(1));
        let a = connection(&pools, &client, 2, t0, false);
        response(&a, false, t0 + ms(2));
        let at = t0 + ms(3);
        let (candidate, alive, seen) = ask(pools.classify_miss(&host(), &client, at, 1));
        assert_eq!(candidate.id(), a.id());
        let again = |lookup: &KernelLookup, now: Instant, alive: &Miss| {
            look_again_at(&candidate, lookup, now, alive, seen, at)
        };
        let established = state(TcpState::Established);
        assert_eq!(again(&established, at, &alive), Some(at + LOOK_AGAIN_EVERY));
        assert_eq!(
            again(&established, t0 + ms(75), &alive),
            Some(t0 + ms(2) + CLOSED_AT_RELEASE)
        );
        assert_eq!(again(&established, t0 + ms(80), &alive), None);
        // Another request in flight: alive at the first answer
        // (`all_busy`), looked at again all the same, for a pool that may
        // keep none to show (`may_wait_for_pool_off`); not once the pool
        // has closed a connection for its idle timeout.
        let busy = Miss::new(MissReason::AllBusy);
        assert_eq!(again(&established, at, &busy), Some(at + LOOK_AGAIN_EVERY));
        assert_eq!(again(&established, t0 + ms(80), &busy), None);
        let fin_wait1 = state(TcpState::FinWait1);
        assert_eq!(again(&fin_wait1, at + ms(10), &alive), Some(at + ms(15)));
        assert_eq!(again(&fin_wait1, at + UNDATED_CLOSE_WAIT, &alive), None);
        // `FIN_WAIT2` before the application closed the socket: no timer.
        let fin_wait2 = state(TcpState::FinWait2);
        assert_eq!(again(&fin_wait2, at, &alive), Some(at + LOOK_AGAIN_EVERY));
        // Closed, `other` counted idle at its release, or not.
        a.set_idle_others_at_release(1);
        assert_eq!(
            again(&closed_ago(ms(1)), at, &alive),
            Some(at + LOOK_AGAIN_EVERY)
        );
        a.set_idle_others_at_release(0);
        assert_eq!(again(&closed_ago(ms(1)), at, &alive), None);
        let timed_out = Arc::new(ClientState::unknown_settings());
        let b = connection(&pools, &timed_out, 3, t0, false);
        response(&b, false, t0 + ms(2));
        timed_out
            .inferred
            .observe(PoolClose::Expired { idle: ms(500) });
        assert_eq!(look_again_at(&b, &established, at, &busy, 1, at), None);
        client.inferred.note_reuse();
        assert_eq!(again(&established, at, &alive), None);
        assert_eq!(again(&established, at, &busy), None);
        a.set_idle_others_at_release(1);
        assert_eq!(again(&closed_ago(ms(1)), at, &alive), None);
        // FIN_WAIT1 is dated whatever the pool did before.
        assert_eq!(again(&fin_wait1, at, &alive), Some(at + LOOK_AGAIN_EVERY));
    }

    /// A socket found gone no more than `CLOSED_AT_RELEASE` after its
    /// release, with no end its traffic showed, was closed by our side
    /// (hyper-util's pool, at release or with a dropped checkout; a TLS
    /// server's close_notify reset it): not the server's close, which
    /// comes after its keep-alive timeout. Later, or after an announced
    /// close, it is not.
    ///
    /// Over plain TCP a socket gone is never our close alone: ours leaves
    /// `TIME_WAIT` (a tester's server closing unannounced just after each
    /// response read `release_race`, 12 of 12 runs).
    #[test]
    fn a_socket_gone_moments_after_its_release_was_our_close() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let pools = PoolHistory::default();
        let client = client();
        let plain = connection(&pools, &client, 1, t0, false);
        let a = watched_over_tls(&plain, &client, t0 + ms(1));
        assert!(gone_after_own_close(&a, t0 + ms(50)));
        assert!(!gone_after_own_close(&a, t0 + ms(200)));
        response(&plain, false, t0 + ms(1));
        assert!(
            !gone_after_own_close(&plain, t0 + ms(50)),
            "over plain TCP our close leaves TIME_WAIT"
        );
        plain.mark_closed();
        assert!(
            gone_after_own_close(&plain, t0 + ms(50)),
            "the kernel showed our close before"
        );
        let b = watched_over_tls(&connection(&pools, &client, 2, t0, false), &client, t0);
        response(&b, true, t0 + ms(1));
        assert!(
            !gone_after_own_close(&b, t0 + ms(50)),
            "the server announced it"
        );
    }

    /// `plain` made over TLS (a 1 ms handshake): an HTTP/1.1 connection
    /// of `client` whose one response ended at `at`, its socket's end
    /// watched (the kernel's report not in yet).
    fn watched_over_tls(
        plain: &ConnectionRecord,
        client: &Arc<ClientState>,
        at: Instant,
    ) -> Arc<ConnectionRecord> {
        let setup = ConnectionSetup {
            tls: Some(Duration::from_millis(1)),
            ..(*plain.setup).clone()
        };
        let record = Arc::new(ConnectionRecord::new(
            Arc::new(setup),
            SpanContext::empty_context(),
            None,
            Arc::clone(client),
            Some(host()),
            None,
        ));
        response(&record, false, at);
        record.mark_end_watched();
        record
    }

    /// A gone HTTP/1.1 socket over TLS is read by the kernel's report of
    /// its end: our FIN acknowledged (the server still read when we
    /// closed), or our data acknowledged and the server's last data its
    /// answer just before the end, is our close; our last data
    /// unacknowledged (the server's socket was closed: it reset), or
    /// nothing sent after the response and the server's data long before
    /// the end (its reset), is the server's. Our close, so dated, names the
    /// client's limits as a close the kernel's `TIME_WAIT` dates does.
    #[test]
    fn a_gone_tls_socket_is_read_by_the_kernels_report_of_its_end() {
        use crate::kernel::{Acknowledged, SocketEnd, SocketEndSink};
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let end = |seen: u64, received: u64, sent: u64, acknowledged| SocketEnd {
            seen_at: t0 + ms(seen),
            since_last_receive: ms(received),
            since_last_send: ms(sent),
            since_last_ack: ms(received),
            acknowledged,
            unread: 0,
            rtt: Duration::ZERO,
            unacked: 0,
            retransmits: 0,
        };
        // A TLS 1.3 close_notify record (24 bytes) and a FIN never read.
        let unread = |end: SocketEnd| SocketEnd { unread: 25, ..end };
        let ours = |idle: u64| Some(ReportedEnd::Ours { idle: ms(idle) });
        let server = Some(ReportedEnd::Server);
        let all = Acknowledged::DataAndFin;
        for (report, expected) in [
            // The client's idle timeout, 400 ms after the response: the
            // server's close_notify refused, our close_notify the last data.
            (end(405, 404, 4, all), ours(400)),
            // The same, reported 90 ms late (a busy watch thread).
            (end(495, 404, 4, all), ours(400)),
            // The same, the server's answer read before our socket closed.
            (end(402, 0, 1, all), ours(401)),
            // ... before it acknowledged our FIN.
            (end(402, 0, 1, Acknowledged::Data), ours(401)),
            // Its close at release (the idle limit), in the response's jiffy.
            (end(3, 2, 2, all), ours(1)),
            // The client's idle timeout 300 ms after the response, the
            // server's answer in the same jiffy, never read.
            (unread(end(302, 2, 2, all)), ours(300)),
            // The server's close_notify 300 ms after the response, read,
            // ours in answer within the same jiffy; the server acknowledged
            // it and our FIN, then reset (nginx's idle close, its worker
            // slow to close: seen under load).
            (end(302, 2, 2, all), server),
            // The server's close_notify 300 ms after the response, ours in
            // answer, its FIN: TIME_WAIT, expired by the miss.
            (end(302, 2, 1, all), server),
            // The server's close_notify 300 ms after the response, then
            // ours, which its closed socket reset.
            (end(302, 1, 0, Acknowledged::NotAllData), server),
            // The server's close_notify 300 ms after our last data, our FIN
            // without one (a connection that carried no request).
            (end(300, 0, 300, all), server),
            // The server's reset 300 ms after it: nothing sent since.
            (end(301, 300, 301, Acknowledged::Data), server),
            // Closed by our side at release with data unread (the server's
            // session tickets): the kernel resets instead of a FIN, our
            // last data unacknowledged.
            (unread(end(3, 2, 2, Acknowledged::NotAllData)), ours(1)),
        ] {
            let pools = PoolHistory::default();
            let client = Arc::new(ClientState::unknown_settings());
            let a = connection(&pools, &client, 1, t0, false);
            response(&a, false, t0);
            assert_eq!(reported_end(&a), None, "plain HTTP");
            let b = watched_over_tls(&a, &client, t0);
            assert!(b.awaits_socket_end());
            assert_eq!(reported_end(&b), None, "not reported yet");
            b.socket_ended(report);
            assert!(!b.awaits_socket_end());
            assert_eq!(reported_end(&b), expected, "{report:?}");
            let now = t0 + ms(1000);
            let alive = Miss::caused_by(MissReason::AllBusy, Previous::of(&b, now, None));
            let miss = decide_from_kernel(&b, &KernelLookup::NotFound, now, alive, 1, now);
            let (reason, end) = match expected {
                Some(ReportedEnd::Ours { idle }) if idle > CLOSED_AT_RELEASE => {
                    (MissReason::IdleExpired, ConnectionEnd::IdleTimeout)
                }
                Some(ReportedEnd::Ours { .. }) => (MissReason::AllBusy, ConnectionEnd::IdleLimit),
                _ => (MissReason::ClosedByPeer, ConnectionEnd::PeerClosed),
            };
            assert_eq!(miss.reason, reason, "{report:?}");
            assert_eq!(miss.previous.and_then(|p| p.end), Some(end), "{report:?}");
        }
    }

    /// A gone TLS socket whose last data each way fell in the response's
    /// jiffy, all of it read and acknowledged, is a close at release only
    /// when the pool may have closed it there: its idle limit not known to
    /// be above 0, or the release over it. Under a limit above 0 not
    /// reached, it is the server's close without close_notify just after
    /// the response (a tester's server closing after every third response
    /// read `release_race`, 12 of 12 runs), and the miss names it.
    #[test]
    fn a_same_jiffy_end_under_a_pool_that_keeps_it_is_the_servers_close() {
        use crate::kernel::{Acknowledged, SocketEnd, SocketEndSink};
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let same_jiffy = SocketEnd {
            seen_at: t0 + ms(3),
            since_last_receive: ms(2),
            since_last_send: ms(2),
            since_last_ack: ms(2),
            acknowledged: Acknowledged::DataAndFin,
            unread: 0,
            rtt: Duration::ZERO,
            unacked: 0,
            retransmits: 0,
        };
        // Our last data 3 ms before the server's, which came with the
        // response: the request and its response, or our close_notify at
        // release and the server's answer.
        let request_then_response = SocketEnd {
            seen_at: t0 + ms(6),
            since_last_receive: ms(2),
            since_last_send: ms(5),
            ..same_jiffy
        };
        // The request and its response, then nothing until the server's
        // FIN without close_notify 300 ms later, which (with its
        // acknowledgement of our answering FIN) is the last segment: no
        // close of ours at release, whatever the limit (a tester's server
        // read `pool_disabled`, 15 of 15 misses, with the limit unknown).
        let idle_close_without_close_notify = SocketEnd {
            seen_at: t0 + ms(300),
            since_last_receive: ms(300),
            since_last_send: ms(303),
            since_last_ack: ms(0),
            ..same_jiffy
        };
        let ours = Some(ReportedEnd::Ours { idle: ms(1) });
        // (report, idle limit set through our builder, release over it,
        // expected)
        for (report, limit, over, expected) in [
            (same_jiffy, None, false, ours),
            (
                idle_close_without_close_notify,
                None,
                false,
                Some(ReportedEnd::Server),
            ),
            (
                idle_close_without_close_notify,
                Some(10),
                false,
                Some(ReportedEnd::Server),
            ),
            (same_jiffy, Some(10), false, Some(ReportedEnd::Server)),
            (same_jiffy, Some(10), true, ours),
            (request_then_response, None, false, ours),
            (
                request_then_response,
                Some(10),
                false,
                Some(ReportedEnd::Server),
            ),
            (request_then_response, Some(10), true, ours),
        ] {
            let pools = PoolHistory::default();
            let client = Arc::new(ClientState::new(Some(None), limit));
            let plain = connection(&pools, &client, 1, t0, false);
            let b = watched_over_tls(&plain, &client, t0);
            assert!(pools.record_connection(host(), Arc::clone(&b)));
            if over {
                b.mark_over_idle_limit();
            }
            b.socket_ended(report);
            assert_eq!(
                reported_end(&b),
                expected,
                "{report:?}, limit {limit:?}, over {over}"
            );
            if expected == Some(ReportedEnd::Server) {
                let at = t0 + ms(5);
                let (candidate, alive, seen) = ask(pools.classify_miss(&host(), &client, at, 1));
                assert_eq!(candidate.id(), b.id());
                let miss =
                    decide_from_kernel(&candidate, &KernelLookup::NotFound, at, alive, seen, at);
                assert_eq!(
                    (miss.reason, miss.previous.map(|p| (p.id, p.end))),
                    (
                        MissReason::ClosedByPeer,
                        Some((b.id(), Some(ConnectionEnd::PeerClosed)))
                    )
                );
            }
        }
        // A connection that never carried a request: hyper-util may drop
        // it at its put-back whatever the limit, so the same report is our
        // close (a tester saw it read as the server's).
        let pools = PoolHistory::default();
        let client = Arc::new(ClientState::new(Some(None), Some(10)));
        let plain = connection(&pools, &client, 1, t0, false);
        let unused = ConnectionRecord::new(
            Arc::new(ConnectionSetup {
                tls: Some(ms(1)),
                ..(*plain.setup).clone()
            }),
            SpanContext::empty_context(),
            None,
            Arc::clone(&client),
            Some(host()),
            None,
        );
        unused.mark_end_watched();
        unused.socket_ended(same_jiffy);
        assert!(
            matches!(reported_end(&unused), Some(ReportedEnd::Ours { .. })),
            "{:?}",
            reported_end(&unused)
        );
    }

    /// HTTP/1.1 over TLS in `TIME_WAIT` at the miss (our FIN first, the
    /// server's after it): the server's close_notify came first and hyper
    /// closed on it, or our pool closed it and the server answered our
    /// close_notify with its FIN alone (nginx). Until the kernel's report
    /// of the socket's end is in, the miss looks again; the report tells:
    /// no data from the server after the response is our close (the
    /// client's idle timeout, inferred), its close_notify 300 ms after the
    /// response is its close. Without a report: the server's.
    #[test]
    fn a_tls_time_wait_is_read_by_the_kernels_report_of_its_end() {
        use crate::kernel::{Acknowledged, SocketEnd, SocketEndSink};
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let end = |seen: u64, received: u64, sent: u64| SocketEnd {
            seen_at: t0 + ms(seen),
            since_last_receive: ms(received),
            since_last_send: ms(sent),
            since_last_ack: ms(received),
            acknowledged: Acknowledged::DataAndFin,
            // The server's FIN, never read.
            unread: 1,
            rtt: Duration::ZERO,
            unacked: 0,
            retransmits: 0,
        };
        // (closed how long before the miss, by the TIME_WAIT timer; the
        // report; the reason)
        for (closed, report, expected) in [
            // Our close_notify 300 ms after the response, nginx's FIN.
            (100, Some(end(301, 301, 1)), MissReason::IdleExpired),
            // ... the descriptor closed 90 ms later (a starved task): the
            // ages count from then.
            (100, Some(end(390, 390, 90)), MissReason::IdleExpired),
            // The server's close_notify 300 ms after the response, ours in
            // answer, its FIN.
            (100, Some(end(302, 2, 1)), MissReason::ClosedByPeer),
            // ... ours in answer within the same jiffy.
            (100, Some(end(302, 2, 2)), MissReason::ClosedByPeer),
            // Our close_notify 300 ms after the response, the server's
            // answer (a close_notify of its own) and its FIN while hyper
            // still held the shut-down socket: never read, later than
            // ours.
            (
                100,
                Some(SocketEnd {
                    unread: 25,
                    ..end(302, 1, 2)
                }),
                MissReason::IdleExpired,
            ),
            // The server's close_notify 150 ms after the response, ours in
            // answer, the descriptor closed 240 ms later: its ages alone
            // would date the server's data before the response.
            (250, Some(end(390, 241, 240)), MissReason::ClosedByPeer),
            // Our close_notify 200 ms after the response to a server 150 ms
            // away: its FIN, and our TIME_WAIT, 150 ms after our close; the
            // response's data then came 150 ms before the timer's date
            // less the 200 ms between it and our close_notify.
            (
                50,
                Some(SocketEnd {
                    rtt: ms(150),
                    ..end(350, 350, 150)
                }),
                MissReason::IdleExpired,
            ),
            (100, None, MissReason::ClosedByPeer),
        ] {
            let pools = PoolHistory::default();
            let client = Arc::new(ClientState::unknown_settings());
            let a = connection(&pools, &client, 1, t0, false);
            let b = watched_over_tls(&a, &client, t0);
            let now = t0 + ms(400);
            let lookup = closed_ago(ms(closed));
            let alive = Miss::caused_by(MissReason::ReleaseRace, Previous::of(&b, now, None));
            assert!(
                look_again_at(&b, &lookup, now, &alive, 1, now).is_some(),
                "waits for the report"
            );
            if let Some(report) = report {
                b.socket_ended(report);
                assert_eq!(look_again_at(&b, &lookup, now, &alive, 1, now), None);
            }
            let miss = decide_from_kernel(&b, &lookup, now, alive, 1, now);
            assert_eq!(miss.reason, expected, "{report:?}");
            let end = match expected {
                MissReason::IdleExpired => ConnectionEnd::IdleTimeout,
                _ => ConnectionEnd::PeerClosed,
            };
            assert_eq!(miss.previous.and_then(|p| p.end), Some(end), "{report:?}");
        }
    }

    /// Row 10e's release race: a candidate released just before a miss is
    /// told held (its next request started before the miss) from on its
    /// way back to the pool (the only request since started after it); an
    /// older release, HTTP/2, or two requests since are not told.
    #[test]
    fn the_request_that_took_a_candidate_after_a_miss_tells_held_from_returning() {
        let pools = PoolHistory::default();
        let client = client();
        let t0 = Instant::now();
        let candidate = connection(&pools, &client, 1, t0, false);
        response(&candidate, false, t0 + Duration::from_millis(5));
        let seen = candidate.requests.load(Ordering::Relaxed);
        let released = candidate.last_released();
        let missed_at = t0 + Duration::from_millis(6);
        assert_eq!(
            rider_since(&candidate, seen, released, missed_at),
            Rider::NoneYet
        );

        // Started after the miss: it was not held at the miss.
        candidate.count_request(missed_at + Duration::from_millis(1));
        assert_eq!(
            rider_since(&candidate, seen, released, missed_at),
            Rider::AfterMiss
        );
        // A second one since: the first one's start is not kept.
        candidate.count_request(missed_at + Duration::from_millis(2));
        assert_eq!(
            rider_since(&candidate, seen, released, missed_at),
            Rider::Unknown
        );

        // Started before the miss (handed the candidate by its release).
        let held = connection(&pools, &client, 2, t0, false);
        response(&held, false, t0 + Duration::from_millis(5));
        let seen = held.requests.load(Ordering::Relaxed);
        let released = held.last_released();
        held.count_request(t0 + Duration::from_millis(4));
        assert_eq!(
            rider_since(&held, seen, released, missed_at),
            Rider::InFlightAtMiss
        );

        // Released long before the miss: back in the pool by then.
        let long_ago = missed_at + CLOSED_AT_RELEASE + Duration::from_millis(1);
        let old = connection(&pools, &client, 3, t0, false);
        response(&old, false, t0 + Duration::from_millis(5));
        let seen = old.requests.load(Ordering::Relaxed);
        old.count_request(long_ago + Duration::from_millis(1));
        assert_eq!(
            rider_since(&old, seen, old.last_released(), long_ago),
            Rider::Unknown
        );
        // Released after the miss, or never: not told.
        assert_eq!(
            rider_since(
                &old,
                seen,
                Some(missed_at + Duration::from_millis(1)),
                missed_at
            ),
            Rider::Unknown
        );
        assert_eq!(rider_since(&old, seen, None, missed_at), Rider::Unknown);

        // HTTP/2: multiplexed, no one-at-a-time rider.
        let h2 = connection(&pools, &client, 4, t0, true);
        h2.mark_released(t0 + Duration::from_millis(5));
        let seen = h2.requests.load(Ordering::Relaxed);
        h2.count_request(missed_at + Duration::from_millis(1));
        assert_eq!(
            rider_since(&h2, seen, h2.last_released(), missed_at),
            Rider::Unknown
        );
    }
}
