//! `conntrace lab <scenario>`: replays, on loopback, the connection faults
//! behind the incidents in `shared/INCIDENTS.md` (and the other ways a pool
//! loses connections), and prints what the telemetry concluded, read back
//! from the very spans it exported (`http.connection.miss_reason`, the
//! setup phases, `tcp.syn_retransmit`, `tcp.address_skipped`,
//! `dns.lookup_began`, `proxy.connect`, ...).
//!
//! Every scenario starts its own servers and fault injectors from
//! `conntrace-lab` (loopback only, nothing to set up), runs one or more
//! *runs* (each under its own `lab <scenario>: <run>` span, attribute
//! `conntrace.lab.run`), then reads the spans back and prints, in plain
//! words and numbers, what they show and the fix. With
//! `OTEL_EXPORTER_OTLP_ENDPOINT` set the spans are also exported; `--json`
//! prints the `conntrace.lab/v1` document (SCHEMA.md).
//!
//! One module per scenario; [`runner`] holds what they share (arguments,
//! span pipeline, clients, output), [`view`] reads the spans back.

mod cancelled_handshake;
mod connect_proxy;
mod dead_first_address;
mod discarded;
mod dns_change;
mod dns_queue;
mod env_proxy;
mod far_server;
mod goaway;
mod idle_expired;
mod ipv6_blackhole;
mod net;
mod new_client;
mod redirect_chain;
mod report;
mod request_limit;
mod runner;
mod server_closed;
mod stalled;
mod text;
mod view;

pub(crate) use runner::{LabArgs, run};

/// How many requests per run a scenario takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RequestCount {
    /// Without `--requests`.
    pub(crate) default: u32,
    /// The fewest that can reproduce the scenario.
    pub(crate) min: u32,
    /// Why fewer cannot show it (the end of the error line).
    pub(crate) why: &'static str,
}

/// The scenarios, in `--list` order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Scenario {
    /// Incident 3: far server, TLS 1.2 vs 1.3, fresh vs pooled, resumption,
    /// full accept queue.
    FarServer,
    /// Incident 4: IPv6 drops SYNs, IPv4 works; address order.
    Ipv6Blackhole,
    /// `idle_expired`.
    IdleExpired,
    /// `discarded`.
    Discarded,
    /// `closed_by_peer`.
    ServerClosed,
    /// `new_client`.
    NewClient,
    /// A CONNECT proxy.
    ConnectProxy,
    /// DNS queueing behind a saturated blocking pool.
    DnsQueue,
    /// A dead first address with a connect timeout.
    DeadFirstAddress,
    /// A request cancelled mid-handshake.
    CancelledHandshake,
    /// A redirect chain across five hosts.
    RedirectChain,
    /// A proxy from `HTTPS_PROXY`, open and refusing.
    EnvProxy,
    /// `request_limit`: the server's per-connection request limit.
    RequestLimit,
    /// HTTP/2 GOAWAY after N streams.
    GoAway,
    /// A stalled HTTP/2 connection.
    StalledConnection,
    /// A DNS change under a pooled connection.
    DnsChange,
}

impl Scenario {
    /// Every scenario, in `--list` order.
    pub(crate) const ALL: [Scenario; 16] = [
        Scenario::FarServer,
        Scenario::Ipv6Blackhole,
        Scenario::IdleExpired,
        Scenario::Discarded,
        Scenario::ServerClosed,
        Scenario::NewClient,
        Scenario::ConnectProxy,
        Scenario::DnsQueue,
        Scenario::DeadFirstAddress,
        Scenario::CancelledHandshake,
        Scenario::RedirectChain,
        Scenario::EnvProxy,
        Scenario::RequestLimit,
        Scenario::GoAway,
        Scenario::StalledConnection,
        Scenario::DnsChange,
    ];

