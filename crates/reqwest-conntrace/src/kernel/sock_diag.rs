//! One `NETLINK_SOCK_DIAG` socket and the exact-socket query over it
//! (`SOCK_DIAG_BY_FAMILY` with an `inet_diag_req_v2`, as `ss` sends, but
//! for one address pair instead of a dump). Linux only.

use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use netlink_packet_core::{
    NLM_F_DUMP, NLM_F_REQUEST, NetlinkBuffer, NetlinkHeader, NetlinkMessage, NetlinkPayload,
};
use netlink_packet_sock_diag::SockDiagMessage;
use netlink_packet_sock_diag::constants::{AF_INET, AF_INET6, IPPROTO_TCP};
use netlink_packet_sock_diag::inet::nlas::Nla;
use netlink_packet_sock_diag::inet::{
    ExtensionFlags, InetRequest, InetResponse, SocketId, StateFlags,
};
use netlink_sys::protocols::NETLINK_SOCK_DIAG;
use netlink_sys::{Socket, SocketAddr as NetlinkAddr};

use super::error::{OffReason, QueryError};
use super::facts::{TcpFacts, TcpInfo, TcpState};
use super::owned::{DumpedSocket, OwnedSocket};

/// How long one `recv` on the netlink socket may block (`SO_RCVTIMEO`).
/// The kernel answers an exact-socket query while handling our `send`, so
/// the reply is normally queued before `recv` is even called.
pub(crate) const RECV_TIMEOUT: Duration = Duration::from_millis(100);

/// `idiag_states` bit mask: every state of include/net/tcp_states.h (bits
/// 1 to 13, `TCP_ESTABLISHED` to `TCP_BOUND_INACTIVE`), `TIME_WAIT` and
/// `NEW_SYN_RECV` included.
const ALL_STATES: u32 = (1 << 14) - 2;

/// `idiag_cookie` value meaning "no cookie, match by addresses only"
/// (`INET_DIAG_NOCOOKIE`, include/uapi/linux/inet_diag.h).
const NO_COOKIE: [u8; 8] = [0xff; 8];

/// `idiag_states` bit mask of a connected socket's states, the only ones
/// [`SockDiag::connected_to`] dumps: `TCP_ESTABLISHED` (1) and
/// `TCP_CLOSE_WAIT` (8) (include/net/tcp_states.h).
const CONNECTED_STATES: u32 = (1 << 1) | (1 << 8);

/// How long a whole dump may take before it is given up.
const DUMP_TIMEOUT: Duration = Duration::from_millis(500);

/// Receive buffer of a dump: the kernel fills each datagram of a dump up
/// to 32 KiB (`netlink_dump`), as `ss` reads them.
const DUMP_BUFFER: usize = 64 * 1024;

/// Receive buffer: one reply is a netlink header, an `inet_diag_msg` and a
/// few attributes (`tcp_info` is under 300 bytes), far below this.
const RECV_BUFFER: usize = 8192;

/// An open sock_diag socket.
pub(crate) struct SockDiag {
    socket: Socket,
    /// Sequence number of the last request; replies to older ones are skipped.
    seq: u32,
    /// Some query got a well-formed answer, so later errors are passing
    /// trouble, not a kernel (or sandbox) without sock_diag.
    proven: bool,
    recv_buf: Vec<u8>,
}

impl SockDiag {
    /// Opens the socket, bounds its `send`/`recv` time, and probes it by
    /// looking up a listening socket of our own on 127.0.0.1 (skipped when
    /// no such socket can be bound: then the first lookup is the probe).
    pub(crate) fn open() -> Result<SockDiag, OffReason> {
        let mut socket = Socket::new(NETLINK_SOCK_DIAG).map_err(OffReason::Socket)?;
        socket.bind_auto().map_err(OffReason::Socket)?;
        socket
            .connect(&NetlinkAddr::new(0, 0))
            .map_err(OffReason::Socket)?;
        let timeouts = socket2::SockRef::from(&socket);
        timeouts
            .set_read_timeout(Some(RECV_TIMEOUT))
            .map_err(OffReason::Socket)?;
        timeouts
            .set_write_timeout(Some(RECV_TIMEOUT))
            .map_err(OffReason::Socket)?;
        let mut diag = SockDiag {
            socket,
            seq: 0,
            proven: false,
            recv_buf: Vec::with_capacity(RECV_BUFFER),
        };
        diag.probe()?;
        Ok(diag)
    }

