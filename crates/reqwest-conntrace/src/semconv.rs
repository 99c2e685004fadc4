//! Every span name, attribute key, metric name, event name and enumerated
//! value this crate emits, in one place.
//!
//! Where an OpenTelemetry semantic convention exists (semantic conventions
//! v1.42.0, re-exported from [`opentelemetry_semantic_conventions`]) the
//! constant here is that convention's constant. This crate's own names (no
//! convention exists for connection-pool attribution, setup phases, kernel
//! TCP facts or fan-outs; checked against semantic conventions v1.42.0) are:
//! everything under `http.connection.*` except [`HTTP_CONNECTION_STATE`],
//! `http.fan_out.*`, the metrics `http.client.connection.setup.duration`,
//! `http.client.connections.opened`, `http.client.requests.untracked` and
//! `http.client.pool.*`, the span names
//! `http.connection_setup`, `dns.lookup`, `tcp.connect`, `proxy.connect`,
//! `tls.handshake`, and the events. These names are stable within a major
//! version of this crate.

use opentelemetry_semantic_conventions::attribute as sc;

// ---------------------------------------------------------------------------
// Span names
// ---------------------------------------------------------------------------

/// Name of the connection-setup span: one per new connection, child of the
/// request whose pool miss triggered the connect. Its children are
/// [`DNS_LOOKUP_SPAN`], [`TCP_CONNECT_SPAN`] and [`TLS_HANDSHAKE_SPAN`].
pub const CONNECTION_SETUP_SPAN: &str = "http.connection_setup";
/// Name of the DNS phase span (child of [`CONNECTION_SETUP_SPAN`]): from the
/// resolver call to its answer. Absent when the host is an IP literal or a
/// `ClientBuilder::resolve` override answered (see [`HTTP_CONNECTION_DNS_SKIPPED`]).
pub const DNS_LOOKUP_SPAN: &str = "dns.lookup";
/// Name of the TCP phase span (child of [`CONNECTION_SETUP_SPAN`]): from the
/// DNS answer (or the connect call when DNS was skipped) to the first byte of
/// the TLS ClientHello (or to the connection being ready for plain HTTP).
/// Includes every Happy Eyeballs attempt (RFC 8305) and SYN retransmit.
pub const TCP_CONNECT_SPAN: &str = "tcp.connect";
/// Name of the proxy tunnel phase span (child of [`CONNECTION_SETUP_SPAN`]):
/// an `https` request through an HTTP proxy, however configured (the
/// instrumented builder's
/// [`proxy`](crate::InstrumentedClientBuilder::proxy), reqwest's builder
/// including `Proxy::custom`, or the `HTTPS_PROXY` / `ALL_PROXY` /
/// `NO_PROXY` environment; judged from where the connect went), from the
/// TCP connection to the proxy being established to the proxy's answer to
/// `CONNECT` (RFC 9110 §9.3.6): `200` and the start of TLS, or a refusal,
/// which fails the span with an [`ERROR_TYPE_PROXY_AUTH_REQUIRED`] /
/// [`ERROR_TYPE_PROXY_CONNECT_REFUSED`] / [`ERROR_TYPE_PROXY_CONNECT_FAILED`]
/// `error.type` (and `http.response.status_code = 407` for the first).
/// Carries `server.address` / `server.port` (the tunnel's target),
/// [`HTTP_CONNECTION_PROXY_ADDRESS`] / [`HTTP_CONNECTION_PROXY_PORT`] and,
/// once connected, `network.peer.*` (the proxy). Its start is the start of
/// the connect future's poll that completed the TCP connect and sent the
/// CONNECT request (no hook exists between them): exact when that poll is
/// the one the socket becoming writable woke, as it is for hyper-util's
/// tunnel. When the proxy's answer was already there within the same poll
/// (a loopback proxy faster than the scheduler), no boundary exists: the
/// span then starts with that poll and includes the TCP connect.
pub const PROXY_CONNECT_SPAN: &str = "proxy.connect";
/// Name of the TLS phase span (child of [`CONNECTION_SETUP_SPAN`], https
/// only): from building the ClientHello to the connection being ready.
pub const TLS_HANDSHAKE_SPAN: &str = "tls.handshake";

// ---------------------------------------------------------------------------
// Semantic-convention attributes we use (semconv v1.42.0)
// ---------------------------------------------------------------------------

/// `http.request.method` (string), HTTP semconv.
pub const HTTP_REQUEST_METHOD: &str = sc::HTTP_REQUEST_METHOD;
/// `http.request.method_original` (string), HTTP semconv: the method sent
/// when it is not a known one (`http.request.method` is then `_OTHER`).
pub const HTTP_REQUEST_METHOD_ORIGINAL: &str = sc::HTTP_REQUEST_METHOD_ORIGINAL;
/// `http.request.resend_count` (int), HTTP semconv: the number of
/// physical requests sent before this one for the same call: redirect hops
/// followed, and attempts of a retry middleware placed before
/// [`ConnTraceMiddleware`](crate::ConnTraceMiddleware) (it hands the same
/// `Extensions` to each attempt); the first request has none.
pub const HTTP_REQUEST_RESEND_COUNT: &str = sc::HTTP_REQUEST_RESEND_COUNT;
/// `http.response.status_code` (int), HTTP semconv.
pub const HTTP_RESPONSE_STATUS_CODE: &str = sc::HTTP_RESPONSE_STATUS_CODE;
/// `http.response.body.size` (int, bytes): body bytes read by the caller.
pub const HTTP_RESPONSE_BODY_SIZE: &str = sc::HTTP_RESPONSE_BODY_SIZE;
/// `http.connection.state` (string, `idle` / `active`), HTTP metrics semconv.
pub const HTTP_CONNECTION_STATE: &str = sc::HTTP_CONNECTION_STATE;
/// `url.full` (string): credentials and signed query values redacted.
pub const URL_FULL: &str = sc::URL_FULL;
/// `url.scheme` (string).
pub const URL_SCHEME: &str = sc::URL_SCHEME;
/// `server.address` (string): the URL's host (for TLS also the SNI name).
pub const SERVER_ADDRESS: &str = sc::SERVER_ADDRESS;
/// `server.port` (int): the URL's port or the scheme's default.
pub const SERVER_PORT: &str = sc::SERVER_PORT;
/// `error.type` (string): one of the `ERROR_TYPE_*` values below, or an HTTP
/// status code as a string for 4xx/5xx responses.
pub const ERROR_TYPE: &str = sc::ERROR_TYPE;
/// `network.protocol.version` (string): `1.1` or `2`.
pub const NETWORK_PROTOCOL_VERSION: &str = sc::NETWORK_PROTOCOL_VERSION;
/// `network.peer.address` (string): IP the connection went to (a proxy's
/// address when proxied). On a connect whose TLS handshake hung or failed
/// after TCP connected (no connection came back), the address is learnt
/// from the kernel (`tcp.connect` and setup span; see
/// [`HTTP_CONNECTION_PEER_CANDIDATES`] for when it cannot be).
pub const NETWORK_PEER_ADDRESS: &str = sc::NETWORK_PEER_ADDRESS;
/// `network.peer.port` (int).
pub const NETWORK_PEER_PORT: &str = sc::NETWORK_PEER_PORT;
/// `network.local.address` (string).
pub const NETWORK_LOCAL_ADDRESS: &str = sc::NETWORK_LOCAL_ADDRESS;
/// `network.local.port` (int): the client's ephemeral port, which with the
/// peer pair identifies the socket (e.g. in `ss -ti` or a server access log).
pub const NETWORK_LOCAL_PORT: &str = sc::NETWORK_LOCAL_PORT;
/// `network.type` (string): `ipv4` or `ipv6`.
pub const NETWORK_TYPE: &str = sc::NETWORK_TYPE;
/// `network.transport` (string): always `tcp` here.
pub const NETWORK_TRANSPORT: &str = sc::NETWORK_TRANSPORT;
/// `dns.question.name` (string): the name asked of the resolver.
pub const DNS_QUESTION_NAME: &str = sc::DNS_QUESTION_NAME;
/// `dns.answers` (string array): resolved addresses in the order returned.
pub const DNS_ANSWERS: &str = sc::DNS_ANSWERS;
/// `tls.protocol.name` (string): always `tls`.
pub const TLS_PROTOCOL_NAME: &str = sc::TLS_PROTOCOL_NAME;
/// `tls.protocol.version` (string): `1.2` or `1.3`.
pub const TLS_PROTOCOL_VERSION: &str = sc::TLS_PROTOCOL_VERSION;
/// `tls.resumed` (bool): the handshake resumed a session (TLS 1.3 ticket or
/// TLS 1.2 session id / ticket), so no certificate was sent or verified.
pub const TLS_RESUMED: &str = sc::TLS_RESUMED;
/// `tls.next_protocol` (string): ALPN result, `h2` or `http/1.1`.
pub const TLS_NEXT_PROTOCOL: &str = sc::TLS_NEXT_PROTOCOL;

