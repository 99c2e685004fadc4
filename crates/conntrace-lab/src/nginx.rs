//! `Nginx`: a real nginx on loopback, as a reference server whose access
//! log tells which connection served each request.
//!
//! The fixture runs nginx in the foreground and single-process mode
//! (`daemon off; master_process off;`) as a child process, with a generated
//! `nginx.conf`, pid file, logs and temp paths all inside a private temp
//! directory. No `user` directive is written: a single-process nginx never
//! switches user, so it works the same as root or not. It serves on
//! `127.0.0.1`, random free ports:
//!
//! - TLS 1.3 only (session tickets on, key file in the temp dir);
//! - TLS 1.2 only (session ids via `ssl_session_cache` + tickets);
//! - TLS 1.2/1.3 with HTTP/2 offered via ALPN (`http2 on;` on nginx >=
//!   1.25.1, `listen ... ssl http2` before);
//! - plain HTTP (optional, on by default).
//!
//! Every listener answers `GET /` (any path) with `200 ok\n`, but for a
//! redirect chain: `/hop/<rest>` answers `302` to `/<rest>`, so
//! `/hop/hop/hop/` is three redirects, then `200` at `/` (each hop its
//! own request in the access log, on the connection the client chose);
//! `/to/127.0.0.<k>/<rest>` answers `302` to `<rest>` on that address, the
//! same port and scheme (across hosts: see
//! [`NginxConfig::loopback_hosts`]).
//! Stock nginx
//! cannot delay a response, so when [`NginxConfig::upstream`] is set,
//! `/delay/...` and `/bytes/...` are proxied (new upstream connection per
//! request) to that server, normally a [`TestServer`](crate::TestServer).
//!
//! The ports are found by binding `127.0.0.1:0` and releasing the sockets
//! before nginx starts; if nginx then fails to bind, the start is retried
//! with new ports (up to 5 times).

mod access_log;

use std::fmt::Write as _;
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tokio::time::Instant;

pub use access_log::{AccessLogEntry, NginxListener};

use crate::{LabError, PkiFiles, TestPki};

/// How long `start` waits for nginx to listen on all ports, per attempt.
const READY_TIMEOUT: Duration = Duration::from_secs(10);
/// Start attempts (each with new ports) before giving up.
const ATTEMPTS: usize = 5;

/// What the nginx fixture serves and how.
#[derive(Debug, Clone)]
pub struct NginxConfig {
    pki: TestPki,
    keepalive_timeout: Duration,
    keepalive_requests: u32,
    plain_http: bool,
    loopback_hosts: u8,
    upstream: Option<SocketAddr>,
}

impl NginxConfig {
    /// Defaults: certificate from `pki`, `keepalive_timeout 65s`,
    /// `keepalive_requests 10000`, plain HTTP listener on, no upstream.
    pub fn new(pki: &TestPki) -> Self {
        Self {
            pki: pki.clone(),
            keepalive_timeout: Duration::from_secs(65),
            keepalive_requests: 10_000,
            plain_http: true,
            loopback_hosts: 1,
            upstream: None,
        }
    }

    /// nginx's `keepalive_timeout` (millisecond resolution): how long an idle
    /// keep-alive connection stays open.
    pub fn keepalive_timeout(mut self, timeout: Duration) -> Self {
        self.keepalive_timeout = timeout;
        self
    }

    /// nginx's `keepalive_requests`: requests per connection before nginx closes it.
    pub fn keepalive_requests(mut self, n: u32) -> Self {
        self.keepalive_requests = n;
        self
    }

    /// Whether to also serve plain HTTP (default true).
    pub fn plain_http(mut self, on: bool) -> Self {
        self.plain_http = on;
        self
    }

    /// The plain HTTP listener also listens on `127.0.0.2` up to
    /// `127.0.0.<n>`, on the same port (Linux routes all of `127.0.0.0/8`
    /// to loopback), so a redirect chain can cross hosts (pool keys):
    /// `/to/127.0.0.2/<rest>` answers `302` to `http://127.0.0.2:<port>/<rest>`.
    /// Default: 1 (`127.0.0.1` only).
    pub fn loopback_hosts(mut self, n: u8) -> Self {
        self.loopback_hosts = n.max(1);
        self
    }

    /// Proxies `/delay/...` and `/bytes/...` to this plain-HTTP server.
    pub fn upstream(mut self, addr: SocketAddr) -> Self {
        self.upstream = Some(addr);
        self
    }
}

/// A running nginx. Dropping it kills the process and deletes its directory.
#[derive(Debug)]
pub struct Nginx {
    child: Child,
    dir: tempfile::TempDir,
    version: (u32, u32, u32),
    tls13: SocketAddr,
    tls12: SocketAddr,
    h2: SocketAddr,
    plain: Option<SocketAddr>,
    pki_files: PkiFiles,
}

