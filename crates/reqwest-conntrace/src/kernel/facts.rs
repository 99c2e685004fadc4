//! What the kernel says about one TCP socket: its state and, while it is a
//! full socket, a few `struct tcp_info` counters, decoded from sock_diag
//! replies.

use std::sync::OnceLock;
use std::time::Duration;

/// The kernel's view of one TCP socket, from a sock_diag (`NETLINK_SOCK_DIAG`)
/// query for its exact address pair.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct TcpFacts {
    /// The socket's TCP state (`idiag_state` of `struct inet_diag_msg`,
    /// include/uapi/linux/inet_diag.h).
    pub state: TcpState,
    /// Counters from `struct tcp_info` (the `INET_DIAG_INFO` attribute).
    ///
    /// `None` when the kernel sends none, which it does for every socket
    /// that is no longer a full socket: `TIME_WAIT`, and also `FIN_WAIT2`
    /// once the application has closed the socket (the kernel then keeps
    /// only a time-wait "mini socket" whose diag state is `FIN_WAIT2`), and
    /// request sockets (`NEW_SYN_RECV`). While the socket is in `SYN_SENT`
    /// it is present but holds the kernel's initial values (RTT 0, MSS 524),
    /// except `total_retransmits`, which counts SYN retransmissions.
    pub info: Option<TcpInfo>,
    /// Bytes received and not yet read by the application
    /// (`idiag_rqueue` of `struct inet_diag_msg`: `rcv_nxt - copied_seq`,
    /// net/ipv4/tcp_diag.c; `ss`: `Recv-Q`); 0 for `TIME_WAIT` sockets.
    pub receive_queue: u32,
    /// Time left on the socket's `TIME_WAIT` timer (`idiag_expires` when
    /// `idiag_timer` is 3, in ms); `None` in every other state. The timer
    /// runs [`TIME_WAIT_LENGTH`] from the moment both sides had closed, so
    /// `TIME_WAIT_LENGTH - left` is how long ago the connection ended
    /// (see [`TcpFacts::closed_ago`]).
    pub time_wait_left: Option<Duration>,
    /// Time left on the timer of a `FIN_WAIT2` socket the application has
    /// closed (the kernel's time-wait "mini socket" in its `FIN_WAIT2`
    /// substate: `idiag_expires` when `idiag_timer` is 3, in ms); `None` in
    /// every other state, and for a `FIN_WAIT2` socket still open. The
    /// timer runs `net.ipv4.tcp_fin_timeout` (default 60 s) from when the
    /// peer acknowledged our FIN (net/ipv4/tcp_input.c,
    /// `tcp_rcv_state_process`), so it dates our close
    /// ([`TcpFacts::closed_ago`]).
    pub fin_wait2_left: Option<Duration>,
}

/// How long Linux keeps a socket in `TIME_WAIT`: `TCP_TIMEWAIT_LEN`
/// (include/net/tcp.h, 60 s, a constant with no sysctl).
pub const TIME_WAIT_LENGTH: Duration = Duration::from_secs(60);

impl TcpFacts {
    /// For a socket our side closed first, how long ago that was, from its
    /// timer; `None` when it has none that dates the close.
    ///
    /// - `FIN_WAIT2` (closed by the application, the peer has not closed
    ///   yet): when the peer acknowledged our FIN, so when we closed it, to
    ///   within one round trip. Its length is read once from
    ///   `/proc/sys/net/ipv4/tcp_fin_timeout`; `None` when that cannot be
    ///   read or is above [`TIME_WAIT_LENGTH`] (the kernel then runs
    ///   another timer first).
    /// - `TIME_WAIT`: when it entered that state, when the peer's FIN
    ///   answered ours; with a peer that closes as soon as it reads our
    ///   FIN (as HTTP servers do), when we closed it, to within one round
    ///   trip. A peer that holds its side open makes this later than our
    ///   close by that long.
    pub fn closed_ago(&self) -> Option<Duration> {
        match (self.time_wait_left, self.fin_wait2_left) {
            (Some(left), _) => Some(TIME_WAIT_LENGTH.saturating_sub(left)),
            (None, Some(left)) => fin_timeout().map(|length| length.saturating_sub(left)),
            (None, None) => None,
        }
    }
}