// ---------------------------------------------------------------------------
// Our own attributes (no convention exists)
// ---------------------------------------------------------------------------

/// `http.connection.reused` (bool, request span): the serving connection was
/// ready before this request started, i.e. a pool hit.
pub const HTTP_CONNECTION_REUSED: &str = "http.connection.reused";
/// `http.connection.id` (int, request span, setup span, link): process-unique
/// id of a connection, assigned when its connect starts, counting from 1.
pub const HTTP_CONNECTION_ID: &str = "http.connection.id";
/// `http.connection.wait_time` (double, seconds, request span): how long this
/// request waited for a connection: `max(0, t - request start)` where `t` is
/// the later of the serving connection's ready time and the end of the
/// previous response on it (HTTP/1.1). 0 on an idle hit.
pub const HTTP_CONNECTION_WAIT_TIME: &str = "http.connection.wait_time";
/// `http.connection.request_count` (int, request span): requests the serving
/// connection has carried, this one included, as the server counts them
/// (nginx `$connection_requests`): requests that got a response (counted
/// when its headers arrive) and requests sent on it that gave up on their
/// response (a reqwest timeout, or the request's future dropped:
/// `error.type` `timeout` / `cancelled`, whose span carries it too).
/// Requests that failed otherwise (reset, HTTP/2 GOAWAY or error) are not
/// counted: the server may never have seen them.
pub const HTTP_CONNECTION_REQUEST_COUNT: &str = "http.connection.request_count";
/// `http.connection.age` (double, seconds, request span): time from the
/// serving connection becoming ready to this request's start (0 when the
/// connection became ready after the request started).
pub const HTTP_CONNECTION_AGE: &str = "http.connection.age";
/// `http.connection.idle_time` (double, seconds, request span, hits only):
/// time the connection sat idle in the pool before this request started:
/// request start minus the end of the previous response on the connection
/// (body read to the end or dropped), or minus the ready time when the
/// connection had carried nothing yet. Absent on misses and when the
/// connection was busy when the request started.
pub const HTTP_CONNECTION_IDLE_TIME: &str = "http.connection.idle_time";
/// `http.connection.used_by_trigger` (bool, setup span): whether the request
/// whose pool miss started this connect was the one it served. `false` when a
/// pooled connection freed up first (hyper-util's pool race) or another
/// HTTP/2 connection won; the request then carries a link instead.
pub const HTTP_CONNECTION_USED_BY_TRIGGER: &str = "http.connection.used_by_trigger";
/// `http.connection.setup.outcome` (string, setup span): what became of the
/// connection; one of the `SETUP_OUTCOME_*` values.
pub const HTTP_CONNECTION_SETUP_OUTCOME: &str = "http.connection.setup.outcome";
/// `http.connection.dns_skipped` (string, setup span): present when no DNS
/// lookup ran: `ip_literal` (the host is an IP address) or `override` (a
/// `ClientBuilder::resolve` override answered without calling the resolver).
pub const HTTP_CONNECTION_DNS_SKIPPED: &str = "http.connection.dns_skipped";
/// `http.connection.proxied` (bool, setup span): the connection goes through
/// an HTTP proxy (the peer address is then the proxy's), judged from what
/// the connect did: the address its socket reached is not the target's,
/// it resolved another host's name, reqwest marked it absolute-form, or
/// hyper-util's `CONNECT` tunnel failed; never from the configuration
/// alone.
pub const HTTP_CONNECTION_PROXIED: &str = "http.connection.proxied";
/// `http.connection.proxy.address` (string, setup and `proxy.connect`
/// spans): the proxy's host as configured (a name or an IP literal) when a
/// proxy of the instrumented builder, reqwest's builder or the
/// `ALL_PROXY` / `HTTPS_PROXY` / `HTTP_PROXY` / `NO_PROXY` environment
/// matches the address reached; else the name the connect resolved or the
/// IP it connected to (a `Proxy::custom` proxy). Present even when the
/// connect to the proxy failed (then no `network.peer.*` is known).
pub const HTTP_CONNECTION_PROXY_ADDRESS: &str = "http.connection.proxy.address";
/// `http.connection.proxy.port` (int): the proxy's port (configured, or
/// the one connected to).
pub const HTTP_CONNECTION_PROXY_PORT: &str = "http.connection.proxy.port";
/// `http.connection.tls.resumption_offered` (bool, `tls.handshake` span):
/// the client offered a cached TLS session (ticket or session id).
pub const HTTP_CONNECTION_TLS_RESUMPTION_OFFERED: &str = "http.connection.tls.resumption_offered";
/// `http.connection.tls.verification_skipped` (bool, `tls.handshake` span,
/// present only when `true`): the server's certificate was accepted without
/// verification (`TlsSettings::danger_accept_invalid_certs`, the CLI's
/// `-k`); the `tls.certificate_verified` event is absent then.
pub const HTTP_CONNECTION_TLS_VERIFICATION_SKIPPED: &str =
    "http.connection.tls.verification_skipped";

