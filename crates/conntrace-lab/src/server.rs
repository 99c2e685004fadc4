//! `TestServer`: a loopback HTTP/1.1 + HTTP/2 server, plain or TLS, that
//! counts connections and handshakes and records every request.
//!
//! Routes (any method): `/delay/<ms>` answers after `<ms>` extra
//! milliseconds, `/bytes/<n>` answers with `n` bytes, `/redirect/<host:port>/<path>`
//! answers `302` with `Location: <scheme>://<host:port>/<path>` (the
//! server's own scheme) and nginx's short HTML body, `/gate/<name>/<n>`
//! holds each response until `n` requests to that same path have arrived
//! (a wave whose requests are all in flight at once; `n` at most
//! 100,000), everything else answers with the configured body (default
//! `ok`). Request bodies are read fully.
//! Every response carries [`HEADER_CONNECTION_ID`], [`HEADER_REQUEST_INDEX`]
//! and [`HEADER_REMOTE_PORT`] so a client can compare its view with the
//! server's.

mod records;
mod service;

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};
use tokio_rustls::TlsAcceptor;

pub use records::{ConnectionEnd, ConnectionRecord, RequestRecord, TlsSessionInfo};
use service::{Activity, ConnCtx, ResponseConfig};

use crate::{LabError, TestPki};

/// Response header: the server's id of the connection that served the request.
pub const HEADER_CONNECTION_ID: &str = "x-conntrace-connection-id";
/// Response header: 1-based index of the request on its connection.
pub const HEADER_REQUEST_INDEX: &str = "x-conntrace-request-index";
/// Response header: the client's port as the server saw it.
pub const HEADER_REMOTE_PORT: &str = "x-conntrace-remote-port";

/// Which TLS protocol versions the server accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TlsVersions {
    /// TLS 1.3 only.
    Tls13Only,
    /// TLS 1.2 only.
    Tls12Only,
    /// TLS 1.2 and 1.3 (the client picks; rustls clients pick 1.3).
    #[default]
    Both,
}

/// Which HTTP versions the server speaks (and advertises via ALPN over TLS).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HttpVersions {
    /// HTTP/1.1 only; ALPN offers `http/1.1`.
    Http1Only,
    /// HTTP/2 only; ALPN offers `h2`; plain HTTP expects h2c prior knowledge.
    Http2Only,
    /// Both; ALPN offers `h2` then `http/1.1`; plain HTTP detects the h2 preface.
    #[default]
    Both,
}

/// Configures and starts a [`TestServer`]. Defaults: `127.0.0.1:0`, plain
/// HTTP, both HTTP versions, keep-alive on, no idle timeout, body `ok`, no delay.
#[derive(Debug, Clone)]
pub struct TestServerBuilder {
    bind: SocketAddr,
    pki: Option<TestPki>,
    tls_versions: TlsVersions,
    http_versions: HttpVersions,
    session_resumption: bool,
    keep_alive: bool,
    idle_timeout: Option<Duration>,
    body: Bytes,
    delay: Duration,
    max_requests: Option<u64>,
    announce_limit: bool,
    idle_reset: bool,
    idle_abrupt: bool,
    stall_after: Option<u64>,
    keep_alive_header: Option<u64>,
}

impl Default for TestServerBuilder {
    fn default() -> Self {
        Self {
            bind: SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
            pki: None,
            tls_versions: TlsVersions::Both,
            http_versions: HttpVersions::Both,
            session_resumption: true,
            keep_alive: true,
            idle_timeout: None,
            body: Bytes::from_static(b"ok"),
            delay: Duration::ZERO,
            max_requests: None,
            announce_limit: true,
            idle_reset: false,
            idle_abrupt: false,
            stall_after: None,
            keep_alive_header: None,
        }
    }
}

impl TestServerBuilder {
    /// The address to listen on (default `127.0.0.1:0`, i.e. a free port);
    /// e.g. `[::1]:0` for IPv6 loopback.
    pub fn bind(mut self, addr: SocketAddr) -> Self {
        self.bind = addr;
        self
    }

    /// Serves HTTPS with `pki`'s leaf certificate (chain: leaf, CA).
    pub fn tls(mut self, pki: &TestPki) -> Self {
        self.pki = Some(pki.clone());
        self
    }

    /// TLS protocol versions accepted (default [`TlsVersions::Both`]); ignored for plain HTTP.
    pub fn tls_versions(mut self, versions: TlsVersions) -> Self {
        self.tls_versions = versions;
        self
    }

