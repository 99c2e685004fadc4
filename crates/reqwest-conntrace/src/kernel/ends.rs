//! The end of a watched TCP socket as the kernel reports it when it frees
//! the socket: sock_diag's destroy broadcast (`SKNLGRP_INET_TCP_DESTROY`,
//! `SKNLGRP_INET6_TCP_DESTROY`; net/core/sock_diag.c,
//! `sock_diag_broadcast_destroy`), which any process may join, and which
//! carries the socket's last `tcp_info`. A socket found gone at a miss
//! leaves nothing else behind: this report says when it ended relative to
//! its last data each way, which tells a close of ours from the server's
//! over TLS (see `pool::end_report`), and keeps the evidence of a stall for a
//! request that gave up on a connection hyper closed before the kernel
//! was asked (see `request::stall_evidence`).
//!
//! One `conntrace-tcp-ends` thread per process listens while sockets are
//! watched (it exits after [`IDLE_EXIT`] with none); a socket's report goes
//! to the [`SocketEndSink`] it was watched with, and only watched sockets
//! are kept (the broadcast covers every TCP socket of the network
//! namespace). Off Linux, or where the broadcast cannot be joined, nothing
//! is watched ([`watch`] answers `false`).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

/// What the kernel reported of a watched socket when it freed it.
#[cfg_attr(not(target_os = "linux"), allow(dead_code))] // built by the Linux watch only
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SocketEnd {
    /// When this process read the report: no earlier than the socket's
    /// end, later by the broadcast's and this thread's scheduling delay.
    pub(crate) seen_at: Instant,
    /// Time from the last data the socket received to its end
    /// (`tcpi_last_data_recv`, ms, counted in jiffies: 1 to 10 ms
    /// resolution). Data the kernel refused because our side had closed
    /// (the reset of `TCPAbortOnData`) does not count.
    pub(crate) since_last_receive: Duration,
    /// Time from the last data the socket sent to its end
    /// (`tcpi_last_data_sent`, same units). A bare FIN is no data; a TLS
    /// close_notify is.
    pub(crate) since_last_send: Duration,
    /// Time from the last acknowledgement the socket received to its end
    /// (`tcpi_last_ack_recv`, same units): any segment that acknowledged
    /// no less than before counts (net/ipv4/tcp_input.c, `tcp_ack` sets
    /// `rcv_tstamp`), a bare FIN or a data segment the kernel then refused
    /// included.
    pub(crate) since_last_ack: Duration,
    /// What the peer had acknowledged of what the socket sent.
    pub(crate) acknowledged: Acknowledged,
    /// Bytes the socket received that this process never read, a FIN
    /// counting one (`idiag_rqueue`: `rcv_nxt - copied_seq`, which closing
    /// the socket leaves as it was; net/ipv4/tcp_diag.c,
    /// `tcp_diag_get_info`). More than one: data came after the process
    /// stopped reading, as a server's close_notify answering ours after
    /// our pool shut the connection down.
    pub(crate) unread: u32,
    /// The smoothed round-trip time at the end (`tcpi_rtt`, µs).
    pub(crate) rtt: Duration,
    /// Segments sent and not acknowledged at the end (`tcpi_unacked`).
    pub(crate) unacked: u32,
    /// Segments retransmitted over the socket's life
    /// (`tcpi_total_retrans`).
    pub(crate) retransmits: u32,
}

impl SocketEnd {
    /// Whether data came that the process never read ([`Self::unread`]
    /// above the one a FIN counts): after hyper shut the connection down,
    /// as a server's close_notify answering ours.
    pub(crate) fn has_unread_data(&self) -> bool {
        self.unread > 1
    }
}

/// What the peer had acknowledged of what a socket sent, when it ended:
/// `tcpi_bytes_acked` (which counts the sequence numbers the SYN and a FIN
/// take, one each) against the data sent once (`tcpi_bytes_sent` less
/// `tcpi_bytes_retrans`; Linux 4.19+).
#[cfg_attr(not(target_os = "linux"), allow(dead_code))] // built by the Linux watch only
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Acknowledged {
    /// Every byte and our FIN: the peer was still reading when we closed.
    DataAndFin,
    /// Every byte, not a FIN (none sent, or not acknowledged yet).
    Data,
    /// Not every byte: the last data sent was never acknowledged (the
    /// peer's socket was closed when it came, and answered with a reset).
    NotAllData,
}

/// Who gets a watched socket's [`SocketEnd`].
pub(crate) trait SocketEndSink: Send + Sync {
    /// The kernel freed the socket; called once, on the watch thread.
    fn socket_ended(&self, end: SocketEnd);
}

/// How long the watch thread lives with no socket watched.
#[cfg_attr(not(target_os = "linux"), allow(dead_code))] // built by the Linux watch only
const IDLE_EXIT: Duration = Duration::from_secs(10);

