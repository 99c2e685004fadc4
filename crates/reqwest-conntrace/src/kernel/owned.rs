//! This process's connected TCP sockets to given peers: a sock_diag dump
//! of connected sockets, kept where the peer is one of the asked addresses
//! and the socket's inode is one of this process's open file descriptors
//! (`/proc/self/fd`). The way to learn which address a connect reached
//! when the connection object never came back (the TLS handshake hung or
//! failed after TCP connected).

use std::collections::HashSet;
use std::net::SocketAddr;

use super::facts::TcpState;

/// One connected TCP socket of this process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct OwnedSocket {
    /// The socket's local address.
    pub(crate) local: SocketAddr,
    /// Its peer: one of the asked addresses.
    pub(crate) remote: SocketAddr,
    /// `ESTABLISHED` or `CLOSE_WAIT` (the only states dumped).
    pub(crate) state: TcpState,
}

/// The answer to one owned-sockets lookup.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum OwnedLookup {
    /// This process's connected sockets to the asked peers (maybe none).
    Found(Vec<OwnedSocket>),
    /// sock_diag (or `/proc/self/fd`) does not work here.
    Unavailable,
    /// No complete answer in time (the dump, or the queue wait).
    TimedOut,
}

/// A socket as the dump shows it, before the ownership check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DumpedSocket {
    pub(crate) socket: OwnedSocket,
    /// `idiag_inode`: the socket's inode, 0 once no file refers to it
    /// (closed by the application, an orphan finishing its FIN handshake).
    pub(crate) inode: u64,
}

/// Keeps the dumped sockets whose inode is one of `open`, the socket inodes
/// of this process's open file descriptors. An inode of 0 (no file: an
/// orphan socket) is never kept.
pub(crate) fn owned_by(dumped: &[DumpedSocket], open: &HashSet<u64>) -> Vec<OwnedSocket> {
    dumped
        .iter()
        .filter(|d| d.inode != 0 && open.contains(&d.inode))
        .map(|d| d.socket)
        .collect()
}

/// Which of the socket inodes `wanted` this process has open: the
/// `/proc/self/fd/N` links that read `socket:[INODE]` (proc(5)), read until
/// every wanted inode was seen (in the worst case, a socket that is not
/// ours, every descriptor: linear in the process's open files).
#[cfg_attr(not(target_os = "linux"), allow(dead_code))] // sock_diag only
pub(crate) fn open_socket_inodes(wanted: &HashSet<u64>) -> std::io::Result<HashSet<u64>> {
    let mut found = HashSet::new();
    for entry in std::fs::read_dir("/proc/self/fd")? {
        if found.len() == wanted.len() {
            break;
        }
        // An fd closed between the listing and the readlink is skipped.
        let Ok(target) = std::fs::read_link(entry?.path()) else {
            continue;
        };
        if let Some(inode) = socket_inode(&target.to_string_lossy())
            && wanted.contains(&inode)
        {
            found.insert(inode);
        }
    }
    Ok(found)
}

/// The inode in a `/proc/<pid>/fd` link text `socket:[INODE]`.
fn socket_inode(link: &str) -> Option<u64> {
    link.strip_prefix("socket:[")?
        .strip_suffix(']')?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dumped(remote_port: u16, inode: u64) -> DumpedSocket {
        DumpedSocket {
            socket: OwnedSocket {
                local: SocketAddr::from(([127, 0, 0, 1], 40000 + remote_port)),
                remote: SocketAddr::from(([127, 0, 0, 1], remote_port)),
                state: TcpState::Established,
            },
            inode,
        }
    }

    #[test]
    fn parses_socket_links_only() {
        assert_eq!(socket_inode("socket:[123456]"), Some(123456));
        assert_eq!(socket_inode("pipe:[123456]"), None);
        assert_eq!(socket_inode("/dev/null"), None);
        assert_eq!(socket_inode("socket:[]"), None);
    }

    #[test]
    fn keeps_sockets_with_an_open_inode_never_orphans() {
        let open: HashSet<u64> = [7, 9].into_iter().collect();
        let all = [dumped(1, 7), dumped(2, 8), dumped(3, 0), dumped(4, 9)];
        let kept: Vec<u16> = owned_by(&all, &open)
            .iter()
            .map(|s| s.remote.port())
            .collect();
        assert_eq!(kept, vec![1, 4]);
    }

    /// A socket this test holds is found among this process's open
    /// descriptors, an inode no descriptor has is not; once closed, neither.
    #[cfg(target_os = "linux")]
    #[test]
    fn a_socket_of_ours_is_found_until_closed() {
        use std::os::unix::fs::MetadataExt;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        // The socket's inode, as fstat on its descriptor gives it.
        let fd = std::os::fd::AsFd::as_fd(&listener)
            .try_clone_to_owned()
            .expect("dup");
        let inode = std::fs::File::from(fd).metadata().expect("fstat").ino();
        let wanted: HashSet<u64> = [inode, u64::MAX].into_iter().collect();
        let found = open_socket_inodes(&wanted).expect("/proc/self/fd");
        assert_eq!(found, [inode].into_iter().collect(), "ours, not the other");
        drop(listener);
        assert!(
            open_socket_inodes(&wanted)
                .expect("/proc/self/fd")
                .is_empty()
        );
    }
}
