//! The client options of `conntrace probe` and how they become an
//! instrumented `reqwest` client.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Args, ValueEnum};
use reqwest_conntrace::{AddressOrder, ConnTrace, TlsSettings};
use reqwest_middleware::ClientWithMiddleware;
use url::Url;

use crate::resolve::{self, PinnedResolver, ResolveEntry};

/// How long [`wait_for_connects`] waits at most (longer than any connect
/// the lab makes: its 3 s SYN retransmission).
const CONNECTS_DEADLINE: Duration = Duration::from_secs(10);
/// How often [`wait_for_connects`] looks.
const CONNECTS_POLL: Duration = Duration::from_millis(2);

/// Waits until `in_flight()` (connects started and not finished, e.g.
/// [`ConnTrace::connects_in_flight`]) is 0, at most [`CONNECTS_DEADLINE`]:
/// a run's requests can be done while connects they started still finish
/// in the background (a pool race's losers: hyper-util hands a waiting
/// request a connection released meanwhile and lets its own connect go
/// on; every connect after the first HTTP/2 one). Their setup spans end
/// when they finish: a command that ends its telemetry first loses them.
pub(crate) async fn wait_for_connects(in_flight: impl Fn() -> usize) {
    let deadline = tokio::time::Instant::now() + CONNECTS_DEADLINE;
    while in_flight() > 0 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(CONNECTS_POLL).await;
    }
}

/// HTTP version policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HttpPolicy {
    /// ALPN decides over TLS (`h2` if the server picks it), HTTP/1.1 in clear.
    Auto,
    /// HTTP/1.1 only (ALPN offers only `http/1.1`).
    Http1,
    /// HTTP/2 only (prior knowledge).
    Http2,
}

impl HttpPolicy {
    /// Name used in output: `auto`, `http1` or `http2`.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            HttpPolicy::Auto => "auto",
            HttpPolicy::Http1 => "http1",
            HttpPolicy::Http2 => "http2",
        }
    }
}

/// `--address-order` values (the library's [`AddressOrder`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum)]
pub(crate) enum AddressOrderArg {
    /// The resolver's order (getaddrinfo applies RFC 6724).
    #[default]
    Keep,
    /// IPv4 addresses first, IPv6 after them as the Happy Eyeballs fallback.
    Ipv4First,
    /// IPv6 addresses first, IPv4 after them as the fallback.
    Ipv6First,
}

impl AddressOrderArg {
    /// The library's policy.
    pub(crate) fn order(self) -> AddressOrder {
        match self {
            AddressOrderArg::Keep => AddressOrder::Keep,
            AddressOrderArg::Ipv4First => AddressOrder::Ipv4First,
            AddressOrderArg::Ipv6First => AddressOrder::Ipv6First,
        }
    }

    /// The name on the command line and in `--json`.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            AddressOrderArg::Keep => "keep",
            AddressOrderArg::Ipv4First => "ipv4-first",
            AddressOrderArg::Ipv6First => "ipv6-first",
        }
    }
}

/// Options shaping the client (TLS trust, name pinning, address order,
/// HTTP version, timeout).
#[derive(Debug, Clone, Args)]
pub(crate) struct ClientOptions {
    /// Trust only the certificates in this PEM file instead of the system's
    /// roots, as curl's --cacert does: CA certificates, and also a pinned
    /// certificate the server presents as its own (a self-signed one from
    /// `openssl req -x509`, or a leaf: curl's partial chain). The host name
    /// is still checked. [default: system roots]
    #[arg(long, value_name = "FILE")]
    pub(crate) cacert: Option<PathBuf>,

    /// Accept any server certificate (curl's -k): the TLS handshake is still
    /// made and timed, and its span says `http.connection.tls.verification_skipped`.
    /// [default: off]
    #[arg(short = 'k', long)]
    pub(crate) insecure: bool,

    /// Connect to these addresses for HOST:PORT instead of asking DNS
    /// (curl's syntax; IPv6 in brackets; repeatable; an entry whose
    /// HOST:PORT differs from the URL's is ignored with a warning). A static
    /// resolver answers the name with the addresses in the given order, so
    /// the connect's dns.lookup span exists (~0 ms), --address-order applies
    /// and a fallback to a later address shows (address_fallback,
    /// tcp.address_skipped). [default: none]
    #[arg(long, value_name = "HOST:PORT:ADDR[,ADDR...]", value_parser = resolve::parse)]
    pub(crate) resolve: Vec<ResolveEntry>,

