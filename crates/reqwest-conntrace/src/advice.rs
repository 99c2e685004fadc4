//! Pool-size advice from Little's law: per host, the peak number of
//! requests in flight against the idle-pool limit the client was built with.
//!
//! With `L` requests in flight on average (Little's law: arrival rate ×
//! time in the client, e.g. 250 req/s × 0.1–0.2 s = 25–50), an idle limit
//! `K < L` means that after every burst `L - K` connections are closed and
//! the next burst pays `L - K` new connections (incident 2). The advice is to
//! keep `pool_max_idle_per_host` at or above the observed peak.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::pool::HostKey;

/// Hosts tracked per handle; when full, the one idle the longest is dropped.
const MAX_HOSTS: usize = 1024;

/// Requests in flight to one host, over the current advice interval.
#[derive(Debug, Clone)]
struct HostLoad {
    in_flight: u64,
    /// Peak of `in_flight` since `interval_start`.
    peak: u64,
    /// Peak of the previous interval (what the gauge reports early in an interval).
    previous_peak: u64,
    /// `pool_max_idle_per_host` of the latest client seen serving the host,
    /// when set through this crate.
    idle_limit: Option<usize>,
    /// `all_busy` misses since `interval_start`.
    forced_misses: u64,
    interval_start: Instant,
    /// When the advice was last logged.
    advised: Option<Instant>,
    last_seen: Instant,
}

/// The advice check of one response, when peak concurrency forced misses.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct AdviceCheck {
    pub(crate) peak_in_flight: u64,
    pub(crate) idle_limit: usize,
    pub(crate) misses_per_second: f64,
    /// Log it now (once per interval per host).
    pub(crate) log_now: bool,
}

/// Pool-size advice for one host (Little's law): the client's idle pool
/// is smaller than the requests in flight to the host, and that forced
/// `all_busy` misses. From [`ConnTrace::pool_advice`](crate::ConnTrace::pool_advice).
///
/// Its `Display` is the advice line this crate also logs (WARN, target
/// `reqwest_conntrace`), e.g. `pool too small for b.internal:443: observed
/// peak in flight 9, idle limit 2, misses per second 31.20; suggested
/// pool_max_idle_per_host >= 9`.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct PoolAdvice {
    /// The host (`server.address`).
    pub server_address: String,
    /// Its port (`server.port`).
    pub server_port: u16,
    /// Most requests in flight to the host at once in the interval.
    pub peak_in_flight: u64,
    /// The client's `pool_max_idle_per_host`.
    pub idle_limit: usize,
    /// `all_busy` misses per second over the interval so far.
    pub misses_per_second: f64,
    /// The `pool_max_idle_per_host` that keeps the peak's connections: the
    /// observed peak in flight.
    pub suggested_max_idle_per_host: u64,
}

impl std::fmt::Display for PoolAdvice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "pool too small for {}:{}: observed peak in flight {}, idle limit {}, misses per second {:.2}; suggested pool_max_idle_per_host >= {}",
            self.server_address,
            self.server_port,
            self.peak_in_flight,
            self.idle_limit,
            self.misses_per_second,
            self.suggested_max_idle_per_host
        )
    }
}

/// A host's gauges (`http.client.pool.peak_in_flight` / `.idle_limit`).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct HostGauges {
    pub(crate) server_address: String,
    pub(crate) server_port: u16,
    pub(crate) peak_in_flight: u64,
    pub(crate) idle_limit: Option<usize>,
}

/// Per-host load of one handle.
#[derive(Debug)]
pub(crate) struct PoolLoad {
    hosts: Mutex<HashMap<HostKey, HostLoad>>,
    interval: Duration,
}

impl PoolLoad {
    pub(crate) fn new(interval: Duration) -> Self {
        Self {
            hosts: Mutex::new(HashMap::new()),
            interval: interval.max(Duration::from_millis(1)),
        }
    }

    fn hosts(&self) -> MutexGuard<'_, HashMap<HostKey, HostLoad>> {
        self.hosts.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn roll(&self, load: &mut HostLoad, now: Instant) {
        if now.saturating_duration_since(load.interval_start) >= self.interval {
            load.previous_peak = load.peak;
            load.peak = load.in_flight;
            load.forced_misses = 0;
            load.interval_start = now;
        }
    }

    /// A request to `host` started.
    pub(crate) fn request_started(&self, host: &HostKey, now: Instant) {
        let mut hosts = self.hosts();
        if !hosts.contains_key(host)
            && hosts.len() >= MAX_HOSTS
            && let Some(oldest) = hosts
                .iter()
                .filter(|(_, l)| l.in_flight == 0)
                .min_by_key(|(_, l)| l.last_seen)
                .map(|(k, _)| k.clone())
        {
            hosts.remove(&oldest);
        }
        // Cloning the key only for a host not seen yet.
        if !hosts.contains_key(host) {
            hosts.insert(
                host.clone(),
                HostLoad {
                    in_flight: 0,
                    peak: 0,
                    previous_peak: 0,
                    idle_limit: None,
                    forced_misses: 0,
                    interval_start: now,
                    advised: None,
                    last_seen: now,
                },
            );
        }
        let Some(load) = hosts.get_mut(host) else {
            return;
        };
        self.roll(load, now);
        load.in_flight += 1;
        load.peak = load.peak.max(load.in_flight);
        load.last_seen = now;
    }