/// `http.connection.miss_reason` (string, request span): why the request
/// was not served by an idle pooled connection; one of the `MISS_REASON_*`
/// values (see [`MissReason`](crate::MissReason) for each value's fix).
/// Present on every request that was not an idle hit: misses, and hits that
/// waited for a busy connection. Also on the setup span of the connect a
/// miss started: the value its trigger's span records (docs/REFERENCE.md,
/// setup span attributes).
pub const HTTP_CONNECTION_MISS_REASON: &str = "http.connection.miss_reason";
/// `http.connection.untracked` (string, request span): present when a
/// bounded table of the handle was full, so this request's pool facts are
/// missing; the value names the table and so the setting to raise:
/// [`UNTRACKED_CONNECTION_REGISTRY`], [`UNTRACKED_POOL_ADVICE`],
/// [`UNTRACKED_POOL_HISTORY`]; or, [`UNTRACKED_LOCAL_TRANSPORT`], that its
/// connection could not be told from others. Such requests also count in
/// [`HTTP_CLIENT_REQUESTS_UNTRACKED`], and the first time a table is full one
/// WARN line (target `reqwest_conntrace`) names the setting.
pub const HTTP_CONNECTION_UNTRACKED: &str = "http.connection.untracked";
/// `http.connection.address_order` (string, `dns.lookup` span): the
/// address-order policy applied to the answers: `keep`, `ipv4_first` or
/// `ipv6_first` ([`AddressOrder`](crate::AddressOrder)).
pub const HTTP_CONNECTION_ADDRESS_ORDER: &str = "http.connection.address_order";
/// `http.connection.addresses` (string array, `tcp.connect` span): the
/// resolved addresses in the order handed to the connector (after the
/// address-order policy). Absent when DNS was skipped.
pub const HTTP_CONNECTION_ADDRESSES: &str = "http.connection.addresses";
/// `http.connection.address_index` (int, `tcp.connect` span): position of
/// the address that connected in [`HTTP_CONNECTION_ADDRESSES`], from 0.
pub const HTTP_CONNECTION_ADDRESS_INDEX: &str = "http.connection.address_index";
/// `http.connection.peer_candidates` (string array, `tcp.connect` span): a
/// connect that never returned a connection (its TLS handshake hung or
/// failed after TCP connected) whose address the kernel could not pin down:
/// this process had connected sockets, unknown to the connection registry,
/// to more than one of these resolved addresses (parallel connects to the
/// same host in their handshakes at once), so `network.peer.address` is left
/// out and the addresses it may have been are listed here. When one address
/// is left (or only one was resolved) it is `network.peer.address` instead.
pub const HTTP_CONNECTION_PEER_CANDIDATES: &str = "http.connection.peer_candidates";
/// `http.connection.address_fallback` (bool, `tcp.connect` and setup span):
/// the address that connected was not the first one handed to the connector:
/// earlier addresses failed, timed out or lost the Happy Eyeballs race
/// (events [`EVENT_TCP_ADDRESS_SKIPPED`] say which).
pub const HTTP_CONNECTION_ADDRESS_FALLBACK: &str = "http.connection.address_fallback";
/// `http.connection.address_outcome` (string, on
/// [`EVENT_TCP_ADDRESS_SKIPPED`]): what became of an address tried before
/// the winner: `timed_out` (its share of the connect timeout elapsed),
/// `failed` (it failed before its share, e.g. refused), `outraced` (the other
/// address family connected first, Happy Eyeballs). Inferred from hyper-util's
/// documented order and the phase's duration: no per-attempt hook exists.
pub const HTTP_CONNECTION_ADDRESS_OUTCOME: &str = "http.connection.address_outcome";
/// `http.connection.tcp.syn_retransmits` (int, `tcp.connect` span): SYN
/// retransmissions the connect waited out, read off the phase's duration
/// against Linux's initial RTO schedule (first retransmit 1 s after the SYN,
/// then 3 s, 7 s, 15 s cumulative: `TCP_TIMEOUT_INIT` = 1 s, doubling per
/// RFC 6298), and confirmed by the kernel's retransmit count where available.
pub const HTTP_CONNECTION_TCP_SYN_RETRANSMITS: &str = "http.connection.tcp.syn_retransmits";

/// `http.connection.phase.duration` (double, seconds, on a phase event of
/// the setup span with [`ConnectionPhases::Events`](crate::ConnectionPhases::Events)):
/// the phase's duration, the one its span would have had (the event's time
/// is the phase's start).
pub const HTTP_CONNECTION_PHASE_DURATION: &str = "http.connection.phase.duration";

/// `http.connection.tcp.rtt` (double, seconds, `tcp.connect` span): the
/// kernel's smoothed round-trip time of the socket right after the connect
/// completed (`tcpi_rtt` of `struct tcp_info`, Linux sock_diag). Absent where
/// the kernel view is unavailable.
pub const HTTP_CONNECTION_TCP_RTT: &str = "http.connection.tcp.rtt";
/// `http.connection.tcp.rtt_variance` (double, seconds, `tcp.connect`
/// span): the kernel's RTT variance (`tcpi_rttvar`).
pub const HTTP_CONNECTION_TCP_RTT_VARIANCE: &str = "http.connection.tcp.rtt_variance";
/// `http.connection.tcp.congestion_window` (int, segments, `tcp.connect`
/// span): the sender's congestion window (`tcpi_snd_cwnd`) when the
/// connection became ready (for https after the TLS handshake's flights, so
/// it may already exceed the initial window of 10, RFC 6928).
pub const HTTP_CONNECTION_TCP_CONGESTION_WINDOW: &str = "http.connection.tcp.congestion_window";
/// `http.connection.tcp.mss` (int, bytes, `tcp.connect` span): the send
/// maximum segment size (`tcpi_snd_mss`).
pub const HTTP_CONNECTION_TCP_MSS: &str = "http.connection.tcp.mss";
/// `http.connection.tcp.retransmits` (int, `tcp.connect` span): segments
/// the kernel retransmitted on the socket during setup, SYN retransmissions
/// included (`tcpi_total_retrans`, read when the connection became ready).
pub const HTTP_CONNECTION_TCP_RETRANSMITS: &str = "http.connection.tcp.retransmits";

/// `http.fan_out.batches` (int, `fan_out` span of [`fan_out`](crate::fan_out)):
/// number of batches run.
pub const FAN_OUT_BATCHES: &str = "http.fan_out.batches";
/// `http.fan_out.batches_with_new_connection` (int, `fan_out` span):
/// batches in which at least one request was served by a connection that was
/// not ready when it started (a pool miss, its own or a concurrent one's).
pub const FAN_OUT_BATCHES_WITH_NEW_CONNECTION: &str = "http.fan_out.batches_with_new_connection";
/// `http.fan_out.wait_time.total` (double, seconds, `fan_out` span): the
/// batches' connection wait times, summed.
pub const FAN_OUT_WAIT_TIME_TOTAL: &str = "http.fan_out.wait_time.total";
/// `http.fan_out.wait_time.max` (double, seconds, `fan_out` span): the
/// largest connection wait of one batch.
pub const FAN_OUT_WAIT_TIME_MAX: &str = "http.fan_out.wait_time.max";
/// `http.fan_out.slowest_batch.index` (int, `fan_out` span): index of the
/// batch that finished last relative to its start (it sets the fan-out's latency).
pub const FAN_OUT_SLOWEST_BATCH_INDEX: &str = "http.fan_out.slowest_batch.index";
/// `http.fan_out.slowest_batch.duration` (double, seconds, `fan_out` span).
pub const FAN_OUT_SLOWEST_BATCH_DURATION: &str = "http.fan_out.slowest_batch.duration";
/// `http.fan_out.batch.index` (int, `batch` span): the batch's position, from 0.
pub const FAN_OUT_BATCH_INDEX: &str = "http.fan_out.batch.index";
/// `http.fan_out.batch.requests` (int, `batch` span): requests the batch made.
pub const FAN_OUT_BATCH_REQUESTS: &str = "http.fan_out.batch.requests";
/// `http.fan_out.batch.new_connection` (bool, `batch` span): the batch paid
/// for a new connection (see [`FAN_OUT_BATCHES_WITH_NEW_CONNECTION`]).
pub const FAN_OUT_BATCH_NEW_CONNECTION: &str = "http.fan_out.batch.new_connection";

// ---------------------------------------------------------------------------
// Metrics
// ---------------------------------------------------------------------------

/// `http.client.request.duration` (histogram, s), HTTP metrics semconv
/// v1.42.0: request start to the end of the response body (or failure).
/// Attributes: `http.request.method`, `server.address`, `server.port`,
/// `url.scheme`, `http.response.status_code` (when a response arrived),
/// `error.type` (on failure), `network.protocol.version`, and this crate's
/// [`HTTP_CONNECTION_REUSED`] (when the connection is known), so hit and miss
/// latency compare directly and the miss ratio is a ratio of counts.
pub const HTTP_CLIENT_REQUEST_DURATION: &str =
    opentelemetry_semantic_conventions::metric::HTTP_CLIENT_REQUEST_DURATION;
/// `http.client.active_requests` (updowncounter, `{request}`), semconv:
/// requests started and not yet ended (body read or dropped). Attributes:
/// `http.request.method`, `server.address`, `server.port`, `url.scheme`.
pub const HTTP_CLIENT_ACTIVE_REQUESTS: &str =
    opentelemetry_semantic_conventions::metric::HTTP_CLIENT_ACTIVE_REQUESTS;
/// `dns.lookup.duration` (histogram, s), DNS metrics semconv: resolver call
/// to answer. Attributes: `dns.question.name`, `error.type` on failure.
pub const DNS_LOOKUP_DURATION: &str =
    opentelemetry_semantic_conventions::metric::DNS_LOOKUP_DURATION;
