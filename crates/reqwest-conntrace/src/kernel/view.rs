//! The kernel's view of a TCP socket: its state (`ESTABLISHED`,
//! `CLOSE_WAIT`, ...) and `tcp_info` counters (RTT, congestion window, MSS,
//! retransmits), asked of Linux through sock_diag (`NETLINK_SOCK_DIAG`, the
//! interface `ss` uses) for one exact (local, remote) address pair.
//!
//! Lookups go to one dedicated thread per [`KernelView`], started on first
//! use; callers never block. Where sock_diag does not work (other targets,
//! sandboxes without netlink, kernels without `tcp_diag`) every lookup
//! answers [`KernelLookup::Unavailable`] after one warning.

use std::fmt;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::SendError;
use std::sync::{Arc, OnceLock};
#[cfg(test)]
use std::time::Duration;
use std::time::Instant;

use super::error::OffReason;
use super::facts::TcpFacts;
#[cfg(all(test, target_os = "linux"))]
use super::facts::{TcpInfo, TcpState};
use super::owned::OwnedLookup;
use super::worker;

/// The answer to one kernel lookup.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum KernelLookup {
    /// The kernel has a TCP socket with this address pair.
    Found(TcpFacts),
    /// It has none (never existed, or closed and gone: after `LAST_ACK`, or
    /// after `TIME_WAIT` expired).
    NotFound,
    /// sock_diag does not work here (see [`KernelView::is_available`]).
    Unavailable,
    /// No answer in time: the caller's timeout, the netlink socket's, or the
    /// lookup waited too long in the queue.
    TimedOut,
}

impl KernelLookup {
    /// Whether the answer shows the socket closing or closed (any state
    /// but `ESTABLISHED`, or gone); no answer shows nothing.
    pub(crate) fn shows_closed(&self) -> bool {
        match self {
            KernelLookup::Found(facts) => facts.state != crate::TcpState::Established,
            KernelLookup::NotFound => true,
            KernelLookup::Unavailable | KernelLookup::TimedOut => false,
        }
    }
}

/// Kernel lookups for one `ConnTrace` handle. Creating it opens nothing;
/// the first lookup starts the `conntrace-sock-diag` thread, which owns
/// one netlink socket and exits when this view is dropped.
pub(crate) struct KernelView {
    /// False once sock_diag failed (or from the start off Linux).
    available: Arc<AtomicBool>,
    /// The thread's queue, once started; `None` if it could not be started.
    queue: OnceLock<Option<worker::Queue>>,
}

impl KernelView {
    /// A view that has not started its thread yet.
    pub(crate) fn new() -> Self {
        KernelView {
            available: Arc::new(AtomicBool::new(cfg!(target_os = "linux"))),
            queue: OnceLock::new(),
        }
    }

    /// Queues a lookup of the TCP socket whose local address is `local`
    /// and whose peer is `remote` (both IPv4 or both IPv6). Never blocks.
    ///
    /// `then` runs on the `conntrace-sock-diag` thread with the answer;
    /// keep it short, it delays the lookups queued after it. Only if that
    /// thread cannot be started (or has died) does `then` run at once on
    /// the caller's thread, with [`KernelLookup::Unavailable`].
    ///
    /// For an answer someone waits for: it wakes the thread at once. See
    /// [`lookup_batched`](Self::lookup_batched) for one nobody waits for.
    pub(crate) fn lookup_then(
        &self,
        local: SocketAddr,
        remote: SocketAddr,
        then: impl FnOnce(KernelLookup) + Send + 'static,
    ) {
        self.queue_socket(local, remote, Box::new(then), true);
    }

    /// As [`lookup_then`](Self::lookup_then), for an answer nobody waits
    /// for (a span's end, a pool check): answered up to
    /// [`worker::BATCH_WINDOW`] (2 ms) later, in one wake-up of the thread
    /// with the lookups queued meanwhile.
    pub(crate) fn lookup_batched(
        &self,
        local: SocketAddr,
        remote: SocketAddr,
        then: impl FnOnce(KernelLookup) + Send + 'static,
    ) {
        self.queue_socket(local, remote, Box::new(then), false);
    }