    /// HTTP versions spoken (default [`HttpVersions::Both`]).
    pub fn http_versions(mut self, versions: HttpVersions) -> Self {
        self.http_versions = versions;
        self
    }

    /// TLS session resumption (default on): TLS 1.3 stateless tickets (rustls
    /// ring `Ticketer`) and TLS 1.2 session ids (in-memory cache, 1024
    /// entries). Off disables both: no tickets sent, no session cache.
    pub fn session_resumption(mut self, on: bool) -> Self {
        self.session_resumption = on;
        self
    }

    /// HTTP/1 keep-alive (default on). Off: every HTTP/1 response carries
    /// `connection: close` and the server closes the connection after it.
    /// No effect on HTTP/2.
    pub fn keep_alive(mut self, on: bool) -> Self {
        self.keep_alive = on;
        self
    }

    /// Server-side idle timeout: once a connection has had no request in
    /// flight for this long (since its last response finished, or since the
    /// connection was set up), the server shuts it down gracefully (HTTP/1:
    /// closes the socket; HTTP/2: sends GOAWAY and closes). Default: none.
    pub fn idle_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.idle_timeout = timeout;
        self
    }

    /// The default response body length in bytes (filled with `x`); default
    /// is the 2-byte body `ok`.
    pub fn body_size(mut self, bytes: usize) -> Self {
        self.body = Bytes::from(vec![b'x'; bytes]);
        self
    }

    /// Requests per connection before the server ends it (like nginx
    /// `keepalive_requests`): HTTP/1 answers the last one with
    /// `Connection: close` and closes; HTTP/2 sends GOAWAY with it and
    /// closes once it is answered. Default: no limit.
    pub fn max_requests_per_connection(mut self, limit: Option<u64>) -> Self {
        self.max_requests = limit;
        self
    }

    /// Whether HTTP/1's last response under
    /// [`max_requests_per_connection`](Self::max_requests_per_connection)
    /// says `Connection: close`. Off: it does not, and the server closes
    /// the socket (FIN) as soon as that response is written, unannounced,
    /// as some servers and load balancers do; the connection's record
    /// still ends [`ConnectionEnd::RequestLimit`]. Default: on.
    pub fn announce_request_limit(mut self, on: bool) -> Self {
        self.announce_limit = on;
        self
    }

    /// The idle timeout closes connections with a TCP reset (`SO_LINGER`
    /// 0, then close: RST instead of FIN) instead of gracefully. Default: off.
    pub fn idle_close_with_reset(mut self, on: bool) -> Self {
        self.idle_reset = on;
        self
    }

    /// The idle timeout closes the socket at once, with a FIN but without
    /// hyper's graceful shutdown, so over TLS no close_notify goes first
    /// (RFC 8446 section 6.1 asks for one; some servers, proxies closing
    /// an idle `CONNECT` tunnel, and load balancers send none). The
    /// connection's record still ends [`ConnectionEnd::IdleTimeout`].
    /// Default: off (graceful: over TLS, close_notify then FIN).
    pub fn idle_close_without_close_notify(mut self, on: bool) -> Self {
        self.idle_abrupt = on;
        self
    }

    /// Requests after the `n`-th on a connection are never answered: the
    /// server reads them and then sends nothing more on that stream (the
    /// connection stays open), as a stalled peer would. Default: off.
    pub fn stall_after(mut self, n: Option<u64>) -> Self {
        self.stall_after = n;
        self
    }

    /// Adds `Keep-Alive: timeout=<secs>` to every HTTP/1 response (as
    /// Apache httpd does), advertising the server's idle timeout. It only
    /// advertises: set [`idle_timeout`](Self::idle_timeout) to enforce it.
    /// Default: none.
    pub fn keep_alive_header(mut self, timeout_secs: Option<u64>) -> Self {
        self.keep_alive_header = timeout_secs;
        self
    }

    /// A fixed delay added before every response (default zero).
    pub fn delay(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }

    /// Binds the listener and starts serving on the current tokio runtime.
    ///
    /// # Errors
    /// [`LabError::Io`] if the address cannot be bound, [`LabError::Tls`] if
    /// rustls rejects the TLS configuration.
    pub async fn start(self) -> Result<TestServer, LabError> {
        let acceptor = match &self.pki {
            Some(pki) => Some(TlsAcceptor::from(Arc::new(self.server_config(pki)?))),
            None => None,
        };
        let listener = TcpListener::bind(self.bind)
            .await
            .map_err(|e| LabError::io(format!("bind test server on {}", self.bind), e))?;
        let addr = listener
            .local_addr()
            .map_err(|e| LabError::io("read test server address", e))?;
        let shared = Arc::new(Shared::default());
        let settings = Arc::new(Settings {
            acceptor,
            http_versions: self.http_versions,
            keep_alive: self.keep_alive,
            idle_timeout: self.idle_timeout,
            idle_reset: self.idle_reset,
            idle_abrupt: self.idle_abrupt,
            response: Arc::new(ResponseConfig {
                body: self.body,
                delay: self.delay,
                max_requests: self.max_requests,
                announce_limit: self.announce_limit,
                stall_after: self.stall_after,
                keep_alive_header: self.keep_alive_header,
            }),
        });
        let task = tokio::spawn(accept_loop(listener, settings, shared.clone()));
        Ok(TestServer {
            addr,
            tls: self.pki.is_some(),
            shared,
            task: Some(task),
        })
    }

    fn server_config(&self, pki: &TestPki) -> Result<rustls::ServerConfig, LabError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let versions: &[&'static rustls::SupportedProtocolVersion] = match self.tls_versions {
            TlsVersions::Tls13Only => &[&rustls::version::TLS13],
            TlsVersions::Tls12Only => &[&rustls::version::TLS12],
            TlsVersions::Both => &[&rustls::version::TLS13, &rustls::version::TLS12],
        };
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_protocol_versions(versions)?
            .with_no_client_auth()
            .with_single_cert(pki.leaf_chain_der(), pki.leaf_key_der())?;
        config.alpn_protocols = match self.http_versions {
            HttpVersions::Http1Only => vec![b"http/1.1".to_vec()],
            HttpVersions::Http2Only => vec![b"h2".to_vec()],
            HttpVersions::Both => vec![b"h2".to_vec(), b"http/1.1".to_vec()],
        };
        if self.session_resumption {
            config.ticketer = rustls::crypto::ring::Ticketer::new()?;
            config.session_storage = rustls::server::ServerSessionMemoryCache::new(1024);
        } else {
            config.session_storage = Arc::new(rustls::server::NoServerSessionStorage {});
            config.send_tls13_tickets = 0;
        }
        Ok(config)
    }
}