/// `http.client.open_connections` (updowncounter, `{connection}`), semconv:
/// connections this handle knows to be open, by [`HTTP_CONNECTION_STATE`]
/// `active` (carrying a request) or `idle`, with `server.address`,
/// `server.port`, `url.scheme`, `network.protocol.version`. A connection
/// stops counting when its close is observed: an HTTP/1.1 body dropped
/// early, a release over `pool_max_idle_per_host`, the pool idle timeout
/// elapsing, or (Linux) the kernel no longer listing its socket as
/// established. Where the kernel view is unavailable a connection the
/// server closed keeps counting as idle until the idle timeout.
pub const HTTP_CLIENT_OPEN_CONNECTIONS: &str =
    opentelemetry_semantic_conventions::metric::HTTP_CLIENT_OPEN_CONNECTIONS;
/// `http.client.connection.duration` (histogram, s), semconv: a connection's
/// life from ready to its observed close (see
/// [`HTTP_CLIENT_OPEN_CONNECTIONS`] for which closes are observed; a close
/// seen through the kernel is timed when it is seen). Attributes:
/// `server.address`, `server.port`, `url.scheme`, `network.protocol.version`.
pub const HTTP_CLIENT_CONNECTION_DURATION: &str =
    opentelemetry_semantic_conventions::metric::HTTP_CLIENT_CONNECTION_DURATION;
/// `http.client.connection.setup.duration` (histogram, s), ours: connector
/// call to connection ready (the `http.connection_setup` span's duration).
/// Attributes: `server.address`, `server.port`, `url.scheme`,
/// `network.type`, `tls.protocol.version`, `tls.resumed`, `error.type`
/// (failed or cancelled connects).
pub const HTTP_CLIENT_CONNECTION_SETUP_DURATION: &str = "http.client.connection.setup.duration";
/// `http.client.connections.opened` (counter, `{connection}`), ours:
/// connections established. Attributes: `server.address`, `server.port`,
/// `url.scheme`, `tls.resumed`.
pub const HTTP_CLIENT_CONNECTIONS_OPENED: &str = "http.client.connections.opened";
/// `http.client.pool.misses` (counter, `{request}`), ours: requests that were
/// not idle hits, by [`HTTP_CONNECTION_MISS_REASON`], with `server.address`,
/// `server.port`, `url.scheme`, and [`HTTP_CONNECTION_POOL_LIMITS`] when
/// the reason depended on a pool limit this crate could not read. A
/// request that missed (triggered a connect) and failed before its
/// response (its connect refused or rejected, or it timed out) counts too,
/// with its [`ERROR_TYPE`]: misses without `error.type` are the answered
/// ones.
pub const HTTP_CLIENT_POOL_MISSES: &str = "http.client.pool.misses";
/// `http.client.requests.untracked` (counter, `{request}`), ours: requests
/// whose pool facts are missing because a bounded table was full, by
/// [`HTTP_CONNECTION_UNTRACKED`], with `server.address`, `server.port`,
/// `url.scheme`. Alert on any increase: raise the setting the value names.
pub const HTTP_CLIENT_REQUESTS_UNTRACKED: &str = "http.client.requests.untracked";
/// `http.client.pool.peak_in_flight` (gauge, `{request}`), ours: the most
/// requests in flight at once to `server.address`/`server.port` since the
/// current advice interval started (Little's law `L`; the same number as
/// the pool advice and [`ConnTrace::peak_in_flight`](crate::ConnTrace::peak_in_flight)).
pub const HTTP_CLIENT_POOL_PEAK_IN_FLIGHT: &str = "http.client.pool.peak_in_flight";
/// `http.client.pool.idle_limit` (gauge, `{connection}`), ours:
/// `pool_max_idle_per_host` of the client serving `server.address`/
/// `server.port`, with [`HTTP_CONNECTION_POOL_LIMITS`] saying where it came
/// from: [`POOL_LIMITS_CONFIGURED`] when set through
/// [`InstrumentedClientBuilder::pool_max_idle_per_host`](crate::InstrumentedClientBuilder::pool_max_idle_per_host),
/// [`POOL_LIMITS_INFERRED`] when set on reqwest's builder and inferred
/// from the connections the pool closed at release (an upper bound: the
/// fewest idle connections the pool held when it closed a released one).
/// Absent while neither (unlimited, `usize::MAX` set through our builder
/// included, or no such close seen).
pub const HTTP_CLIENT_POOL_IDLE_LIMIT: &str = "http.client.pool.idle_limit";

/// The instrument a metric in [`METRICS`] is recorded with. It decides
/// the OTLP data type and how the metric arrives in Prometheus (through
/// the OpenTelemetry Collector's `prometheus` exporter: a counter gets
/// `_total`, a histogram `_bucket` / `_sum` / `_count`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Instrument {
    /// Monotonic sum (OTLP `Sum`, `is_monotonic = true`): a Prometheus counter.
    Counter,
    /// Non-monotonic sum (OTLP `Sum`, `is_monotonic = false`): a Prometheus gauge.
    UpDownCounter,
    /// Last value (OTLP `Gauge`): a Prometheus gauge.
    Gauge,
    /// Explicit-bucket histogram (OTLP `Histogram`).
    Histogram,
}

/// One metric this crate exports over OTLP (an entry of [`METRICS`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Metric {
    /// The metric's name: one of the metric constants of this module.
    pub name: &'static str,
    /// Its unit as exported (UCUM: `s`, or a `{annotation}` for counts).
    pub unit: &'static str,
    /// The instrument it is recorded with.
    pub instrument: Instrument,
    /// Every attribute key a data point of it can carry (a point carries a
    /// subset: e.g. `error.type` only on failures).
    pub attributes: &'static [&'static str],
}

/// Every metric this crate exports, with its unit, instrument and the
/// attribute keys its points can carry: what dashboards and alert rules can
/// rely on. The end-to-end tests check it against what the SDK exports
/// (names, units, instruments, attribute keys) and check the repository's
/// Prometheus rules and Grafana dashboard against it.
pub const METRICS: &[Metric] = &[
    Metric {
        name: HTTP_CLIENT_REQUEST_DURATION,
        unit: "s",
        instrument: Instrument::Histogram,
        attributes: &[
            HTTP_REQUEST_METHOD,
            SERVER_ADDRESS,
            SERVER_PORT,
            URL_SCHEME,
            HTTP_RESPONSE_STATUS_CODE,
            ERROR_TYPE,
            NETWORK_PROTOCOL_VERSION,
            HTTP_CONNECTION_REUSED,
        ],
    },
    Metric {
        name: HTTP_CLIENT_ACTIVE_REQUESTS,
        unit: "{request}",
        instrument: Instrument::UpDownCounter,
        attributes: &[HTTP_REQUEST_METHOD, SERVER_ADDRESS, SERVER_PORT, URL_SCHEME],
    },
    Metric {
        name: DNS_LOOKUP_DURATION,
        unit: "s",
        instrument: Instrument::Histogram,
        attributes: &[DNS_QUESTION_NAME, ERROR_TYPE],
    },
    Metric {
        name: HTTP_CLIENT_OPEN_CONNECTIONS,
        unit: "{connection}",
        instrument: Instrument::UpDownCounter,
        attributes: &[
            HTTP_CONNECTION_STATE,
            SERVER_ADDRESS,
            SERVER_PORT,
            URL_SCHEME,
            NETWORK_PROTOCOL_VERSION,
        ],
    },
    Metric {
        name: HTTP_CLIENT_CONNECTION_DURATION,
        unit: "s",
        instrument: Instrument::Histogram,
        attributes: &[
            SERVER_ADDRESS,
            SERVER_PORT,
            URL_SCHEME,
            NETWORK_PROTOCOL_VERSION,
        ],
    },
    Metric {
        name: HTTP_CLIENT_CONNECTION_SETUP_DURATION,
        unit: "s",
        instrument: Instrument::Histogram,
        attributes: &[
            SERVER_ADDRESS,
            SERVER_PORT,
            URL_SCHEME,
            NETWORK_TYPE,
            TLS_PROTOCOL_VERSION,
            TLS_RESUMED,
            ERROR_TYPE,
        ],
    },
    Metric {
        name: HTTP_CLIENT_CONNECTIONS_OPENED,
        unit: "{connection}",
        instrument: Instrument::Counter,
        attributes: &[SERVER_ADDRESS, SERVER_PORT, URL_SCHEME, TLS_RESUMED],
    },
    Metric {
        name: HTTP_CLIENT_POOL_MISSES,
        unit: "{request}",
        instrument: Instrument::Counter,
        attributes: &[
            SERVER_ADDRESS,
            SERVER_PORT,
            URL_SCHEME,
            HTTP_CONNECTION_MISS_REASON,
            HTTP_CONNECTION_POOL_LIMITS,
            ERROR_TYPE,
        ],
    },
    Metric {
        name: HTTP_CLIENT_POOL_PEAK_IN_FLIGHT,
        unit: "{request}",
        instrument: Instrument::Gauge,
        attributes: &[SERVER_ADDRESS, SERVER_PORT],
    },
    Metric {
        name: HTTP_CLIENT_POOL_IDLE_LIMIT,
        unit: "{connection}",
        instrument: Instrument::Gauge,
        attributes: &[SERVER_ADDRESS, SERVER_PORT, HTTP_CONNECTION_POOL_LIMITS],
    },
    // Recorded only when a bounded table is full (see
    // [`DEGRADATION_METRICS`]): absent from an ordinary run's export.
    Metric {
        name: HTTP_CLIENT_REQUESTS_UNTRACKED,
        unit: "{request}",
        instrument: Instrument::Counter,
        attributes: &[
            SERVER_ADDRESS,
            SERVER_PORT,
            URL_SCHEME,
            HTTP_CONNECTION_UNTRACKED,
        ],
    },
];

