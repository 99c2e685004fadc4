//! Small HTTP/TLS clients for the tests.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper::client::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls_pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

/// A response as the tests need it.
pub(crate) struct Resp {
    pub(crate) status: http::StatusCode,
    pub(crate) headers: http::HeaderMap,
    pub(crate) body: Bytes,
}

impl Resp {
    pub(crate) fn header_u64(&self, name: &str) -> u64 {
        self.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok())
            .expect("numeric response header")
    }
}

pub(crate) async fn tcp(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).await.expect("TCP connect");
    s.set_nodelay(true).expect("nodelay");
    s
}

pub(crate) async fn tls(
    addr: SocketAddr,
    config: Arc<rustls::ClientConfig>,
) -> std::io::Result<TlsStream<TcpStream>> {
    let name = ServerName::try_from("localhost").expect("server name");
    TlsConnector::from(config)
        .connect(name, tcp(addr).await)
        .await
}

pub(crate) async fn h1<I>(io: I) -> http1::SendRequest<Empty<Bytes>>
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (sender, conn) = http1::handshake(TokioIo::new(io))
        .await
        .expect("h1 handshake");
    tokio::spawn(conn);
    sender
}

pub(crate) async fn h2<I>(io: I) -> http2::SendRequest<Empty<Bytes>>
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (sender, conn) = http2::handshake(TokioExecutor::new(), TokioIo::new(io))
        .await
        .expect("h2 handshake");
    tokio::spawn(conn);
    sender
}

fn request(uri: &str, host: &str) -> http::Request<Empty<Bytes>> {
    http::Request::builder()
        .uri(uri)
        .header(http::header::HOST, host)
        .body(Empty::new())
        .expect("request")
}

async fn collect(resp: http::Response<hyper::body::Incoming>) -> Resp {
    let (parts, body) = resp.into_parts();
    Resp {
        status: parts.status,
        headers: parts.headers,
        body: body.collect().await.expect("response body").to_bytes(),
    }
}

pub(crate) async fn get1(
    sender: &mut http1::SendRequest<Empty<Bytes>>,
    uri: &str,
    host: &str,
) -> hyper::Result<Resp> {
    sender.ready().await?;
    let resp = sender.send_request(request(uri, host)).await?;
    Ok(collect(resp).await)
}

pub(crate) async fn get2(sender: &mut http2::SendRequest<Empty<Bytes>>, uri: &str) -> Resp {
    sender.ready().await.expect("h2 ready");
    let resp = sender
        .send_request(
            http::Request::builder()
                .uri(uri)
                .body(Empty::new())
                .expect("request"),
        )
        .await
        .expect("h2 response");
    collect(resp).await
}
