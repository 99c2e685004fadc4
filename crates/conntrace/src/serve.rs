//! `conntrace serve`: a loopback HTTPS (or plain HTTP) test server from
//! conntrace-lab, optionally behind a delaying proxy, to point `probe` at.

use std::io::Write as _;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Args, ValueEnum};
use conntrace_lab::{DelayProxy, HttpVersions, TestPki, TestServer, TlsVersions};

/// Arguments of `conntrace serve`.
#[derive(Debug, Args)]
pub(crate) struct ServeArgs {
    /// Port the server listens on (0: any free port). With --rtt-ms above 0
    /// clients connect to the delay proxy instead, on a free port; the URL
    /// printed is the one to use.
    #[arg(long, default_value_t = 0)]
    pub(crate) port: u16,

    /// Loopback address to bind (127.0.0.1 or ::1).
    #[arg(long, default_value_t = IpAddr::V4(Ipv4Addr::LOCALHOST))]
    pub(crate) bind: IpAddr,

    /// Emulated round-trip time in ms, through a delaying TCP proxy in front
    /// of the server (0: no proxy).
    #[arg(long, value_name = "MS", default_value_t = 0,
          value_parser = clap::value_parser!(u64).range(0..=10_000))]
    pub(crate) rtt_ms: u64,

    /// Server think time added to every response, ms.
    #[arg(long, value_name = "MS", default_value_t = 0,
          value_parser = clap::value_parser!(u64).range(0..=10_000))]
    pub(crate) delay_ms: u64,

    /// TLS versions accepted.
    #[arg(long, value_enum, default_value_t = TlsArg::Both)]
    pub(crate) tls: TlsArg,

    /// HTTP versions spoken (ALPN over TLS).
    #[arg(long, value_enum, default_value_t = HttpArg::Both)]
    pub(crate) http: HttpArg,

    /// Plain HTTP instead of HTTPS (so no TLS options).
    #[arg(long, conflicts_with_all = ["tls", "no_resumption", "ca_out"])]
    pub(crate) plain: bool,

    /// Disable TLS session resumption on the server.
    #[arg(long)]
    pub(crate) no_resumption: bool,

    /// Close connections idle for this many ms (0: never).
    #[arg(long, value_name = "MS", default_value_t = 0)]
    pub(crate) idle_timeout_ms: u64,

    /// Where to write the test CA certificate (PEM) for --cacert, once the
    /// server is listening (each server makes its own CA, so two servers
    /// must not share the file). [default: conntrace-lab-ca-PORT.pem, PORT
    /// being the printed URL's]
    #[arg(long, value_name = "PATH")]
    pub(crate) ca_out: Option<PathBuf>,
}

/// `--tls` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum TlsArg {
    /// TLS 1.2 only.
    #[value(name = "1.2")]
    V12,
    /// TLS 1.3 only.
    #[value(name = "1.3")]
    V13,
    /// Both (clients pick 1.3).
    Both,
}

/// `--http` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum HttpArg {
    /// HTTP/1.1 only.
    #[value(name = "1")]
    H1,
    /// HTTP/2 only.
    #[value(name = "2")]
    H2,
    /// Both.
    Both,
}

/// Runs the server until Ctrl-C. Prints the URL to use on the first line
/// (`https://localhost:PORT/`, or the bracketed address when bound to IPv6),
/// then the CA file and, for IPv6, the `--resolve` that reaches it by name.
///
/// # Errors
/// When the server or proxy cannot start or the CA file cannot be written.
pub(crate) async fn run(args: ServeArgs) -> anyhow::Result<ExitCode> {
    if !args.bind.is_loopback() {
        anyhow::bail!("--bind must be a loopback address, got {}", args.bind);
    }
    let mut builder = TestServer::builder()
        .bind(SocketAddr::new(args.bind, args.port))
        .delay(Duration::from_millis(args.delay_ms))
        .session_resumption(!args.no_resumption)
        .tls_versions(match args.tls {
            TlsArg::V12 => TlsVersions::Tls12Only,
            TlsArg::V13 => TlsVersions::Tls13Only,
            TlsArg::Both => TlsVersions::Both,
        })
        .http_versions(match args.http {
            HttpArg::H1 => HttpVersions::Http1Only,
            HttpArg::H2 => HttpVersions::Http2Only,
            HttpArg::Both => HttpVersions::Both,
        });
    if args.idle_timeout_ms > 0 {
        builder = builder.idle_timeout(Some(Duration::from_millis(args.idle_timeout_ms)));
    }
    let pki = TestPki::localhost().context("cannot generate the test certificates")?;
    if !args.plain {
        builder = builder.tls(&pki);
    }
    let server = builder
        .start()
        .await
        .context("cannot start the test server")?;
    let proxy = if args.rtt_ms > 0 {
        Some(
            DelayProxy::start(server.addr(), Duration::from_millis(args.rtt_ms) / 2)
                .await
                .context("cannot start the delay proxy")?,
        )
    } else {
        None
    };
    let addr = proxy.as_ref().map_or(server.addr(), DelayProxy::addr);
    let scheme = if args.plain { "http" } else { "https" };
    // The certificate covers localhost, 127.0.0.1 and ::1. Bound to IPv6,
    // the URL names the address: `localhost` may resolve to 127.0.0.1 only.
    let host = match (args.plain, addr.ip()) {
        (_, IpAddr::V6(ip)) => format!("[{ip}]"),
        (false, IpAddr::V4(_)) => "localhost".to_owned(),
        (true, IpAddr::V4(ip)) => ip.to_string(),
    };
    // Written only once the server listens (a server that failed to start
    // leaves a running one's CA alone), via a temporary file and a rename.
    let ca_path = (!args.plain).then(|| {
        args.ca_out
            .clone()
            .unwrap_or_else(|| PathBuf::from(format!("conntrace-lab-ca-{}.pem", addr.port())))
    });
    if let Some(path) = &ca_path {
        write_atomically(path, pki.ca_cert_pem().as_bytes())
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    let mut out = std::io::stdout();
    writeln!(out, "{scheme}://{host}:{}/", addr.port())?;
    if let Some(path) = &ca_path {
        writeln!(out, "ca: {}", path.display())?;
    }
    if let IpAddr::V6(ip) = addr.ip() {
        writeln!(
            out,
            "by name: {scheme}://localhost:{port}/ --resolve localhost:{port}:[{ip}]",
            port = addr.port()
        )?;
    }
    if let Some(p) = &proxy {
        writeln!(
            out,
            "rtt: {} ms via proxy {} -> server {}",
            p.rtt().as_millis(),
            p.addr(),
            server.addr()
        )?;
    }
    out.flush()?;
    tokio::signal::ctrl_c()
        .await
        .context("cannot wait for Ctrl-C")?;
    eprintln!(
        "served {} request(s) on {} connection(s), {} TLS handshake(s) ({} resumed)",
        server.request_count(),
        server.accepted_connections(),
        server.tls_handshakes(),
        server.tls_resumed_handshakes()
    );
    Ok(ExitCode::SUCCESS)
}

/// Writes `bytes` to a temporary file beside `path` and renames it over
/// `path`, so a reader never sees a half-written certificate.
fn write_atomically(path: &std::path::Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_file_name(format!(
        ".{}.tmp-{}",
        path.file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
        std::process::id()
    ));
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, path).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}