/// The entries of [`METRICS`] recorded only when something degraded (a
/// bounded table was full): an ordinary run exports every other metric, and
/// these only then.
pub const DEGRADATION_METRICS: &[&str] = &[HTTP_CLIENT_REQUESTS_UNTRACKED];

// ---------------------------------------------------------------------------
// Events
// ---------------------------------------------------------------------------

/// Event on a request span that missed with `all_busy` while the host's peak
/// in flight exceeded the client's idle limit: carries
/// [`HTTP_CLIENT_POOL_PEAK_IN_FLIGHT`], [`HTTP_CLIENT_POOL_IDLE_LIMIT`],
/// [`HTTP_CONNECTION_POOL_MISSES_PER_SECOND`] and
/// [`HTTP_CONNECTION_POOL_SUGGESTED_IDLE`]. The same advice is logged once
/// per interval per host when the interval closes, with the whole
/// interval's numbers (target `reqwest_conntrace`, level WARN).
pub const EVENT_POOL_ADVICE: &str = "http.connection.pool_advice";
/// `http.connection.pool.misses_per_second` (double, on [`EVENT_POOL_ADVICE`]):
/// `all_busy` misses to the host since the current advice interval started,
/// divided by the seconds since it started (at least 1 s).
pub const HTTP_CONNECTION_POOL_MISSES_PER_SECOND: &str = "http.connection.pool.misses_per_second";
/// `http.connection.pool.suggested_max_idle_per_host` (int, on
/// [`EVENT_POOL_ADVICE`]): the `pool_max_idle_per_host` that would have kept
/// the peak's connections: the observed peak in flight.
pub const HTTP_CONNECTION_POOL_SUGGESTED_IDLE: &str =
    "http.connection.pool.suggested_max_idle_per_host";

/// Event on `tcp.connect`, one per SYN retransmission waited out, at the
/// moment it was sent (connect start + 1 s, 3 s, 7 s ...); carries
/// [`HTTP_CONNECTION_TCP_SYN_RETRANSMITS`] (its number, from 1) and
/// [`HTTP_CONNECTION_TCP_RTO`]. The 1 s / 3 s connect times of incident 4.
pub const EVENT_TCP_SYN_RETRANSMIT: &str = "tcp.syn_retransmit";
/// `http.connection.tcp.rto` (double, seconds, on [`EVENT_TCP_SYN_RETRANSMIT`]):
/// the retransmission timeout that expired before this SYN was resent (1,
/// 2, 4 ... s on Linux).
pub const HTTP_CONNECTION_TCP_RTO: &str = "http.connection.tcp.rto";
/// Event on `tcp.connect`, one per address tried before the one that
/// connected; carries `network.peer.address`, `network.peer.port` and
/// [`HTTP_CONNECTION_ADDRESS_OUTCOME`].
pub const EVENT_TCP_ADDRESS_SKIPPED: &str = "tcp.address_skipped";

/// Event on `tls.handshake` (TLS 1.3): the ServerHello was processed and the
/// handshake keys derived. Not emitted for TLS 1.2 (rustls exposes no hook at
/// that point for 1.2).
pub const EVENT_TLS_SERVER_HELLO: &str = "tls.server_hello";
/// Event on `tls.handshake`: the server's certificate chain was verified.
/// Full handshakes only (a resumed handshake sends no certificate).
pub const EVENT_TLS_CERTIFICATE_VERIFIED: &str = "tls.certificate_verified";
/// Event on `tls.handshake`: the server's certificate chain was rejected;
/// carries `error.type` and `exception.message`.
pub const EVENT_TLS_CERTIFICATE_REJECTED: &str = "tls.certificate_rejected";
/// Event on `tls.handshake` (TLS 1.3): the server's Finished was processed.
pub const EVENT_TLS_SERVER_FINISHED: &str = "tls.server_finished";
/// Event on `dns.lookup`: the lookup began on a resolver thread. The time
/// between the span's start and this event was spent queueing for a thread of
/// tokio's blocking pool (`getaddrinfo` blocks), not resolving.
pub const EVENT_DNS_LOOKUP_BEGAN: &str = "dns.lookup_began";
/// Event on the request span: the response headers arrived (reqwest handed
/// the response over, before any body byte was read). Its time minus the
/// span's start is the time to first byte, the same instant as
/// `RequestReport::time_to_first_byte`; from it to the span's end the body
/// was read. The name is the one OpenTelemetry Go's `otelhttptrace` gives the
/// first response byte (`GotFirstResponseByte`); semconv v1.42.0 has none.
pub const EVENT_RESPONSE_HEADERS: &str = "http.receive.start";
/// Event on the setup span when an HTTP/2 connect lost the ALPN race: another
/// HTTP/2 connection to the same origin was established first and hyper-util
/// closed this one unused.
pub const EVENT_CONNECTION_COALESCED: &str = "http.connection.coalesced";
/// `exception.message` (string) on events carrying an error's text.
pub const EXCEPTION_MESSAGE: &str =
    opentelemetry_semantic_conventions::attribute::EXCEPTION_MESSAGE;

// ---------------------------------------------------------------------------
// Values
// ---------------------------------------------------------------------------