    /// Looks up our own listening socket: it must be found, in `LISTEN`.
    fn probe(&mut self) -> Result<(), OffReason> {
        let Ok(listener) = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)) else {
            return Ok(());
        };
        let Ok(local) = listener.local_addr() else {
            return Ok(());
        };
        // A listening socket's id has the unspecified address and port 0 as
        // its destination.
        let unconnected = SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0));
        match self.query(local, unconnected) {
            Ok(Some(facts)) if facts.state == TcpState::Listen => Ok(()),
            Ok(Some(facts)) => Err(OffReason::FirstQuery(QueryError::Decode(format!(
                "our listening socket {local} shows as {}",
                facts.state.as_str()
            )))),
            Ok(None) => Err(OffReason::NoTcpHandler),
            Err(e) => Err(OffReason::FirstQuery(e)),
        }
    }

    /// Some query got a well-formed answer on this socket.
    pub(crate) fn proven(&self) -> bool {
        self.proven
    }

    /// The kernel's facts about the TCP socket whose local address is
    /// `local` and whose peer is `remote`; `Ok(None)` when there is none.
    pub(crate) fn query(
        &mut self,
        local: SocketAddr,
        remote: SocketAddr,
    ) -> Result<Option<TcpFacts>, QueryError> {
        let family = match (local.ip(), remote.ip()) {
            (IpAddr::V4(_), IpAddr::V4(_)) => AF_INET,
            (IpAddr::V6(_), IpAddr::V6(_)) => AF_INET6,
            // No socket has an IPv4 end and an IPv6 end.
            _ => return Ok(None),
        };
        self.seq = self.seq.wrapping_add(1);
        let seq = self.seq;
        self.send_request(family, local, remote, seq)?;

        let deadline = Instant::now() + RECV_TIMEOUT;
        loop {
            self.recv_buf.clear();
            match self.socket.recv(&mut self.recv_buf, 0) {
                Ok(_) => {}
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    return Err(QueryError::TimedOut(RECV_TIMEOUT));
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(QueryError::Io(e)),
            }
            if let Some(answer) = answer_in(&self.recv_buf, seq, local, remote) {
                if answer.is_ok() {
                    self.proven = true;
                }
                return answer;
            }
            if Instant::now() >= deadline {
                return Err(QueryError::TimedOut(RECV_TIMEOUT));
            }
        }
    }

    /// Every connected (`ESTABLISHED` or `CLOSE_WAIT`) TCP socket of the
    /// machine whose peer is one of `remotes`, with its inode: one dump
    /// (`NLM_F_DUMP`) per address family and peer port asked. The kernel
    /// sends only sockets with that peer port (`inet_diag_dump_icsk` skips
    /// others when `idiag_dport` is set) but walks all its connected
    /// sockets to find them (there is no index by peer); the addresses are
    /// matched here.
    pub(crate) fn connected_to(
        &mut self,
        remotes: &[SocketAddr],
    ) -> Result<Vec<DumpedSocket>, QueryError> {
        let mut found = Vec::new();
        let mut dumps: Vec<(bool, u16)> = remotes.iter().map(|r| (r.is_ipv4(), r.port())).collect();
        dumps.sort_unstable();
        dumps.dedup();
        for (v4, port) in dumps {
            let family = if v4 { AF_INET } else { AF_INET6 };
            self.seq = self.seq.wrapping_add(1);
            let seq = self.seq;
            let mut header = NetlinkHeader::default();
            header.flags = NLM_F_REQUEST | NLM_F_DUMP;
            header.sequence_number = seq;
            let request = SockDiagMessage::InetRequest(InetRequest {
                family,
                protocol: IPPROTO_TCP,
                extensions: ExtensionFlags::empty(),
                states: StateFlags::from_bits_retain(CONNECTED_STATES),
                socket_id: SocketId {
                    destination_port: port,
                    ..if v4 {
                        SocketId::new_v4()
                    } else {
                        SocketId::new_v6()
                    }
                },
            });
            let mut message = NetlinkMessage::new(header, NetlinkPayload::from(request));
            message.finalize();
            let mut bytes = vec![0; message.buffer_len()];
            message.serialize(&mut bytes);
            self.socket.send(&bytes, 0).map_err(QueryError::Io)?;

            let deadline = Instant::now() + DUMP_TIMEOUT;
            let mut buf = Vec::with_capacity(DUMP_BUFFER);
            loop {
                buf.clear();
                match self.socket.recv(&mut buf, 0) {
                    Ok(_) => {}
                    Err(e)
                        if matches!(
                            e.kind(),
                            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                        ) =>
                    {
                        return Err(QueryError::TimedOut(RECV_TIMEOUT));
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(QueryError::Io(e)),
                }
                if dump_part(&buf, seq, remotes, &mut found)? {
                    self.proven = true;
                    break;
                }
                if Instant::now() >= deadline {
                    return Err(QueryError::TimedOut(DUMP_TIMEOUT));
                }
            }
        }
        Ok(found)
    }

    /// Sends the `inet_diag_req_v2` for exactly this address pair, asking
    /// for `tcp_info` (`INET_DIAG_INFO`).
    fn send_request(
        &self,
        family: u8,
        local: SocketAddr,
        remote: SocketAddr,
        seq: u32,
    ) -> Result<(), QueryError> {
        let mut header = NetlinkHeader::default();
        // No NLM_F_DUMP: an exact lookup, answered by one message (the
        // socket, or an error: ENOENT when there is no such socket).
        header.flags = NLM_F_REQUEST;
        header.sequence_number = seq;
        let request = SockDiagMessage::InetRequest(InetRequest {
            family,
            protocol: IPPROTO_TCP,
            extensions: ExtensionFlags::INFO,
            states: StateFlags::from_bits_retain(ALL_STATES),
            socket_id: SocketId {
                source_port: local.port(),
                destination_port: remote.port(),
                source_address: local.ip(),
                destination_address: remote.ip(),
                interface_id: 0,
                cookie: NO_COOKIE,
            },
        });
        let mut message = NetlinkMessage::new(header, NetlinkPayload::from(request));
        message.finalize();
        let mut bytes = vec![0; message.buffer_len()];
        message.serialize(&mut bytes);
        self.socket.send(&bytes, 0).map_err(QueryError::Io)?;
        Ok(())
    }
}