    /// As [`lookup_then`](Self::lookup_then), asked at `due` (not before):
    /// a second look at a socket whose state is about to change, or once
    /// something expected had time to happen.
    pub(crate) fn lookup_at(
        &self,
        local: SocketAddr,
        remote: SocketAddr,
        due: Instant,
        then: impl FnOnce(KernelLookup) + Send + 'static,
    ) {
        let query = worker::Query::Socket {
            local,
            remote,
            then: Box::new(then),
        };
        self.queue(query, due, false);
    }

    /// Queues the exact-pair lookup, due now.
    fn queue_socket(
        &self,
        local: SocketAddr,
        remote: SocketAddr,
        then: worker::Then,
        urgent: bool,
    ) {
        let query = worker::Query::Socket {
            local,
            remote,
            then,
        };
        self.queue(query, Instant::now(), urgent);
    }

    /// Queues a lookup of this process's connected TCP sockets
    /// (`ESTABLISHED` or `CLOSE_WAIT`) whose peer is one of `remotes`, to
    /// be answered at `due` (not before): a sock_diag dump of the machine's
    /// connected sockets with those peer ports, kept when the socket's
    /// inode is one of this process's open file descriptors
    /// (`/proc/self/fd`). Never blocks. When due, `wanted()` is asked
    /// first: `false` drops the lookup with no kernel work and `then`
    /// unrun; else `then` runs as for [`lookup_then`](Self::lookup_then).
    /// Costly (the descriptor scan is linear in the process's open files):
    /// use it only where no exact pair is known.
    pub(crate) fn connected_to_then(
        &self,
        remotes: Vec<SocketAddr>,
        due: Instant,
        wanted: impl Fn() -> bool + Send + 'static,
        then: impl FnOnce(OwnedLookup) + Send + 'static,
    ) {
        self.queue(
            worker::Query::ConnectedTo {
                remotes,
                wanted: Box::new(wanted),
                then: Box::new(then),
            },
            due,
            false,
        );
    }

    /// Hands `query` to the thread (started on first use), due at `due`
    /// (waking the thread at once if `urgent`), or answers it unavailable at
    /// once when there is no thread.
    fn queue(&self, query: worker::Query, due: Instant, urgent: bool) {
        let queue = self
            .queue
            .get_or_init(|| match worker::spawn(self.available.clone()) {
                Ok(queue) => Some(queue),
                Err(e) => {
                    worker::turn_off(&self.available, &OffReason::Thread(e));
                    None
                }
            });
        let lookup = worker::Lookup {
            query,
            queued_at: due,
            urgent,
        };
        let Some(queue) = queue else {
            lookup.query.unavailable();
            return;
        };
        if let Err(SendError(lookup)) = queue.send(lookup) {
            if self.available.load(Ordering::Acquire) {
                worker::turn_off(&self.available, &OffReason::ThreadGone);
            }
            lookup.query.unavailable();
        }
    }

    #[cfg(test)]
    /// Looks up the TCP socket `local` → `remote` (see
    /// [`lookup_then`](Self::lookup_then)); answers
    /// [`KernelLookup::TimedOut`] if there is no answer within `timeout`.
    /// Needs a Tokio runtime with time enabled.
    pub(crate) async fn lookup(
        &self,
        local: SocketAddr,
        remote: SocketAddr,
        timeout: Duration,
    ) -> KernelLookup {
        let (answer, answered) = tokio::sync::oneshot::channel();
        self.lookup_then(local, remote, move |lookup| {
            let _ = answer.send(lookup); // the caller may have timed out
        });
        match tokio::time::timeout(timeout, answered).await {
            Ok(Ok(lookup)) => lookup,
            // The callback was dropped unrun: the thread died mid-lookup.
            Ok(Err(_)) => KernelLookup::Unavailable,
            Err(_) => KernelLookup::TimedOut,
        }
    }

    /// Whether sock_diag works here: true until the first failure to open
    /// the netlink socket or to answer the first query (then false for
    /// good); always false off Linux.
    pub(crate) fn is_available(&self) -> bool {
        self.available.load(Ordering::Acquire)
    }
}

impl fmt::Debug for KernelView {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KernelView")
            .field("available", &self.is_available())
            .field("started", &self.queue.get().is_some())
            .finish()
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use std::net::{Ipv4Addr, Ipv6Addr};
    use std::process::Command;

