//! When hyper-util may have put an HTTP/1.1 connection back in its pool,
//! as the response body's reads show: the start of its idle clock.

use std::time::Instant;

/// The earliest instant hyper may have finished reading a response, from
/// how the caller read its body. hyper-util puts an HTTP/1.1 connection
/// back in its pool, and starts its idle clock, as soon as hyper has read
/// the response to its end, not when the caller has: hyper's HTTP/1
/// dispatcher hands the body over in frames through a channel holding one
/// frame (hyper 1.x `body::incoming`, `mpsc::channel(0)` with one sender),
/// so it sends the last data frame once the caller has taken the one
/// before it, and goes idle once it has read the body's end. A small body
/// that came with the headers is read at once, however late the caller
/// reads it.
///
/// So hyper had read the response no earlier than the latest of:
/// - the response's headers reaching the caller;
/// - the caller taking a data frame that another one followed (hyper could
///   send that one only then);
/// - the caller receiving a data frame, or the body's end, that it had
///   waited for (its poll returned `Pending` since the frame before): it
///   arrived then. A caller that reads as data comes dates the put-back at
///   its own read; one that reads late, without waiting, leaves it as early
///   as the frames before allow, even when the body's end arrived later
///   while it was not reading (which the reads cannot show).
///
/// No later than the body's end as the caller read it.
#[derive(Debug, Default)]
pub(crate) struct PutBackBound {
    /// The latest instant hyper was seen still owing the body's end.
    owed_at: Option<Instant>,
    /// When the caller took the latest data frame.
    last_data_at: Option<Instant>,
    /// The body's poll returned `Pending` since the latest data frame (or
    /// the headers).
    waited: bool,
}

impl PutBackBound {
    /// The caller took a data frame at `now`: the frame before it (if any)
    /// was taken before hyper could send this one, and one waited for
    /// arrived now.
    pub(crate) fn on_data(&mut self, now: Instant) {
        if self.waited {
            self.owe(now);
        } else if let Some(previous) = self.last_data_at {
            self.owe(previous);
        }
        self.waited = false;
        self.last_data_at = Some(now);
    }

    /// The body's poll returned `Pending`: what comes next arrives then.
    pub(crate) fn on_pending(&mut self) {
        self.waited = true;
    }

    fn owe(&mut self, at: Instant) {
        self.owed_at = Some(self.owed_at.map_or(at, |owed| owed.max(at)));
    }

    /// The earliest instant hyper may have finished reading the response
    /// whose headers reached the caller at `headers_at` and whose body's
    /// end the caller read at `end` (the end waited for: `end`).
    pub(crate) fn earliest(&self, headers_at: Option<Instant>, end: Instant) -> Instant {
        if self.waited {
            return end;
        }
        headers_at
            .into_iter()
            .chain(self.owed_at)
            .max()
            .unwrap_or(end)
            .min(end)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn at(t0: Instant, ms: u64) -> Instant {
        t0 + Duration::from_millis(ms)
    }

    /// A small body read 160 ms after its headers, in one frame, never
    /// waited for: hyper may have finished with the headers.
    #[test]
    fn a_body_read_late_in_one_frame_may_be_done_at_the_headers() {
        let t0 = Instant::now();
        let mut bound = PutBackBound::default();
        bound.on_data(at(t0, 160));
        assert_eq!(bound.earliest(Some(t0), at(t0, 160)), t0);
    }

    /// Frames: hyper sends the last once the caller has taken the one
    /// before; a frame or an end the caller waited for arrived when it got
    /// it (a prompt reader's put-back is its own read).
    #[test]
    fn the_frame_before_the_last_and_any_wait_bound_it() {
        let t0 = Instant::now();
        let mut bound = PutBackBound::default();
        bound.on_data(at(t0, 10));
        bound.on_data(at(t0, 50));
        bound.on_data(at(t0, 200));
        assert_eq!(bound.earliest(Some(t0), at(t0, 200)), at(t0, 50));
        // The last frame waited for: it arrived when taken.
        let mut bound = PutBackBound::default();
        bound.on_data(at(t0, 10));
        bound.on_pending();
        bound.on_data(at(t0, 150));
        assert_eq!(bound.earliest(Some(t0), at(t0, 150)), at(t0, 150));
        // A wait for an earlier frame bounds it there, not later.
        let mut bound = PutBackBound::default();
        bound.on_pending();
        bound.on_data(at(t0, 40));
        bound.on_data(at(t0, 300));
        assert_eq!(bound.earliest(Some(t0), at(t0, 300)), at(t0, 40));
        // The end (a chunked body's) waited for: the end.
        bound.on_pending();
        assert_eq!(bound.earliest(Some(t0), at(t0, 320)), at(t0, 320));
        // Never after the end the caller read.
        let mut bound = PutBackBound::default();
        bound.on_data(at(t0, 10));
        bound.on_data(at(t0, 200));
        assert_eq!(bound.earliest(Some(at(t0, 150)), at(t0, 100)), at(t0, 100));
        // No headers seen, nothing owed: the end.
        assert_eq!(PutBackBound::default().earliest(None, at(t0, 7)), at(t0, 7));
    }
}
