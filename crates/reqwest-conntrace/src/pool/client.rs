//! What this crate knows about one instrumented client instance: its
//! identity within the handle and the pool settings it was built with.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// reqwest's default pool idle timeout (`ClientBuilder::pool_idle_timeout`,
/// reqwest 0.13: 90 s).
pub(crate) const REQWEST_DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(90);

/// A client whose first request to a host comes less than this long after
/// it was built counts as a new client
/// (miss reason `new_client`) when an earlier client of the handle had
/// connected to that host.
pub(crate) const NEW_CLIENT_WINDOW: Duration = Duration::from_secs(10);

/// Process-wide client ids: a later client always has a larger id.
static NEXT_CLIENT_ID: AtomicU64 = AtomicU64::new(1);

/// One client instance, as its connector layer knows it.
#[derive(Debug)]
pub(crate) struct ClientState {
    pub(crate) id: u64,
    pub(crate) built_at: Instant,
    /// The pool idle timeout the client was built with (`None`: never expires).
    pub(crate) idle_timeout: Option<Duration>,
    /// `pool_max_idle_per_host`, when set through this crate (reqwest's
    /// default is unlimited).
    pub(crate) max_idle_per_host: Option<usize>,
    /// The keep-alive mismatch warning was logged for this client.
    keep_alive_warned: AtomicBool,
}

impl ClientState {
    pub(crate) fn new(idle_timeout: Option<Duration>, max_idle_per_host: Option<usize>) -> Self {
        Self {
            id: NEXT_CLIENT_ID.fetch_add(1, Ordering::Relaxed),
            built_at: Instant::now(),
            idle_timeout,
            max_idle_per_host,
            keep_alive_warned: AtomicBool::new(false),
        }
    }

    /// `true` the first time only: log the keep-alive mismatch warning once
    /// per client.
    pub(crate) fn first_keep_alive_warning(&self) -> bool {
        !self.keep_alive_warned.swap(true, Ordering::Relaxed)
    }

    /// A client with reqwest's default pool settings and no known proxy.
    pub(crate) fn reqwest_defaults() -> Self {
        Self::new(Some(REQWEST_DEFAULT_IDLE_TIMEOUT), None)
    }
}
