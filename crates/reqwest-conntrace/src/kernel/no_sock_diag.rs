//! Stand-in for `sock_diag.rs` on targets other than Linux: opening always
//! fails with [`OffReason::NotLinux`], so every lookup answers
//! `KernelLookup::Unavailable`.

use std::convert::Infallible;
use std::net::SocketAddr;

use super::error::{OffReason, QueryError};
use super::facts::TcpFacts;
use super::owned::DumpedSocket;

/// A sock_diag socket, which cannot exist on this target.
pub(crate) struct SockDiag {
    never: Infallible,
}

impl SockDiag {
    /// Always fails: sock_diag is Linux-only.
    pub(crate) fn open() -> Result<SockDiag, OffReason> {
        Err(OffReason::NotLinux)
    }

    /// Unreachable: no `SockDiag` is ever built here.
    pub(crate) fn proven(&self) -> bool {
        match self.never {}
    }

    /// Unreachable: no `SockDiag` is ever built here.
    pub(crate) fn query(
        &mut self,
        _local: SocketAddr,
        _remote: SocketAddr,
    ) -> Result<Option<TcpFacts>, QueryError> {
        match self.never {}
    }

    /// Unreachable: no `SockDiag` is ever built here.
    pub(crate) fn connected_to(
        &mut self,
        _remotes: &[SocketAddr],
    ) -> Result<Vec<DumpedSocket>, QueryError> {
        match self.never {}
    }
}
