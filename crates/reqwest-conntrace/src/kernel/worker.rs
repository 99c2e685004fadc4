//! The `conntrace-sock-diag` thread: owns one sock_diag socket (opened on
//! the first lookup) and answers queued lookups one at a time, running each
//! lookup's callback with the answer; a lookup asked for later is held
//! until it is due.
//!
//! Waking a thread costs more than the lookup itself (about 10 µs on each
//! side on loopback, against a few µs for the netlink round trip), so a
//! lookup nobody waits for (a [`Lookup::urgent`] of `false`: the facts a
//! `tcp.connect` span ends with, the pool's checks of idle connections)
//! lets the thread rest up to [`BATCH_WINDOW`] first, parked: lookups queued
//! meanwhile do not wake it, and it answers them all in one go. An urgent
//! lookup (a miss's reason, a failed request's evidence) unparks it at once.

use std::io;
use std::net::SocketAddr;
use std::panic::{self, AssertUnwindSafe};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SendError, Sender};
use std::thread::{self, Thread};
use std::time::{Duration, Instant};

use super::KernelLookup;
use super::error::{OffReason, QueryError};
use super::owned::{self, OwnedLookup};
use super::sock_diag::SockDiag;

/// The thread's name (as `ps -T` and panic messages show it).
pub(crate) const THREAD_NAME: &str = "conntrace-sock-diag";

/// A lookup queued longer than this is answered `TimedOut` without asking
/// the kernel, so a backlog drains at once instead of piling up.
const MAX_QUEUE_WAIT: Duration = Duration::from_secs(1);

/// How long a lookup nobody waits for may rest in the queue so that the
/// ones queued after it share its wake-up (at 4000 connections/s: about 8
/// lookups per wake-up, at most 500 wake-ups/s).
pub(crate) const BATCH_WINDOW: Duration = Duration::from_millis(2);

/// The callback of a queued lookup.
pub(crate) type Then = Box<dyn FnOnce(KernelLookup) + Send + 'static>;

/// The callback of a queued owned-sockets lookup.
pub(crate) type ThenOwned = Box<dyn FnOnce(OwnedLookup) + Send + 'static>;

/// One queued lookup.
pub(crate) struct Lookup {
    pub(crate) query: Query,
    /// When it was queued; for a lookup asked for later, when it is due
    /// (the thread holds it until then).
    pub(crate) queued_at: Instant,
    /// Someone waits for the answer (answered at once, never batched).
    pub(crate) urgent: bool,
}

/// What a queued lookup asks, and where its answer goes.
pub(crate) enum Query {
    /// The socket with this exact address pair.
    Socket {
        /// The socket's local address.
        local: SocketAddr,
        /// The socket's peer address.
        remote: SocketAddr,
        /// Runs on the thread with the answer.
        then: Then,
    },
    /// This process's connected sockets to any of these peers.
    ConnectedTo {
        remotes: Vec<SocketAddr>,
        /// Asked when the lookup is due: `false` drops it unanswered (its
        /// asker no longer needs it), before any kernel work.
        wanted: Box<dyn Fn() -> bool + Send + 'static>,
        /// Runs on the thread with the answer.
        then: ThenOwned,
    },
}

impl Query {
    /// Runs the callback with "unavailable", on the caller's thread.
    pub(crate) fn unavailable(self) {
        match self {
            Query::Socket { then, .. } => then(KernelLookup::Unavailable),
            Query::ConnectedTo { then, .. } => then(OwnedLookup::Unavailable),
        }
    }
}

/// The thread's queue: lookups go in, an urgent one also wakes the thread.
pub(crate) struct Queue {
    sender: Sender<Lookup>,
    thread: Thread,
    /// An urgent lookup is queued: the thread stops resting.
    urgent: Arc<AtomicBool>,
}

impl Queue {
    /// Queues `lookup`; gives it back if the thread is gone.
    pub(crate) fn send(&self, lookup: Lookup) -> Result<(), SendError<Lookup>> {
        let urgent = lookup.urgent;
        self.sender.send(lookup)?;
        if urgent {
            self.urgent.store(true, Ordering::Release);
            self.thread.unpark();
        }
        Ok(())
    }
}