    /// A request to `host` ended.
    pub(crate) fn request_ended(&self, host: &HostKey) {
        if let Some(load) = self.hosts().get_mut(host) {
            load.in_flight = load.in_flight.saturating_sub(1);
        }
    }

    /// Requests to `host` in flight now (started, not ended).
    pub(crate) fn in_flight(&self, host: &HostKey) -> u64 {
        self.hosts().get(host).map_or(0, |load| load.in_flight)
    }

    /// A response from `host` was attributed; `all_busy` says whether it
    /// missed because every connection was busy. Returns the advice when the
    /// peak in flight this interval exceeds the idle limit and such misses
    /// happened.
    pub(crate) fn on_response(
        &self,
        host: &HostKey,
        idle_limit: Option<usize>,
        all_busy: bool,
        now: Instant,
    ) -> Option<AdviceCheck> {
        let mut hosts = self.hosts();
        let load = hosts.get_mut(host)?;
        self.roll(load, now);
        if idle_limit.is_some() {
            load.idle_limit = idle_limit;
        }
        if all_busy {
            load.forced_misses += 1;
        }
        // A limit of 0 is a deliberate choice not to pool: no advice.
        let limit = load.idle_limit.filter(|l| *l > 0)?;
        if !all_busy || load.peak <= limit as u64 {
            return None;
        }
        let log_now = load
            .advised
            .is_none_or(|t| now.saturating_duration_since(t) >= self.interval);
        if log_now {
            load.advised = Some(now);
        }
        let elapsed = now
            .saturating_duration_since(load.interval_start)
            .as_secs_f64()
            .max(1.0);
        Some(AdviceCheck {
            peak_in_flight: load.peak,
            idle_limit: limit,
            misses_per_second: load.forced_misses as f64 / elapsed,
            log_now,
        })
    }

    /// The advice for every host whose peak in flight this interval
    /// exceeded its idle limit with forced misses.
    pub(crate) fn advice(&self, now: Instant) -> Vec<PoolAdvice> {
        let mut hosts = self.hosts();
        hosts
            .iter_mut()
            .filter_map(|(key, load)| {
                self.roll(load, now);
                let limit = load.idle_limit.filter(|l| *l > 0)?;
                (load.forced_misses > 0 && load.peak > limit as u64).then(|| {
                    let elapsed = now
                        .saturating_duration_since(load.interval_start)
                        .as_secs_f64()
                        .max(1.0);
                    PoolAdvice {
                        server_address: key.host.clone(),
                        server_port: key.port,
                        peak_in_flight: load.peak,
                        idle_limit: limit,
                        misses_per_second: load.forced_misses as f64 / elapsed,
                        suggested_max_idle_per_host: load.peak,
                    }
                })
            })
            .collect()
    }

    /// Gauges of every host: the larger of this and the previous interval's peak.
    pub(crate) fn gauges(&self, now: Instant) -> Vec<HostGauges> {
        let mut hosts = self.hosts();
        hosts
            .iter_mut()
            .map(|(key, load)| {
                self.roll(load, now);
                HostGauges {
                    server_address: key.host.clone(),
                    server_port: key.port,
                    peak_in_flight: load.peak.max(load.previous_peak),
                    idle_limit: load.idle_limit,
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn advice_needs_forced_misses_above_the_limit_and_logs_once_per_interval() {
        let load = PoolLoad::new(Duration::from_secs(60));
        let t0 = Instant::now();
        let b = HostKey {
            scheme: "https".to_owned(),
            host: "b".to_owned(),
            port: 443,
        };
        for _ in 0..5 {
            load.request_started(&b, t0);
        }
        // No pooling on purpose, a hit, or a limit at or above the peak: no advice.
        assert_eq!(load.on_response(&b, Some(0), true, t0), None);
        assert_eq!(load.on_response(&b, Some(2), false, t0), None);
        assert_eq!(load.on_response(&b, Some(5), true, t0), None);
        let first = load
            .on_response(&b, Some(2), true, t0)
            .expect("peak 5 > limit 2 with a forced miss");
        assert_eq!(
            (first.peak_in_flight, first.idle_limit, first.log_now),
            (5, 2, true)
        );
        let second = load
            .on_response(&b, None, true, t0 + Duration::from_secs(1))
            .expect("still advised");
        assert!(!second.log_now, "logged once per interval");
        let gauges = load.gauges(t0);
        assert_eq!(gauges[0].peak_in_flight, 5);
        assert_eq!(gauges[0].idle_limit, Some(2));
    }
}