/// [`HTTP_CONNECTION_SETUP_OUTCOME`]: the connection served the request that triggered it.
pub const SETUP_OUTCOME_USED: &str = "used";
/// [`HTTP_CONNECTION_SETUP_OUTCOME`]: the trigger was served by another
/// connection first; this one went to the pool for later requests.
pub const SETUP_OUTCOME_POOLED: &str = "pooled";
/// [`HTTP_CONNECTION_SETUP_OUTCOME`]: HTTP/2 connect that lost the ALPN race
/// and was closed unused by hyper-util.
pub const SETUP_OUTCOME_COALESCED: &str = "coalesced";
/// [`HTTP_CONNECTION_SETUP_OUTCOME`]: HTTP/1.1 connect whose trigger was
/// served by another connection first, closed unused by hyper-util: its
/// idle pool for the host was full (`pool_max_idle_per_host`) as the
/// connection was put there, or the waiting request it was handed to had
/// been served already. A connect paid for nothing; not a failure.
pub const SETUP_OUTCOME_CLOSED_UNUSED: &str = "closed_unused";
/// [`HTTP_CONNECTION_SETUP_OUTCOME`]: its trigger opened more than one
/// connection ([`HTTP_CONNECTION_CONNECTS`] on the request span) and was
/// answered on another one: a middleware placed after
/// [`ConnTraceMiddleware`](crate::ConnTraceMiddleware) (a retry) most
/// likely sent a request on this one that no request span shows, or it
/// went to the pool unused; which of the two cannot be told.
pub const SETUP_OUTCOME_UNSEEN: &str = "unseen";
/// [`HTTP_CONNECTION_SETUP_OUTCOME`]: the connect failed (`error.type` says why).
pub const SETUP_OUTCOME_FAILED: &str = "failed";
/// [`HTTP_CONNECTION_SETUP_OUTCOME`]: the connect was abandoned before it
/// finished (its request was dropped or timed out).
pub const SETUP_OUTCOME_CANCELLED: &str = "cancelled";

/// [`HTTP_CONNECTION_MISS_REASON`]: no connection to the host yet in this client.
pub const MISS_REASON_COLD: &str = "cold";
/// [`HTTP_CONNECTION_MISS_REASON`]: every connection to the host was in use,
/// or the freed ones were closed over `pool_max_idle_per_host`.
pub const MISS_REASON_ALL_BUSY: &str = "all_busy";
/// [`HTTP_CONNECTION_MISS_REASON`]: the idle connection outlived the pool's idle timeout.
pub const MISS_REASON_IDLE_EXPIRED: &str = "idle_expired";
/// [`HTTP_CONNECTION_MISS_REASON`]: the server closed the idle connection.
pub const MISS_REASON_CLOSED_BY_PEER: &str = "closed_by_peer";
/// [`HTTP_CONNECTION_MISS_REASON`]: the previous response's body was dropped unread.
pub const MISS_REASON_DISCARDED: &str = "discarded";
/// [`HTTP_CONNECTION_MISS_REASON`]: a client built moments ago, while an
/// earlier client of the handle had a connection to the host.
pub const MISS_REASON_NEW_CLIENT: &str = "new_client";
/// [`HTTP_CONNECTION_MISS_REASON`]: the server ended the previous
/// connection with its last response, `Connection: close` or an HTTP/2
/// GOAWAY (its per-connection request limit).
pub const MISS_REASON_REQUEST_LIMIT: &str = "request_limit";
/// [`HTTP_CONNECTION_MISS_REASON`]: the client keeps no idle connection
/// (`pool_max_idle_per_host(0)`).
pub const MISS_REASON_POOL_DISABLED: &str = "pool_disabled";
/// [`HTTP_CONNECTION_MISS_REASON`]: the previous HTTP/1.1 connection was
/// alive and free but hyper-util had not put it back into its pool yet.
pub const MISS_REASON_RELEASE_RACE: &str = "release_race";
/// [`HTTP_CONNECTION_MISS_REASON`]: the client's own pool closed the
/// previous idle connection, under pool limits this crate could not read
/// (set on reqwest's builder); see [`POOL_LIMITS_UNKNOWN`].
pub const MISS_REASON_POOL_CLOSED: &str = "pool_closed";
/// [`HTTP_CONNECTION_MISS_REASON`]: the client itself asked to close the
/// previous connection (its request sent `Connection: close`).
pub const MISS_REASON_CLIENT_CLOSE: &str = "client_close";
/// [`HTTP_CONNECTION_MISS_REASON`]: a request on the previous HTTP/1.1
/// connection failed or was cancelled before its response ended (a
/// timeout), so hyper gave the connection up.
pub const MISS_REASON_ABANDONED: &str = "abandoned";

/// `http.connection.pool.limits` (string), ours: where a pool limit
/// (`pool_max_idle_per_host`, `pool_idle_timeout`) came from.
/// - On a request span and on [`HTTP_CLIENT_POOL_MISSES`]: present when
///   the miss reason depended on a limit this crate could not read (not
///   set through [`InstrumentedClientBuilder`](crate::InstrumentedClientBuilder);
///   reqwest's builder has no getter for it): [`POOL_LIMITS_INFERRED`] or
///   [`POOL_LIMITS_UNKNOWN`]. Absent: the limit was configured.
/// - On [`HTTP_CLIENT_POOL_IDLE_LIMIT`] and [`EVENT_POOL_ADVICE`]:
///   [`POOL_LIMITS_CONFIGURED`] or [`POOL_LIMITS_INFERRED`].
pub const HTTP_CONNECTION_POOL_LIMITS: &str = "http.connection.pool.limits";
/// [`HTTP_CONNECTION_POOL_LIMITS`]: set through
/// [`InstrumentedClientBuilder`](crate::InstrumentedClientBuilder).
pub const POOL_LIMITS_CONFIGURED: &str = "configured";
/// [`HTTP_CONNECTION_POOL_LIMITS`]: not set through this crate, inferred
/// from how the client's own pool closed an idle HTTP/1.1 connection (the
/// kernel shows our side closed it; its `TIME_WAIT` timer dates the close):
/// within moments of its release, while `N` others were idle, is the idle
/// limit (`all_busy`, `previous.end = idle_limit`, the limit at most `N`;
/// `pool_disabled` for `N = 0`); later, after idling `d`, is the idle
/// timeout (`idle_expired`, `previous.end = idle_timeout`, the timeout at
/// most `d`: hyper-util checks every timeout, so `d` lies between the
/// timeout and twice it).
pub const POOL_LIMITS_INFERRED: &str = "inferred";
/// [`HTTP_CONNECTION_POOL_LIMITS`]: the limit was neither read nor
/// inferred (no dated close: the socket was not in `TIME_WAIT`, or the
/// kernel view is unavailable); the reason is the kernel's fallback (our
/// side closed the idle connection; with the idle timeout known, the idle
/// limit did it: `all_busy`), or is [`MISS_REASON_POOL_CLOSED`].
pub const POOL_LIMITS_UNKNOWN: &str = "unknown";