/// `net.ipv4.tcp_fin_timeout` of this process's network namespace, read
/// once; `None` when unreadable, or above [`TIME_WAIT_LENGTH`] (the kernel
/// then keeps the socket whole, on its keep-alive timer, for the excess
/// first: `tcp_rcv_state_process`).
fn fin_timeout() -> Option<Duration> {
    static FIN_TIMEOUT: OnceLock<Option<Duration>> = OnceLock::new();
    *FIN_TIMEOUT.get_or_init(|| {
        let text = std::fs::read_to_string("/proc/sys/net/ipv4/tcp_fin_timeout").ok()?;
        let length = Duration::from_secs(text.trim().parse().ok()?);
        (length <= TIME_WAIT_LENGTH).then_some(length)
    })
}

/// Counters from the kernel's `struct tcp_info` (include/uapi/linux/tcp.h)
/// for one socket, as `ss -ti` shows them.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct TcpInfo {
    /// Smoothed round-trip time, `tcpi_rtt` (kernel unit: µs; `ss` shows it
    /// in ms as the first number of `rtt:`).
    pub rtt: Duration,
    /// Round-trip time variation, `tcpi_rttvar` (kernel unit: µs; `ss`: the
    /// second number of `rtt:`).
    pub rtt_variance: Duration,
    /// Congestion window in segments, `tcpi_snd_cwnd` (`ss`: `cwnd:`).
    pub congestion_window: u32,
    /// Sender maximum segment size in bytes, `tcpi_snd_mss` (`ss`: `mss:`).
    pub send_mss: u32,
    /// Segments retransmitted over the socket's whole life,
    /// `tcpi_total_retrans` (`ss`: the second number of `retrans:`). SYN
    /// retransmissions count: a connect whose first SYN was dropped shows 1.
    pub total_retransmits: u32,
    /// Segments currently presumed lost (sent, not yet acknowledged or
    /// retransmitted), `tcpi_lost` (`ss`: `lost:`). A snapshot, not a total.
    pub lost: u32,
    /// Segments sent and not yet acknowledged, `tcpi_unacked` (`ss`:
    /// `unacked:`). A snapshot: data stuck on the way to the peer.
    pub unacked: u32,
    /// Time since data last arrived from the peer, `tcpi_last_data_recv`
    /// (reported in ms, counted in jiffies: 1 to 10 ms resolution; `ss`:
    /// `lastrcv:`).
    pub since_last_receive: Duration,
}

/// TCP states as numbered in include/net/tcp_states.h (the value of
/// `idiag_state` in a sock_diag reply).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum TcpState {
    /// `TCP_ESTABLISHED` (1): the connection is open.
    Established,
    /// `TCP_SYN_SENT` (2): connecting; our SYN is not answered yet.
    SynSent,
    /// `TCP_SYN_RECV` (3): a server-side full socket finishing its handshake
    /// (briefly, or a TCP Fast Open socket until the client's ACK); half-open
    /// server connections show as [`TcpState::NewSynRecv`].
    SynRecv,
    /// `TCP_FIN_WAIT1` (4): we closed and sent FIN; it is not yet acknowledged.
    FinWait1,
    /// `TCP_FIN_WAIT2` (5): we closed, our FIN was acknowledged; waiting for
    /// the peer's FIN.
    FinWait2,
    /// `TCP_TIME_WAIT` (6): both sides closed, we closed first; the kernel
    /// keeps the address pair reserved (60 s on Linux).
    TimeWait,
    /// `TCP_CLOSE` (7): no connection (a socket not connected yet, or torn down).
    Close,
    /// `TCP_CLOSE_WAIT` (8): the peer closed (sent FIN); we have not closed yet.
    CloseWait,
    /// `TCP_LAST_ACK` (9): the peer closed first, then we did; waiting for
    /// the acknowledgement of our FIN.
    LastAck,
    /// `TCP_LISTEN` (10): a listening socket.
    Listen,
    /// `TCP_CLOSING` (11): both sides sent FIN at the same time (simultaneous
    /// close); waiting for the acknowledgement of ours.
    Closing,
    /// `TCP_NEW_SYN_RECV` (12): a request socket, a server-side connection
    /// in the middle of its handshake.
    NewSynRecv,
    /// `TCP_BOUND_INACTIVE` (13, Linux 6.7+): bound, neither connected nor
    /// listening.
    BoundInactive,
}

