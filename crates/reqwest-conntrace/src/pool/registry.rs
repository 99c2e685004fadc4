//! Live connections by socket address pair: how a response's `HttpInfo`
//! (local and remote address) is traced back to the connect that made it.

use std::collections::VecDeque;
use std::hash::{BuildHasher, RandomState};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use hashbrown::HashTable;

use crate::pool::host::HostKey;
use crate::pool::record::{ConnectionRecord, Pair};

/// Shards of the table: requests on different connections take different
/// locks (one `Mutex<HashMap>` was the one lock every response took).
const SHARDS: usize = 16;

/// At most one sweep per this interval.
const SWEEP_INTERVAL: Duration = Duration::from_secs(1);

/// At most this many kernel lookups per sweep (the idle-longest
/// connections first), so a sweep never floods the sock_diag queue that
/// pool-miss classification also waits on.
pub(crate) const SWEEP_KERNEL_CHECKS: usize = 1024;

/// One shard: its open connections and its most recently closed ones,
/// under one lock, so a connection moves from one to the other at once: a
/// lookup (a response on the connection, say the last streams of an HTTP/2
/// connection the server ended with GOAWAY) never falls between the two.
/// With a lock each, a lookup between the removal from the open table and
/// the push to the closed one found neither, and its request was
/// `untracked` (seen in e2e runs under load).
#[derive(Debug, Default)]
struct Shard {
    /// Open connections, found by their own socket address pair. A slot
    /// holds only the record's pointer (8 bytes; a map keyed by a copy of
    /// the pair took 72), the pair is read from the record.
    open: HashTable<Arc<ConnectionRecord>>,
    /// The most recently closed connections, oldest first (see
    /// [`CLOSED_PER_SHARD`]).
    closed: VecDeque<(Pair, Arc<ConnectionRecord>)>,
}

/// The shard of an address pair: connections to one server differ in their
/// local port.
fn shard_of((local, remote): Pair) -> usize {
    usize::from(local.port() ^ remote.port().rotate_left(8)) % SHARDS
}

/// The registry refused a connection: it holds `capacity` connections
/// that may all still be in use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RegistryFull {
    pub(crate) capacity: usize,
}

/// Connections closed most recently, per shard, that a response may still
/// name: 64 per shard, 1,024 in all (the oldest is forgotten first).
///
/// A server that closes after its last response (`Connection: close`, its
/// per-connection request limit) makes the socket disappear as soon as
/// hyper has read that response and closed its side, before the request
/// that carried it has run the middleware (it waits for its task to be
/// polled: milliseconds on a loaded machine); a miss asking the kernel
/// about the connection then sees its close first. Its response must
/// still name it. 1,024: at a thousand connections closed per second,
/// about a second of closes, far longer than a response waits for its
/// task.
const CLOSED_PER_SHARD: usize = 64;

/// Connections by (local, remote) socket address.
///
/// A connection stays until its close is observed (the handle removes it:
/// see `Inner::connection_closed`), never because newer ones arrived: a
/// connection the client can still use must stay attributable. The bound is
/// a safety cap on memory: at the cap a new connection is refused (and its
/// requests say so, `http.connection.untracked`), never an old one evicted.
/// Connections that closed without the handle seeing it (the server closed an
/// idle one; the client was dropped) are found by sweeps once the registry
/// is three quarters full: see [`Registry::sweep_due`]. A removed
/// connection stays findable by [`get`](Registry::get) among the most
/// recently closed ([`CLOSED_PER_SHARD`]), outside the cap, so a response
/// that arrives after its connection's close was observed still names it.
#[derive(Debug)]
pub(crate) struct Registry {
    shards: [Mutex<Shard>; SHARDS],
    /// Hashes a pair for the shards' tables (std's SipHash, randomly keyed).
    hasher: RandomState,
    len: AtomicUsize,
    capacity: usize,
    /// Start of the latest sweep, in ms since `created`.
    last_sweep_ms: AtomicU64,
    created: Instant,
}

