//! Live connections by socket address pair: how a response's `HttpInfo`
//! (local and remote address) is traced back to the connect that made it.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use opentelemetry::trace::SpanContext;

use crate::client::ClientState;
use crate::miss::ConnectionEnd;
use crate::pool::{HostKey, MissSlot};
use crate::report::ConnectionSetup;

/// One established connection as this handle saw it being set up.
#[derive(Debug)]
pub(crate) struct ConnectionRecord {
    pub(crate) setup: Arc<ConnectionSetup>,
    pub(crate) setup_span: SpanContext,
    /// Id of the request whose pool miss started the connect.
    pub(crate) trigger_id: Option<u64>,
    pub(crate) requests: AtomicU64,
    /// The client whose connector made it.
    pub(crate) client: Arc<ClientState>,
    /// The pool key it serves, when the trigger was known.
    pub(crate) host: Option<HostKey>,
    /// Why the connect was needed (the trigger's pool miss).
    pub(crate) miss: Option<Arc<MissSlot>>,
    /// Requests currently using it (HTTP/1.1: 0 or 1).
    in_use: AtomicU32,
    /// An HTTP/1.1 response was dropped mid-body: hyper closed it.
    discarded: AtomicBool,
    /// Released while the client's idle pool for the host was full: hyper
    /// closed it.
    over_idle_limit: AtomicBool,
    /// Its close was observed and counted.
    closed: AtomicBool,
    /// End of the latest response on this connection (body read or dropped).
    last_released: Mutex<Option<Instant>>,
    /// An HTTP/1.1 response body was dropped before its end: hyper closed
    /// the connection unless it had already read the whole body (then it
    /// went back to the pool). Cleared by a later response on it.
    dropped_early: AtomicBool,
    /// The latest response carried `Connection: close`.
    connection_close: AtomicBool,
    /// How it ended, once known (first cause wins).
    end: OnceLock<ConnectionEnd>,
    /// The server's advertised keep-alive timeout (`Keep-Alive: timeout=N`),
    /// in milliseconds; 0 = none seen.
    server_keep_alive_ms: AtomicU64,
    /// HTTP/2 streams reset because their response was dropped early.
    stream_resets: AtomicU64,
    /// A request timed out on it while nothing arrived from the peer.
    stalled: AtomicBool,
    /// A newer DNS answer for its host no longer holds its peer address.
    dns_stale: AtomicBool,
}

impl ConnectionRecord {
    pub(crate) fn new(
        setup: Arc<ConnectionSetup>,
        setup_span: SpanContext,
        trigger_id: Option<u64>,
        client: Arc<ClientState>,
        host: Option<HostKey>,
        miss: Option<Arc<MissSlot>>,
    ) -> Self {
        Self {
            setup,
            setup_span,
            trigger_id,
            requests: AtomicU64::new(0),
            client,
            host,
            miss,
            in_use: AtomicU32::new(0),
            discarded: AtomicBool::new(false),
            over_idle_limit: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            last_released: Mutex::new(None),
            dropped_early: AtomicBool::new(false),
            connection_close: AtomicBool::new(false),
            end: OnceLock::new(),
            server_keep_alive_ms: AtomicU64::new(0),
            stream_resets: AtomicU64::new(0),
            stalled: AtomicBool::new(false),
            dns_stale: AtomicBool::new(false),
        }
    }

    /// A newer DNS answer for its host does not hold its peer address.
    pub(crate) fn mark_dns_stale(&self) {
        self.dns_stale.store(true, Ordering::Relaxed);
    }

    pub(crate) fn is_dns_stale(&self) -> bool {
        self.dns_stale.load(Ordering::Relaxed)
    }

    /// An HTTP/1.1 body was dropped before its end at `at`.
    pub(crate) fn mark_dropped_early(&self, at: Instant) {
        self.dropped_early.store(true, Ordering::Relaxed);
        self.mark_released(at);
    }

    pub(crate) fn is_dropped_early(&self) -> bool {
        self.dropped_early.load(Ordering::Relaxed)
    }

    /// A response arrived on it: whatever was dropped before, the pool kept
    /// it, and it is not stalled.
    pub(crate) fn mark_alive(&self) {
        self.dropped_early.store(false, Ordering::Relaxed);
        self.stalled.store(false, Ordering::Relaxed);
    }

    /// Records whether the latest response said `Connection: close`.
    pub(crate) fn set_connection_close(&self, close: bool) {
        self.connection_close.store(close, Ordering::Relaxed);
    }

    pub(crate) fn said_connection_close(&self) -> bool {
        self.connection_close.load(Ordering::Relaxed)
    }

    /// Records how it ended (the first cause recorded wins).
    pub(crate) fn set_end(&self, end: ConnectionEnd) {
        let _ = self.end.set(end);
    }

    /// How it ended, if known.
    pub(crate) fn end(&self) -> Option<ConnectionEnd> {
        self.end.get().copied()
    }

    /// Records the server's advertised keep-alive timeout; returns `true`
    /// the first time one is seen on this connection.
    pub(crate) fn set_server_keep_alive(&self, timeout: Duration) -> bool {
        let ms = u64::try_from(timeout.as_millis())
            .unwrap_or(u64::MAX)
            .max(1);
        self.server_keep_alive_ms.swap(ms, Ordering::Relaxed) == 0
    }

    /// The server's advertised keep-alive timeout, if any.
    pub(crate) fn server_keep_alive(&self) -> Option<Duration> {
        match self.server_keep_alive_ms.load(Ordering::Relaxed) {
            0 => None,
            ms => Some(Duration::from_millis(ms)),
        }
    }