/// The answer to request `seq` in one received datagram, if it holds it.
fn answer_in(
    datagram: &[u8],
    seq: u32,
    local: SocketAddr,
    remote: SocketAddr,
) -> Option<Result<Option<TcpFacts>, QueryError>> {
    let mut rest = datagram;
    while !rest.is_empty() {
        let Ok(buffer) = NetlinkBuffer::new_checked(rest) else {
            return Some(Err(QueryError::Decode(format!(
                "truncated netlink message ({} bytes left)",
                rest.len()
            ))));
        };
        // new_checked guarantees header size <= length <= rest.len().
        let length = buffer.length() as usize;
        let message = &rest[..length];
        // Messages are 4-byte aligned (NLMSG_ALIGN).
        rest = rest.get(length.next_multiple_of(4)..).unwrap_or_default();
        if buffer.sequence_number() != seq {
            continue; // a late reply to an earlier, timed-out request
        }
        let parsed = match NetlinkMessage::<SockDiagMessage>::deserialize(message) {
            Ok(parsed) => parsed,
            Err(e) => return Some(Err(QueryError::Decode(e.to_string()))),
        };
        match parsed.payload {
            NetlinkPayload::InnerMessage(SockDiagMessage::InetResponse(response)) => {
                return Some(facts(&response, message, local, remote));
            }
            NetlinkPayload::Error(error) => {
                let error = error.to_io();
                return Some(if error.kind() == io::ErrorKind::NotFound {
                    Ok(None)
                } else {
                    Err(QueryError::Kernel(error))
                });
            }
            NetlinkPayload::Done(_) => return Some(Ok(None)),
            _ => {}
        }
    }
    None
}

