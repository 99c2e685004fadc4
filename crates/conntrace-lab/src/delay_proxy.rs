//! `DelayProxy`: a userspace TCP proxy that adds a fixed one-way delay in
//! each direction, to emulate a far server on loopback (kernel netem is not
//! available on our machines).
//!
//! Every chunk read from one side is time-stamped and released to the other
//! side no earlier than `arrival + one_way_delay`. A reader task per
//! direction pushes `(deadline, bytes)` into a channel and a writer task
//! sleeps until each deadline, so chunks keep their order and are not
//! serialised behind each other's delays (a pipeline, like a long wire).
//! EOF (half-close) travels the same way: the writer shuts down its write
//! side at the EOF's deadline.
//!
//! **The TCP handshake.** The client's `connect()` to the proxy completes at
//! once (the kernel answers the SYN on loopback; userspace cannot delay
//! that). To still charge the handshake's round trip, the proxy holds the
//! client's bytes: a chunk leaves for the server no earlier than
//! `accept + RTT + one_way_delay` (RTT = 2 x one-way delay). The first byte
//! of a new connection therefore reaches the server ~1.5 RTT after the
//! client called `connect()`, and the first response arrives ~2 RTT after it,
//! exactly as over a real link with this RTT. What differs is *where* the
//! wait shows up on the client: in the first write/read after connect (e.g.
//! the TLS ClientHello round trip), not inside `connect()` itself.
//! [`DelayProxy::start_without_handshake_delay`] turns this off.
//!
//! The proxy connects to the upstream right after accepting, with
//! `TCP_NODELAY` on both sockets. tokio's 1 ms timer granularity adds up to
//! ~1.5 ms per direction (measured: 50 ms RTT gives 52-53 ms per request).
//! Bandwidth is not limited and there is no emulated slow start.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;

use crate::LabError;

/// Chunks buffered per direction before the reader stops reading
/// (back-pressure towards the sender, like a full TCP window).
const CHANNEL_CHUNKS: usize = 1024;
/// Largest chunk read in one go, bytes.
const READ_CHUNK: usize = 64 * 1024;

/// A running delaying proxy. Dropping it closes the listener and all
/// proxied connections.
#[derive(Debug)]
pub struct DelayProxy {
    addr: SocketAddr,
    upstream: SocketAddr,
    one_way_delay: Duration,
    stats: Arc<Stats>,
    task: Option<JoinHandle<()>>,
}

#[derive(Debug, Default)]
struct Stats {
    accepted: AtomicU64,
    upstream_failures: AtomicU64,
    bytes_to_upstream: AtomicU64,
    bytes_to_client: AtomicU64,
}

impl DelayProxy {
    /// Starts a proxy on `127.0.0.1:0` forwarding to `upstream`, adding
    /// `one_way_delay` to each direction (RTT = 2 x `one_way_delay`) and
    /// charging one RTT for the TCP handshake (see the module docs).
    ///
    /// # Errors
    /// [`LabError::Io`] if the listening socket cannot be bound.
    pub async fn start(upstream: SocketAddr, one_way_delay: Duration) -> Result<Self, LabError> {
        Self::start_inner(upstream, one_way_delay, true).await
    }

    /// As [`DelayProxy::start`], but the TCP handshake costs nothing: only
    /// the per-direction delay applies.
    ///
    /// # Errors
    /// [`LabError::Io`] if the listening socket cannot be bound.
    pub async fn start_without_handshake_delay(
        upstream: SocketAddr,
        one_way_delay: Duration,
    ) -> Result<Self, LabError> {
        Self::start_inner(upstream, one_way_delay, false).await
    }

    async fn start_inner(
        upstream: SocketAddr,
        one_way_delay: Duration,
        handshake_delay: bool,
    ) -> Result<Self, LabError> {
        let bind = if upstream.is_ipv6() {
            SocketAddr::from((std::net::Ipv6Addr::LOCALHOST, 0))
        } else {
            SocketAddr::from((Ipv4Addr::LOCALHOST, 0))
        };
        let listener = TcpListener::bind(bind)
            .await
            .map_err(|e| LabError::io(format!("bind delay proxy on {bind}"), e))?;
        let addr = listener
            .local_addr()
            .map_err(|e| LabError::io("read delay proxy address", e))?;
        let stats = Arc::new(Stats::default());
        let handshake = if handshake_delay {
            one_way_delay * 2
        } else {
            Duration::ZERO
        };
        let task = tokio::spawn(accept_loop(
            listener,
            upstream,
            one_way_delay,
            handshake,
            stats.clone(),
        ));
        Ok(Self {
            addr,
            upstream,
            one_way_delay,
            stats,
            task: Some(task),
        })
    }

