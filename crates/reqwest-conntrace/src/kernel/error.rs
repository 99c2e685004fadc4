//! Why a sock_diag query or the whole kernel view failed.

use std::io;
use std::time::Duration;

/// One sock_diag query failed.
#[derive(Debug, thiserror::Error)]
#[cfg_attr(not(target_os = "linux"), allow(dead_code))] // no queries off Linux
pub(crate) enum QueryError {
    /// No reply within the netlink socket's receive timeout.
    #[error("no sock_diag reply within {0:?}")]
    TimedOut(Duration),
    /// Sending the request or receiving the reply failed.
    #[error("netlink socket I/O failed: {0}")]
    Io(io::Error),
    /// The kernel answered with an error other than "no such socket".
    #[error("the kernel refused the sock_diag query: {0}")]
    Kernel(io::Error),
    /// The reply could not be decoded.
    #[error("undecodable sock_diag reply: {0}")]
    Decode(String),
}

/// Kernel TCP facts are off for good, and why (the reason the one warning
/// logs).
#[derive(Debug, thiserror::Error)]
pub(crate) enum OffReason {
    /// The target has no sock_diag (it is Linux-only).
    #[error("sock_diag (netlink) exists only on Linux")]
    #[cfg_attr(target_os = "linux", allow(dead_code))] // built on other targets only
    NotLinux,
    /// The lookup thread could not be started.
    #[error("cannot start the conntrace-sock-diag thread: {0}")]
    Thread(io::Error),
    /// The netlink socket could not be opened or set up.
    #[error("cannot open a NETLINK_SOCK_DIAG socket: {0}")]
    #[cfg_attr(not(target_os = "linux"), allow(dead_code))] // used on Linux only
    Socket(io::Error),
    /// The kernel answers sock_diag but does not know TCP sockets.
    #[error(
        "the kernel has no sock_diag handler for TCP (tcp_diag module not loaded and not loadable here?)"
    )]
    #[cfg_attr(not(target_os = "linux"), allow(dead_code))] // used on Linux only
    NoTcpHandler,
    /// The first query (the probe of our own listening socket, or the first
    /// lookup) failed.
    #[error("the first sock_diag query failed: {0}")]
    FirstQuery(QueryError),
    /// The lookup thread is gone (it panicked).
    #[error("the conntrace-sock-diag thread has stopped")]
    ThreadGone,
}

impl OffReason {
    /// Expected on this target (no need to warn anyone about it).
    pub(crate) fn is_expected(&self) -> bool {
        matches!(self, OffReason::NotLinux)
    }
}
