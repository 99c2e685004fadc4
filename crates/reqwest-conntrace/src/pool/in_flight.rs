//! The requests to one host in flight at a miss: how many, and when each
//! started. The starts decide whether an HTTP/2 connection's idle clock in
//! hyper-util may have restarted unseen (row 9 of the miss-reason table,
//! REFERENCE section 14).

use std::time::{Duration, Instant};

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
    /// When hyper-util's idle clock for a shared (HTTP/2) connection last
    /// restarted, at the latest these requests allow: `since`, its latest
    /// checkout a response showed, moved to each request still in flight
    /// that started before the clock (`timeout`) ran out from there. Such
    /// a request may have checked the connection out unseen (its response
    /// has not shown its connection yet), restarting the clock; one that
    /// started later found the connection expired, as the missing request
    /// did, and restarted nothing. Only starts before `before` count: the
    /// missing request's own start, and those of requests started with it,
    /// come after (had the pool handed one of those the connection, the
    /// missing request would have had it too).
    pub(crate) fn http2_clock_restart(
        &self,
        mut since: Instant,
        timeout: Duration,
        before: Instant,
    ) -> Instant {
        while let Some(later) = self
            .starts
            .iter()
            .filter(|s| **s > since && **s < since + timeout && **s < before)
            .max()
        {
            since = *later;
        }
        since
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

    /// A start inside the clock's window moves it, again from there; a
    /// start after the window ran out (a request that found the connection
    /// expired), or not before the miss's own, does not.
    #[test]
    fn an_http2_clock_restarts_at_each_start_inside_its_window() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let t = ms(100);
        let load = InFlight {
            count: 3,
            starts: vec![t0 + ms(60), t0 + ms(150), t0 + ms(400)],
        };
        let end = t0 + ms(500);
        assert_eq!(load.http2_clock_restart(t0, t, end), t0 + ms(150));
        assert_eq!(load.http2_clock_restart(t0 + ms(150), t, end), t0 + ms(150));
        assert_eq!(load.http2_clock_restart(t0 - ms(200), t, end), t0 - ms(200));
        assert_eq!(load.http2_clock_restart(t0, t, t0 + ms(100)), t0 + ms(60));
        assert_eq!(InFlight::from(3).http2_clock_restart(t0, t, end), t0);
    }
}
