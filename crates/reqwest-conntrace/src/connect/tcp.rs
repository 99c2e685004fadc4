//! The end of a `tcp.connect` span: SYN retransmissions waited out, and the
//! kernel's own view of the socket when it answers.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime};

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
    /// Where the kernel's facts go for the connection's report, when a
    /// report wants them (else the span alone carries them).
    pub(crate) facts: Option<Arc<OnceLock<TcpFacts>>>,
    /// Counts the span as not ended yet, for [`wait_for_pending_spans`].
    pub(crate) _pending: PendingEnd,
}

/// `tcp.connect` spans created and not ended yet, in the whole process
/// (most wait for the kernel's answer on the `conntrace-sock-diag` thread).
static PENDING_ENDS: AtomicUsize = AtomicUsize::new(0);
static ENDED: (Mutex<()>, Condvar) = (Mutex::new(()), Condvar::new());
/// Callers of [`wait_for_pending_spans`] inside it: the last pending end
/// wakes them only when there are some (std's `Condvar::notify_all` is a
/// futex syscall even with nobody waiting, and most connects end their
/// `tcp.connect` span at once, bringing the count to 0).
static WAITERS: AtomicUsize = AtomicUsize::new(0);

/// One span counted in the pending ends until dropped.
#[derive(Debug)]
pub(crate) struct PendingEnd(());

impl PendingEnd {
    pub(crate) fn new() -> Self {
        PENDING_ENDS.fetch_add(1, Ordering::SeqCst);
        PendingEnd(())
    }
}

impl Drop for PendingEnd {
    fn drop(&mut self) {
        // A waiter counts itself before it checks the pending ends (both
        // sequentially consistent): either it is counted here, or its check
        // sees this end.
        if PENDING_ENDS.fetch_sub(1, Ordering::SeqCst) == 1 && WAITERS.load(Ordering::SeqCst) > 0 {
            // Under the lock, so a waiter between its check and its wait
            // cannot miss the wake-up.
            let _lock = ENDED.0.lock().unwrap_or_else(|e| e.into_inner());
            ENDED.1.notify_all();
        }
    }
}

/// Waits until every span this crate keeps open for the kernel's answer
/// has ended (at most `timeout`); `true` if none is left. Call it before
/// flushing or shutting down a tracer provider you set up yourself:
/// a `tcp.connect` span, and a request span whose miss reason or failure
/// evidence (`stalled`) needs the kernel, end when the kernel's answer about
/// the socket arrives (on the `conntrace-sock-diag` thread, within about
/// 2 ms: a lookup nobody waits for rests up to 2 ms to share the thread's
/// wake-up with others; a lookup queued longer than 1 s is given up), which
/// may be after the response was handed to the caller. Connects still
/// running are not waited for ([`connects_in_flight`](crate::connects_in_flight)). `otlp::OtlpGuard`'s
/// flush, shutdown and drop (feature `otlp`) call it with a 2 s bound.
pub fn wait_for_pending_spans(timeout: Duration) -> bool {
    WAITERS.fetch_add(1, Ordering::SeqCst);
    let none_left = wait_for_ends(timeout);
    WAITERS.fetch_sub(1, Ordering::SeqCst);
    none_left
}

/// The wait of [`wait_for_pending_spans`], whose caller is counted in
/// [`WAITERS`].
fn wait_for_ends(timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    let mut lock = ENDED.0.lock().unwrap_or_else(|e| e.into_inner());
    while PENDING_ENDS.load(Ordering::SeqCst) > 0 {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        lock = match ENDED.1.wait_timeout(lock, left) {
            Ok((l, _)) => l,
            Err(e) => e.into_inner().0,
        };
    }
    true
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
            if let Some(kept) = &self.facts {
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

#[cfg(test)]
mod tests {
    use std::net::{Ipv4Addr, SocketAddr};
    use std::sync::atomic::AtomicUsize;

    use opentelemetry::trace::{Tracer, TracerProvider};
    use opentelemetry_sdk::error::OTelSdkResult;
    use opentelemetry_sdk::trace::{SdkTracerProvider, SpanData, SpanProcessor};

    use super::*;
    use crate::kernel::KernelView;

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
            cx: Context::new().with_span(span),
            start: now,
            end: now,
            syn_by_timing: 0,
            facts: None,
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
