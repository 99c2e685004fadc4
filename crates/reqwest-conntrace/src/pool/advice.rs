//! Pool-size advice from Little's law: per host, the peak number of
//! requests in flight against the idle-pool limit the client was built with.
//!
//! With `L` requests in flight on average (Little's law: arrival rate ×
//! time in the client, e.g. 250 req/s × 0.1–0.2 s = 25–50), an idle limit
//! `K < L` means that after every burst `L - K` connections are closed and
//! the next burst pays `L - K` new connections (incident 2). The advice is to
//! keep `pool_max_idle_per_host` at or above the observed peak.
//!
//! One definition per number, wherever it is reported (the advice event on
//! a request span, [`ConnTrace::pool_advice`](crate::ConnTrace::pool_advice),
//! [`ConnTrace::peak_in_flight`](crate::ConnTrace::peak_in_flight), the
//! `http.client.pool.peak_in_flight` gauge, the WARN line):
//! - **peak in flight**: the most requests to the host in flight at once
//!   (from the middleware's start of the request to the end of its body)
//!   since the current advice interval started;
//! - **misses per second**: the host's `all_busy` misses since the interval
//!   started, divided by the seconds since it started (at least 1 s).
//!
//! Each is read at the moment it is reported. The WARN line is logged once
//! per interval and host, when the interval closes (on the first request,
//! response, metrics collection or `pool_advice()` call after its end), so
//! it carries the whole interval's numbers: the values `pool_advice()`
//! would have returned at that moment.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::export::metrics::HostGauges;
use crate::pool::host::{HostKey, HostMap};
use crate::pool::in_flight::InFlight;
use crate::pool::inferred::LimitSource;
use crate::semconv;

/// Default cap on the hosts whose load one handle tracks at once: 1,024
/// (`ConnTraceBuilder::pool_advice_hosts`).
pub const DEFAULT_POOL_ADVICE_HOSTS: usize = 1024;

/// Requests in flight to one host, over the current advice interval.
#[derive(Debug, Clone)]
struct HostLoad {
    in_flight: u64,
    /// When each request in flight started (`in_flight` of them).
    starts: Vec<Instant>,
    /// Peak of `in_flight` since `interval_start`.
    peak: u64,
    /// `pool_max_idle_per_host` of the latest client seen serving the host,
    /// when set through this crate or inferred, and which.
    idle_limit: Option<(usize, LimitSource)>,
    /// `all_busy` misses since `interval_start`.
    forced_misses: u64,
    interval_start: Instant,
    last_seen: Instant,
}

impl HostLoad {
    /// The advice as of `now`, when the peak exceeded the idle limit and
    /// forced misses happened.
    fn advice(&self, key: &HostKey, now: Instant) -> Option<PoolAdvice> {
        // A limit of 0 is a deliberate choice not to pool: no advice.
        let (limit, source) = self.idle_limit.filter(|(l, _)| *l > 0)?;
        (self.forced_misses > 0 && self.peak > limit as u64).then(|| {
            let elapsed = now
                .saturating_duration_since(self.interval_start)
                .as_secs_f64()
                .max(1.0);
            PoolAdvice {
                server_address: key.host.to_string(),
                server_port: key.port,
                peak_in_flight: self.peak,
                idle_limit: limit,
                idle_limit_inferred: source == LimitSource::Inferred,
                misses_per_second: self.forced_misses as f64 / elapsed,
                suggested_max_idle_per_host: self.peak,
            }
        })
    }
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
    /// The client's `pool_max_idle_per_host`: set through
    /// [`InstrumentedClientBuilder::pool_max_idle_per_host`](crate::InstrumentedClientBuilder::pool_max_idle_per_host),
    /// or, when it was set on reqwest's builder, inferred from the
    /// connections the pool closed at release (see `idle_limit_inferred`).
    pub idle_limit: usize,
    /// `idle_limit` was inferred (`http.connection.pool.limits = inferred`):
    /// the fewest idle connections the client's pool held when it was seen
    /// closing a released one, so the limit is at most this.
    pub idle_limit_inferred: bool,
    /// `all_busy` misses per second over the interval so far.
    pub misses_per_second: f64,
    /// The `pool_max_idle_per_host` that keeps the peak's connections: the
    /// observed peak in flight.
    pub suggested_max_idle_per_host: u64,
}

impl PoolAdvice {
    /// Where `idle_limit` came from: the `http.connection.pool.limits`
    /// value, `configured` or `inferred`.
    pub fn idle_limit_source(&self) -> &'static str {
        if self.idle_limit_inferred {
            semconv::POOL_LIMITS_INFERRED
        } else {
            semconv::POOL_LIMITS_CONFIGURED
        }
    }
}