/// Starts the thread; it ends when the returned queue is dropped (after
/// answering what is still queued).
pub(crate) fn spawn(available: Arc<AtomicBool>) -> io::Result<Queue> {
    let (sender, lookups) = mpsc::channel();
    let urgent = Arc::new(AtomicBool::new(false));
    let flag = urgent.clone();
    let handle = thread::Builder::new()
        .name(THREAD_NAME.to_owned())
        .spawn(move || run(&lookups, &available, &flag))?;
    Ok(Queue {
        sender,
        thread: handle.thread().clone(),
        urgent,
    })
}

/// Marks kernel facts off for good and says why, once (callers reach this
/// only on the transition to off).
pub(crate) fn turn_off(available: &AtomicBool, reason: &OffReason) {
    available.store(false, Ordering::Release);
    if reason.is_expected() {
        tracing::debug!(target: "reqwest_conntrace", "kernel TCP facts are off: {reason}");
    } else {
        tracing::warn!(
            target: "reqwest_conntrace",
            "kernel TCP facts (sock_diag) are off for this ConnTrace: {reason}"
        );
    }
}

/// The thread's loop: blocks for a lookup and holds one asked for later
/// until it is due (a due one goes before newer arrivals); for one nobody
/// waits for, rests (parked, so senders do not wake it) up to
/// [`BATCH_WINDOW`] or until an urgent lookup arrives; then answers
/// everything queued that is due.
fn run(lookups: &Receiver<Lookup>, available: &AtomicBool, urgent: &AtomicBool) {
    let mut kernel = Kernel::Unopened;
    let mut later: Vec<Lookup> = Vec::new();
    loop {
        let now = Instant::now();
        if let Some(i) = later.iter().position(|l| l.queued_at <= now) {
            answer(&mut kernel, later.swap_remove(i), available);
            continue;
        }
        let received = match later.iter().map(|l| l.queued_at).min() {
            None => lookups.recv().map_err(|_| RecvTimeoutError::Disconnected),
            Some(due) => lookups.recv_timeout(due.saturating_duration_since(now)),
        };
        let first = match received {
            Ok(lookup) if lookup.queued_at > Instant::now() => {
                later.push(lookup);
                continue;
            }
            Ok(lookup) => lookup,
            Err(RecvTimeoutError::Timeout) => continue,
            Err(RecvTimeoutError::Disconnected) => {
                // The view is gone: what was asked for later is answered
                // now, so no callback is dropped unrun.
                for lookup in later.drain(..) {
                    answer(&mut kernel, lookup, available);
                }
                break;
            }
        };
        if !first.urgent {
            let until = first.queued_at + BATCH_WINDOW;
            loop {
                let now = Instant::now();
                if urgent.load(Ordering::Acquire) || now >= until {
                    break;
                }
                thread::park_timeout(until - now);
            }
        }
        urgent.store(false, Ordering::Release);
        answer(&mut kernel, first, available);
        for lookup in lookups.try_iter() {
            if lookup.queued_at > Instant::now() {
                later.push(lookup);
            } else {
                answer(&mut kernel, lookup, available);
            }
        }
    }
}

/// Answers one due lookup and runs its callback.
fn answer(kernel: &mut Kernel, lookup: Lookup, available: &AtomicBool) {
    let stale = lookup.queued_at.elapsed() > MAX_QUEUE_WAIT;
    // A panicking callback must not take kernel facts down for everyone.
    let ran = match lookup.query {
        Query::Socket {
            local,
            remote,
            then,
        } => {
            let answer = if stale {
                KernelLookup::TimedOut
            } else {
                kernel.lookup(local, remote, available, SockDiag::open)
            };
            panic::catch_unwind(AssertUnwindSafe(move || then(answer)))
        }
        Query::ConnectedTo {
            remotes,
            wanted,
            then,
        } => {
            if !wanted() {
                return;
            }
            let answer = if stale {
                OwnedLookup::TimedOut
            } else {
                kernel.connected_to(&remotes, available, SockDiag::open)
            };
            panic::catch_unwind(AssertUnwindSafe(move || then(answer)))
        }
    };
    if ran.is_err() {
        tracing::warn!(
            target: "reqwest_conntrace",
            "a kernel TCP lookup callback panicked; the sock_diag thread carries on"
        );
    }
}

/// The thread's sock_diag socket, through its life.
enum Kernel {
    /// Not opened yet (no lookup so far).
    Unopened,
    /// Open and working.
    Open(SockDiag),
    /// Off for good; every lookup answers `Unavailable`.
    Off,
}

