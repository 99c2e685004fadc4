//! What the test server remembers about connections and requests.

use std::net::SocketAddr;
use std::time::Instant;

/// TLS facts of one accepted connection, as seen by the server.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct TlsSessionInfo {
    /// The negotiated protocol version (`TLSv1_3` or `TLSv1_2`).
    pub version: Option<rustls::ProtocolVersion>,
    /// Whether the handshake resumed an earlier session (ticket or session id),
    /// from rustls `ServerConnection::handshake_kind()`.
    pub resumed: bool,
    /// The ALPN protocol agreed on (`"h2"`, `"http/1.1"`), if any.
    pub alpn: Option<String>,
}

/// One TCP connection the server accepted (and, for TLS, completed a handshake on).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ConnectionRecord {
    /// Server-assigned id, 1-based and in accept order (like nginx's `$connection`).
    pub id: u64,
    /// The client's address; its port is the client's local port.
    pub peer: SocketAddr,
    /// When the server accepted the socket.
    pub accepted_at: Instant,
    /// TLS facts; `None` for plain HTTP.
    pub tls: Option<TlsSessionInfo>,
    /// How the connection ended; `None` while it is open.
    pub end: Option<ConnectionEnd>,
    /// Requests it received (set when it ended, else 0).
    pub requests: u64,
}

/// How the server saw one of its connections end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConnectionEnd {
    /// The server ended it after its request limit: HTTP/1 with
    /// `Connection: close` on the last response, HTTP/2 with GOAWAY.
    RequestLimit,
    /// The server's idle timeout closed it gracefully (HTTP/1: FIN;
    /// HTTP/2: GOAWAY, then FIN).
    IdleTimeout,
    /// The server's idle timeout closed it with a TCP reset (RST).
    IdleReset,
    /// The client closed it, or it failed.
    Closed,
}

/// One request the server answered.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RequestRecord {
    /// The id of the connection that carried it (see [`ConnectionRecord::id`]).
    pub connection_id: u64,
    /// The client's address (`remote_port()` is nginx's `$remote_port`).
    pub peer: SocketAddr,
    /// 1-based index of this request on its connection (nginx's
    /// `$connection_requests`). For HTTP/2 it counts streams in arrival order.
    pub request_index: u64,
    /// The request method.
    pub method: String,
    /// The request path and query.
    pub path: String,
    /// The HTTP version the request arrived with.
    pub version: http::Version,
    /// Bytes of request body received.
    pub body_bytes: u64,
    /// Whether the connection's TLS handshake was resumed; `None` for plain HTTP.
    pub tls_resumed: Option<bool>,
    /// When the server started handling the request (headers parsed).
    pub received_at: Instant,
}

impl RequestRecord {
    /// The client's local port (the server's view of the remote port).
    pub fn remote_port(&self) -> u16 {
        self.peer.port()
    }
}
