//! The one-paragraph conclusion comparing the demo's two phases, written
//! from the measured numbers.

use super::report::{DemoConfig, PhaseSummary};

/// Percentage with no decimals.
fn pct(r: f64) -> String {
    format!("{:.0} %", r * 100.0)
}

/// Milliseconds with no decimals, `?` when unknown.
fn ms0(v: Option<f64>) -> String {
    v.map_or_else(|| "?".to_owned(), |v| format!("{v:.0}"))
}

/// Batch indices that missed in more than half of their calls, e.g. `batches 2, 3 and 4`.
fn missing_batches(p: &PhaseSummary) -> Option<String> {
    let idx: Vec<String> = p
        .batches
        .iter()
        .filter(|b| b.miss_ratio > 0.5)
        .map(|b| b.index.to_string())
        .collect();
    match idx.as_slice() {
        [] => None,
        [one] => Some(format!("batch {one}")),
        [init @ .., last] => Some(format!("batches {} and {last}", init.join(", "))),
    }
}

/// The conclusion for `phases` (small pool first, right-sized pool second).
pub(crate) fn write(config: &DemoConfig, phases: &[PhaseSummary]) -> String {
    let (Some(small), Some(right)) = (phases.first(), phases.get(1)) else {
        return "Not enough phases ran to compare.".to_owned();
    };
    let mut text = format!(
        "With an idle pool of {} connections per host for {} concurrent batch calls per user \
         request ({:.0} calls/s; {:.1} calls in flight on average, up to {} at once), {} of the \
         batch calls found no idle connection: {} waited for a new TCP + TLS connection ({} ms \
         each at {} ms RTT) and {} waited for a connection another call was still using, \
         although each had started a connect of its own (the server accepted {} connections \
         for {} calls, against {} with an idle pool of {}; {} of them served no call at \
         all).",
        small.pool_max_idle_per_host,
        config.batches,
        config.rate_per_s * config.batches as f64,
        small.in_flight_mean,
        small.in_flight_peak,
        pct(small.miss_ratio),
        small.misses_new_connection,
        ms0(small.connection_setup_mean_ms),
        config.rtt_ms,
        small.misses_waited_for_busy,
        small.connections_opened,
        small.calls,
        right.connections_opened,
        right.pool_max_idle_per_host,
        small.connections_served_none(),
    );
    if let Some(which) = missing_batches(small) {
        text.push_str(&format!(
            " The misses fell on {which}: the first calls of each fan-out took the idle \
             connections and the pool kept only {} of them afterwards.",
            small.pool_max_idle_per_host
        ));
    }
    let fan = |p: &PhaseSummary| p.fanout_ms.as_ref().map(|d| (d.p50, d.p99));
    let call50 = |p: &PhaseSummary| p.call_ms.as_ref().map(|d| d.p50);
    if let (Some((s50, s99)), Some((r50, r99))) = (fan(small), fan(right)) {
        let factor = if r99 > 0.0 { s99 / r99 } else { 0.0 };
        text.push_str(&format!(
            " Because a fan-out waits for its slowest batch, its p50 / p99 were {s50:.0} / \
             {s99:.0} ms against {r50:.0} / {r99:.0} ms with an idle pool of {} (p99 {factor:.1}x), \
             while the median single call was {} against {} ms: the service did not get slower, \
             getting a connection did.",
            right.pool_max_idle_per_host,
            ms0(call50(small)),
            ms0(call50(right)),
        ));
    }
    text.push_str(&format!(
        " Calls spent {} of their time waiting for a connection with the small pool and {} with \
         the right-sized one (connection setup alone: {} vs {}). Keep the idle pool per host at \
         least at the peak in-flight concurrency (here {}), and alert on the pool-miss ratio \
         ({} vs {}).",
        pct(small.connection_wait_share),
        pct(right.connection_wait_share),
        pct(small.handshake_share),
        pct(right.handshake_share),
        small.in_flight_peak,
        pct(small.miss_ratio),
        pct(right.miss_ratio),
    ));
    text
}