impl TcpState {
    /// The state for a kernel state number (include/net/tcp_states.h);
    /// `None` for a number this crate does not know.
    #[cfg_attr(not(target_os = "linux"), allow(dead_code))] // sock_diag only
    pub(crate) fn from_kernel(state: u8) -> Option<TcpState> {
        Some(match state {
            1 => TcpState::Established,
            2 => TcpState::SynSent,
            3 => TcpState::SynRecv,
            4 => TcpState::FinWait1,
            5 => TcpState::FinWait2,
            6 => TcpState::TimeWait,
            7 => TcpState::Close,
            8 => TcpState::CloseWait,
            9 => TcpState::LastAck,
            10 => TcpState::Listen,
            11 => TcpState::Closing,
            12 => TcpState::NewSynRecv,
            13 => TcpState::BoundInactive,
            _ => return None,
        })
    }

    /// The kernel's name in lower snake case, without `TCP_`:
    /// `"established"`, `"close_wait"`, `"fin_wait2"`, ...
    pub fn as_str(self) -> &'static str {
        match self {
            TcpState::Established => "established",
            TcpState::SynSent => "syn_sent",
            TcpState::SynRecv => "syn_recv",
            TcpState::FinWait1 => "fin_wait1",
            TcpState::FinWait2 => "fin_wait2",
            TcpState::TimeWait => "time_wait",
            TcpState::Close => "close",
            TcpState::CloseWait => "close_wait",
            TcpState::LastAck => "last_ack",
            TcpState::Listen => "listen",
            TcpState::Closing => "closing",
            TcpState::NewSynRecv => "new_syn_recv",
            TcpState::BoundInactive => "bound_inactive",
        }
    }

    /// The peer closed first (sent FIN before we did): `CLOSE_WAIT` or
    /// `LAST_ACK`.
    pub fn closed_by_peer(self) -> bool {
        matches!(self, TcpState::CloseWait | TcpState::LastAck)
    }

    /// We closed first (or both at once): `FIN_WAIT1`, `FIN_WAIT2`,
    /// `TIME_WAIT` or `CLOSING`.
    pub fn closed_by_us(self) -> bool {
        matches!(
            self,
            TcpState::FinWait1 | TcpState::FinWait2 | TcpState::TimeWait | TcpState::Closing
        )
    }
}

/// Byte offsets in `struct tcp_info` (include/uapi/linux/tcp.h). All lie in
/// the part of the struct unchanged since Linux 2.6, so the decoder accepts
/// the shorter structs of old kernels and the longer ones of new kernels.
#[cfg_attr(not(target_os = "linux"), allow(dead_code))] // sock_diag only
mod offset {
    /// `__u32 tcpi_snd_mss`.
    pub(super) const SND_MSS: usize = 16;
    /// `__u32 tcpi_unacked`.
    pub(super) const UNACKED: usize = 24;
    /// `__u32 tcpi_lost`.
    pub(super) const LOST: usize = 32;
    /// `__u32 tcpi_last_data_recv` (ms).
    pub(super) const LAST_DATA_RECV: usize = 52;
    /// `__u32 tcpi_rtt` (µs).
    pub(super) const RTT: usize = 68;
    /// `__u32 tcpi_rttvar` (µs).
    pub(super) const RTTVAR: usize = 72;
    /// `__u32 tcpi_snd_cwnd`.
    pub(super) const SND_CWND: usize = 80;
    /// `__u32 tcpi_total_retrans`.
    pub(super) const TOTAL_RETRANS: usize = 100;
}