/// `http.connection.previous.id` (int, request span, misses caused by a
/// connection that ended): the id of that connection.
pub const HTTP_CONNECTION_PREVIOUS_ID: &str = "http.connection.previous.id";
/// `http.connection.previous.idle_time` (double, seconds, as
/// [`HTTP_CONNECTION_PREVIOUS_ID`]): end of its last response to this
/// request's start; the end as hyper read it, which hyper-util's idle clock
/// starts from (a body the caller read later does not shorten it).
pub const HTTP_CONNECTION_PREVIOUS_IDLE_TIME: &str = "http.connection.previous.idle_time";
/// `http.connection.previous.request_count` (int, as
/// [`HTTP_CONNECTION_PREVIOUS_ID`]): requests it carried, counted as
/// [`HTTP_CONNECTION_REQUEST_COUNT`].
pub const HTTP_CONNECTION_PREVIOUS_REQUEST_COUNT: &str = "http.connection.previous.request_count";
/// `http.connection.previous.end` (string, as [`HTTP_CONNECTION_PREVIOUS_ID`]):
/// how it ended; one of the `CONNECTION_END_*` values.
pub const HTTP_CONNECTION_PREVIOUS_END: &str = "http.connection.previous.end";
/// [`HTTP_CONNECTION_PREVIOUS_END`]: its last response carried `Connection: close`.
pub const CONNECTION_END_CONNECTION_CLOSE: &str = "connection_close";
/// [`HTTP_CONNECTION_PREVIOUS_END`]: HTTP/2, ended by the server (GOAWAY, close).
pub const CONNECTION_END_GOAWAY: &str = "goaway";
/// [`HTTP_CONNECTION_PREVIOUS_END`]: the kernel showed the server's FIN.
pub const CONNECTION_END_PEER_FIN: &str = "peer_fin";
/// [`HTTP_CONNECTION_PREVIOUS_END`]: a request on it failed with a reset.
pub const CONNECTION_END_PEER_RESET: &str = "peer_reset";
/// [`HTTP_CONNECTION_PREVIOUS_END`]: gone from the kernel without our close
/// (the server's FIN or RST; not told apart once the socket is gone).
pub const CONNECTION_END_PEER_CLOSED: &str = "peer_closed";
/// [`HTTP_CONNECTION_PREVIOUS_END`]: an HTTP/2 connection error ended it.
pub const CONNECTION_END_HTTP2_ERROR: &str = "http2_error";
/// [`HTTP_CONNECTION_PREVIOUS_END`]: the client's pool idle timeout elapsed.
pub const CONNECTION_END_IDLE_TIMEOUT: &str = "idle_timeout";
/// [`HTTP_CONNECTION_PREVIOUS_END`]: released while the idle pool was full.
pub const CONNECTION_END_IDLE_LIMIT: &str = "idle_limit";
/// `http.connection.previous.end`: the client's pool closed it (the
/// kernel shows our side's close) under pool limits this crate could not
/// read ([`MISS_REASON_POOL_CLOSED`]).
pub const CONNECTION_END_POOL_CLOSED: &str = "pool_closed";
/// [`HTTP_CONNECTION_PREVIOUS_END`]: a response body was dropped before its end.
pub const CONNECTION_END_DISCARDED: &str = "discarded";
/// [`HTTP_CONNECTION_PREVIOUS_END`]: its last request sent `Connection:
/// close` (the client asked for the close).
pub const CONNECTION_END_CLIENT_CLOSE: &str = "client_close";
/// [`HTTP_CONNECTION_PREVIOUS_END`]: HTTP/1.1, a request on it failed or
/// was cancelled before its response ended (a timeout); hyper closed it.
pub const CONNECTION_END_ABANDONED: &str = "abandoned";

/// `http.connection.server_keep_alive` (double, seconds, request span): the
/// idle timeout the server advertised on the serving connection with a
/// `Keep-Alive: timeout=N` response header (RFC 2068 §19.7.1.1), latest seen.
pub const HTTP_CONNECTION_SERVER_KEEP_ALIVE: &str = "http.connection.server_keep_alive";
/// `http.connection.client_idle_timeout` (double, seconds, on
/// [`EVENT_KEEP_ALIVE_MISMATCH`]): the client's pool idle timeout. Also on
/// the request span of an `idle_expired` miss under an inferred idle
/// timeout ([`POOL_LIMITS_INFERRED`]): the timeout as inferred so far, the
/// shortest idle time at which the client's pool was seen closing a
/// connection (the timeout is at most this and more than half of it).
pub const HTTP_CONNECTION_CLIENT_IDLE_TIMEOUT: &str = "http.connection.client_idle_timeout";
/// Event on the request span whose response first advertised a server
/// keep-alive timeout shorter than the client's pool idle timeout: idle
/// connections will be closed by the server first (`closed_by_peer`
/// misses, and requests racing the close fail with `connection_reset`).
/// Attributes: [`HTTP_CONNECTION_SERVER_KEEP_ALIVE`] and
/// [`HTTP_CONNECTION_CLIENT_IDLE_TIMEOUT`]. A client idle timeout this
/// crate could not read (set on reqwest's builder, or reqwest's default
/// 90 s) is not guessed: the event comes instead on the span of a miss
/// whose previous connection the server ended (the kernel dates its close
/// from the report of the socket's end) after the client's pool had kept
/// it idle past the keep-alive it advertised, with
/// [`HTTP_CONNECTION_SERVER_KEEP_ALIVE`] and [`HTTP_CONNECTION_POOL_LIMITS`]
/// = [`POOL_LIMITS_INFERRED`].
pub const EVENT_KEEP_ALIVE_MISMATCH: &str = "http.connection.keep_alive_mismatch";
/// `http.connection.dns_stale` (bool, request span, only ever `true`): the
/// serving (reused) connection's peer address is not in the newest DNS
/// answer for its host, judged at this request (a pooled connection still
/// going to an address DNS no longer gives). The newest answer is the
/// latest successful lookup of the host by the connection's own client's
/// [`TracedResolver`](crate::TracedResolver), whatever the connects to it
/// did; none without a lookup or through a proxy.
pub const HTTP_CONNECTION_DNS_STALE: &str = "http.connection.dns_stale";
/// `http.connection.stream_resets` (int, request span): HTTP/2 responses
/// on the serving connection dropped so far before their body was read to
/// the end (the dropped request included). Each such drop makes h2 reset
/// the stream (RST_STREAM CANCEL) unless the whole body had already
/// arrived (END_STREAM received, its data unread), which cannot be seen
/// from outside: hyper's `Incoming::is_end_stream` (h2's
/// `RecvStream::is_end_stream`) turns true only once the received data has
/// also been read. So this is an upper bound on the resets h2 sent.
/// Requests on it that gave up on their response (a reqwest timeout, a
/// dropped future: h2 resets their open stream) count too.
pub const HTTP_CONNECTION_STREAM_RESETS: &str = "http.connection.stream_resets";
/// Event on a request span whose HTTP/2 response was dropped before its
/// body was read to the end: h2 resets the stream (RST_STREAM CANCEL)
/// unless the whole body had already arrived, which cannot be seen (see
/// [`HTTP_CONNECTION_STREAM_RESETS`], its attribute); also on an HTTP/2
/// request that gave up on its response (timeout, dropped future) on a
/// connection it names, whose stream h2 resets.
pub const EVENT_STREAM_RESET: &str = "http.connection.stream_reset";
/// `http.connection.connects` (int, request span, only when 2 or more):
/// connections opened for this one call through
/// [`ConnTraceMiddleware`](crate::ConnTraceMiddleware). One physical
/// request opens at most one: hyper-util checks its pool once per request,
/// and checks again only to resend a request whose idle pooled connection
/// closed before the request was written (hyper-util's
/// `retry_canceled_requests`; that request reached no server), which opens
/// a second one only if the first checkout had also started a connect. So
/// 2 or more mean the call sent requests this span does not show: a
/// middleware placed after `ConnTraceMiddleware` (a retry) resent it, or
/// hyper-util resent a request an HTTP/2 connection refused as its server
/// ended it (GOAWAY), which opens a new connection when the first checkout
/// had started a connect too ([`EVENT_UNSEEN_REQUESTS`] tells which).
/// Requests such a middleware sent on pooled connections open none and are
/// not counted. Comes with [`EVENT_UNSEEN_REQUESTS`].
pub const HTTP_CONNECTION_CONNECTS: &str = "http.connection.connects";
/// Event on a request span with [`HTTP_CONNECTION_CONNECTS`]: the call
/// sent more physical requests than this span shows. When the server ended
/// a connection of the host during the call (a later connect's miss names
/// it, or an HTTP/2 connection's GOAWAY reached us then), hyper-util resent
/// a request that connection refused unprocessed: the event carries
/// [`HTTP_CONNECTION_PREVIOUS_ID`] naming it, and its `exception.message`
/// says so. Otherwise the message says how many connections were opened
/// and that `ConnTraceMiddleware` belongs after (inside) any retry
/// middleware; answered over HTTP/2, it names both causes (the GOAWAY may
/// not be known yet when the call returns).
pub const EVENT_UNSEEN_REQUESTS: &str = "http.connection.unseen_requests";
/// `http.connection.stalled` (bool, request span, only ever `true`): the
/// request gave up on its response (timed out, or its future was dropped)
/// on a connection that received nothing from the peer during the request,
/// or, timing out while its body was read, since the body's last bytes
/// (kernel `tcpi_last_data_recv`, which counts jiffies: within 10 ms),
/// after waiting longer than a round trip (`tcpi_rtt`) plus those 10 ms.
pub const HTTP_CONNECTION_STALLED: &str = "http.connection.stalled";
/// `http.connection.unsent` (bool, request span, only ever `true`): the
/// request gave up (its future was dropped) in its first poll, on a
/// current-thread tokio runtime that also runs the connection the span
/// names, so before hyper could write it (hyper writes on the connection's
/// own task, which then runs only after the request's task yields): the
/// server never saw it, and it is not counted in
/// [`HTTP_CONNECTION_REQUEST_COUNT`] (absent on the span) nor as an HTTP/2
/// stream reset.
pub const HTTP_CONNECTION_UNSENT: &str = "http.connection.unsent";
/// `http.connection.tcp.unacked` (int, segments, request span of a failed
/// request): segments sent and not yet acknowledged (`tcpi_unacked`).
pub const HTTP_CONNECTION_TCP_UNACKED: &str = "http.connection.tcp.unacked";
/// `http.connection.tcp.since_last_receive` (double, seconds, request span
/// of a failed request): time since the last data arrived on the connection
/// (`tcpi_last_data_recv`).
pub const HTTP_CONNECTION_TCP_SINCE_LAST_RECEIVE: &str = "http.connection.tcp.since_last_receive";
/// `http.connection.tcp.state` (string, request span of a failed request):
/// the socket's TCP state when the failure was seen (`established`,
/// `close_wait`, ...; `gone` when the kernel no longer lists it).
pub const HTTP_CONNECTION_TCP_STATE: &str = "http.connection.tcp.state";
/// `error.type`: HTTP/2, the server sent GOAWAY and the request was not
/// (or not completely) served.
pub const ERROR_TYPE_HTTP2_GOAWAY: &str = "http2_goaway";
/// `error.type`: HTTP/2, the stream was reset (RST_STREAM).
pub const ERROR_TYPE_HTTP2_STREAM_RESET: &str = "http2_stream_reset";
/// `error.type`: HTTP/2, a connection-level protocol error.
pub const ERROR_TYPE_HTTP2_ERROR: &str = "http2_error";

