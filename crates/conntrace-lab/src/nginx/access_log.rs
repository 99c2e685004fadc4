//! nginx access-log lines in the fixture's `conntrace` log format.

/// The `log_format` the fixture configures; fields are separated by single
/// spaces, empty variables are logged by nginx as `-`.
pub(crate) const LOG_FORMAT: &str = "$remote_port $connection $connection_requests \
$ssl_protocol $ssl_session_reused $server_protocol $server_port $request_method $status \
$request_time $request_uri $server_addr";

/// Which of the fixture's listeners served a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NginxListener {
    /// TLS 1.3 only, session tickets on.
    Tls13,
    /// TLS 1.2 only, session ids and tickets on.
    Tls12,
    /// TLS 1.2 + 1.3 with HTTP/2 offered via ALPN.
    H2,
    /// Plain HTTP.
    Plain,
}

/// One parsed access-log line.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct AccessLogEntry {
    /// `$remote_port`: the client's local port.
    pub remote_port: u16,
    /// `$connection`: nginx's connection serial number.
    pub connection: u64,
    /// `$connection_requests`: 1-based index of the request on its connection.
    pub connection_requests: u64,
    /// `$ssl_protocol` (`TLSv1.3`, `TLSv1.2`), `None` for plain HTTP.
    pub ssl_protocol: Option<String>,
    /// `$ssl_session_reused == "r"`: the TLS session was resumed.
    pub ssl_session_reused: bool,
    /// `$server_protocol` (`HTTP/1.1`, `HTTP/2.0`).
    pub server_protocol: String,
    /// `$server_port`: the port that received the request.
    pub server_port: u16,
    /// `$request_method`.
    pub method: String,
    /// `$status`: the response status code.
    pub status: u16,
    /// `$request_time`: seconds from the first request byte to the log write
    /// (millisecond resolution).
    pub request_time_secs: f64,
    /// `$request_uri`: path and query as sent.
    pub request_uri: String,
    /// `$server_addr`: the address that received the request (the plain
    /// listener also listens on other loopback addresses with
    /// [`NginxConfig::loopback_hosts`](super::NginxConfig::loopback_hosts)).
    pub server_addr: std::net::IpAddr,
    /// The fixture listener that served it (filled in by
    /// [`Nginx::access_log`](super::Nginx::access_log); `None` from
    /// [`AccessLogEntry::parse_line`]).
    pub listener: Option<NginxListener>,
}

impl AccessLogEntry {
    /// Parses one line in the fixture's format; `None` if it does not match.
    pub fn parse_line(line: &str) -> Option<AccessLogEntry> {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let [
            remote_port,
            connection,
            connection_requests,
            ssl_protocol,
            ssl_session_reused,
            server_protocol,
            server_port,
            method,
            status,
            request_time,
            request_uri,
            server_addr,
        ] = fields.as_slice()
        else {
            return None;
        };
        Some(AccessLogEntry {
            remote_port: remote_port.parse().ok()?,
            connection: connection.parse().ok()?,
            connection_requests: connection_requests.parse().ok()?,
            ssl_protocol: (*ssl_protocol != "-").then(|| (*ssl_protocol).to_owned()),
            ssl_session_reused: *ssl_session_reused == "r",
            server_protocol: (*server_protocol).to_owned(),
            server_port: server_port.parse().ok()?,
            method: (*method).to_owned(),
            status: status.parse().ok()?,
            request_time_secs: request_time.parse().ok()?,
            request_uri: (*request_uri).to_owned(),
            server_addr: server_addr.parse().ok()?,
            listener: None,
        })
    }
}