    /// The order the resolved addresses are tried in: keep (the resolver's),
    /// ipv4-first or ipv6-first (the other family stays the Happy Eyeballs
    /// fallback, 300 ms later). Where IPv6 drops SYNs, ipv4-first avoids the
    /// fallback delay (incident 4). Applies to DNS answers and to --resolve
    /// addresses alike.
    #[arg(long, value_enum, value_name = "ORDER", default_value_t = AddressOrderArg::Keep)]
    pub(crate) address_order: AddressOrderArg,

    /// HTTP/1.1 only: ALPN offers only http/1.1. [default: off; ALPN decides]
    #[arg(long, conflicts_with = "http2")]
    pub(crate) http1: bool,

    /// HTTP/2 only, by prior knowledge: h2c on http://; on https:// ALPN
    /// offers only h2, so a server without HTTP/2 refuses the handshake (or,
    /// if it ignores ALPN, never answers: the request times out, as curl's
    /// --http2-prior-knowledge does). [default: off; ALPN decides]
    #[arg(long)]
    pub(crate) http2: bool,

    /// Per-request timeout in seconds (connect included; a connect
    /// abandoned at it is reported as a timeout).
    #[arg(long, value_name = "SECS", default_value = "30", value_parser = parse_secs)]
    pub(crate) timeout: Duration,
}

/// Parses a positive number of seconds (fractions allowed).
fn parse_secs(text: &str) -> Result<Duration, String> {
    let secs: f64 = text
        .trim()
        .parse()
        .map_err(|_| format!("{text:?} is not a number of seconds"))?;
    if !secs.is_finite() || secs <= 0.0 || secs > 86_400.0 {
        return Err("expected a number of seconds above 0 and at most 86400".to_owned());
    }
    Ok(Duration::from_secs_f64(secs))
}

impl ClientOptions {
    /// The HTTP version policy the flags select.
    pub(crate) fn http_policy(&self) -> HttpPolicy {
        match (self.http1, self.http2) {
            (true, _) => HttpPolicy::Http1,
            (_, true) => HttpPolicy::Http2,
            _ => HttpPolicy::Auto,
        }
    }

    /// Reads `--cacert` once and applies `-k`: the TLS settings every
    /// client of a run shares.
    ///
    /// # Errors
    /// When the file cannot be read or holds no PEM certificate: a bad
    /// command line ([`crate::error::Usage`], exit 2).
    pub(crate) fn tls_settings(&self) -> anyhow::Result<TlsSettings> {
        let tls = TlsSettings::new().danger_accept_invalid_certs(self.insecure);
        let Some(path) = &self.cacert else {
            return Ok(tls);
        };
        let pem = std::fs::read(path)
            .with_context(|| format!("cannot read --cacert {}", path.display()))
            .map_err(crate::error::usage)?;
        tls.built_in_roots(false)
            .partial_chain(true)
            .add_root_certificates_pem(&pem)
            .with_context(|| {
                format!(
                    "--cacert {} is not a usable PEM certificate file",
                    path.display()
                )
            })
            .map_err(crate::error::usage)
    }

    /// A failed request's one-line message, with the fix that depends on
    /// these options: under `--http2`, a connection that broke once
    /// connected (hyper's `SendRequest`, a reset) most likely met a server
    /// without HTTP/2 (its h2c error text varies: `channel closed`,
    /// `broken pipe`); one that timed out may have met an HTTP/1.1 server
    /// still waiting for the rest of a request (h2c, or a TLS server that
    /// ignores ALPN, such as OpenSSL's `s_server`: curl's
    /// `--http2-prior-knowledge` hangs there too).
    pub(crate) fn explain(&self, message: &str) -> String {
        // An HTTP/2 error frame the server sent ("... error received")
        // shows it speaks HTTP/2.
        if !self.http2 || message.contains("; fix:") || message.contains("error received") {
            return message.to_owned();
        }
        if message.contains("SendRequest") || message.contains("connection reset") {
            return format!(
                "{message}; fix: the server may not speak HTTP/2 (h2c by prior knowledge on http://); drop --http2"
            );
        }
        if message.starts_with("timed out") {
            return format!(
                "{message}; fix: a server without HTTP/2 (one that ignores ALPN, or plain HTTP/1.1) never answers HTTP/2 by prior knowledge; try without --http2"
            );
        }
        message.to_owned()
    }

