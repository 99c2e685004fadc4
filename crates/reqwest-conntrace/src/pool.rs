//! Each client's connections per host, as far as this handle saw them: what
//! a pool miss's reason is read from when reqwest calls the connector.
//!
//! hyper-util's pool is invisible from outside, so this is a model of it,
//! kept true by what the handle observes: connections established (connector
//! layer), taken and released by responses (middleware and body wrapper),
//! discarded (HTTP/1.1 body dropped early), over the idle limit at release
//! (`pool_max_idle_per_host`), idle past the pool's idle timeout, and, through
//! the kernel's view (sock_diag), closed by the server.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Instant;

use opentelemetry::KeyValue;

use crate::client::{ClientState, NEW_CLIENT_WINDOW};
use crate::miss::MissReason;
use crate::registry::ConnectionRecord;
use crate::semconv;

/// A pool key as hyper-util keys its pool: scheme, host, port.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct HostKey {
    pub(crate) scheme: String,
    pub(crate) host: String,
    pub(crate) port: u16,
}

impl HostKey {
    /// `server.address`, `server.port`, `url.scheme`.
    pub(crate) fn attributes(&self) -> Vec<KeyValue> {
        vec![
            KeyValue::new(semconv::SERVER_ADDRESS, self.host.clone()),
            KeyValue::new(semconv::SERVER_PORT, i64::from(self.port)),
            KeyValue::new(semconv::URL_SCHEME, self.scheme.clone()),
        ]
    }
}

/// Connections remembered per host (most recent first out when full).
const CONNECTIONS_PER_HOST: usize = 64;
/// Hosts remembered per handle; the one unused the longest is forgotten.
const MAX_HOSTS: usize = 1024;

#[derive(Debug)]
struct HostHistory {
    connections: VecDeque<Arc<ConnectionRecord>>,
    last_used: Instant,
}

/// Every client's connections by host.
#[derive(Debug, Default)]
pub(crate) struct PoolHistory {
    hosts: Mutex<HashMap<HostKey, HostHistory>>,
}

/// What the history says about a pool miss.
#[derive(Debug, Clone)]
pub(crate) enum MissVerdict {
    /// The reason is known from the history alone.
    Decided(MissReason),
    /// The most recent idle connection should still be in the pool: ask the
    /// kernel whether the server closed it; if not, `otherwise`.
    AskKernel {
        local: SocketAddr,
        remote: SocketAddr,
        candidate: Arc<ConnectionRecord>,
        otherwise: MissReason,
    },
}

impl PoolHistory {
    fn hosts(&self) -> MutexGuard<'_, HashMap<HostKey, HostHistory>> {
        self.hosts.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Remembers a new connection to `host`.
    pub(crate) fn record_connection(&self, host: HostKey, record: Arc<ConnectionRecord>) {
        let now = Instant::now();
        let mut hosts = self.hosts();
        if hosts.len() >= MAX_HOSTS
            && !hosts.contains_key(&host)
            && let Some(oldest) = hosts
                .iter()
                .min_by_key(|(_, h)| h.last_used)
                .map(|(k, _)| k.clone())
        {
            hosts.remove(&oldest);
        }
        let history = hosts.entry(host).or_insert_with(|| HostHistory {
            connections: VecDeque::new(),
            last_used: now,
        });
        history.last_used = now;
        if history.connections.len() >= CONNECTIONS_PER_HOST {
            history.connections.pop_front();
        }
        history.connections.push_back(record);
    }

    /// Why `client` found no idle connection to `host` at `now` (called when
    /// reqwest calls the connector: hyper-util's pool checkout just failed).
    pub(crate) fn classify_miss(
        &self,
        host: &HostKey,
        client: &ClientState,
        now: Instant,
    ) -> MissVerdict {
        let hosts = self.hosts();
        let Some(history) = hosts.get(host) else {
            return MissVerdict::Decided(MissReason::Cold);
        };
        let mine: Vec<&Arc<ConnectionRecord>> = history
            .connections
            .iter()
            .filter(|r| r.client.id == client.id)
            .collect();
        if mine.is_empty() {
            let earlier_client = history.connections.iter().any(|r| r.client.id < client.id);
            let young = now.saturating_duration_since(client.built_at) < NEW_CLIENT_WINDOW;
            return MissVerdict::Decided(if earlier_client && young {
                MissReason::NewClient
            } else {
                MissReason::Cold
            });
        }
        // hyper-util hands out the most recently released idle connection
        // first: that is the one this request would have had.
        let Some(candidate) = mine
            .iter()
            .filter(|r| r.http2() || r.in_use() == 0)
            .max_by_key(|r| r.last_activity())
        else {
            return MissVerdict::Decided(MissReason::AllBusy);
        };
        if candidate.is_discarded() {
            return MissVerdict::Decided(MissReason::Discarded);
        }
        if candidate.is_peer_closed() {
            return MissVerdict::Decided(MissReason::ClosedByPeer);
        }
        if candidate.is_over_idle_limit() {
            return MissVerdict::Decided(MissReason::AllBusy);
        }
        if client
            .idle_timeout
            .is_some_and(|t| now.saturating_duration_since(candidate.last_activity()) >= t)
        {
            return MissVerdict::Decided(MissReason::IdleExpired);
        }
        match (candidate.setup.local_addr, candidate.setup.peer_addr) {
            (Some(local), Some(remote)) => MissVerdict::AskKernel {
                local,
                remote,
                candidate: Arc::clone(candidate),
                otherwise: MissReason::AllBusy,
            },
            _ => MissVerdict::Decided(MissReason::AllBusy),
        }
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
    pub(crate) fn on_released(
        &self,
        host: &HostKey,
        record: &ConnectionRecord,
        now: Instant,
    ) -> bool {
        let Some(limit) = record.client.max_idle_per_host else {
            return false;
        };
        let hosts = self.hosts();
        let Some(history) = hosts.get(host) else {
            return false;
        };
        let idle = history
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
            .count();
        if idle >= limit {
            record.mark_over_idle_limit();
            return true;
        }
        false
    }
}

/// The miss reason of one connect, shared by the request that triggered it
/// and the connection it made. Filled at once, or when the kernel answers.
#[derive(Debug)]
pub(crate) struct MissSlot {
    reason: OnceLock<MissReason>,
    /// Used if the kernel has not answered in time.
    fallback: MissReason,
}

impl MissSlot {
    pub(crate) fn decided(reason: MissReason) -> Self {
        let slot = Self::pending(reason);
        let _ = slot.reason.set(reason);
        slot
    }

    pub(crate) fn pending(fallback: MissReason) -> Self {
        Self {
            reason: OnceLock::new(),
            fallback,
        }
    }

    pub(crate) fn set(&self, reason: MissReason) {
        let _ = self.reason.set(reason);
    }

    /// The reason, or the fallback if it is not known yet.
    pub(crate) fn get(&self) -> MissReason {
        self.reason.get().copied().unwrap_or(self.fallback)
    }

    /// Whether the reason is known (decided at once, or the kernel answered).
    pub(crate) fn is_settled(&self) -> bool {
        self.reason.get().is_some()
    }
}