/// A running test server. Dropping it stops the listener and aborts every
/// connection task.
#[derive(Debug)]
pub struct TestServer {
    addr: SocketAddr,
    tls: bool,
    shared: Arc<Shared>,
    task: Option<JoinHandle<()>>,
}

impl TestServer {
    /// A builder with the defaults described on [`TestServerBuilder`].
    pub fn builder() -> TestServerBuilder {
        TestServerBuilder::default()
    }

    /// Starts a plain HTTP server with all defaults on `127.0.0.1:0`.
    ///
    /// # Errors
    /// As [`TestServerBuilder::start`].
    pub async fn start_plain() -> Result<TestServer, LabError> {
        Self::builder().start().await
    }

    /// The address the server listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Whether the server speaks TLS.
    pub fn is_tls(&self) -> bool {
        self.tls
    }

    /// A URL for `path` (which should start with `/`): `https://localhost:PORT`
    /// for TLS (the certificate names `localhost`), `http://IP:PORT` for
    /// plain HTTP. `localhost` is resolved by the client: where it also maps
    /// to `::1` a client may try that first and fall back; for a
    /// deterministic single connect attempt (and for an IPv6 bind) pin it,
    /// e.g. reqwest `ClientBuilder::resolve("localhost", server.addr())`.
    pub fn url(&self, path: &str) -> String {
        if self.tls {
            format!("https://localhost:{}{path}", self.addr.port())
        } else {
            format!("http://{}{path}", self.addr)
        }
    }