/// Receive errors in a row after which the thread gives up (until the
/// next [`watch`]).
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
const MAX_FAILURES: u32 = 100;

/// Most sockets watched at once; past it (after forgetting those whose
/// sink is gone) a socket is not watched, and its end is read as it is
/// without the report.
const MAX_WATCHED: usize = 65_536;

type Pair = (SocketAddr, SocketAddr);

/// The key a watched socket is kept under: a 64-bit fingerprint of its
/// address pair (24 bytes an entry with its sink, where the pair itself
/// would take 80). Two watched pairs sharing one is a 2^-64 chance per
/// pair of pairs; the later watch then replaces the earlier.
fn fingerprint(pair: &Pair) -> u64 {
    use std::hash::{Hash as _, Hasher as _};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    pair.hash(&mut hasher);
    hasher.finish()
}

#[derive(Default)]
struct Watched {
    /// By [`fingerprint`] of the socket's address pair.
    sockets: HashMap<u64, Weak<dyn SocketEndSink>>,
    /// The thread is running (or starting).
    running: bool,
    /// The broadcast cannot be joined here: nothing is watched.
    off: bool,
}

static WATCHED: Mutex<Option<Watched>> = Mutex::new(None);

fn watched() -> MutexGuard<'static, Option<Watched>> {
    WATCHED.lock().unwrap_or_else(|e| e.into_inner())
}

/// Watches the TCP socket from `local` to `remote`: its end goes to `sink`
/// (when it is still alive then). `false` when it is not watched (off
/// Linux, the broadcast cannot be joined, or [`MAX_WATCHED`]). Never
/// blocks on the kernel: the thread is started, not waited for.
pub(crate) fn watch(local: SocketAddr, remote: SocketAddr, sink: Weak<dyn SocketEndSink>) -> bool {
    if !cfg!(target_os = "linux") {
        return false;
    }
    let mut guard = watched();
    let w = guard.get_or_insert_with(Watched::default);
    if w.off {
        return false;
    }
    if w.sockets.len() >= MAX_WATCHED {
        w.sockets.retain(|_, sink| sink.strong_count() > 0);
        if w.sockets.len() >= MAX_WATCHED {
            return false;
        }
    }
    w.sockets.insert(fingerprint(&(local, remote)), sink);
    if !w.running {
        w.running = true;
        let started = std::thread::Builder::new()
            .name("conntrace-tcp-ends".into())
            .spawn(listen);
        if started.is_err() {
            w.running = false;
            w.off = true;
            w.sockets.clear();
            return false;
        }
    }
    true
}

/// Hands `end` of the socket `pair` to its sink, if it was watched.
#[cfg_attr(not(target_os = "linux"), allow(dead_code))] // built by the Linux watch only
fn report(pair: Pair, end: SocketEnd) {
    let sink = watched()
        .as_mut()
        .and_then(|w| w.sockets.remove(&fingerprint(&pair)))
        .and_then(|sink| sink.upgrade());
    if let Some(sink) = sink {
        sink.socket_ended(end);
    }
}

/// The thread stops: for good when `off` (the broadcast cannot be
/// joined), else until the next [`watch`].
fn stop(off: bool) {
    if let Some(w) = watched().as_mut() {
        w.running = false;
        if off {
            w.off = true;
            w.sockets.clear();
        }
    }
}

/// Whether the thread should exit: nothing watched since `idle_since`
/// for [`IDLE_EXIT`] (marked stopped under the same lock a new watch
/// takes, so none is left without a thread).
#[cfg_attr(not(target_os = "linux"), allow(dead_code))] // built by the Linux watch only
fn exit_when_idle(idle_since: &mut Option<Instant>) -> bool {
    let mut guard = watched();
    let Some(w) = guard.as_mut() else {
        return true;
    };
    if !w.sockets.is_empty() {
        *idle_since = None;
        return false;
    }
    let since = *idle_since.get_or_insert_with(Instant::now);
    if since.elapsed() >= IDLE_EXIT {
        w.running = false;
        return true;
    }
    false
}