    /// The proxy's listening address (IPv4 loopback, or IPv6 loopback when
    /// the upstream is IPv6).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The address connections are forwarded to.
    pub fn upstream(&self) -> SocketAddr {
        self.upstream
    }

    /// The delay added to each direction.
    pub fn one_way_delay(&self) -> Duration {
        self.one_way_delay
    }

    /// The emulated round-trip time (2 x one-way delay).
    pub fn rtt(&self) -> Duration {
        self.one_way_delay * 2
    }

    /// Client connections accepted so far.
    pub fn connections(&self) -> u64 {
        self.stats.accepted.load(Ordering::SeqCst)
    }

    /// Accepted connections whose upstream connect failed (closed at once).
    pub fn upstream_failures(&self) -> u64 {
        self.stats.upstream_failures.load(Ordering::SeqCst)
    }

    /// Bytes delivered to the upstream so far.
    pub fn bytes_to_upstream(&self) -> u64 {
        self.stats.bytes_to_upstream.load(Ordering::SeqCst)
    }

    /// Bytes delivered to clients so far.
    pub fn bytes_to_client(&self) -> u64 {
        self.stats.bytes_to_client.load(Ordering::SeqCst)
    }

    /// Closes the listener and every proxied connection, and waits for that.
    pub async fn shutdown(mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
            let _ = task.await;
        }
    }
}

impl Drop for DelayProxy {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

async fn accept_loop(
    listener: TcpListener,
    upstream: SocketAddr,
    delay: Duration,
    handshake: Duration,
    stats: Arc<Stats>,
) {
    let mut tasks = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((client, _)) => {
                    stats.accepted.fetch_add(1, Ordering::SeqCst);
                    let accepted_at = Instant::now();
                    tasks.spawn(proxy_connection(client, accepted_at, upstream, delay, handshake, stats.clone()));
                }
                Err(e) => {
                    tracing::warn!(error = %e, "delay proxy accept failed");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            },
            Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
        }
    }
}

async fn proxy_connection(
    client: TcpStream,
    accepted_at: Instant,
    upstream: SocketAddr,
    delay: Duration,
    handshake: Duration,
    stats: Arc<Stats>,
) {
    let _ = client.set_nodelay(true);
    let server = match TcpStream::connect(upstream).await {
        Ok(s) => s,
        Err(e) => {
            tracing::debug!(error = %e, %upstream, "delay proxy upstream connect failed");
            stats.upstream_failures.fetch_add(1, Ordering::SeqCst);
            return;
        }
    };
    let _ = server.set_nodelay(true);
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    let not_before = accepted_at + handshake;
    let up = pipe(
        client_read,
        server_write,
        delay,
        not_before,
        stats.clone(),
        true,
    );
    let down = pipe(server_read, client_write, delay, accepted_at, stats, false);
    tokio::join!(up, down);
}

/// One direction: a reader that time-stamps chunks and a writer that
/// releases each at its deadline.
async fn pipe(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    delay: Duration,
    not_before: Instant,
    stats: Arc<Stats>,
    upstream_bound: bool,
) {
    let (tx, mut rx) = mpsc::channel::<(Instant, Option<Bytes>)>(CHANNEL_CHUNKS);
    let reader = async move {
        let mut buf = vec![0u8; READ_CHUNK];
        loop {
            // A read error ends the direction like an EOF.
            let n: usize = from.read(&mut buf).await.unwrap_or_default();
            let deadline = Instant::now().max(not_before) + delay;
            let chunk = (n > 0).then(|| Bytes::copy_from_slice(&buf[..n]));
            let eof = chunk.is_none();
            if tx.send((deadline, chunk)).await.is_err() || eof {
                return;
            }
        }
    };
    let writer = async move {
        while let Some((deadline, chunk)) = rx.recv().await {
            tokio::time::sleep_until(deadline).await;
            match chunk {
                Some(bytes) => {
                    if to.write_all(&bytes).await.is_err() {
                        return;
                    }
                    let counter = if upstream_bound {
                        &stats.bytes_to_upstream
                    } else {
                        &stats.bytes_to_client
                    };
                    counter.fetch_add(bytes.len() as u64, Ordering::SeqCst);
                }
                None => {
                    let _ = to.shutdown().await;
                    return;
                }
            }
        }
        // The reader is gone without an EOF marker: close our side too.
        let _ = to.shutdown().await;
    };
    tokio::join!(reader, writer);
}