impl Registry {
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            shards: std::array::from_fn(|_| Mutex::new(Shard::default())),
            hasher: RandomState::new(),
            len: AtomicUsize::new(0),
            capacity: capacity.max(1),
            last_sweep_ms: AtomicU64::new(0),
            created: Instant::now(),
        }
    }

    fn shard(&self, pair: Pair) -> MutexGuard<'_, Shard> {
        self.shards[shard_of(pair)]
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    fn hash(&self, pair: Pair) -> u64 {
        self.hasher.hash_one(pair)
    }

    /// Records a new connection, found by its socket address pair (a
    /// connection without one, a local transport, is not kept: nothing
    /// could find it). A previous connection on the same pair (the port was
    /// reused after a close) is replaced. At the cap the connection is
    /// refused.
    pub(crate) fn insert(&self, record: Arc<ConnectionRecord>) -> Result<(), RegistryFull> {
        let Some(pair) = record.pair() else {
            return Ok(());
        };
        let hash = self.hash(pair);
        let mut shard = self.shard(pair);
        if let Some(previous) = shard.open.find_mut(hash, |r| r.pair() == Some(pair)) {
            *previous = record;
            return Ok(());
        }
        let reserved = self
            .len
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (n < self.capacity).then_some(n + 1)
            });
        if reserved.is_err() {
            // Its responses must not name a closed connection that had the
            // same address pair.
            shard.closed.retain(|(p, _)| *p != pair);
            return Err(RegistryFull {
                capacity: self.capacity,
            });
        }
        // Only records with a pair are kept: the 0 is never used.
        shard
            .open
            .insert_unique(hash, record, |r| r.pair().map_or(0, |p| self.hash(p)));
        Ok(())
    }

    /// The connection on this address pair, if known: the open one, else
    /// the latest one closed recently (see [`CLOSED_PER_SHARD`]).
    pub(crate) fn get(
        &self,
        local: SocketAddr,
        remote: SocketAddr,
    ) -> Option<Arc<ConnectionRecord>> {
        let pair = (local, remote);
        let hash = self.hash(pair);
        let shard = self.shard(pair);
        if let Some(open) = shard.open.find(hash, |r| r.pair() == Some(pair)) {
            return Some(Arc::clone(open));
        }
        shard
            .closed
            .iter()
            .rev()
            .find(|(p, _)| *p == pair)
            .map(|(_, record)| Arc::clone(record))
    }

    /// Forgets a connection known to be closed: it leaves the open ones,
    /// and stays findable among the recently closed (see
    /// [`CLOSED_PER_SHARD`]), in one step under the shard's lock: a
    /// concurrent [`get`](Self::get) finds it in one or the other.
    pub(crate) fn remove(&self, local: SocketAddr, remote: SocketAddr, id: u64) {
        let pair = (local, remote);
        let hash = self.hash(pair);
        let mut shard = self.shard(pair);
        let removed = match shard.open.find_entry(hash, |r| r.pair() == Some(pair)) {
            Ok(entry) if entry.get().id() == id => entry.remove().0,
            _ => return,
        };
        self.len.fetch_sub(1, Ordering::Relaxed);
        if shard.closed.len() >= CLOSED_PER_SHARD {
            shard.closed.pop_front();
        }
        shard.closed.push_back((pair, removed));
    }

    /// The HTTP/2 connection to `host` among the recently closed (see
    /// [`CLOSED_PER_SHARD`]) that its server ended (GOAWAY, or another end
    /// of the server's) with the end reaching this client at or after
    /// `since`, or, undated, with traffic at or after it: hyper-util
    /// resends a request such a connection refused unprocessed. Walks every
    /// shard's closed list (1,024 at most): for the rare call that opened
    /// two connections, never per request.
    pub(crate) fn closed_http2_ended_since(&self, host: &HostKey, since: Instant) -> Option<u64> {
        let ended = |r: &ConnectionRecord| {
            r.http2()
                && r.host.as_ref() == Some(host)
                && match r.server_end_by() {
                    Some(by) => by >= since,
                    None => r.end().is_some_and(|e| e.by_server()) && r.last_activity() >= since,
                }
        };
        self.shards.iter().find_map(|shard| {
            shard
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .closed
                .iter()
                .rev()
                .find(|(_, r)| ended(r))
                .map(|(_, r)| r.id())
        })
    }

    /// Every connection currently remembered.
    pub(crate) fn snapshot(&self) -> Vec<Arc<ConnectionRecord>> {
        let mut all = Vec::with_capacity(self.len());
        for shard in &self.shards {
            all.extend(
                shard
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .open
                    .iter()
                    .cloned(),
            );
        }
        all
    }

    /// Number of connections currently remembered.
    pub(crate) fn len(&self) -> usize {
        self.len.load(Ordering::Relaxed)
    }

    /// Whether the caller should sweep now: the registry is at least three
    /// quarters full and no sweep started in the last second. `true` for
    /// one caller only.
    pub(crate) fn sweep_due(&self, now: Instant) -> bool {
        if self.len() < self.capacity - self.capacity / 4 {
            return false;
        }
        let now_ms = now.saturating_duration_since(self.created).as_millis() as u64;
        let interval = SWEEP_INTERVAL.as_millis() as u64;
        let last = self.last_sweep_ms.load(Ordering::Relaxed);
        // 0: never swept.
        (last == 0 || now_ms.saturating_sub(last) >= interval)
            && self
                .last_sweep_ms
                .compare_exchange(last, now_ms.max(1), Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
    }
}
#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::record::tests::{pair, record};

    #[test]
    fn keeps_every_connection_and_refuses_past_the_cap() {
        let registry = Registry::new(3);
        for port in 1..=3 {
            assert_eq!(registry.insert(record(u64::from(port), port)), Ok(()));
        }
        assert_eq!(
            registry.insert(record(4, 4)),
            Err(RegistryFull { capacity: 3 })
        );
        // Nothing was evicted to make room.
        for port in 1..=3 {
            let (l, r) = pair(port);
            assert_eq!(registry.get(l, r).map(|r| r.id()), Some(u64::from(port)));
        }
        // A port reused after a close replaces its pair without a new slot.
        assert_eq!(registry.insert(record(22, 2)), Ok(()));
        assert_eq!(registry.len(), 3);
        let (l, r) = pair(2);
        assert_eq!(registry.get(l, r).map(|r| r.id()), Some(22));
        // A close frees a slot; a stale close (another id) does not.
        registry.remove(l, r, 2);
        assert_eq!(registry.len(), 3);
        registry.remove(l, r, 22);
        assert_eq!(registry.len(), 2, "closed: no longer counted");
        assert!(registry.snapshot().iter().all(|c| c.id() != 22), "not open");
        assert_eq!(registry.insert(record(4, 4)), Ok(()));
        assert_eq!((registry.len(), registry.snapshot().len()), (3, 3));
    }

    #[test]
    fn a_closed_connection_stays_findable_until_newer_closes_push_it_out() {
        let registry = Registry::new(8);
        let (l, r) = pair(7);
        registry.insert(record(7, 7)).expect("room");
        registry.remove(l, r, 7);
        assert_eq!(registry.len(), 0, "no longer counted against the cap");
        assert!(registry.snapshot().is_empty(), "not open");
        assert_eq!(registry.get(l, r).map(|r| r.id()), Some(7));
        // A new connection on the same pair is the one found.
        registry.insert(record(77, 7)).expect("room");
        assert_eq!(registry.get(l, r).map(|r| r.id()), Some(77));
        registry.remove(l, r, 77);
        assert_eq!(registry.get(l, r).map(|r| r.id()), Some(77));
        // Closes in the same shard push the oldest out (ports 16 apart
        // share a shard).
        for k in 1..=CLOSED_PER_SHARD as u16 {
            let (l2, r2) = pair(7 + 16 * k);
            registry
                .insert(record(1000 + u64::from(k), 7 + 16 * k))
                .expect("room");
            registry.remove(l2, r2, 1000 + u64::from(k));
        }
        assert_eq!(registry.get(l, r).map(|r| r.id()), None);
        let (l2, r2) = pair(7 + 16 * CLOSED_PER_SHARD as u16);
        assert!(registry.get(l2, r2).is_some());
    }

    /// A connection closing while a response on it looks it up (the last
    /// streams of an HTTP/2 connection the server ended) is found, open or
    /// closed, at every moment of its close: each connection is looked up
    /// by another thread all through its removal. Before, the open and the
    /// closed tables had a lock each, and a lookup between the two steps
    /// found neither.
    #[test]
    fn a_connection_is_found_all_through_its_close() {
        use std::sync::atomic::AtomicU64;
        const CLOSES: u64 = 20_000;
        let registry = Registry::new(8);
        // 0: none yet; else the id being closed (its port is `id % 60 + 1`).
        let closing = AtomicU64::new(0);
        // The last id the looker has seen closed (it looks once more after).
        let seen = AtomicU64::new(0);
        let port = |id: u64| u16::try_from(id % 60 + 1).expect("small");
        std::thread::scope(|s| {
            s.spawn(|| {
                for id in 1..=CLOSES {
                    registry.insert(record(id, port(id))).expect("room");
                    closing.store(id, Ordering::Release);
                    let (l, r) = pair(port(id));
                    registry.remove(l, r, id);
                    // In step with the looker: at most one close ahead.
                    while seen.load(Ordering::Acquire) < id {
                        std::hint::spin_loop();
                    }
                }
            });
            let mut missing = Vec::new();
            let mut last = 0;
            while last < CLOSES {
                let id = closing.load(Ordering::Acquire);
                if id == 0 {
                    std::hint::spin_loop();
                    continue;
                }
                let (l, r) = pair(port(id));
                if registry.get(l, r).map(|r| r.id()) != Some(id) {
                    missing.push(id);
                }
                if id != last {
                    last = id;
                    seen.store(id, Ordering::Release);
                }
            }
            assert!(missing.is_empty(), "not found: {missing:?}");
        });
    }

    #[test]
    fn a_refused_connection_does_not_name_the_closed_one_on_its_pair() {
        let registry = Registry::new(1);
        let (l, r) = pair(1);
        registry.insert(record(1, 1)).expect("room");
        registry.remove(l, r, 1);
        registry.insert(record(2, 2)).expect("room");
        assert!(registry.insert(record(3, 1)).is_err());
        assert_eq!(registry.get(l, r).map(|r| r.id()), None);
    }

    #[test]
    fn a_sweep_is_due_from_three_quarters_full_once_per_interval() {
        let registry = Registry::new(8);
        let t0 = Instant::now();
        for port in 1..=5 {
            registry
                .insert(record(u64::from(port), port))
                .expect("room");
        }
        assert!(!registry.sweep_due(t0), "5 of 8: not yet");
        registry.insert(record(6, 6)).expect("room");
        let t1 = t0 + Duration::from_millis(5);
        assert!(registry.sweep_due(t1));
        assert!(!registry.sweep_due(t1 + Duration::from_millis(10)));
        assert!(registry.sweep_due(t1 + SWEEP_INTERVAL));
    }
}