impl TcpInfo {
    /// Decodes the payload of an `INET_DIAG_INFO` attribute (a `struct
    /// tcp_info` in host byte order); `None` if it is too short to hold
    /// `tcpi_total_retrans`.
    #[cfg_attr(not(target_os = "linux"), allow(dead_code))] // sock_diag only
    pub(crate) fn decode(tcp_info: &[u8]) -> Option<TcpInfo> {
        let u32_at = |at: usize| -> Option<u32> {
            let bytes = tcp_info.get(at..at + 4)?;
            Some(u32::from_ne_bytes(bytes.try_into().ok()?))
        };
        Some(TcpInfo {
            rtt: Duration::from_micros(u64::from(u32_at(offset::RTT)?)),
            rtt_variance: Duration::from_micros(u64::from(u32_at(offset::RTTVAR)?)),
            congestion_window: u32_at(offset::SND_CWND)?,
            send_mss: u32_at(offset::SND_MSS)?,
            total_retransmits: u32_at(offset::TOTAL_RETRANS)?,
            lost: u32_at(offset::LOST)?,
            unacked: u32_at(offset::UNACKED)?,
            since_last_receive: Duration::from_millis(u64::from(u32_at(offset::LAST_DATA_RECV)?)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_round_trip_kernel_numbers_and_names() {
        let mut names = std::collections::HashSet::new();
        for n in 1..=13 {
            let state = TcpState::from_kernel(n).expect("known state");
            assert!(names.insert(state.as_str()), "{state:?} name is unique");
        }
        assert_eq!(TcpState::from_kernel(0), None);
        assert_eq!(TcpState::from_kernel(14), None);
        assert_eq!(
            TcpState::from_kernel(8).map(TcpState::as_str),
            Some("close_wait")
        );
        assert_eq!(TcpState::from_kernel(6), Some(TcpState::TimeWait));
    }

    #[test]
    fn who_closed_first() {
        for n in 1..=13 {
            let state = TcpState::from_kernel(n).expect("known state");
            assert!(
                !(state.closed_by_peer() && state.closed_by_us()),
                "{state:?}"
            );
        }
        assert!(TcpState::CloseWait.closed_by_peer());
        assert!(TcpState::LastAck.closed_by_peer());
        assert!(TcpState::FinWait1.closed_by_us());
        assert!(TcpState::FinWait2.closed_by_us());
        assert!(TcpState::TimeWait.closed_by_us());
        assert!(TcpState::Closing.closed_by_us());
        assert!(!TcpState::Established.closed_by_peer());
        assert!(!TcpState::Established.closed_by_us());
    }

    #[test]
    fn decodes_tcp_info_fields_at_uapi_offsets() {
        // The 104-byte prefix every kernel since 2.6 sends, plus a tail as
        // newer kernels append (ignored).
        let mut raw = vec![0u8; 232];
        let mut put = |at: usize, v: u32| raw[at..at + 4].copy_from_slice(&v.to_ne_bytes());
        put(16, 65483);
        put(24, 4);
        put(32, 2);
        put(52, 1234);
        put(68, 1500);
        put(72, 750);
        put(80, 10);
        put(100, 3);
        let info = TcpInfo::decode(&raw).expect("long enough");
        assert_eq!(
            info,
            TcpInfo {
                rtt: Duration::from_micros(1500),
                rtt_variance: Duration::from_micros(750),
                congestion_window: 10,
                send_mss: 65483,
                total_retransmits: 3,
                lost: 2,
                unacked: 4,
                since_last_receive: Duration::from_millis(1234),
            }
        );
        assert_eq!(TcpInfo::decode(&raw[..104]), Some(info));
        assert_eq!(TcpInfo::decode(&raw[..103]), None);
    }
}