impl std::fmt::Display for PoolAdvice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "pool too small for {}:{}: observed peak in flight {}, idle limit {}{}, misses per second {:.2}; suggested pool_max_idle_per_host >= {}",
            self.server_address,
            self.server_port,
            self.peak_in_flight,
            self.idle_limit,
            if self.idle_limit_inferred {
                " (inferred)"
            } else {
                ""
            },
            self.misses_per_second,
            self.suggested_max_idle_per_host
        )
    }
}

/// Per-host load of one handle. Bounded: a host is forgotten only once its
/// load says nothing any more (nothing in flight, not seen for two advice
/// intervals, so both peaks the gauges report have rolled away); when the
/// cap is reached with every host still informative, a new host is not
/// tracked (its requests say so) and one warning names the setting.
#[derive(Debug)]
pub(crate) struct PoolLoad {
    hosts: Mutex<HostMap<HostLoad>>,
    interval: Duration,
    max_hosts: usize,
    /// The cap was reached and logged.
    full_logged: AtomicBool,
}

impl PoolLoad {
    pub(crate) fn new(interval: Duration, max_hosts: usize) -> Self {
        Self {
            hosts: Mutex::new(HostMap::default()),
            interval: interval.max(Duration::from_millis(1)),
            max_hosts: max_hosts.max(1),
            full_logged: AtomicBool::new(false),
        }
    }

    /// Whether `load` no longer tells anything at `now`.
    fn is_stale(&self, load: &HostLoad, now: Instant) -> bool {
        load.in_flight == 0 && now.saturating_duration_since(load.last_seen) >= 2 * self.interval
    }

    fn hosts(&self) -> MutexGuard<'_, HostMap<HostLoad>> {
        self.hosts.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts a new interval when the current one is over; returns the
    /// closed interval's advice, to be logged (outside the lock).
    fn roll(&self, key: &HostKey, load: &mut HostLoad, now: Instant) -> Option<PoolAdvice> {
        if now.saturating_duration_since(load.interval_start) < self.interval {
            return None;
        }
        let closed = load.advice(key, now);
        load.peak = load.in_flight;
        load.forced_misses = 0;
        load.interval_start = now;
        closed
    }

    /// A request to `host` started. `false` when the host is not tracked
    /// (the table is full of hosts whose load still counts).
    pub(crate) fn request_started(&self, host: &HostKey, now: Instant) -> bool {
        let (tracked, closed) = self.request_started_locked(host, now);
        log(closed);
        tracked
    }

    fn request_started_locked(&self, host: &HostKey, now: Instant) -> (bool, Option<PoolAdvice>) {
        let mut hosts = self.hosts();
        // A host already tracked: one lookup (every request takes this lock).
        if let Some(load) = hosts.get_mut(host) {
            return (true, self.started(host, load, now));
        }
        if hosts.len() >= self.max_hosts {
            let stale = hosts
                .iter()
                .find(|(_, l)| self.is_stale(l, now))
                .map(|(k, _)| k.clone());
            match stale {
                Some(stale) => {
                    hosts.remove(&stale);
                }
                None => {
                    if !self.full_logged.swap(true, Ordering::Relaxed) {
                        tracing::warn!(
                            target: "reqwest_conntrace",
                            "pool advice tracks {} hosts, all active in the last two advice intervals; requests to further hosts are untracked ({}={}); raise ConnTraceBuilder::pool_advice_hosts",
                            self.max_hosts,
                            semconv::HTTP_CONNECTION_UNTRACKED,
                            semconv::UNTRACKED_POOL_ADVICE,
                        );
                    }
                    return (false, None);
                }
            }
        }
        // Cloning the key only for a host not seen yet.
        let load = hosts.entry(host.clone()).or_insert(HostLoad {
            in_flight: 0,
            starts: Vec::new(),
            peak: 0,
            idle_limit: None,
            forced_misses: 0,
            interval_start: now,
            last_seen: now,
        });
        (true, self.started(host, load, now))
    }

    /// Counts a request started at `now` in `load`, the load of `host`.
    fn started(&self, host: &HostKey, load: &mut HostLoad, now: Instant) -> Option<PoolAdvice> {
        let closed = self.roll(host, load, now);
        load.in_flight += 1;
        load.starts.push(now);
        load.peak = load.peak.max(load.in_flight);
        load.last_seen = now;
        closed
    }