impl Kernel {
    /// The open socket, opening it with `open` first if needed; `None` once
    /// kernel facts are off.
    fn open(
        &mut self,
        available: &AtomicBool,
        open: impl FnOnce() -> Result<SockDiag, OffReason>,
    ) -> Option<&mut SockDiag> {
        if let Kernel::Unopened = self {
            *self = match open() {
                Ok(diag) => Kernel::Open(diag),
                Err(reason) => {
                    turn_off(available, &reason);
                    Kernel::Off
                }
            };
        }
        match self {
            Kernel::Open(diag) => Some(diag),
            _ => None,
        }
    }

    /// Answers one owned-sockets lookup: the dump, then the ownership
    /// check against `/proc/self/fd` (skipped when nothing matched).
    fn connected_to(
        &mut self,
        remotes: &[SocketAddr],
        available: &AtomicBool,
        open: impl FnOnce() -> Result<SockDiag, OffReason>,
    ) -> OwnedLookup {
        let Some(diag) = self.open(available, open) else {
            return OwnedLookup::Unavailable;
        };
        let dumped = match diag.connected_to(remotes) {
            Ok(dumped) => dumped,
            Err(QueryError::TimedOut(_)) => return OwnedLookup::TimedOut,
            Err(error) => {
                tracing::debug!(
                    target: "reqwest_conntrace",
                    ?remotes, "kernel TCP dump failed: {error}"
                );
                return OwnedLookup::Unavailable;
            }
        };
        if dumped.is_empty() {
            return OwnedLookup::Found(Vec::new());
        }
        let wanted = dumped.iter().map(|d| d.inode).filter(|i| *i != 0).collect();
        match owned::open_socket_inodes(&wanted) {
            Ok(open) => OwnedLookup::Found(owned::owned_by(&dumped, &open)),
            Err(error) => {
                tracing::debug!(
                    target: "reqwest_conntrace",
                    "cannot list /proc/self/fd: {error}"
                );
                OwnedLookup::Unavailable
            }
        }
    }

    /// Answers one lookup, opening the socket with `open` first if needed.
    fn lookup(
        &mut self,
        local: SocketAddr,
        remote: SocketAddr,
        available: &AtomicBool,
        open: impl FnOnce() -> Result<SockDiag, OffReason>,
    ) -> KernelLookup {
        let Some(diag) = self.open(available, open) else {
            return KernelLookup::Unavailable;
        };
        match diag.query(local, remote) {
            Ok(Some(facts)) => KernelLookup::Found(facts),
            Ok(None) => KernelLookup::NotFound,
            Err(QueryError::TimedOut(_)) => KernelLookup::TimedOut,
            Err(error) if !diag.proven() => {
                turn_off(available, &OffReason::FirstQuery(error));
                *self = Kernel::Off;
                KernelLookup::Unavailable
            }
            Err(error) => {
                tracing::debug!(
                    target: "reqwest_conntrace",
                    %local, %remote, "kernel TCP lookup failed: {error}"
                );
                KernelLookup::Unavailable
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::net::Ipv4Addr;
    use std::sync::Mutex;

    use super::*;

    /// Collects what a `tracing` fmt subscriber writes.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl Write for Captured {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.0.lock().expect("lock").extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_failed_open_turns_kernel_facts_off_with_one_warning() {
        let captured = Captured::default();
        let writer = captured.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .finish();
        let available = AtomicBool::new(true);
        let local = SocketAddr::from((Ipv4Addr::LOCALHOST, 1));
        let remote = SocketAddr::from((Ipv4Addr::LOCALHOST, 2));
        let refused = || {
            Err(OffReason::Socket(io::Error::from(
                io::ErrorKind::PermissionDenied,
            )))
        };
        let mut kernel = Kernel::Unopened;
        tracing::subscriber::with_default(subscriber, || {
            for _ in 0..3 {
                let lookup = kernel.lookup(local, remote, &available, refused);
                assert_eq!(lookup, KernelLookup::Unavailable);
            }
        });
        assert!(!available.load(Ordering::Acquire));
        assert!(matches!(kernel, Kernel::Off));
        let logs = String::from_utf8(captured.0.lock().expect("lock").clone()).expect("utf-8");
        let warnings: Vec<&str> = logs.lines().filter(|l| l.contains("WARN")).collect();
        assert_eq!(warnings.len(), 1, "{logs}");
        assert!(
            warnings[0].contains("reqwest_conntrace")
                && warnings[0].contains("kernel TCP facts (sock_diag) are off")
                && warnings[0].contains("cannot open a NETLINK_SOCK_DIAG socket"),
            "{logs}"
        );
    }
}
