//! Spans that end off the request path, counted so a flush can wait for
//! them: `tcp.connect` (ended on the `conntrace-sock-diag` thread when the
//! kernel answers; with `ConnectionPhases::Events`, the setup span carrying
//! its event), request spans whose miss reason or failure evidence
//! waits for the kernel, and setup spans of unused connects waiting for the
//! kernel's looks.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

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
/// a `tcp.connect` span (with [`ConnectionPhases::Events`](crate::ConnectionPhases::Events):
/// the setup span carrying its event), and a request span whose miss reason or failure
/// evidence (`stalled`) needs the kernel, end when the kernel's answer about
/// the socket arrives (on the `conntrace-sock-diag` thread, within about
/// 2 ms: a lookup nobody waits for rests up to 2 ms to share the thread's
/// wake-up with others; a lookup queued longer than 1 s is given up), which
/// may be after the response was handed to the caller. A setup span whose
/// connection its trigger did not use ends when the kernel shows the pool
/// closed it unused or kept it, at most 500 ms after its trigger was served
/// (`http.connection.setup.outcome`). Connects still
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