#[cfg(target_os = "linux")]
fn listen() {
    use netlink_packet_core::{NetlinkBuffer, NetlinkMessage, NetlinkPayload};
    use netlink_packet_sock_diag::SockDiagMessage;
    use netlink_packet_sock_diag::inet::nlas::Nla;
    use netlink_sys::Socket;
    use netlink_sys::protocols::NETLINK_SOCK_DIAG;

    /// `SKNLGRP_INET_TCP_DESTROY` and `SKNLGRP_INET6_TCP_DESTROY`
    /// (include/uapi/linux/sock_diag.h).
    const GROUPS: [u32; 2] = [1, 3];
    /// Offsets in `struct tcp_info` (include/uapi/linux/tcp.h) beyond
    /// what [`TcpInfo::decode`](crate::kernel::TcpInfo) reads:
    /// `tcpi_last_data_sent` and `tcpi_last_ack_recv` (ms, `__u32`),
    /// `tcpi_bytes_acked`,
    /// `tcpi_bytes_sent` and `tcpi_bytes_retrans` (`__u64`; the last two
    /// since Linux 4.19).
    const LAST_DATA_SENT: usize = 44;
    const LAST_ACK_RECV: usize = 56;
    const BYTES_ACKED: usize = 120;
    const BYTES_SENT: usize = 200;
    const BYTES_RETRANS: usize = 208;

    let open = || -> std::io::Result<Socket> {
        let mut socket = Socket::new(NETLINK_SOCK_DIAG)?;
        socket.bind_auto()?;
        for group in GROUPS {
            socket.add_membership(group)?;
        }
        // Woken at least once a second to see whether anything is watched.
        socket2::SockRef::from(&socket).set_read_timeout(Some(Duration::from_secs(1)))?;
        // Room for a burst of ends (each report is under 400 bytes).
        let _ = socket.set_rx_buf_sz(1 << 20);
        Ok(socket)
    };
    let socket = match open() {
        Ok(socket) => socket,
        Err(e) => {
            tracing::debug!(target: "reqwest_conntrace", "TCP socket ends not watched: {e}");
            stop(true);
            return;
        }
    };
    let mut buf: Vec<u8> = Vec::with_capacity(64 * 1024);
    let mut idle_since = None;
    let mut failures = 0;
    loop {
        buf.clear();
        match socket.recv(&mut buf, 0) {
            Ok(_) => failures = 0,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock
                        | std::io::ErrorKind::TimedOut
                        | std::io::ErrorKind::Interrupted
                ) => {}
            // ENOBUFS (a burst overflowed the buffer: those reports are
            // lost, their sockets read as without one), or worse: given up
            // after a run of them.
            Err(e) => {
                failures += 1;
                if failures >= MAX_FAILURES {
                    tracing::debug!(target: "reqwest_conntrace", "TCP socket ends no longer watched: {e}");
                    stop(false);
                    return;
                }
            }
        }
        let seen_at = Instant::now();
        let mut rest = buf.as_slice();
        while let Ok(message) = NetlinkBuffer::new_checked(rest) {
            let length = message.length() as usize;
            let bytes = &rest[..length];
            rest = rest.get(length.next_multiple_of(4)..).unwrap_or_default();
            let Ok(parsed) = NetlinkMessage::<SockDiagMessage>::deserialize(bytes) else {
                continue;
            };
            let NetlinkPayload::InnerMessage(SockDiagMessage::InetResponse(response)) =
                parsed.payload
            else {
                continue;
            };
            let id = &response.header.socket_id;
            let pair = (
                SocketAddr::new(id.source_address, id.source_port),
                SocketAddr::new(id.destination_address, id.destination_port),
            );
            let Some(info) = response.nlas.iter().find_map(|nla| match nla {
                Nla::TcpInfo(bytes) => Some(bytes.as_slice()),
                _ => None,
            }) else {
                continue;
            };
            let ms_at = |at: usize| -> Option<Duration> {
                let bytes = info.get(at..at + 4)?;
                Some(Duration::from_millis(u64::from(u32::from_ne_bytes(
                    bytes.try_into().ok()?,
                ))))
            };
            let u64_at = |at: usize| -> Option<u64> {
                Some(u64::from_ne_bytes(info.get(at..at + 8)?.try_into().ok()?))
            };
            let acknowledged = (|| {
                let data = u64_at(BYTES_SENT)?.checked_sub(u64_at(BYTES_RETRANS)?)?;
                let acked = u64_at(BYTES_ACKED)?;
                Some(if acked >= data + 2 {
                    Acknowledged::DataAndFin
                } else if acked > data {
                    Acknowledged::Data
                } else {
                    Acknowledged::NotAllData
                })
            })();
            if let (
                Some(since_last_send),
                Some(since_last_ack),
                Some(decoded),
                Some(acknowledged),
            ) = (
                ms_at(LAST_DATA_SENT),
                ms_at(LAST_ACK_RECV),
                crate::kernel::TcpInfo::decode(info),
                acknowledged,
            ) {
                report(
                    pair,
                    SocketEnd {
                        seen_at,
                        since_last_receive: decoded.since_last_receive,
                        since_last_send,
                        since_last_ack,
                        acknowledged,
                        unread: response.header.recv_queue,
                        rtt: decoded.rtt,
                        unacked: decoded.unacked,
                        retransmits: decoded.total_retransmits,
                    },
                );
            }
        }
        if exit_when_idle(&mut idle_since) {
            return;
        }
    }
}

#[cfg(not(target_os = "linux"))]
fn listen() {
    stop(true);
}