    /// A URL for `path` with the IP literal as host (`https://[::1]:PORT/..`
    /// or `http://127.0.0.1:PORT/..`); the test certificate covers both IPs.
    pub fn ip_url(&self, path: &str) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        format!("{scheme}://{}{path}", self.addr)
    }

    /// TCP connections accepted so far.
    pub fn accepted_connections(&self) -> u64 {
        self.shared.accepted.load(Ordering::SeqCst)
    }

    /// TLS handshakes completed so far (full and resumed).
    pub fn tls_handshakes(&self) -> u64 {
        self.shared.tls_handshakes.load(Ordering::SeqCst)
    }

    /// TLS handshakes completed so far that resumed a session.
    pub fn tls_resumed_handshakes(&self) -> u64 {
        self.shared.tls_resumed.load(Ordering::SeqCst)
    }

    /// TLS handshakes that failed (e.g. the client rejected the certificate).
    pub fn tls_handshake_failures(&self) -> u64 {
        self.shared.tls_failures.load(Ordering::SeqCst)
    }

    /// Connections that have ended (closed by either side or timed out).
    pub fn closed_connections(&self) -> u64 {
        self.shared.closed.load(Ordering::SeqCst)
    }

    /// Requests answered (or being answered) so far.
    pub fn request_count(&self) -> usize {
        self.shared.requests.lock().map(|r| r.len()).unwrap_or(0)
    }

    /// Every request seen so far, in arrival order.
    pub fn requests(&self) -> Vec<RequestRecord> {
        self.shared
            .requests
            .lock()
            .map(|r| r.clone())
            .unwrap_or_default()
    }

    /// Every connection accepted so far (after its TLS handshake, if any), in order.
    pub fn connections(&self) -> Vec<ConnectionRecord> {
        self.shared
            .connections
            .lock()
            .map(|c| c.clone())
            .unwrap_or_default()
    }

    /// Stops accepting, aborts all connection tasks and waits until the
    /// listening socket is closed.
    pub async fn shutdown(mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
            let _ = task.await;
        }
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

/// Counters and records shared by the accept loop, connections and the handle.
#[derive(Debug, Default)]
pub(crate) struct Shared {
    accepted: AtomicU64,
    tls_handshakes: AtomicU64,
    tls_resumed: AtomicU64,
    tls_failures: AtomicU64,
    closed: AtomicU64,
    requests: Mutex<Vec<RequestRecord>>,
    connections: Mutex<Vec<ConnectionRecord>>,
    /// `/gate/...` barriers by path.
    gates: Mutex<std::collections::HashMap<String, Arc<tokio::sync::Barrier>>>,
}

impl Shared {
    /// The barrier of the gate path `path`, holding `n` requests.
    pub(crate) fn gate(&self, path: &str, n: usize) -> Option<Arc<tokio::sync::Barrier>> {
        let mut gates = self.gates.lock().ok()?;
        Some(
            gates
                .entry(path.to_owned())
                .or_insert_with(|| Arc::new(tokio::sync::Barrier::new(n)))
                .clone(),
        )
    }

    pub(crate) fn record_request(&self, record: RequestRecord) {
        if let Ok(mut requests) = self.requests.lock() {
            requests.push(record);
        }
    }
}

struct Settings {
    acceptor: Option<TlsAcceptor>,
    http_versions: HttpVersions,
    keep_alive: bool,
    idle_timeout: Option<Duration>,
    idle_reset: bool,
    idle_abrupt: bool,
    response: Arc<ResponseConfig>,
}

async fn accept_loop(listener: TcpListener, settings: Arc<Settings>, shared: Arc<Shared>) {
    let mut tasks = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    let id = shared.accepted.fetch_add(1, Ordering::SeqCst) + 1;
                    tasks.spawn(serve_socket(stream, peer, id, settings.clone(), shared.clone()));
                }
                Err(e) => {
                    tracing::warn!(error = %e, "test server accept failed");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            },
            Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
        }
    }
}

async fn serve_socket(
    stream: TcpStream,
    peer: SocketAddr,
    id: u64,
    settings: Arc<Settings>,
    shared: Arc<Shared>,
) {
    let accepted_at = Instant::now();
    if let Err(e) = stream.set_nodelay(true) {
        tracing::warn!(error = %e, "set TCP_NODELAY failed");
    }
    // Linger 0: the close at the idle timeout sends RST instead of FIN.
    if settings.idle_reset
        && let Err(e) = socket2::SockRef::from(&stream).set_linger(Some(Duration::ZERO))
    {
        tracing::warn!(error = %e, "set SO_LINGER failed");
    }
    match &settings.acceptor {
        Some(acceptor) => match acceptor.accept(stream).await {
            Ok(tls) => {
                let conn = tls.get_ref().1;
                let info = TlsSessionInfo {
                    version: conn.protocol_version(),
                    resumed: conn.handshake_kind() == Some(rustls::HandshakeKind::Resumed),
                    alpn: conn
                        .alpn_protocol()
                        .map(|p| String::from_utf8_lossy(p).into_owned()),
                };
                shared.tls_handshakes.fetch_add(1, Ordering::SeqCst);
                if info.resumed {
                    shared.tls_resumed.fetch_add(1, Ordering::SeqCst);
                }
                let mode = match (settings.http_versions, info.alpn.as_deref()) {
                    (HttpVersions::Both, Some("h2")) => HttpVersions::Http2Only,
                    (HttpVersions::Both, Some("http/1.1")) => HttpVersions::Http1Only,
                    (mode, _) => mode,
                };
                let resumed = info.resumed;
                record_connection(&shared, id, peer, accepted_at, Some(info));
                serve_http(tls, peer, id, Some(resumed), mode, &settings, &shared).await;
            }
            Err(e) => {
                tracing::debug!(error = %e, "test server TLS handshake failed");
                shared.tls_failures.fetch_add(1, Ordering::SeqCst);
            }
        },
        None => {
            record_connection(&shared, id, peer, accepted_at, None);
            let mode = settings.http_versions;
            serve_http(stream, peer, id, None, mode, &settings, &shared).await;
        }
    }
    shared.closed.fetch_add(1, Ordering::SeqCst);
}