/// [`HTTP_CONNECTION_UNTRACKED`]: the serving connection is not in the
/// handle's connection registry: it was made while the registry held
/// `registry_capacity` open connections
/// ([`ConnTraceBuilder::registry_capacity`](crate::ConnTraceBuilder::registry_capacity);
/// the registry-full WARN line says so), or, without that line, it was
/// forgotten after a close was inferred for it (a request that failed with
/// `connection_reset` names the connection it most likely went out on).
/// The request span then has no `http.connection.id`, `reused`,
/// `request_count`, `wait_time` or `miss_reason`.
pub const UNTRACKED_CONNECTION_REGISTRY: &str = "connection_registry";
/// [`HTTP_CONNECTION_UNTRACKED`]: the request's host is not in the pool
/// advice's per-host load table: it was full of hosts active in the last two
/// advice intervals
/// ([`ConnTraceBuilder::pool_advice_hosts`](crate::ConnTraceBuilder::pool_advice_hosts)).
/// No pool advice and no `http.client.pool.*` gauges for the host; the
/// pool attributes are unaffected. A request untracked in both tables
/// carries [`UNTRACKED_CONNECTION_REGISTRY`] (it counts under both values).
pub const UNTRACKED_POOL_ADVICE: &str = "pool_advice";
/// [`HTTP_CONNECTION_UNTRACKED`]: the request's host is not in the pool
/// history the miss reason is read from: its table was full of hosts with
/// live connections
/// ([`ConnTraceBuilder::pool_history_hosts`](crate::ConnTraceBuilder::pool_history_hosts)),
/// or the host had more than 16,384 open connections at once and one was
/// forgotten. The request carries no `http.connection.miss_reason`
/// (its connection attributes are unaffected).
pub const UNTRACKED_POOL_HISTORY: &str = "pool_history";
/// [`HTTP_CONNECTION_UNTRACKED`]: the response came over a local transport
/// (reqwest's `unix_socket`), which gives no socket addresses to match it
/// with its connection, and more than one open connection of the host was
/// free to have carried it. A response over a local transport is
/// attributed when exactly one was (one request at a time over one
/// connection); after concurrent requests left several open, none is
/// guessed until only one is left (a connection the server closed while
/// idle is only known closed from its traffic). Such a request carries no
/// `http.connection.id`, `reused`, `request_count`, `wait_time` or
/// `miss_reason`.
pub const UNTRACKED_LOCAL_TRANSPORT: &str = "local_transport";

/// [`HTTP_CONNECTION_ADDRESS_OUTCOME`]: the address's share of the connect timeout elapsed.
pub const ADDRESS_OUTCOME_TIMED_OUT: &str = "timed_out";
/// [`HTTP_CONNECTION_ADDRESS_OUTCOME`]: the address failed before its timeout share.
pub const ADDRESS_OUTCOME_FAILED: &str = "failed";
/// [`HTTP_CONNECTION_ADDRESS_OUTCOME`]: the other family's address connected first.
pub const ADDRESS_OUTCOME_OUTRACED: &str = "outraced";

/// [`HTTP_CONNECTION_DNS_SKIPPED`]: the host is an IP literal.
pub const DNS_SKIPPED_IP_LITERAL: &str = "ip_literal";
/// [`HTTP_CONNECTION_DNS_SKIPPED`]: a `ClientBuilder::resolve` override answered.
pub const DNS_SKIPPED_OVERRIDE: &str = "override";
/// [`HTTP_CONNECTION_DNS_SKIPPED`]: the connection is a local transport
/// (reqwest's `unix_socket`: a Unix domain socket), with no name to resolve.
pub const DNS_SKIPPED_LOCAL_TRANSPORT: &str = "local_transport";

/// `error.type`: a deadline expired (request timeout, connect timeout).
pub const ERROR_TYPE_TIMEOUT: &str = "timeout";
/// `error.type`: the work was abandoned (future dropped) before it finished.
pub const ERROR_TYPE_CANCELLED: &str = "cancelled";
/// `error.type`: DNS resolution failed (unknown host, resolver error).
pub const ERROR_TYPE_DNS: &str = "dns_error";
/// `error.type`: the peer refused the TCP connection (RST to our SYN).
pub const ERROR_TYPE_CONNECTION_REFUSED: &str = "connection_refused";
/// `error.type`: the connection was reset or closed by the peer mid-exchange
/// (including hyper's "connection closed before message completed": a
/// pooled connection the server had just closed).
pub const ERROR_TYPE_CONNECTION_RESET: &str = "connection_reset";
/// `error.type`: a response body ended before all of it arrived because
/// the server closed the connection (its FIN: hyper's "IncompleteBody",
/// an I/O `UnexpectedEof`; over TLS also a close without
/// `close_notify`). A reset (RST) mid-body is [`ERROR_TYPE_CONNECTION_RESET`].
pub const ERROR_TYPE_INCOMPLETE_BODY: &str = "incomplete_body";
/// `error.type`: the server's certificate was rejected.
pub const ERROR_TYPE_TLS_CERTIFICATE: &str = "tls_certificate_invalid";
/// `error.type`: any other TLS failure (alert, no common version or cipher).
pub const ERROR_TYPE_TLS: &str = "tls_error";
/// `error.type`: the proxy answered `CONNECT` with `407 Proxy
/// Authentication Required` (RFC 9110 §15.5.8).
pub const ERROR_TYPE_PROXY_AUTH_REQUIRED: &str = "proxy_auth_required";
/// `error.type`: the proxy answered `CONNECT` with another non-2xx status
/// (e.g. `502`, `403`); hyper-util 0.1.21 does not keep the code.
pub const ERROR_TYPE_PROXY_CONNECT_REFUSED: &str = "proxy_connect_refused";
/// `error.type`: the proxy closed the connection before answering
/// `CONNECT`, or answered with headers over 8 KiB.
pub const ERROR_TYPE_PROXY_CONNECT_FAILED: &str = "proxy_connect_failed";
/// `error.type`: any other I/O or protocol error.
pub const ERROR_TYPE_OTHER: &str = "_OTHER";