    /// The `--resolve` entries that apply to `url`; warns on stderr about the others.
    pub(crate) fn resolve_for(&self, url: &Url) -> Vec<ResolveEntry> {
        let (matching, other): (Vec<_>, Vec<_>) =
            self.resolve.iter().cloned().partition(|e| e.matches(url));
        for e in other {
            eprintln!(
                "warning: --resolve {e} does not match the URL's host and port ({}:{}), ignored",
                url.host_str().unwrap_or_default(),
                url.port_or_known_default().unwrap_or_default()
            );
        }
        matching
    }
}

/// Everything needed to build one instrumented client.
#[derive(Debug, Clone)]
pub(crate) struct ClientSpec {
    /// TLS trust and options.
    pub(crate) tls: TlsSettings,
    /// Name pins (already filtered for the URL).
    pub(crate) resolve: Vec<ResolveEntry>,
    /// HTTP version policy.
    pub(crate) http: HttpPolicy,
    /// Per-request timeout (also the connect timeout).
    pub(crate) timeout: Duration,
    /// `pool_max_idle_per_host`; `None` states reqwest's default
    /// (unlimited, [`REQWEST_DEFAULT_POOL_MAX_IDLE_PER_HOST`]).
    pub(crate) pool_max_idle_per_host: Option<usize>,
    /// The order resolved addresses are tried in.
    pub(crate) address_order: AddressOrder,
}

impl ClientSpec {
    /// Builds the instrumented client with the middleware.
    ///
    /// # Errors
    /// When the library refuses the settings.
    pub(crate) fn build(&self, trace: &ConnTrace) -> anyhow::Result<ClientWithMiddleware> {
        let mut builder = reqwest::Client::builder()
            .timeout(self.timeout)
            .user_agent(concat!("conntrace/", env!("CARGO_PKG_VERSION")));
        builder = match self.http {
            HttpPolicy::Auto => builder,
            HttpPolicy::Http1 => builder.http1_only(),
            HttpPolicy::Http2 => builder.http2_prior_knowledge(),
        };
        // Pool settings through the instrumented builder, so the library
        // knows them (miss reasons, pool advice).
        let mut instrumented = trace
            .instrument_client(builder)
            .tls(self.tls.clone())
            .connect_timeout(self.timeout)
            .address_order(self.address_order);
        // Pinned names through the instrumented resolver (not reqwest's
        // overrides, which bypass it): the lookup, the address order and
        // the fallback stay visible.
        if !self.resolve.is_empty() {
            instrumented = instrumented.dns_resolver(PinnedResolver::new(&self.resolve));
        }
        instrumented
            .pool_max_idle_per_host(
                self.pool_max_idle_per_host
                    .unwrap_or(REQWEST_DEFAULT_POOL_MAX_IDLE_PER_HOST),
            )
            .pool_idle_timeout(Some(REQWEST_DEFAULT_POOL_IDLE_TIMEOUT))
            .build_with_middleware()
            .context("cannot build the HTTP client")
    }
}

/// reqwest's default idle pool size per host (reqwest 0.13
/// `ClientBuilder`: `usize::MAX`, unlimited), stated on the instrumented
/// builder by the clients [`ClientSpec`] builds when no size is asked for,
/// for the same reason as [`REQWEST_DEFAULT_POOL_IDLE_TIMEOUT`]: a pool
/// known to keep its connections tells a server's close right after a
/// response from the pool's own close at release.
pub(crate) const REQWEST_DEFAULT_POOL_MAX_IDLE_PER_HOST: usize = usize::MAX;

/// reqwest's default pool idle timeout (reqwest 0.13 `ClientBuilder`,
/// 90 s), stated on the instrumented builder by every client of this CLI:
/// the library does not assume defaults it cannot read.
pub(crate) const REQWEST_DEFAULT_POOL_IDLE_TIMEOUT: std::time::Duration =
    std::time::Duration::from_secs(90);