impl Nginx {
    /// Finds the nginx binary: `$NGINX_BIN`, then `nginx` in `PATH`, then
    /// `/usr/sbin/nginx`, `/usr/local/sbin/nginx`, `/usr/local/nginx/sbin/nginx`.
    ///
    /// # Errors
    /// [`LabError::NginxMissing`] listing the places searched.
    pub fn find_binary() -> Result<PathBuf, LabError> {
        let mut searched = Vec::new();
        if let Some(bin) = std::env::var_os("NGINX_BIN") {
            let bin = PathBuf::from(bin);
            if bin.is_file() {
                return Ok(bin);
            }
            searched.push(bin.display().to_string());
        }
        let mut candidates: Vec<PathBuf> = std::env::var_os("PATH")
            .map(|p| std::env::split_paths(&p).map(|d| d.join("nginx")).collect())
            .unwrap_or_default();
        candidates.extend(
            [
                "/usr/sbin/nginx",
                "/usr/local/sbin/nginx",
                "/usr/local/nginx/sbin/nginx",
            ]
            .map(PathBuf::from),
        );
        for candidate in candidates {
            if candidate.is_file() {
                return Ok(candidate);
            }
            searched.push(candidate.display().to_string());
        }
        Err(LabError::NginxMissing {
            searched: searched.join(", "),
        })
    }