/// Adds the sockets to one of `remotes` in one datagram of dump `seq` to
/// `found`; `true` once the dump's end (`NLMSG_DONE`) is in it.
fn dump_part(
    datagram: &[u8],
    seq: u32,
    remotes: &[SocketAddr],
    found: &mut Vec<DumpedSocket>,
) -> Result<bool, QueryError> {
    let mut rest = datagram;
    while !rest.is_empty() {
        let buffer = NetlinkBuffer::new_checked(rest).map_err(|_| {
            QueryError::Decode(format!(
                "truncated netlink message ({} bytes left)",
                rest.len()
            ))
        })?;
        let length = buffer.length() as usize;
        let message = &rest[..length];
        rest = rest.get(length.next_multiple_of(4)..).unwrap_or_default();
        if buffer.sequence_number() != seq {
            continue; // a late reply to an earlier, timed-out request
        }
        let parsed = NetlinkMessage::<SockDiagMessage>::deserialize(message)
            .map_err(|e| QueryError::Decode(e.to_string()))?;
        match parsed.payload {
            NetlinkPayload::InnerMessage(SockDiagMessage::InetResponse(response)) => {
                let id = &response.header.socket_id;
                let remote = SocketAddr::new(id.destination_address, id.destination_port);
                let state = TcpState::from_kernel(response.header.state);
                if let (true, Some(state)) = (remotes.contains(&remote), state) {
                    found.push(DumpedSocket {
                        socket: OwnedSocket {
                            local: SocketAddr::new(id.source_address, id.source_port),
                            remote,
                            state,
                        },
                        inode: u64::from(response.header.inode),
                    });
                }
            }
            NetlinkPayload::Done(_) => return Ok(true),
            NetlinkPayload::Error(error) => return Err(QueryError::Kernel(error.to_io())),
            _ => {}
        }
    }
    Ok(false)
}

/// The facts in a reply, if it is about exactly this address pair. (For a
/// pair with no socket the kernel may answer with the listening socket on
/// the local port, so the pair is checked.)
fn facts(
    response: &InetResponse,
    message: &[u8],
    local: SocketAddr,
    remote: SocketAddr,
) -> Result<Option<TcpFacts>, QueryError> {
    let id = &response.header.socket_id;
    let same_pair = id.source_address == local.ip()
        && id.source_port == local.port()
        && id.destination_address == remote.ip()
        && id.destination_port == remote.port();
    if !same_pair {
        return Ok(None);
    }
    let state = TcpState::from_kernel(response.header.state).ok_or_else(|| {
        QueryError::Decode(format!("unknown TCP state {}", response.header.state))
    })?;
    let info = response.nlas.iter().find_map(|nla| match nla {
        Nla::TcpInfo(bytes) => TcpInfo::decode(bytes),
        _ => None,
    });
    Ok(Some(TcpFacts {
        state,
        info,
        receive_queue: response.header.recv_queue,
        // A FIN_WAIT2 mini socket shows the same timer, run from
        // `tcp_fin_timeout` instead of TIME_WAIT's fixed length.
        time_wait_left: if state == TcpState::TimeWait {
            mini_socket_timer_left(message)
        } else {
            None
        },
        fin_wait2_left: if state == TcpState::FinWait2 {
            mini_socket_timer_left(message)
        } else {
            None
        },
    }))
}

/// `idiag_timer` and `idiag_expires` of the `struct inet_diag_msg` in a
/// reply (include/uapi/linux/inet_diag.h: after the 16-byte netlink
/// header, `idiag_timer` is byte 2 and the `__u32 idiag_expires` (ms)
/// follows the 48-byte `inet_diag_sockid` at byte 52). netlink-packet-sock-diag
/// decodes the timer but drops the time left on a `TIME_WAIT` one.
const NETLINK_HEADER: usize = 16;
const TIMER_AT: usize = NETLINK_HEADER + 2;
const EXPIRES_AT: usize = NETLINK_HEADER + 52;
/// `idiag_timer` value of a time-wait mini socket's timer (`TIME_WAIT`,
/// or `FIN_WAIT2` once the application closed it): net/ipv4/inet_diag.c,
/// `inet_twsk_diag_fill`.
const TIMER_TIME_WAIT: u8 = 3;

/// The time left on a time-wait mini socket's timer in this reply, if that
/// is its timer.
fn mini_socket_timer_left(message: &[u8]) -> Option<Duration> {
    if *message.get(TIMER_AT)? != TIMER_TIME_WAIT {
        return None;
    }
    let bytes = message.get(EXPIRES_AT..EXPIRES_AT + 4)?;
    Some(Duration::from_millis(u64::from(u32::from_ne_bytes(
        bytes.try_into().ok()?,
    ))))
}
