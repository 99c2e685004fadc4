//! The requests to one host in flight at a miss: how many, and when each
//! started. The starts decide whether an HTTP/2 connection's idle clock in
//! hyper-util may have restarted unseen (row 9 of the miss-reason table,
//! REFERENCE section 14).

use std::time::Instant;

/// Requests to a host in flight at one moment (started, not ended), the
/// missing request's own included.
#[derive(Debug, Clone, Default)]
pub(crate) struct InFlight {
    /// How many.
    pub(crate) count: u64,
    /// When each started (the middleware's start of the request), in no
    /// order; empty when unknown (a model test giving only the count).
    pub(crate) starts: Vec<Instant>,
}

impl InFlight {
    /// Whether one of them started strictly between `after` and `before`.
    pub(crate) fn any_started_between(&self, after: Instant, before: Instant) -> bool {
        self.starts.iter().any(|s| *s > after && *s < before)
    }
}

impl From<u64> for InFlight {
    fn from(count: u64) -> Self {
        Self {
            count,
            starts: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// Only starts strictly inside the window count.
    #[test]
    fn a_start_counts_only_strictly_inside_the_window() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let load = InFlight {
            count: 2,
            starts: vec![t0, t0 + ms(100)],
        };
        assert!(!load.any_started_between(t0, t0 + ms(100)));
        assert!(load.any_started_between(t0, t0 + ms(101)));
        assert!(load.any_started_between(t0 - ms(1), t0 + ms(1)));
        assert!(!InFlight::from(3).any_started_between(t0 - ms(9), t0 + ms(9)));
    }
}