    use conntrace_lab::backlog::FullBacklogListener;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpSocket, TcpStream};

    use super::*;

    const LOOKUP_TIMEOUT: Duration = Duration::from_secs(2);

    /// A connected loopback pair: (ours, the peer's accepted end), with one
    /// small request and response exchanged, then idle.
    async fn connected_pair(ip: std::net::IpAddr) -> (TcpStream, TcpStream) {
        let listener = TcpListener::bind((ip, 0)).await.expect("bind listener");
        let addr = listener.local_addr().expect("listener address");
        let (ours, peer) = tokio::join!(TcpStream::connect(addr), listener.accept());
        let (mut ours, (mut peer, _)) = (ours.expect("connect"), peer.expect("accept"));
        ours.write_all(b"ping").await.expect("write");
        let mut buf = [0u8; 4];
        peer.read_exact(&mut buf).await.expect("read");
        peer.write_all(b"pong").await.expect("write back");
        ours.read_exact(&mut buf).await.expect("read back");
        (ours, peer)
    }

    fn pair(stream: &TcpStream) -> (SocketAddr, SocketAddr) {
        (
            stream.local_addr().expect("local address"),
            stream.peer_addr().expect("peer address"),
        )
    }

    fn found(lookup: KernelLookup) -> TcpFacts {
        match lookup {
            KernelLookup::Found(facts) => facts,
            other => panic!("expected Found, got {other:?}"),
        }
    }

    /// What `ss -ti` prints for one socket.
    #[derive(Debug)]
    struct SsInfo {
        mss: u32,
        cwnd: u32,
        rtt_ms: f64,
        rttvar_ms: f64,
        retrans_total: u32,
    }

    /// `ss -tinH state <state> src <local> dst <remote>`, parsed.
    fn ss(state: &str, local: SocketAddr, remote: SocketAddr) -> SsInfo {
        let output = Command::new("ss")
            .args(["-tinH", "state", state, "src"])
            .arg(local.to_string())
            .arg("dst")
            .arg(remote.to_string())
            .output()
            .expect("`ss` (iproute2) must be installed to check kernel lookups against it");
        assert!(output.status.success(), "ss failed: {output:?}");
        let text = String::from_utf8_lossy(&output.stdout);
        let field = |name: &str| {
            text.split_whitespace()
                .find_map(|token| token.strip_prefix(name))
                .map(str::to_owned)
        };
        let number = |name: &str| {
            field(name)
                .unwrap_or_else(|| panic!("no `{name}` in ss output {text:?}"))
                .parse::<u32>()
                .expect("number")
        };
        let rtt = field("rtt:").unwrap_or_else(|| panic!("no rtt in ss output {text:?}"));
        let (rtt_ms, rttvar_ms) = rtt.split_once('/').expect("rtt:<rtt>/<rttvar>");
        // retrans:<now>/<total>, printed only when either is nonzero.
        let retrans_total = field("retrans:").map_or(0, |r| {
            r.split_once('/')
                .expect("retrans:<now>/<total>")
                .1
                .parse()
                .expect("number")
        });
        SsInfo {
            mss: number("mss:"),
            cwnd: number("cwnd:"),
            rtt_ms: rtt_ms.parse().expect("rtt ms"),
            rttvar_ms: rttvar_ms.parse().expect("rttvar ms"),
            retrans_total,
        }
    }

    fn assert_matches_ss(info: &TcpInfo, ss: &SsInfo) {
        assert_eq!(info.send_mss, ss.mss, "mss; ss: {ss:?}");
        assert_eq!(info.congestion_window, ss.cwnd, "cwnd; ss: {ss:?}");
        assert_eq!(
            info.total_retransmits, ss.retrans_total,
            "retrans; ss: {ss:?}"
        );
        let rtt_ms = info.rtt.as_secs_f64() * 1e3;
        let rttvar_ms = info.rtt_variance.as_secs_f64() * 1e3;
        assert!(
            (rtt_ms - ss.rtt_ms).abs() <= 1.0,
            "rtt {rtt_ms} ms; ss: {ss:?}"
        );
        assert!(
            (rttvar_ms - ss.rttvar_ms).abs() <= 1.0,
            "rttvar {rttvar_ms} ms; ss: {ss:?}"
        );
    }

    /// Polls until `done` holds for the lookup (TCP teardown on loopback
    /// takes microseconds, but is asynchronous to `close`).
    async fn wait_for(
        view: &KernelView,
        (local, remote): (SocketAddr, SocketAddr),
        done: impl Fn(&KernelLookup) -> bool,
    ) -> KernelLookup {
        let deadline = Instant::now() + Duration::from_secs(2);
        loop {
            let lookup = view.lookup(local, remote, LOOKUP_TIMEOUT).await;
            if done(&lookup) || Instant::now() > deadline {
                return lookup;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    fn state_is(state: TcpState) -> impl Fn(&KernelLookup) -> bool {
        move |lookup| matches!(lookup, KernelLookup::Found(facts) if facts.state == state)
    }

    async fn established_matches_ss(ip: std::net::IpAddr) {
        let view = KernelView::new();
        let (ours, _peer) = connected_pair(ip).await;
        let (local, remote) = pair(&ours);
        let facts = found(view.lookup(local, remote, LOOKUP_TIMEOUT).await);
        assert_eq!(facts.state, TcpState::Established);
        assert!(!facts.state.closed_by_peer() && !facts.state.closed_by_us());
        let info = facts.info.expect("an established socket has tcp_info");
        assert!(info.send_mss > 0 && info.congestion_window > 0, "{info:?}");
        assert_matches_ss(&info, &ss("established", local, remote));
        assert!(view.is_available());
    }

    #[tokio::test]
    async fn finds_established_ipv4_socket_as_ss_shows_it() {
        established_matches_ss(Ipv4Addr::LOCALHOST.into()).await;
    }

    #[tokio::test]
    async fn finds_established_ipv6_socket_as_ss_shows_it() {
        established_matches_ss(Ipv6Addr::LOCALHOST.into()).await;
    }

    #[tokio::test]
    async fn peer_closing_first_shows_close_wait_then_the_socket_is_gone() {
        let view = KernelView::new();
        let (ours, peer) = connected_pair(Ipv4Addr::LOCALHOST.into()).await;
        let ids = pair(&ours);
        drop(peer);
        let facts = found(wait_for(&view, ids, state_is(TcpState::CloseWait)).await);
        assert_eq!(facts.state, TcpState::CloseWait);
        assert!(facts.state.closed_by_peer() && !facts.state.closed_by_us());
        assert!(facts.info.is_some(), "CLOSE_WAIT is a full socket");

        // Our close: LAST_ACK until the peer's ACK, then gone.
        drop(ours);
        let gone = wait_for(&view, ids, |l| *l == KernelLookup::NotFound).await;
        assert_eq!(gone, KernelLookup::NotFound);
    }

    #[tokio::test]
    async fn closing_first_shows_fin_wait2_then_time_wait_both_dated_without_tcp_info() {
        let view = KernelView::new();
        let (ours, peer) = connected_pair(Ipv4Addr::LOCALHOST.into()).await;
        let ids = pair(&ours);
        let ours_closed = Instant::now();
        drop(ours);
        let facts = found(wait_for(&view, ids, state_is(TcpState::FinWait2)).await);
        assert_eq!(facts.state, TcpState::FinWait2);
        assert!(facts.state.closed_by_us() && !facts.state.closed_by_peer());
        // Closed by the application, FIN_WAIT2 is a time-wait mini socket,
        // whose `tcp_fin_timeout` timer dates our close (jiffies: up to
        // 10 ms either way), and 200 ms later 200 ms more.
        assert_eq!(facts.info, None);
        let first = facts.closed_ago().expect("FIN_WAIT2 timer");
        assert!(
            first <= ours_closed.elapsed() + Duration::from_millis(10),
            "{first:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
        let later = found(view.lookup(ids.0, ids.1, LOOKUP_TIMEOUT).await);
        assert_eq!(later.state, TcpState::FinWait2);
        let later = later.closed_ago().expect("FIN_WAIT2 timer");
        assert!(
            later >= first + Duration::from_millis(190)
                && later <= ours_closed.elapsed() + Duration::from_millis(10),
            "{first:?} then {later:?}"
        );

        drop(peer);
        let closed = Instant::now();
        let facts = found(wait_for(&view, ids, state_is(TcpState::TimeWait)).await);
        assert_eq!(facts.state, TcpState::TimeWait);
        assert!(facts.state.closed_by_us());
        assert_eq!(facts.info, None, "TIME_WAIT sockets have no tcp_info");
        // The TIME_WAIT timer dates the close: just now, then 300 ms later
        // 300 ms more (jiffies: up to 10 ms either way).
        let first = facts.closed_ago().expect("TIME_WAIT timer");
        assert!(
            first <= closed.elapsed() + Duration::from_millis(10),
            "{first:?}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
        let later = found(view.lookup(ids.0, ids.1, LOOKUP_TIMEOUT).await)
            .closed_ago()
            .expect("still in TIME_WAIT");
        assert!(
            later >= first + Duration::from_millis(290)
                && later <= closed.elapsed() + Duration::from_millis(10),
            "{first:?} then {later:?}"
        );
    }

    #[tokio::test]
    async fn counts_a_dropped_syn_as_a_retransmit_like_ss() {
        let mut backlog = FullBacklogListener::start((Ipv4Addr::LOCALHOST, 0).into())
            .await
            .expect("full backlog listener");
        let server = backlog.addr();
        let socket = TcpSocket::new_v4().expect("socket");
        socket
            .bind((Ipv4Addr::LOCALHOST, 0).into())
            .expect("bind client");
        let local = socket.local_addr().expect("client address");
        let started = Instant::now();
        let connect = tokio::spawn(socket.connect(server));

        tokio::time::sleep(Duration::from_millis(300)).await;
        let view = KernelView::new();
        let facts = found(view.lookup(local, server, LOOKUP_TIMEOUT).await);
        assert_eq!(facts.state, TcpState::SynSent, "first SYN dropped");
        let info = facts.info.expect("SYN_SENT is a full socket");
        assert_eq!(info.total_retransmits, 0, "no retransmit before 1 s");

        backlog.release();
        let stream = connect.await.expect("join").expect("connect");
        let took = started.elapsed();
        assert!(
            (Duration::from_millis(900)..Duration::from_millis(1500)).contains(&took),
            "connect took {took:?}, expected the 1 s SYN retransmission"
        );
        assert_eq!(stream.local_addr().expect("local"), local);

        let facts = found(view.lookup(local, server, LOOKUP_TIMEOUT).await);
        assert_eq!(facts.state, TcpState::Established);
        let info = facts.info.expect("tcp_info");
        assert!(info.total_retransmits >= 1, "{info:?}");
        assert_eq!(
            info.total_retransmits,
            ss("established", local, server).retrans_total
        );
    }

    #[tokio::test]
    async fn missing_socket_is_not_found_quickly_and_callbacks_run_on_the_thread() {
        let view = KernelView::new();
        let local: SocketAddr = (Ipv4Addr::LOCALHOST, 1).into();
        let remote: SocketAddr = (Ipv4Addr::LOCALHOST, 2).into();
        let started = Instant::now();
        assert_eq!(
            view.lookup(local, remote, LOOKUP_TIMEOUT).await,
            KernelLookup::NotFound
        );
        assert!(
            started.elapsed() < Duration::from_millis(100),
            "{:?}",
            started.elapsed()
        );

        let (tx, rx) = std::sync::mpsc::channel();
        view.lookup_then(local, remote, move |lookup| {
            let thread = std::thread::current().name().map(str::to_owned);
            let _ = tx.send((lookup, thread));
        });
        let (lookup, thread) = rx.recv_timeout(LOOKUP_TIMEOUT).expect("callback ran");
        assert_eq!(lookup, KernelLookup::NotFound);
        assert_eq!(thread.as_deref(), Some(worker::THREAD_NAME));

        // Mixed families never match a socket.
        let v6: SocketAddr = (Ipv6Addr::LOCALHOST, 2).into();
        assert_eq!(
            view.lookup(local, v6, LOOKUP_TIMEOUT).await,
            KernelLookup::NotFound
        );
    }

    /// Our connected sockets to a peer, from a dump: the socket we hold to
    /// it (in `/proc/self/fd`), not the one to another port nor the peer's
    /// accepted end; none once ours is closed.
    #[tokio::test]
    async fn connected_to_lists_our_socket_to_that_peer_only() {
        let view = KernelView::new();
        let (ours, peer) = connected_pair(Ipv4Addr::LOCALHOST.into()).await;
        let (_other, _other_peer) = connected_pair(Ipv4Addr::LOCALHOST.into()).await;
        let (local, remote) = pair(&ours);
        let unknown: SocketAddr = (Ipv4Addr::new(127, 0, 0, 2), remote.port()).into();
        let ask = |remotes: Vec<SocketAddr>| {
            let (answer, answered) = tokio::sync::oneshot::channel();
            view.connected_to_then(
                remotes,
                Instant::now(),
                || true,
                move |lookup| {
                    let _ = answer.send(lookup);
                },
            );
            answered
        };
        let found = ask(vec![unknown, remote]).await.expect("answered");
        assert_eq!(
            found,
            OwnedLookup::Found(vec![super::super::OwnedSocket {
                local,
                remote,
                state: TcpState::Established,
            }])
        );
        drop(peer);
        let found = wait_for(&view, (local, remote), state_is(TcpState::CloseWait)).await;
        assert!(matches!(found, KernelLookup::Found(_)));
        let closing = ask(vec![remote]).await.expect("answered");
        assert_eq!(
            closing,
            OwnedLookup::Found(vec![super::super::OwnedSocket {
                local,
                remote,
                state: TcpState::CloseWait,
            }]),
            "the peer closed, we hold it: still ours"
        );
        drop(ours);
        assert_eq!(
            ask(vec![remote]).await.expect("answered"),
            OwnedLookup::Found(Vec::new()),
            "closed by us: no file refers to it"
        );
    }

    /// A lookup asked for later is answered once due, while lookups asked
    /// for now pass it; one no longer wanted when due is dropped unanswered.
    #[tokio::test]
    async fn a_later_lookup_waits_for_its_time_and_can_be_dropped() {
        let view = KernelView::new();
        let (ours, _peer) = connected_pair(Ipv4Addr::LOCALHOST.into()).await;
        let (local, remote) = pair(&ours);
        let asked = Instant::now();
        let (answer, answered) = tokio::sync::oneshot::channel();
        view.connected_to_then(
            vec![remote],
            asked + Duration::from_millis(300),
            || true,
            move |lookup| {
                let _ = answer.send((lookup, Instant::now()));
            },
        );
        let (unwanted, dropped) = tokio::sync::oneshot::channel::<OwnedLookup>();
        view.connected_to_then(
            vec![remote],
            asked + Duration::from_millis(100),
            || false,
            move |lookup| {
                let _ = unwanted.send(lookup);
            },
        );
        // Asked for now: answered before the later one is due.
        assert!(matches!(
            view.lookup(local, remote, LOOKUP_TIMEOUT).await,
            KernelLookup::Found(_)
        ));
        assert!(asked.elapsed() < Duration::from_millis(300));
        let (lookup, at) = answered.await.expect("answered");
        assert!(
            at >= asked + Duration::from_millis(300),
            "not before it was due"
        );
        assert!(matches!(lookup, OwnedLookup::Found(v) if v.len() == 1));
        assert!(
            dropped.await.is_err(),
            "the unwanted one was never answered"
        );
    }

    #[tokio::test]
    async fn lookup_times_out_behind_a_slow_callback() {
        let view = KernelView::new();
        let local: SocketAddr = (Ipv4Addr::LOCALHOST, 1).into();
        let remote: SocketAddr = (Ipv4Addr::LOCALHOST, 2).into();
        view.lookup_then(local, remote, |_| {
            std::thread::sleep(Duration::from_millis(300))
        });
        let lookup = view.lookup(local, remote, Duration::from_millis(50)).await;
        assert_eq!(lookup, KernelLookup::TimedOut);
    }

    /// Batched lookups rest on the queue (up to the batch window) until an
    /// urgent one arrives or the window ends; either way every one is
    /// answered, in the order queued.
    #[tokio::test]
    async fn batched_lookups_are_all_answered_in_order() {
        let view = KernelView::new();
        let local: SocketAddr = (Ipv4Addr::LOCALHOST, 1).into();
        let remote: SocketAddr = (Ipv4Addr::LOCALHOST, 2).into();
        assert_eq!(
            view.lookup(local, remote, LOOKUP_TIMEOUT).await,
            KernelLookup::NotFound
        );
        let (tx, rx) = std::sync::mpsc::channel();
        let queue = |i: usize, urgent: bool| {
            let tx = tx.clone();
            let then = move |lookup| {
                let _ = tx.send((i, lookup));
            };
            if urgent {
                view.lookup_then(local, remote, then);
            } else {
                view.lookup_batched(local, remote, then);
            }
        };
        // Batched only: answered when the window ends.
        for i in 0..3 {
            queue(i, false);
        }
        // Batched, then an urgent one that ends the rest.
        for i in 3..6 {
            queue(i, false);
        }
        queue(6, true);
        let answers: Vec<(usize, KernelLookup)> = (0..7)
            .map(|_| rx.recv_timeout(LOOKUP_TIMEOUT).expect("answered"))
            .collect();
        assert_eq!(
            answers.iter().map(|(i, _)| *i).collect::<Vec<_>>(),
            (0..7).collect::<Vec<_>>()
        );
        assert!(answers.iter().all(|(_, l)| *l == KernelLookup::NotFound));
    }

    #[tokio::test]
    async fn a_panicking_callback_does_not_stop_the_thread() {
        let view = KernelView::new();
        let local: SocketAddr = (Ipv4Addr::LOCALHOST, 1).into();
        let remote: SocketAddr = (Ipv4Addr::LOCALHOST, 2).into();
        view.lookup_then(local, remote, |_| {
            panic!("callback panics (expected in this test)")
        });
        // With RUST_BACKTRACE set, the worker symbolizes the panic's
        // backtrace before it takes the next lookup, which under load can
        // outlast the queue's 1 s limit: a lookup queued meanwhile answers
        // TimedOut. A dead thread answers TimedOut for ever, a live one
        // answers NotFound once it is past the panic, so ask until then.
        let deadline = Instant::now() + Duration::from_secs(30);
        let answer = loop {
            let answer = view.lookup(local, remote, Duration::from_secs(5)).await;
            if answer != KernelLookup::TimedOut || Instant::now() > deadline {
                break answer;
            }
        };
        assert_eq!(answer, KernelLookup::NotFound);
        assert!(view.is_available());
    }

    #[tokio::test]
    async fn thread_exits_when_the_view_is_dropped() {
        let view = KernelView::new();
        assert!(view.queue.get().is_none(), "new() starts nothing");
        let local: SocketAddr = (Ipv4Addr::LOCALHOST, 1).into();
        let remote: SocketAddr = (Ipv4Addr::LOCALHOST, 2).into();
        view.lookup(local, remote, LOOKUP_TIMEOUT).await;
        // The thread holds the only other reference to `available`.
        let available = view.available.clone();
        assert_eq!(Arc::strong_count(&available), 3);
        drop(view);
        let deadline = Instant::now() + Duration::from_secs(2);
        while Arc::strong_count(&available) > 1 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(Arc::strong_count(&available), 1, "thread ended");
    }
}

#[cfg(all(test, not(target_os = "linux")))]
mod off_linux_tests {
    use std::net::Ipv4Addr;

    use super::*;

    #[tokio::test]
    async fn every_lookup_is_unavailable_and_runs_on_the_thread() {
        let view = KernelView::new();
        assert!(!view.is_available());
        let local: SocketAddr = (Ipv4Addr::LOCALHOST, 1).into();
        let remote: SocketAddr = (Ipv4Addr::LOCALHOST, 2).into();
        let lookup = view.lookup(local, remote, Duration::from_secs(2)).await;
        assert_eq!(lookup, KernelLookup::Unavailable);
        let (tx, rx) = std::sync::mpsc::channel();
        view.lookup_then(local, remote, move |lookup| {
            let thread = std::thread::current().name().map(str::to_owned);
            let _ = tx.send((lookup, thread));
        });
        let (lookup, thread) = rx.recv_timeout(Duration::from_secs(2)).expect("ran");
        assert_eq!(lookup, KernelLookup::Unavailable);
        assert_eq!(thread.as_deref(), Some(worker::THREAD_NAME));
        assert!(!view.is_available());
    }
}
