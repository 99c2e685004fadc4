//! The end of a `tcp.connect` span: SYN retransmissions waited out, and the
//! kernel's own view of the socket when it answers.

use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime};

use opentelemetry::KeyValue;

use crate::connect::address::SYN_RETRANSMIT_AT;
use crate::export::pending::PendingEnd;
use crate::export::phases::{PhaseRecord, SetupSpanEnd};
use crate::kernel::{KernelLookup, TcpFacts};
use crate::semconv;

/// A `tcp.connect` span (or event, see [`ConnectionPhases`](crate::ConnectionPhases))
/// whose attributes are not complete yet: ended by [`finish`](Self::finish)
/// at its fixed end time.
pub(crate) struct TcpSpanEnd {
    pub(crate) phase: PhaseRecord,
    /// Wall-clock start and end of the phase.
    pub(crate) start: SystemTime,
    pub(crate) end: SystemTime,
    /// SYN retransmissions the phase's duration implies (0 when the winner
    /// was not the first address tried: its SYN clock started later).
    pub(crate) syn_by_timing: usize,
    /// Where the kernel's facts go for the connection's report, when a
    /// report wants them (else the span alone carries them).
    pub(crate) facts: Option<Arc<OnceLock<TcpFacts>>>,
    /// A `tcp.connect` event's setup span, when the kernel's answer is one
    /// of the two parties its end waits for.
    pub(crate) setup_end: Option<Arc<SetupSpanEnd>>,
    /// Counts the span as not ended yet, for [`wait_for_pending_spans`](crate::wait_for_pending_spans).
    pub(crate) _pending: PendingEnd,
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
        let TcpSpanEnd {
            phase: mut span,
            start,
            end,
            syn_by_timing,
            facts: kept,
            setup_end,
            // Dropped last: the setup span, when it waits, has ended.
            _pending,
        } = self;
        let mut syn = syn_by_timing;
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
            if let Some(kept) = &kept {
                let _ = kept.set(facts.clone());
            }
        }
        if syn > 0 {
            span.set_attribute(KeyValue::new(
                semconv::HTTP_CONNECTION_TCP_SYN_RETRANSMITS,
                syn as i64,
            ));
        }
        for (n, at) in SYN_RETRANSMIT_AT.iter().take(syn).enumerate() {
            span.add_event(
                semconv::EVENT_TCP_SYN_RETRANSMIT,
                start + *at,
                vec![
                    KeyValue::new(semconv::HTTP_CONNECTION_TCP_SYN_RETRANSMITS, n as i64 + 1),
                    KeyValue::new(
                        semconv::HTTP_CONNECTION_TCP_RTO,
                        Duration::from_secs(1u64 << n).as_secs_f64(),
                    ),
                ],
            );
        }
        span.end(end);
        if let Some(setup) = setup_end {
            setup.arrive();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::net::{Ipv4Addr, SocketAddr};
    use std::sync::atomic::{AtomicUsize, Ordering};

    use opentelemetry::Context;
    use opentelemetry::trace::{TraceContextExt, Tracer, TracerProvider};
    use opentelemetry_sdk::error::OTelSdkResult;
    use opentelemetry_sdk::trace::{SdkTracerProvider, SpanData, SpanProcessor};

    use super::*;
    use crate::kernel::KernelView;
    use crate::wait_for_pending_spans;

    /// Counts ended spans.
    #[derive(Debug, Clone, Default)]
    struct Ended(Arc<AtomicUsize>);

    impl SpanProcessor for Ended {
        fn on_start(&self, _: &mut opentelemetry_sdk::trace::Span, _: &Context) {}
        fn on_end(&self, _: SpanData) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
        fn force_flush(&self) -> OTelSdkResult {
            Ok(())
        }
        fn shutdown_with_timeout(&self, _: Duration) -> OTelSdkResult {
            Ok(())
        }
    }

    /// A `tcp.connect` span queued for the kernel behind a slow lookup has
    /// not ended when its connect is over; `wait_for_pending_spans` returns
    /// only once it has, so a flush right after it exports it.
    #[test]
    fn waiting_for_pending_spans_outlasts_a_slow_kernel_lookup() {
        let ended = Ended::default();
        let provider = SdkTracerProvider::builder()
            .with_span_processor(ended.clone())
            .build();
        let span = provider.tracer("test").start("tcp.connect");
        let now = SystemTime::now();
        let ending = TcpSpanEnd {
            phase: PhaseRecord::Span(Context::new().with_span(span)),
            start: now,
            end: now,
            syn_by_timing: 0,
            facts: None,
            setup_end: None,
            _pending: PendingEnd::new(),
        };
        let view = KernelView::new();
        let local = SocketAddr::from((Ipv4Addr::LOCALHOST, 1));
        let remote = SocketAddr::from((Ipv4Addr::LOCALHOST, 2));
        view.lookup_then(local, remote, |_| {
            std::thread::sleep(Duration::from_millis(300))
        });
        view.lookup_then(local, remote, move |lookup| ending.finish(Some(&lookup)));
        assert_eq!(ended.0.load(Ordering::SeqCst), 0, "still queued");
        assert!(wait_for_pending_spans(Duration::from_secs(5)));
        assert_eq!(
            ended.0.load(Ordering::SeqCst),
            1,
            "ended before the wait returned"
        );
    }
}