    /// A request to `host` that started at `started` ended.
    pub(crate) fn request_ended(&self, host: &HostKey, started: Instant) {
        if let Some(load) = self.hosts().get_mut(host) {
            load.in_flight = load.in_flight.saturating_sub(1);
            if let Some(i) = load.starts.iter().position(|s| *s == started) {
                load.starts.swap_remove(i);
            }
        }
    }

    /// The requests to `host` in flight now, with their starts.
    pub(crate) fn in_flight_with_starts(&self, host: &HostKey) -> InFlight {
        self.hosts()
            .get(host)
            .map_or_else(InFlight::default, |load| InFlight {
                count: load.in_flight,
                starts: load.starts.clone(),
            })
    }

    /// Requests to `host` in flight now (started, not ended).
    pub(crate) fn in_flight(&self, host: &HostKey) -> u64 {
        self.hosts().get(host).map_or(0, |load| load.in_flight)
    }

    /// A response from `host` was attributed; `all_busy` says whether it
    /// missed because every connection was busy. Returns the host's advice
    /// as of now when this response was such a miss and the pool is too
    /// small (for the advice event on its span).
    pub(crate) fn on_response(
        &self,
        host: &HostKey,
        idle_limit: Option<(usize, LimitSource)>,
        all_busy: bool,
        now: Instant,
    ) -> Option<PoolAdvice> {
        let (closed, advice) = {
            let mut hosts = self.hosts();
            let load = hosts.get_mut(host)?;
            let closed = self.roll(host, load, now);
            if idle_limit.is_some() {
                load.idle_limit = idle_limit;
            }
            if all_busy {
                load.forced_misses += 1;
            }
            (closed, all_busy.then(|| load.advice(host, now)).flatten())
        };
        log(closed);
        advice
    }

    /// The advice as of `now` for every host whose peak in flight this
    /// interval exceeded its idle limit with forced misses.
    pub(crate) fn advice(&self, now: Instant) -> Vec<PoolAdvice> {
        let (closed, advice): (Vec<_>, Vec<_>) = {
            let mut hosts = self.hosts();
            hosts
                .iter_mut()
                .map(|(key, load)| (self.roll(key, load, now), load.advice(key, now)))
                .unzip()
        };
        closed.into_iter().for_each(log);
        advice.into_iter().flatten().collect()
    }

    /// The peak in flight to `host:port` this interval (`None`: no request
    /// to it seen, or forgotten).
    pub(crate) fn peak_in_flight(&self, host: &str, port: u16, now: Instant) -> Option<u64> {
        let (closed, peak) = {
            let mut hosts = self.hosts();
            let (key, load) = hosts
                .iter_mut()
                .find(|(k, _)| &*k.host == host && k.port == port)?;
            (self.roll(key, load, now), load.peak)
        };
        log(closed);
        Some(peak)
    }

    /// Gauges of every host: this interval's peak in flight and the idle limit.
    pub(crate) fn gauges(&self, now: Instant) -> Vec<HostGauges> {
        let (closed, gauges): (Vec<_>, Vec<_>) = {
            let mut hosts = self.hosts();
            hosts
                .iter_mut()
                .map(|(key, load)| {
                    let closed = self.roll(key, load, now);
                    let gauges = HostGauges {
                        server_address: key.host.to_string(),
                        server_port: key.port,
                        peak_in_flight: load.peak,
                        // `usize::MAX`: no limit (reqwest's default, set
                        // explicitly), which the gauge leaves out rather
                        // than export a number past OTLP's signed range.
                        idle_limit: load
                            .idle_limit
                            .filter(|(limit, _)| *limit != usize::MAX)
                            .map(|(limit, source)| (limit, source.as_str())),
                    };
                    (closed, gauges)
                })
                .unzip()
        };
        closed.into_iter().for_each(log);
        gauges
    }
}

