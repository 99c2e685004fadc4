//! Monotonic instants mapped to wall-clock timestamps for span start/end times.

use std::time::{Duration, Instant, SystemTime};

/// Anchors [`Instant`] (monotonic, used for every duration) to
/// [`SystemTime`] (what OpenTelemetry timestamps carry), so that spans
/// recorded after the fact keep exact, mutually consistent boundaries.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Clock {
    mono: Instant,
    wall: SystemTime,
}

impl Clock {
    pub(crate) fn new() -> Self {
        Self {
            mono: Instant::now(),
            wall: SystemTime::now(),
        }
    }

    /// Wall-clock time of a monotonic instant.
    pub(crate) fn wall(&self, t: Instant) -> SystemTime {
        match t.checked_duration_since(self.mono) {
            Some(after) => self.wall + after,
            None => self.wall - self.mono.duration_since(t),
        }
    }
}

/// Seconds as `f64`, the unit of every duration attribute we emit.
pub(crate) fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}