    /// Counts one more reset stream; returns the new total.
    pub(crate) fn count_stream_reset(&self) -> u64 {
        self.stream_resets.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// Streams reset so far.
    pub(crate) fn stream_resets(&self) -> u64 {
        self.stream_resets.load(Ordering::Relaxed)
    }

    /// A request timed out on it while the peer sent nothing.
    pub(crate) fn mark_stalled(&self) {
        self.stalled.store(true, Ordering::Relaxed);
    }

    pub(crate) fn is_stalled(&self) -> bool {
        self.stalled.load(Ordering::Relaxed)
    }

    /// Requests currently using the connection.
    pub(crate) fn in_use(&self) -> u32 {
        self.in_use.load(Ordering::Relaxed)
    }

    /// A request starts using the connection.
    pub(crate) fn take(&self) {
        self.in_use.fetch_add(1, Ordering::Relaxed);
    }

    /// A request stops using the connection.
    pub(crate) fn give_back(&self) {
        let _ = self
            .in_use
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
    }

    /// hyper closed it because a response was dropped before its end.
    pub(crate) fn mark_discarded(&self, at: Instant) {
        self.discarded.store(true, Ordering::Relaxed);
        self.set_end(ConnectionEnd::Discarded);
        self.mark_released(at);
    }

    pub(crate) fn is_discarded(&self) -> bool {
        self.discarded.load(Ordering::Relaxed)
    }

    /// hyper closed it at release because the idle pool was full (a
    /// belief until the kernel or a later response says otherwise).
    pub(crate) fn mark_over_idle_limit(&self) {
        self.over_idle_limit.store(true, Ordering::Relaxed);
    }

    /// A response arrived on it after all: the pool had kept it.
    pub(crate) fn clear_over_idle_limit(&self) {
        self.over_idle_limit.store(false, Ordering::Relaxed);
    }

    /// Marks the close observed; `true` the first time only.
    pub(crate) fn mark_closed(&self) -> bool {
        !self.closed.swap(true, Ordering::Relaxed)
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Relaxed)
    }

    pub(crate) fn is_over_idle_limit(&self) -> bool {
        self.over_idle_limit.load(Ordering::Relaxed)
    }

    pub(crate) fn id(&self) -> u64 {
        self.setup.id
    }

    /// When the connect finished and the connection became usable.
    pub(crate) fn ready_at(&self) -> Instant {
        self.setup.started + self.setup.total
    }

    /// HTTP/2 was negotiated (multiplexed: no one-at-a-time release).
    pub(crate) fn http2(&self) -> bool {
        self.setup.http2
    }

    fn released(&self) -> MutexGuard<'_, Option<Instant>> {
        self.last_released.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// When the connection was last released to the pool.
    pub(crate) fn last_released(&self) -> Option<Instant> {
        *self.released()
    }

    /// Records the end of a response on this connection.
    pub(crate) fn mark_released(&self, at: Instant) {
        let mut r = self.released();
        if r.is_none_or(|prev| prev < at) {
            *r = Some(at);
        }
    }

    /// Counts one more request on this connection; returns the new total.
    pub(crate) fn count_request(&self) -> u64 {
        self.requests.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// The end of the latest response on this connection, or its ready
    /// time when it has carried none.
    pub(crate) fn last_activity(&self) -> Instant {
        self.last_released()
            .unwrap_or(self.ready_at())
            .max(self.ready_at())
    }
}

/// Connections by (local, remote) socket address. Bounded: when full, the
/// connection idle the longest is forgotten (it has most likely been closed;
/// reqwest's close is invisible through its API).
#[derive(Debug)]
pub(crate) struct Registry {
    map: Mutex<HashMap<(SocketAddr, SocketAddr), Arc<ConnectionRecord>>>,
    capacity: usize,
}

impl Registry {
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            map: Mutex::new(HashMap::new()),
            capacity: capacity.max(1),
        }
    }

    fn map(&self) -> MutexGuard<'_, HashMap<(SocketAddr, SocketAddr), Arc<ConnectionRecord>>> {
        self.map.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records a new connection. A previous connection on the same address
    /// pair (the port was reused after a close) is replaced.
    pub(crate) fn insert(
        &self,
        local: SocketAddr,
        remote: SocketAddr,
        record: Arc<ConnectionRecord>,
    ) {
        let mut map = self.map();
        if map.len() >= self.capacity
            && !map.contains_key(&(local, remote))
            && let Some(oldest) = map
                .iter()
                .min_by_key(|(_, r)| r.last_activity())
                .map(|(k, _)| *k)
        {
            map.remove(&oldest);
        }
        map.insert((local, remote), record);
    }

    /// The connection on this address pair, if known.
    pub(crate) fn get(
        &self,
        local: SocketAddr,
        remote: SocketAddr,
    ) -> Option<Arc<ConnectionRecord>> {
        self.map().get(&(local, remote)).cloned()
    }

    /// Forgets a connection known to be closed.
    pub(crate) fn remove(&self, local: SocketAddr, remote: SocketAddr, id: u64) {
        let mut map = self.map();
        if map.get(&(local, remote)).is_some_and(|r| r.id() == id) {
            map.remove(&(local, remote));
        }
    }

    /// Every connection currently remembered.
    pub(crate) fn snapshot(&self) -> Vec<Arc<ConnectionRecord>> {
        self.map().values().cloned().collect()
    }

    /// Number of connections currently remembered.
    pub(crate) fn len(&self) -> usize {
        self.map().len()
    }
}