/// Logs a closed interval's advice (WARN, target `reqwest_conntrace`).
fn log(closed: Option<PoolAdvice>) {
    if let Some(advice) = closed {
        tracing::warn!(target: "reqwest_conntrace", "{advice}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn advice_needs_forced_misses_above_the_limit_and_every_report_agrees() {
        let load = PoolLoad::new(Duration::from_secs(60), DEFAULT_POOL_ADVICE_HOSTS);
        let t0 = Instant::now();
        let b = HostKey::new("https", "b", 443);
        for _ in 0..5 {
            assert!(load.request_started(&b, t0));
        }
        // No pooling on purpose, a hit, or a limit at or above the peak: no advice.
        assert_eq!(
            load.on_response(&b, Some((0, LimitSource::Configured)), true, t0),
            None
        );
        assert_eq!(
            load.on_response(&b, Some((2, LimitSource::Configured)), false, t0),
            None
        );
        assert_eq!(
            load.on_response(&b, Some((5, LimitSource::Configured)), true, t0),
            None
        );
        let first = load
            .on_response(&b, Some((2, LimitSource::Configured)), true, t0)
            .expect("peak 5 > limit 2 with a forced miss");
        assert_eq!((first.peak_in_flight, first.idle_limit), (5, 2));
        // 3 all_busy misses so far (the limit-0 and limit-5 ones count too:
        // they were all_busy), over at least 1 s.
        assert_eq!(first.misses_per_second, 3.0);
        let later = t0 + Duration::from_secs(2);
        let second = load
            .on_response(&b, None, true, later)
            .expect("still advised");
        assert_eq!(second.misses_per_second, 2.0, "4 misses in 2 s");
        // pool_advice(), the gauge and peak_in_flight() say the same then.
        assert_eq!(load.advice(later), vec![second.clone()]);
        assert_eq!(load.gauges(later)[0].peak_in_flight, 5);
        assert_eq!(
            load.gauges(later)[0].idle_limit,
            Some((2, semconv::POOL_LIMITS_CONFIGURED))
        );
        assert_eq!(load.peak_in_flight("b", 443, later), Some(5));
        // An unlimited pool set through our builder (`usize::MAX`, as
        // `conntrace probe` sets reqwest's default) has no idle-limit
        // gauge: a tester saw it exported as 0, "pooling off".
        load.on_response(
            &b,
            Some((usize::MAX, LimitSource::Configured)),
            false,
            later,
        );
        assert_eq!(load.gauges(later)[0].idle_limit, None);
        load.on_response(&b, Some((2, LimitSource::Configured)), false, later);
        // A new interval starts from the requests in flight.
        let next = t0 + Duration::from_secs(61);
        assert_eq!(load.peak_in_flight("b", 443, next), Some(5));
        load.request_ended(&b, t0);
        load.request_ended(&b, t0);
        assert!(load.advice(next).is_empty(), "no forced miss yet");
    }

    #[test]
    fn the_logged_line_is_the_closed_intervals_advice_as_pool_advice_gave_it() {
        let load = PoolLoad::new(Duration::from_secs(10), DEFAULT_POOL_ADVICE_HOSTS);
        let t0 = Instant::now();
        let b = HostKey::new("http", "b", 80);
        for _ in 0..4 {
            load.request_started(&b, t0);
        }
        for i in 0..20 {
            load.on_response(
                &b,
                Some((1, LimitSource::Configured)),
                true,
                t0 + Duration::from_millis(100 * i),
            );
        }
        let end = t0 + Duration::from_secs(10);
        let expected = load.hosts().get(&b).and_then(|l| l.advice(&b, end));
        let closed = {
            let mut hosts = load.hosts();
            let l = hosts.get_mut(&b).expect("host");
            load.roll(&b, l, end)
        };
        assert_eq!(closed, expected);
        let closed = closed.expect("advised");
        assert_eq!((closed.peak_in_flight, closed.misses_per_second), (4, 2.0));
        assert!(closed.to_string().contains("misses per second 2.00"));
    }
}

#[cfg(test)]
mod bound_tests {
    use super::*;

    fn host(name: &str) -> HostKey {
        HostKey::new("http", name, 80)
    }

    #[test]
    fn a_full_table_forgets_only_stale_hosts_and_otherwise_leaves_new_ones_untracked() {
        let interval = Duration::from_secs(60);
        let load = PoolLoad::new(interval, 2);
        let t0 = Instant::now();
        assert!(load.request_started(&host("a"), t0));
        assert!(load.request_started(&host("b"), t0));
        load.request_ended(&host("a"), t0);
        // `a` is idle but its peak still counts this interval and the next.
        assert!(!load.request_started(&host("c"), t0 + interval));
        assert_eq!(load.gauges(t0 + interval).len(), 2);
        // Two intervals on, `a` says nothing any more; `b` is still in flight.
        let later = t0 + 2 * interval;
        assert!(load.request_started(&host("c"), later));
        let mut hosts: Vec<String> = load
            .gauges(later)
            .into_iter()
            .map(|g| g.server_address)
            .collect();
        hosts.sort();
        assert_eq!(hosts, ["b", "c"]);
        // A tracked host keeps being tracked at the cap.
        assert!(load.request_started(&host("b"), later));
    }
}
