//! `ConnectProxy`: an HTTP proxy on loopback that tunnels `CONNECT`
//! requests and forwards absolute-form plain-HTTP requests, counting both.
//!
//! Tunnels: the proxy connects to the requested `host:port` first and
//! answers `200` only if that worked (`502` otherwise), then copies bytes
//! both ways until either side closes. Forwarded requests
//! (`GET http://host:port/path`): each uses a new upstream HTTP/1.1
//! connection; `proxy-*` headers are dropped and the URI is sent in origin
//! form. Every socket has `TCP_NODELAY`. [`ConnectProxy::start_refusing`]
//! starts one that answers every `CONNECT` with a fixed status instead
//! (`407`, `502`, ...). Every `CONNECT` and its answer is logged
//! ([`ConnectProxy::connect_log`]).

use std::convert::Infallible;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};

use crate::LabError;

type ProxyBody = BoxBody<Bytes, hyper::Error>;

#[derive(Debug, Default)]
struct Stats {
    connections: AtomicU64,
    tunnels: AtomicU64,
    forwarded: AtomicU64,
    failures: AtomicU64,
    targets: Mutex<Vec<String>>,
    /// Answer every CONNECT with this status instead of tunnelling.
    refuse: Option<http::StatusCode>,
    connects: Mutex<Vec<ConnectRecord>>,
}

/// One `CONNECT` the proxy received, and its answer.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ConnectRecord {
    /// The requested `host:port`.
    pub target: String,
    /// The status code the proxy answered with (`200`: tunnel open).
    pub status: u16,
}

impl Stats {
    fn log_connect(&self, target: &str, status: http::StatusCode) {
        if let Ok(mut log) = self.connects.lock() {
            log.push(ConnectRecord {
                target: target.to_owned(),
                status: status.as_u16(),
            });
        }
    }
}

/// A running HTTP CONNECT / forward proxy. Dropping it closes the listener
/// and every tunnel.
#[derive(Debug)]
pub struct ConnectProxy {
    addr: SocketAddr,
    stats: Arc<Stats>,
    task: Option<JoinHandle<()>>,
}

impl ConnectProxy {
    /// Starts the proxy on `127.0.0.1:0`.
    ///
    /// # Errors
    /// [`LabError::Io`] if the port cannot be bound.
    pub async fn start() -> Result<ConnectProxy, LabError> {
        Self::start_with(None).await
    }

    /// Starts a proxy on `127.0.0.1:0` that answers every `CONNECT` with
    /// `status` (e.g. `407 Proxy Authentication Required`, `502 Bad
    /// Gateway`) and opens no tunnel; absolute-form requests are still
    /// forwarded.
    ///
    /// # Errors
    /// [`LabError::Io`] if the port cannot be bound.
    pub async fn start_refusing(status: http::StatusCode) -> Result<ConnectProxy, LabError> {
        Self::start_with(Some(status)).await
    }

    async fn start_with(refuse: Option<http::StatusCode>) -> Result<ConnectProxy, LabError> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .await
            .map_err(|e| LabError::io("bind connect proxy", e))?;
        let addr = listener
            .local_addr()
            .map_err(|e| LabError::io("read connect proxy address", e))?;
        let stats = Arc::new(Stats {
            refuse,
            ..Stats::default()
        });
        let task = tokio::spawn(accept_loop(listener, stats.clone()));
        Ok(ConnectProxy {
            addr,
            stats,
            task: Some(task),
        })
    }

    /// The proxy's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The proxy URL, `http://127.0.0.1:PORT` (for `reqwest::Proxy::all`).
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Client connections accepted by the proxy.
    pub fn connections(&self) -> u64 {
        self.stats.connections.load(Ordering::SeqCst)
    }

    /// `CONNECT` tunnels established (upstream connect succeeded).
    pub fn tunnels(&self) -> u64 {
        self.stats.tunnels.load(Ordering::SeqCst)
    }

    /// Absolute-form requests forwarded (a response came back from upstream).
    pub fn forwarded_requests(&self) -> u64 {
        self.stats.forwarded.load(Ordering::SeqCst)
    }

    /// Tunnels or forwards that failed (upstream unreachable, bad request).
    pub fn failures(&self) -> u64 {
        self.stats.failures.load(Ordering::SeqCst)
    }

    /// Every `CONNECT` received and the status answered, in order.
    pub fn connect_log(&self) -> Vec<ConnectRecord> {
        self.stats
            .connects
            .lock()
            .map(|l| l.clone())
            .unwrap_or_default()
    }

    /// The `host:port` targets of every tunnel and forward, in order.
    pub fn targets(&self) -> Vec<String> {
        self.stats
            .targets
            .lock()
            .map(|t| t.clone())
            .unwrap_or_default()
    }
}

