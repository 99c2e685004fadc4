//! The miss of one connect: its reason, the previous connection it blames,
//! and the slot the triggering request and the new connection share while
//! the kernel is asked.

use std::sync::OnceLock;
use std::time::Duration;

use crate::pool::miss::{ConnectionEnd, MissReason};

/// A connection whose end (or state) caused a miss: the facts named on
/// the request as `http.connection.previous.*`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Previous {
    pub(crate) id: u64,
    /// End of its last response (or its ready time) to the miss.
    pub(crate) idle: Duration,
    pub(crate) request_count: u64,
    /// How it ended; `None` while it is alive (`release_race`).
    pub(crate) end: Option<ConnectionEnd>,
}

/// A miss's reason and the connection that caused it, if one did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Miss {
    pub(crate) reason: MissReason,
    pub(crate) previous: Option<Previous>,
}

impl Miss {
    pub(crate) fn new(reason: MissReason) -> Self {
        Self {
            reason,
            previous: None,
        }
    }

    pub(crate) fn caused_by(reason: MissReason, previous: Previous) -> Self {
        Self {
            reason,
            previous: Some(previous),
        }
    }
}

/// The miss of one connect, shared by the request that triggered it and the
/// connection it made. Filled at once, or when the kernel answers.
#[derive(Debug)]
pub(crate) struct MissSlot {
    miss: OnceLock<Miss>,
    /// Used if the kernel has not answered in time.
    fallback: Miss,
}

impl MissSlot {
    pub(crate) fn decided(miss: Miss) -> Self {
        let slot = Self::pending(miss);
        let _ = slot.miss.set(miss);
        slot
    }

    pub(crate) fn pending(fallback: Miss) -> Self {
        Self {
            miss: OnceLock::new(),
            fallback,
        }
    }

    pub(crate) fn set(&self, miss: Miss) {
        let _ = self.miss.set(miss);
    }

    /// The miss, or the fallback if it is not known yet.
    pub(crate) fn get(&self) -> Miss {
        self.miss.get().copied().unwrap_or(self.fallback)
    }

    /// Whether the miss is known (decided at once, or the kernel answered).
    pub(crate) fn is_settled(&self) -> bool {
        self.miss.get().is_some()
    }
}
