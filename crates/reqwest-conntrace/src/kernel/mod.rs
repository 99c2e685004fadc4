//! The kernel's view of a TCP socket, asked of Linux through sock_diag
//! (`NETLINK_SOCK_DIAG`, the interface `ss` uses) for one exact (local,
//! remote) address pair, or for this process's connected sockets to given
//! peers, on a dedicated thread so callers never block.
//!
//! - `view`: [`KernelView`], the handle's lookups, and their answer [`KernelLookup`];
//! - `worker`: the `conntrace-sock-diag` thread that answers queued lookups;
//! - `sock_diag`: one netlink socket and the exact-socket query (Linux);
//! - `no_sock_diag`: its stand-in on other targets (always unavailable);
//! - `facts`: [`TcpFacts`], [`TcpInfo`], [`TcpState`] decoded from the replies;
//! - `owned`: this process's connected sockets to given peers (a dump,
//!   checked against `/proc/self/fd`), for a connect whose socket never came back;
//! - `ends`: the end of a watched socket as the kernel reports it when it
//!   frees it (sock_diag's destroy broadcast), on a thread of its own;
//! - `error`: why a query or the whole view failed.

mod ends;
mod error;
mod facts;
#[cfg(not(target_os = "linux"))]
mod no_sock_diag;
mod owned;
#[cfg(target_os = "linux")]
mod sock_diag;
mod view;
mod worker;

#[cfg(not(target_os = "linux"))]
use no_sock_diag as sock_diag;

pub(crate) use ends::{Acknowledged, SocketEnd, SocketEndSink, watch as watch_end};
pub use facts::{TIME_WAIT_LENGTH, TcpFacts, TcpInfo, TcpState};
pub(crate) use owned::{OwnedLookup, OwnedSocket};
pub(crate) use view::{KernelLookup, KernelView};