fn record_connection(
    shared: &Shared,
    id: u64,
    peer: SocketAddr,
    accepted_at: Instant,
    tls: Option<TlsSessionInfo>,
) {
    if let Ok(mut conns) = shared.connections.lock() {
        conns.push(ConnectionRecord {
            id,
            peer,
            accepted_at,
            tls,
            end: None,
            requests: 0,
        });
    }
}

/// Records how connection `id` ended and how many requests it received.
fn record_end(shared: &Shared, id: u64, end: ConnectionEnd, requests: u64) {
    if let Ok(mut conns) = shared.connections.lock()
        && let Some(c) = conns.iter_mut().find(|c| c.id == id)
    {
        c.end = Some(end);
        c.requests = requests;
    }
}

async fn serve_http<I>(
    io: I,
    peer: SocketAddr,
    id: u64,
    tls_resumed: Option<bool>,
    mode: HttpVersions,
    settings: &Settings,
    shared: &Arc<Shared>,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let activity = Arc::new(Activity::new());
    let ctx = Arc::new(ConnCtx {
        id,
        peer,
        tls_resumed,
        requests: AtomicU64::new(0),
        activity: activity.clone(),
        limit_reached: tokio::sync::Notify::new(),
        limit_reached_unannounced: tokio::sync::Notify::new(),
    });
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder.http1().keep_alive(settings.keep_alive);
    let builder = match mode {
        HttpVersions::Http1Only => builder.http1_only(),
        HttpVersions::Http2Only => builder.http2_only(),
        HttpVersions::Both => builder,
    };
    let svc_shared = shared.clone();
    let response = settings.response.clone();
    let svc_ctx = ctx.clone();
    let svc = hyper::service::service_fn(move |req| {
        service::handle(req, svc_ctx.clone(), svc_shared.clone(), response.clone())
    });
    let conn = builder.serve_connection(TokioIo::new(io), svc);
    tokio::pin!(conn);
    let idle = async {
        match settings.idle_timeout {
            Some(timeout) => activity.idle_for(timeout).await,
            None => std::future::pending().await,
        }
    };
    let limit = settings.response.max_requests;
    let end = tokio::select! {
        res = conn.as_mut() => {
            if let Err(e) = res {
                tracing::debug!(error = %e, "test server connection ended with error");
            }
            // HTTP/1 ends by itself after a `Connection: close` response.
            if limit.is_some_and(|n| ctx.requests.load(Ordering::SeqCst) >= n) {
                ConnectionEnd::RequestLimit
            } else {
                ConnectionEnd::Closed
            }
        }
        () = idle => {
            if settings.idle_reset {
                // Dropping the connection closes the socket (linger 0: RST).
                ConnectionEnd::IdleReset
            } else if settings.idle_abrupt {
                // Dropping the connection closes the socket (FIN); a TLS
                // stream dropped unshut sends no close_notify.
                ConnectionEnd::IdleTimeout
            } else {
                conn.as_mut().graceful_shutdown();
                let _ = conn.as_mut().await;
                ConnectionEnd::IdleTimeout
            }
        }
        () = ctx.limit_reached.notified() => {
            conn.as_mut().graceful_shutdown();
            let _ = conn.as_mut().await;
            ConnectionEnd::RequestLimit
        }
        () = async {
            ctx.limit_reached_unannounced.notified().await;
            // The last response's body handed to hyper: serve until it is
            // written (a graceful shutdown of an idle HTTP/1 connection
            // writes nothing more), then close.
            ctx.activity.idle_for(Duration::ZERO).await;
        } => {
            conn.as_mut().graceful_shutdown();
            let _ = conn.as_mut().await;
            ConnectionEnd::RequestLimit
        }
    };
    record_end(shared, id, end, ctx.requests.load(Ordering::SeqCst));
}