impl Drop for ConnectProxy {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

async fn accept_loop(listener: TcpListener, stats: Arc<Stats>) {
    let mut tasks = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    let _ = stream.set_nodelay(true);
                    stats.connections.fetch_add(1, Ordering::SeqCst);
                    let stats = stats.clone();
                    tasks.spawn(async move {
                        let svc = hyper::service::service_fn(move |req| handle(req, stats.clone()));
                        let _ = hyper::server::conn::http1::Builder::new()
                            .serve_connection(TokioIo::new(stream), svc)
                            .with_upgrades()
                            .await;
                    });
                }
                Err(e) => {
                    tracing::warn!(error = %e, "connect proxy accept failed");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            },
            Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
        }
    }
}

fn text(status: http::StatusCode, message: &str) -> http::Response<ProxyBody> {
    let body = Full::new(Bytes::from(message.to_owned()))
        .map_err(|never: Infallible| match never {})
        .boxed();
    let mut resp = http::Response::new(body);
    *resp.status_mut() = status;
    resp
}

async fn handle(
    req: http::Request<Incoming>,
    stats: Arc<Stats>,
) -> Result<http::Response<ProxyBody>, Infallible> {
    let Some(authority) = req.uri().authority().map(|a| a.to_string()) else {
        stats.failures.fetch_add(1, Ordering::SeqCst);
        return Ok(text(
            http::StatusCode::BAD_REQUEST,
            "expected CONNECT or an absolute-form URI\n",
        ));
    };
    let target = if authority.contains(':') || req.method() == http::Method::CONNECT {
        authority
    } else {
        format!("{authority}:80")
    };
    if let Ok(mut targets) = stats.targets.lock() {
        targets.push(target.clone());
    }
    let connect = req.method() == http::Method::CONNECT;
    if let Some(status) = stats.refuse.filter(|_| connect) {
        stats.failures.fetch_add(1, Ordering::SeqCst);
        stats.log_connect(&target, status);
        let mut resp = text(status, "refused by the lab proxy\n");
        if status == http::StatusCode::PROXY_AUTHENTICATION_REQUIRED {
            resp.headers_mut().insert(
                http::header::PROXY_AUTHENTICATE,
                http::HeaderValue::from_static("Basic realm=\"conntrace-lab\""),
            );
        }
        return Ok(resp);
    }
    let upstream = match TcpStream::connect(target.as_str()).await {
        Ok(s) => s,
        Err(e) => {
            stats.failures.fetch_add(1, Ordering::SeqCst);
            if connect {
                stats.log_connect(&target, http::StatusCode::BAD_GATEWAY);
            }
            return Ok(text(
                http::StatusCode::BAD_GATEWAY,
                &format!("connect to {target} failed: {e}\n"),
            ));
        }
    };
    let _ = upstream.set_nodelay(true);
    if connect {
        stats.tunnels.fetch_add(1, Ordering::SeqCst);
        stats.log_connect(&target, http::StatusCode::OK);
        tokio::spawn(async move {
            match hyper::upgrade::on(req).await {
                Ok(upgraded) => {
                    let mut client = TokioIo::new(upgraded);
                    let mut upstream = upstream;
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
                }
                Err(e) => tracing::debug!(error = %e, "CONNECT upgrade failed"),
            }
        });
        return Ok(text(http::StatusCode::OK, ""));
    }
    Ok(forward(req, upstream, &stats).await)
}

async fn forward(
    req: http::Request<Incoming>,
    upstream: TcpStream,
    stats: &Stats,
) -> http::Response<ProxyBody> {
    let (mut parts, body) = req.into_parts();
    let origin_form = parts
        .uri
        .path_and_query()
        .map(|p| p.as_str().to_owned())
        .unwrap_or_else(|| "/".to_owned());
    parts.uri = match origin_form.parse() {
        Ok(uri) => uri,
        Err(_) => {
            stats.failures.fetch_add(1, Ordering::SeqCst);
            return text(http::StatusCode::BAD_REQUEST, "bad request target\n");
        }
    };
    parts.headers.remove("proxy-connection");
    parts.headers.remove(http::header::PROXY_AUTHORIZATION);
    let req = http::Request::from_parts(parts, body);
    let (mut sender, conn) =
        match hyper::client::conn::http1::handshake(TokioIo::new(upstream)).await {
            Ok(pair) => pair,
            Err(e) => {
                stats.failures.fetch_add(1, Ordering::SeqCst);
                return text(
                    http::StatusCode::BAD_GATEWAY,
                    &format!("upstream handshake failed: {e}\n"),
                );
            }
        };
    tokio::spawn(async move {
        let _ = conn.await;
    });
    match sender.send_request(req).await {
        Ok(resp) => {
            stats.forwarded.fetch_add(1, Ordering::SeqCst);
            resp.map(|b| b.boxed())
        }
        Err(e) => {
            stats.failures.fetch_add(1, Ordering::SeqCst);
            text(
                http::StatusCode::BAD_GATEWAY,
                &format!("upstream request failed: {e}\n"),
            )
        }
    }
}
