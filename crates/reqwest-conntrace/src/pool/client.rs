//! What this crate knows about one instrumented client instance: its
//! identity within the handle and the pool settings it was built with.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::pool::inferred::{InferredLimits, LimitSource};

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
    /// The pool idle timeout the client was built with (`None`: never
    /// expires, or not known: see `idle_timeout_known`).
    pub(crate) idle_timeout: Option<Duration>,
    /// `pool_idle_timeout` came through this crate's builder. When it did
    /// not, reqwest's builder may have set it, unreadably: no decision
    /// assumes reqwest's default.
    pub(crate) idle_timeout_known: bool,
    /// `pool_max_idle_per_host`, when set through this crate (`None`:
    /// unlimited, or not known: see `max_idle_known`).
    pub(crate) max_idle_per_host: Option<usize>,
    /// `pool_max_idle_per_host` came through this crate's builder.
    pub(crate) max_idle_known: bool,
    /// The limits its pool has shown, for those not set through this
    /// crate's builder.
    pub(crate) inferred: InferredLimits,
    /// The client adds `Connection: close` to every request that has no
    /// `Connection` header of its own (reqwest's
    /// `ClientBuilder::default_headers`, as its `Debug` output shows it to
    /// this crate's builder; `false` for a client built elsewhere).
    pub(crate) default_connection_close: bool,
    /// The keep-alive mismatch warning was logged for this client.
    keep_alive_warned: AtomicBool,
}

impl ClientState {
    /// `None`: the setting did not come through this crate's builder
    /// (unknown); `Some(v)`: set to `v`.
    pub(crate) fn new(
        idle_timeout: Option<Option<Duration>>,
        max_idle_per_host: Option<usize>,
    ) -> Self {
        Self {
            id: NEXT_CLIENT_ID.fetch_add(1, Ordering::Relaxed),
            built_at: Instant::now(),
            idle_timeout: idle_timeout.flatten(),
            idle_timeout_known: idle_timeout.is_some(),
            max_idle_per_host,
            max_idle_known: max_idle_per_host.is_some(),
            inferred: InferredLimits::default(),
            default_connection_close: false,
            keep_alive_warned: AtomicBool::new(false),
        }
    }

    /// The same client, adding `Connection: close` to every request that
    /// has no `Connection` header of its own when `close` (see
    /// [`default_connection_close`](Self::default_connection_close)).
    pub(crate) fn with_default_connection_close(mut self, close: bool) -> Self {
        self.default_connection_close = close;
        self
    }

    /// `true` the first time only: log the keep-alive mismatch warning once
    /// per client.
    pub(crate) fn first_keep_alive_warning(&self) -> bool {
        !self.keep_alive_warned.swap(true, Ordering::Relaxed)
    }

    /// Both pool limits came through this crate's builder.
    pub(crate) fn limits_known(&self) -> bool {
        self.idle_timeout_known && self.max_idle_known
    }

    /// `pool_max_idle_per_host` and where it came from: set through this
    /// crate's builder, or inferred so far; `None` when unlimited or
    /// neither.
    pub(crate) fn idle_limit(&self) -> Option<(usize, LimitSource)> {
        if self.max_idle_known {
            self.max_idle_per_host.map(|n| (n, LimitSource::Configured))
        } else {
            self.inferred
                .idle_limit()
                .map(|n| (n, LimitSource::Inferred))
        }
    }

    /// A client built outside this crate's builder (the connector layer
    /// added to reqwest's builder): its pool settings are unknown.
    pub(crate) fn unknown_settings() -> Self {
        Self::new(None, None)
    }
}