    /// Writes the configuration, starts nginx and waits until the pid file
    /// exists and every port accepts connections.
    ///
    /// # Errors
    /// [`LabError::NginxMissing`] without an nginx binary;
    /// [`LabError::NginxFailed`] if nginx exits or does not listen within
    /// 10 s (after 5 attempts with new ports when the cause was a port
    /// clash); [`LabError::Io`] for temp-dir and file errors.
    pub async fn start(config: NginxConfig) -> Result<Nginx, LabError> {
        let bin = Self::find_binary()?;
        let version = nginx_version(&bin)?;
        let dir = tempfile::Builder::new()
            .prefix("conntrace-nginx-")
            .tempdir()
            .map_err(|e| LabError::io("create nginx temp dir", e))?;
        let pki_files = config.pki.write_to_dir(dir.path())?;
        write_ticket_key(&dir.path().join("ticket.key"))?;
        for sub in ["client_body", "proxy", "fastcgi", "uwsgi", "scgi"] {
            std::fs::create_dir_all(dir.path().join(sub))
                .map_err(|e| LabError::io("create nginx temp path", e))?;
        }

        let mut last_error = None;
        for _ in 0..ATTEMPTS {
            let ports = free_ports(if config.plain_http { 4 } else { 3 })?;
            let addr = |port: u16| SocketAddr::from((Ipv4Addr::LOCALHOST, port));
            let plan = Listeners {
                tls13: addr(ports[0]),
                tls12: addr(ports[1]),
                h2: addr(ports[2]),
                plain: ports.get(3).map(|p| addr(*p)),
            };
            let conf = render_config(dir.path(), &pki_files, &config, &plan, version);
            let conf_path = dir.path().join("nginx.conf");
            std::fs::write(&conf_path, conf).map_err(|e| LabError::io("write nginx.conf", e))?;
            for stale in ["nginx.pid", "error.log", "stderr.log"] {
                let _ = std::fs::remove_file(dir.path().join(stale));
            }
            let mut child = spawn(&bin, dir.path(), &conf_path, version)?;
            match wait_ready(&mut child, dir.path(), &plan.addrs()).await {
                Ok(()) => {
                    return Ok(Nginx {
                        child,
                        dir,
                        version,
                        tls13: plan.tls13,
                        tls12: plan.tls12,
                        h2: plan.h2,
                        plain: plan.plain,
                        pki_files,
                    });
                }
                Err(e) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    if !read_error_log(dir.path()).contains("Address already in use") {
                        return Err(e);
                    }
                    last_error = Some(e);
                }
            }
        }
        Err(last_error.unwrap_or_else(|| LabError::NginxFailed {
            message: "no start attempt was made".into(),
            error_log: String::new(),
        }))
    }

    /// The nginx version, e.g. `(1, 22, 1)`.
    pub fn version(&self) -> (u32, u32, u32) {
        self.version
    }

    /// The TLS 1.3-only listener.
    pub fn tls13_addr(&self) -> SocketAddr {
        self.tls13
    }

    /// The TLS 1.2-only listener.
    pub fn tls12_addr(&self) -> SocketAddr {
        self.tls12
    }

    /// The TLS listener offering HTTP/2 (and HTTP/1.1) via ALPN.
    pub fn h2_addr(&self) -> SocketAddr {
        self.h2
    }

    /// The plain HTTP listener, if configured.
    pub fn plain_addr(&self) -> Option<SocketAddr> {
        self.plain
    }

    /// The address of `listener` (`None` only for `Plain` when disabled).
    pub fn addr(&self, listener: NginxListener) -> Option<SocketAddr> {
        match listener {
            NginxListener::Tls13 => Some(self.tls13),
            NginxListener::Tls12 => Some(self.tls12),
            NginxListener::H2 => Some(self.h2),
            NginxListener::Plain => self.plain,
        }
    }

    /// A URL for `path` on `listener`: `https://localhost:PORT{path}` for TLS
    /// listeners, `http://127.0.0.1:PORT{path}` for plain; `None` for a
    /// disabled plain listener.
    pub fn url(&self, listener: NginxListener, path: &str) -> Option<String> {
        let addr = self.addr(listener)?;
        Some(match listener {
            NginxListener::Plain => format!("http://{addr}{path}"),
            _ => format!("https://localhost:{}{path}", addr.port()),
        })
    }

    /// The PEM files nginx uses (CA, chain, key) inside its temp dir.
    pub fn pki_files(&self) -> &PkiFiles {
        &self.pki_files
    }

    /// The directory holding `nginx.conf`, logs and temp paths.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// All access-log lines written so far, parsed, with
    /// [`AccessLogEntry::listener`] filled in. nginx writes each line
    /// unbuffered when the request completes, which can be just after the
    /// client has read the response: see [`Nginx::wait_for_access_log`].
    /// Lines that do not parse are skipped; a missing log gives an empty list.
    pub fn access_log(&self) -> Vec<AccessLogEntry> {
        let text = std::fs::read_to_string(self.dir.path().join("access.log")).unwrap_or_default();
        text.lines()
            .filter_map(AccessLogEntry::parse_line)
            .map(|mut entry| {
                entry.listener = self.listener_of(entry.server_port);
                entry
            })
            .collect()
    }

    /// Waits until the access log holds at least `min_entries` lines or
    /// `timeout` passes; returns what is there (the caller asserts).
    pub async fn wait_for_access_log(
        &self,
        min_entries: usize,
        timeout: Duration,
    ) -> Vec<AccessLogEntry> {
        let deadline = Instant::now() + timeout;
        loop {
            let entries = self.access_log();
            if entries.len() >= min_entries || Instant::now() >= deadline {
                return entries;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// nginx's error log and captured stderr (for failure messages).
    pub fn error_log(&self) -> String {
        read_error_log(self.dir.path())
    }

    fn listener_of(&self, port: u16) -> Option<NginxListener> {
        [
            NginxListener::Tls13,
            NginxListener::Tls12,
            NginxListener::H2,
            NginxListener::Plain,
        ]
        .into_iter()
        .find(|l| self.addr(*l).map(|a| a.port()) == Some(port))
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

struct Listeners {
    tls13: SocketAddr,
    tls12: SocketAddr,
    h2: SocketAddr,
    plain: Option<SocketAddr>,
}

impl Listeners {
    fn addrs(&self) -> Vec<SocketAddr> {
        let mut addrs = vec![self.tls13, self.tls12, self.h2];
        addrs.extend(self.plain);
        addrs
    }
}

fn read_error_log(dir: &Path) -> String {
    let read = |name: &str| std::fs::read_to_string(dir.join(name)).unwrap_or_default();
    format!("{}{}", read("error.log"), read("stderr.log"))
}

/// Waits until nginx has written its pid file and every address accepts.
async fn wait_ready(child: &mut Child, dir: &Path, addrs: &[SocketAddr]) -> Result<(), LabError> {
    let deadline = Instant::now() + READY_TIMEOUT;
    let pid_file = dir.join("nginx.pid");
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Err(LabError::NginxFailed {
                message: format!("nginx exited during start-up ({status})"),
                error_log: read_error_log(dir),
            });
        }
        let pid_written = std::fs::read_to_string(&pid_file)
            .map(|s| !s.trim().is_empty())
            .unwrap_or(false);
        if pid_written {
            let mut all = true;
            for addr in addrs {
                if tokio::net::TcpStream::connect(addr).await.is_err() {
                    all = false;
                    break;
                }
            }
            if all {
                return Ok(());
            }
        }
        if Instant::now() >= deadline {
            return Err(LabError::NginxFailed {
                message: format!("nginx did not listen within {READY_TIMEOUT:?}"),
                error_log: read_error_log(dir),
            });
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn free_ports(n: usize) -> Result<Vec<u16>, LabError> {
    let listeners = (0..n)
        .map(|_| TcpListener::bind((Ipv4Addr::LOCALHOST, 0)))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| LabError::io("find free ports for nginx", e))?;
    listeners
        .iter()
        .map(|l| l.local_addr().map(|a| a.port()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| LabError::io("find free ports for nginx", e))
}

fn nginx_version(bin: &Path) -> Result<(u32, u32, u32), LabError> {
    let out = Command::new(bin)
        .arg("-v")
        .output()
        .map_err(|e| LabError::io(format!("run {} -v", bin.display()), e))?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    let parsed = text
        .split("nginx/")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .map(|v| {
            let mut parts = v.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
            (
                parts.next().unwrap_or(0),
                parts.next().unwrap_or(0),
                parts.next().unwrap_or(0),
            )
        });
    parsed.ok_or_else(|| LabError::NginxFailed {
        message: format!("cannot parse nginx version from {text:?}"),
        error_log: String::new(),
    })
}

fn write_ticket_key(path: &Path) -> Result<(), LabError> {
    let mut key = [0u8; 80];
    rustls::crypto::ring::default_provider()
        .secure_random
        .fill(&mut key)
        .map_err(|_| {
            LabError::InvalidConfig("no secure random source for the ticket key".into())
        })?;
    std::fs::write(path, key).map_err(|e| LabError::io("write nginx ticket key", e))
}

fn spawn(bin: &Path, dir: &Path, conf: &Path, version: (u32, u32, u32)) -> Result<Child, LabError> {
    let stderr = std::fs::File::create(dir.join("stderr.log"))
        .map_err(|e| LabError::io("create nginx stderr log", e))?;
    let mut cmd = Command::new(bin);
    cmd.arg("-p").arg(dir).arg("-c").arg(conf);
    if version >= (1, 19, 5) {
        cmd.arg("-e").arg(dir.join("error.log"));
    }
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .map_err(|e| LabError::io(format!("start {}", bin.display()), e))
}

fn render_config(
    dir: &Path,
    pki: &PkiFiles,
    config: &NginxConfig,
    plan: &Listeners,
    version: (u32, u32, u32),
) -> String {
    let d = dir.display();
    let http2_directive = version >= (1, 25, 1);
    let mut locations = String::from(
        "        location / { return 200 \"ok\\n\"; }\n        location ~ ^/hop/(.*)$ { return 302 /$1; }\n        location ~ ^/to/(127\\.0\\.0\\.[0-9]+)/(.*)$ { return 302 $scheme://$1:$server_port/$2; }\n",
    );
    if let Some(upstream) = config.upstream {
        let _ = writeln!(
            locations,
            "        location ~ ^/(delay|bytes)/ {{ proxy_pass http://{upstream}; proxy_http_version 1.1; }}"
        );
    }
    let server = |listen: String, extra: &str| {
        format!("    server {{\n        listen {listen};\n{extra}{locations}    }}\n")
    };
    let mut servers = String::new();
    servers += &server(
        format!("{} ssl", plan.tls13),
        "        ssl_protocols TLSv1.3;\n",
    );
    servers += &server(
        format!("{} ssl", plan.tls12),
        "        ssl_protocols TLSv1.2;\n",
    );
    if http2_directive {
        servers += &server(
            format!("{} ssl", plan.h2),
            "        http2 on;\n        ssl_protocols TLSv1.2 TLSv1.3;\n",
        );
    } else {
        servers += &server(
            format!("{} ssl http2", plan.h2),
            "        ssl_protocols TLSv1.2 TLSv1.3;\n",
        );
    }
    if let Some(plain) = plan.plain {
        let mut also = String::new();
        for k in 2..=config.loopback_hosts {
            let _ = writeln!(also, "        listen 127.0.0.{k}:{};", plain.port());
        }
        servers += &server(plain.to_string(), &also);
    }
    format!(
        "daemon off;
master_process off;
worker_processes 1;
pid {d}/nginx.pid;
error_log {d}/error.log info;
events {{ worker_connections 1024; }}
http {{
    client_body_temp_path {d}/client_body;
    proxy_temp_path {d}/proxy;
    fastcgi_temp_path {d}/fastcgi;
    uwsgi_temp_path {d}/uwsgi;
    scgi_temp_path {d}/scgi;
    default_type text/plain;
    log_format conntrace '{fmt}';
    access_log {d}/access.log conntrace;
    keepalive_timeout {ka}ms;
    keepalive_requests {kr};
    ssl_certificate {cert};
    ssl_certificate_key {key};
    ssl_session_cache shared:conntrace:1m;
    ssl_session_timeout 1h;
    ssl_session_tickets on;
    ssl_session_ticket_key {d}/ticket.key;
{servers}}}
",
        fmt = access_log::LOG_FORMAT,
        ka = config.keepalive_timeout.as_millis(),
        kr = config.keepalive_requests,
        cert = pki.cert.display(),
        key = pki.key.display(),
    )
}
