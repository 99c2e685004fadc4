//! The end of a `tcp.connect` span: SYN retransmissions waited out, and the
//! kernel's own view of the socket when it answers.

use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime};

use opentelemetry::trace::TraceContextExt;
use opentelemetry::{Context, KeyValue};

use crate::connect::address::SYN_RETRANSMIT_AT;
use crate::kernel::{KernelLookup, TcpFacts};
use crate::semconv;

/// A `tcp.connect` span whose attributes are not complete yet: ended by
/// [`finish`](Self::finish) at its fixed end time.
pub(crate) struct TcpSpanEnd {
    pub(crate) cx: Context,
    /// Wall-clock start and end of the phase.
    pub(crate) start: SystemTime,
    pub(crate) end: SystemTime,
    /// SYN retransmissions the phase's duration implies (0 when the winner
    /// was not the first address tried: its SYN clock started later).
    pub(crate) syn_by_timing: usize,
    /// Where the kernel's facts go for the connection's report.
    pub(crate) facts: Arc<OnceLock<TcpFacts>>,
}

impl std::fmt::Debug for TcpSpanEnd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpSpanEnd")
            .field("syn_by_timing", &self.syn_by_timing)
            .finish_non_exhaustive()
    }
}

impl TcpSpanEnd {
    /// Records the kernel's facts (when `lookup` found the socket), the SYN
    /// retransmissions, and ends the span. Without the kernel view the
    /// count comes from timing alone; with it, the kernel's retransmit count
    /// caps it (0 there means the slowness was not SYN loss).
    pub(crate) fn finish(self, lookup: Option<&KernelLookup>) {
        let span = self.cx.span();
        let mut syn = self.syn_by_timing;
        if let Some(KernelLookup::Found(facts)) = lookup
            && let Some(info) = &facts.info
        {
            span.set_attribute(KeyValue::new(
                semconv::HTTP_CONNECTION_TCP_RTT,
                info.rtt.as_secs_f64(),
            ));
            span.set_attribute(KeyValue::new(
                semconv::HTTP_CONNECTION_TCP_RTT_VARIANCE,
                info.rtt_variance.as_secs_f64(),
            ));
            span.set_attribute(KeyValue::new(
                semconv::HTTP_CONNECTION_TCP_CONGESTION_WINDOW,
                i64::from(info.congestion_window),
            ));
            span.set_attribute(KeyValue::new(
                semconv::HTTP_CONNECTION_TCP_MSS,
                i64::from(info.send_mss),
            ));
            span.set_attribute(KeyValue::new(
                semconv::HTTP_CONNECTION_TCP_RETRANSMITS,
                i64::from(info.total_retransmits),
            ));
            syn = syn.min(info.total_retransmits as usize);
            let _ = self.facts.set(facts.clone());
        }
        if syn > 0 {
            span.set_attribute(KeyValue::new(
                semconv::HTTP_CONNECTION_TCP_SYN_RETRANSMITS,
                syn as i64,
            ));
        }
        for (n, at) in SYN_RETRANSMIT_AT.iter().take(syn).enumerate() {
            span.add_event_with_timestamp(
                semconv::EVENT_TCP_SYN_RETRANSMIT,
                self.start + *at,
                vec![
                    KeyValue::new(semconv::HTTP_CONNECTION_TCP_SYN_RETRANSMITS, n as i64 + 1),
                    KeyValue::new(
                        semconv::HTTP_CONNECTION_TCP_RTO,
                        Duration::from_secs(1u64 << n).as_secs_f64(),
                    ),
                ],
            );
        }
        span.end_with_timestamp(self.end);
    }
}
