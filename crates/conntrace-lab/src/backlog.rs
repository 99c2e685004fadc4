//! `FullBacklogListener`: a listening socket whose accept queue is full, so
//! the kernel drops further SYNs and clients wait out SYN retransmission
//! (Linux: first retransmit after 1 s, then 3 s, 7 s ... after the first
//! SYN). This reproduces incident 4's 1 s / 3 s connect times on loopback.
//!
//! The listener uses a listen backlog of 1 (Linux queues backlog + 1 = 2
//! completed connections), never accepts, and is pre-filled by its own
//! client connections until a further connect does not complete. From then
//! on every new SYN is dropped. [`FullBacklogListener::release`] starts
//! accepting, so the next SYN retransmission of each waiting client
//! succeeds; [`FullBacklogListener::release_to`] also forwards every
//! accepted client connection to an upstream server (e.g. a
//! [`TestServer`](crate::TestServer)), so a request that waited out the
//! retransmission is then answered.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::task::JoinHandle;

use crate::LabError;

/// The listen backlog used (the kernel queues one more than this).
const BACKLOG: u32 = 1;
/// At most this many pre-fill connections are tried.
const MAX_FILL: usize = 16;
/// A pre-fill connect not done within this long counts as dropped (queue full).
const FILL_PROBE_TIMEOUT: Duration = Duration::from_millis(150);

/// A loopback listener whose accept queue is full. Dropping it closes the
/// listener and all connections it holds.
#[derive(Debug)]
pub struct FullBacklogListener {
    addr: SocketAddr,
    listener: Option<TcpListener>,
    fillers: Vec<TcpStream>,
    accepted: Arc<AtomicU64>,
    forwarded: Arc<AtomicU64>,
    release_task: Option<JoinHandle<()>>,
}

impl FullBacklogListener {
    /// Listens on `addr` (e.g. `127.0.0.1:0` or `[::1]:0`; port 0 picks a free
    /// port) and fills its accept queue.
    ///
    /// Takes about 150 ms (one connect probe must time out to prove the queue
    /// is full).
    ///
    /// # Errors
    /// [`LabError::Io`] if the socket cannot be created, bound or listened
    /// on; [`LabError::InvalidConfig`] if the queue never fills (a kernel
    /// that does not drop SYNs on a full queue).
    pub async fn start(addr: SocketAddr) -> Result<FullBacklogListener, LabError> {
        let socket = if addr.is_ipv4() {
            TcpSocket::new_v4()
        } else {
            TcpSocket::new_v6()
        }
        .map_err(|e| LabError::io("create backlog listener socket", e))?;
        socket
            .bind(addr)
            .map_err(|e| LabError::io(format!("bind backlog listener on {addr}"), e))?;
        let listener = socket
            .listen(BACKLOG)
            .map_err(|e| LabError::io("listen on backlog listener", e))?;
        let addr = listener
            .local_addr()
            .map_err(|e| LabError::io("read backlog listener address", e))?;

        let mut fillers = Vec::new();
        let mut full = false;
        for _ in 0..MAX_FILL {
            match tokio::time::timeout(FILL_PROBE_TIMEOUT, TcpStream::connect(addr)).await {
                Ok(Ok(stream)) => fillers.push(stream),
                Ok(Err(e)) => return Err(LabError::io("pre-fill backlog listener", e)),
                Err(_) => {
                    full = true;
                    break;
                }
            }
        }
        if !full {
            return Err(LabError::InvalidConfig(format!(
                "the accept queue of {addr} did not fill after {MAX_FILL} connections"
            )));
        }
        Ok(FullBacklogListener {
            addr,
            listener: Some(listener),
            fillers,
            accepted: Arc::new(AtomicU64::new(0)),
            forwarded: Arc::new(AtomicU64::new(0)),
            release_task: None,
        })
    }

    /// The listening address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// How many of the listener's own connections fill the queue.
    pub fn filler_connections(&self) -> usize {
        self.fillers.len()
    }

    /// Connections accepted since [`release`](Self::release) (fillers included).
    pub fn accepted_after_release(&self) -> u64 {
        self.accepted.load(Ordering::SeqCst)
    }

    /// Client connections forwarded upstream since
    /// [`release_to`](Self::release_to) (fillers excluded).
    pub fn forwarded_connections(&self) -> u64 {
        self.forwarded.load(Ordering::SeqCst)
    }

    /// Starts accepting (and holding open) every queued and future
    /// connection, so clients waiting on a dropped SYN connect at their next
    /// retransmission. Idempotent.
    pub fn release(&mut self) {
        self.start_accepting(Duration::ZERO, None);
    }

    /// Like [`release`](Self::release), but only after `delay`.
    pub fn release_after(&mut self, delay: Duration) {
        self.start_accepting(delay, None);
    }

    /// Like [`release_after`](Self::release_after), and every accepted
    /// client connection (not the listener's own fillers, which are held)
    /// is then copied both ways to `upstream` until either side closes. A
    /// client that waited out a SYN retransmission is so served by the
    /// upstream server. Idempotent (the first release wins).
    pub fn release_to(&mut self, upstream: SocketAddr, delay: Duration) {
        self.start_accepting(delay, Some(upstream));
    }

    fn start_accepting(&mut self, delay: Duration, upstream: Option<SocketAddr>) {
        let Some(listener) = self.listener.take() else {
            return;
        };
        let fillers: HashSet<SocketAddr> = self
            .fillers
            .iter()
            .filter_map(|s| s.local_addr().ok())
            .collect();
        let accepted = self.accepted.clone();
        let forwarded = self.forwarded.clone();
        self.release_task = Some(tokio::spawn(async move {
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            let mut held = Vec::new();
            let mut copies = tokio::task::JoinSet::new();
            loop {
                tokio::select! {
                    accepted_conn = listener.accept() => {
                        let Ok((stream, peer)) = accepted_conn else { break };
                        let _ = stream.set_nodelay(true);
                        accepted.fetch_add(1, Ordering::SeqCst);
                        match upstream {
                            Some(to) if !fillers.contains(&peer) => {
                                forwarded.fetch_add(1, Ordering::SeqCst);
                                copies.spawn(forward(stream, to));
                            }
                            _ => held.push(stream),
                        }
                    }
                    Some(_) = copies.join_next(), if !copies.is_empty() => {}
                }
            }
        }));
    }
}

/// Copies `client` to and from a new connection to `upstream`.
async fn forward(mut client: TcpStream, upstream: SocketAddr) {
    match TcpStream::connect(upstream).await {
        Ok(mut server) => {
            let _ = server.set_nodelay(true);
            let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
        }
        Err(e) => tracing::debug!(error = %e, %upstream, "backlog forward connect failed"),
    }
}

impl Drop for FullBacklogListener {
    fn drop(&mut self) {
        if let Some(task) = self.release_task.take() {
            task.abort();
        }
    }
}