    /// The name on the command line.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Scenario::FarServer => "far-server",
            Scenario::Ipv6Blackhole => "ipv6-blackhole",
            Scenario::IdleExpired => "idle-expired",
            Scenario::Discarded => "discarded",
            Scenario::ServerClosed => "server-closed",
            Scenario::NewClient => "new-client",
            Scenario::ConnectProxy => "connect-proxy",
            Scenario::DnsQueue => "dns-queue",
            Scenario::DeadFirstAddress => "dead-first-address",
            Scenario::CancelledHandshake => "cancelled-handshake",
            Scenario::RedirectChain => "redirect-chain",
            Scenario::EnvProxy => "env-proxy",
            Scenario::RequestLimit => "request-limit",
            Scenario::GoAway => "goaway",
            Scenario::StalledConnection => "stalled-connection",
            Scenario::DnsChange => "dns-change",
        }
    }

    /// One line for `--list`.
    pub(crate) fn description(self) -> &'static str {
        match self {
            Scenario::FarServer => {
                "incident 3: a far HTTPS server (150 ms RTT): TLS 1.2 vs 1.3, a connection per request vs pooled, resumption on vs off, and a full accept queue that drops the SYN (1 s retransmit)"
            }
            Scenario::Ipv6Blackhole => {
                "incident 4: a name resolving to an IPv6 address that drops SYNs and a working IPv4 one; 8 parallel fetches with the resolver's order (Happy Eyeballs fallback) and with --address-order ipv4-first"
            }
            Scenario::IdleExpired => {
                "the client's pool idle timeout is shorter than the gap between requests: the second request is a miss with idle_expired"
            }
            Scenario::Discarded => {
                "a response body dropped unread: the next request is a miss with discarded; read to the end, the connection is reused"
            }
            Scenario::ServerClosed => {
                "the server's keep-alive timeout is shorter than the client's idle timeout: the pooled connection was closed by the server (closed_by_peer), and the fix"
            }
            Scenario::NewClient => {
                "a new client per request: every request a miss with new_client and a full TLS handshake, vs one shared client"
            }
            Scenario::ConnectProxy => {
                "through an HTTP CONNECT proxy: one tunnel (proxy.connect) for 20 sequential https requests; a plain-http target forwarded"
            }
            Scenario::DnsQueue => {
                "DNS behind a saturated blocking pool: dns.lookup_began shows the queueing, and a connect timeout shorter than it fails in dns.lookup"
            }
            Scenario::DeadFirstAddress => {
                "the first resolved address never answers, the second works, 1 s connect timeout: fallback after half the timeout, tcp.address_skipped timed_out"
            }
            Scenario::CancelledHandshake => {
                "a request timeout (and a connect timeout) fires mid TLS handshake: the abandoned connect's spans end cancelled / timeout, the next request is a miss"
            }
            Scenario::EnvProxy => {
                "a proxy from HTTPS_PROXY (conntrace probe child processes): the setup span names the proxy and has proxy.connect; a CONNECT answered 407 or 502 fails with error.type proxy_auth_required / proxy_connect_refused"
            }
            Scenario::RedirectChain => {
                "a 302 chain across 127.0.0.1 to 127.0.0.5: one span per hop (http.request.resend_count), each on its own host and new connection; the chain again: five idle hits"
            }
            Scenario::RequestLimit => {
                "the server closes each connection after 5 requests (Connection: close, like nginx keepalive_requests): every 6th request is a miss with request_limit naming the connection that carried 5"
            }
            Scenario::GoAway => {
                "an HTTP/2 server sends GOAWAY after 3 streams: the request after it is a miss with request_limit, previous.end goaway, naming the connection"
            }
            Scenario::StalledConnection => {
                "an HTTP/2 peer stops answering: the requests that time out name the connection, stalled, with the kernel's evidence (nothing received)"
            }
            Scenario::DnsChange => {
                "the name moves to another address while a connection to the old one is pooled: requests still going there carry dns_stale"
            }
        }
    }

    /// The default `--rtt-ms` of a scenario that emulates a round-trip
    /// time; `None` for the others, which reject `--rtt-ms`.
    pub(crate) fn default_rtt_ms(self) -> Option<u64> {
        match self {
            Scenario::FarServer => Some(150),
            Scenario::CancelledHandshake => Some(200),
            _ => None,
        }
    }

    /// The default and the smallest `--requests` of a scenario whose request
    /// count is a parameter, the smallest being the fewest requests whose
    /// spans can still show what the scenario replays; `None` for the
    /// others, which reject `--requests`.
    pub(crate) fn requests(self) -> Option<RequestCount> {
        let (default, min, why) = match self {
            Scenario::FarServer => (
                3,
                2,
                "a second request is what reuses a connection or resumes a TLS session",
            ),
            Scenario::Ipv6Blackhole => (8, 1, "one fetch shows the fallback"),
            Scenario::NewClient => (
                5,
                2,
                "the first request is cold, new_client misses start at the second",
            ),
            Scenario::ConnectProxy => (20, 2, "the tunnel is reused from the second request on"),
            _ => return None,
        };
        Some(RequestCount { default, min, why })
    }

    /// The scenario named `name`, if any.
    pub(crate) fn from_name(name: &str) -> Option<Scenario> {
        Scenario::ALL.into_iter().find(|s| s.name() == name)
    }
}
