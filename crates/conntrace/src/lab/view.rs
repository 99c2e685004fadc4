//! Reads a run's exported spans back into plain values: what the telemetry
//! says about each request and each new connection. Everything here comes
//! from span names, attributes and events (the `semconv` names), never from
//! the lab's own knowledge of what it did.

use std::collections::BTreeMap;

use conntrace_lab::{ReceivedEvent, ReceivedSpan};
use reqwest_conntrace::semconv;
use serde::Serialize;

use crate::stats::round3;

/// Attribute on a run span: the run's name (the CLI's own attribute).
pub(crate) const RUN_ATTRIBUTE: &str = "conntrace.lab.run";

/// One run as its spans tell it.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct RunView {
    /// The run's name (`conntrace.lab.run`).
    pub(crate) name: String,
    /// Wall time of the run span.
    pub(crate) wall_ms: f64,
    /// The run's requests, in start order.
    pub(crate) requests: Vec<RequestView>,
    /// The connections the run's requests set up, in start order.
    pub(crate) connections: Vec<ConnectionView>,
    /// The lab servers' and proxies' own counters for this run.
    pub(crate) counters: BTreeMap<String, u64>,
}

/// One request span.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct RequestView {
    /// 1-based position in start order within the run.
    pub(crate) index: usize,
    /// Start, after the start of the run.
    pub(crate) start_ms: f64,
    /// Request span duration (to the end of the body, or the failure).
    pub(crate) total_ms: f64,
    /// `http.response.status_code`.
    pub(crate) status: Option<i64>,
    /// `server.address`.
    pub(crate) server_address: Option<String>,
    /// `http.request.resend_count` (0 when absent: not a resend).
    pub(crate) resend_count: i64,
    /// `error.type`.
    pub(crate) error_type: Option<String>,
    /// The span status message when it failed (the error chain).
    pub(crate) error: Option<String>,
    /// `http.connection.reused`.
    pub(crate) reused: Option<bool>,
    /// `http.connection.miss_reason`.
    pub(crate) miss_reason: Option<String>,
    /// `http.connection.id`.
    pub(crate) connection_id: Option<i64>,
    /// `http.connection.wait_time`, ms.
    pub(crate) wait_ms: Option<f64>,
    /// `http.connection.idle_time`, ms.
    pub(crate) idle_ms: Option<f64>,
    /// `http.response.body.size`.
    pub(crate) body_bytes: Option<i64>,
    /// Ids of the connects this request's pool miss started.
    pub(crate) triggered: Vec<i64>,
    /// `http.connection.request_count`.
    pub(crate) request_count: Option<i64>,
    /// `network.peer.address`.
    pub(crate) peer_address: Option<String>,
    /// `http.connection.previous.id`: the connection whose end caused the miss.
    pub(crate) previous_id: Option<i64>,
    /// `http.connection.previous.request_count`.
    pub(crate) previous_request_count: Option<i64>,
    /// `http.connection.previous.end`: how it ended.
    pub(crate) previous_end: Option<String>,
    /// `http.connection.dns_stale`.
    pub(crate) dns_stale: Option<bool>,
    /// `http.connection.stalled`.
    pub(crate) stalled: Option<bool>,
    /// `http.connection.tcp.since_last_receive`, ms.
    pub(crate) since_last_receive_ms: Option<f64>,
}

impl RequestView {
    /// Whether a response arrived.
    pub(crate) fn ok(&self) -> bool {
        self.status.is_some() && self.error_type.is_none()
    }
}

/// One `http.connection_setup` span and its phases.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct ConnectionView {
    /// `http.connection.id`.
    pub(crate) id: Option<i64>,
    /// Index of the request whose pool miss started it.
    pub(crate) trigger: Option<usize>,
    /// Start, after the start of the run.
    pub(crate) start_ms: f64,
    /// Setup span duration.
    pub(crate) total_ms: f64,
    /// `http.connection.setup.outcome` (`used` when absent and the connect
    /// succeeded: the library sets it only otherwise).
    pub(crate) outcome: String,
    /// `error.type` of the setup span.
    pub(crate) error_type: Option<String>,
    /// The phase span that carries the error, if any.
    pub(crate) failed_phase: Option<String>,
    /// `server.address`.
    pub(crate) server_address: Option<String>,
    /// `network.peer.address` (the proxy's when proxied).
    pub(crate) peer_address: Option<String>,
    /// `network.peer.port`.
    pub(crate) peer_port: Option<i64>,
    /// `network.type`.
    pub(crate) network_type: Option<String>,
    /// `http.connection.proxied`.
    pub(crate) proxied: bool,
    /// `http.connection.proxy.address`: the proxy as configured.
    pub(crate) proxy_address: Option<String>,
    /// `http.connection.proxy.port`.
    pub(crate) proxy_port: Option<i64>,
    /// `http.connection.address_fallback` on the setup span.
    pub(crate) address_fallback: bool,
    /// `http.connection.dns_skipped`.
    pub(crate) dns_skipped: Option<String>,
    /// The `dns.lookup` phase.
    pub(crate) dns: Option<DnsView>,
    /// The `tcp.connect` phase.
    pub(crate) tcp: Option<TcpView>,
    /// The `proxy.connect` phases (one per tunnel; more would be a bug).
    pub(crate) proxy_connect: Vec<PhaseView>,
    /// The `tls.handshake` phase.
    pub(crate) tls: Option<TlsView>,
}

/// A phase's duration and error.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct PhaseView {
    /// Phase span duration.
    pub(crate) ms: f64,
    /// Its `error.type`.
    pub(crate) error_type: Option<String>,
    /// Its `http.response.status_code` (a proxy's answer to `CONNECT`, when
    /// known).
    pub(crate) status: Option<i64>,
}

/// The `dns.lookup` span.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct DnsView {
    /// Span duration (asked to answered).
    pub(crate) ms: f64,
    /// Span start to the `dns.lookup_began` event: time spent queueing for
    /// a resolver thread; `null` without the event.
    pub(crate) queued_ms: Option<f64>,
    /// `dns.answers`, in the resolver's order.
    pub(crate) answers: Vec<String>,
    /// `http.connection.address_order`.
    pub(crate) address_order: Option<String>,
    /// Its `error.type`.
    pub(crate) error_type: Option<String>,
}

/// The `tcp.connect` span.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct TcpView {
    /// Span duration.
    pub(crate) ms: f64,
    /// `network.peer.address`.
    pub(crate) peer_address: Option<String>,
    /// `http.connection.addresses`, in connect order.
    pub(crate) addresses: Vec<String>,
    /// `http.connection.address_index`.
    pub(crate) address_index: Option<i64>,
    /// `http.connection.address_fallback`.
    pub(crate) address_fallback: Option<bool>,
    /// `tcp.address_skipped` events.
    pub(crate) skipped: Vec<SkippedView>,
    /// `http.connection.tcp.syn_retransmits`.
    pub(crate) syn_retransmits: Option<i64>,
    /// `tcp.syn_retransmit` events.
    pub(crate) syn_retransmit_events: Vec<SynRetransmitView>,
    /// The kernel's view of the socket (absent where sock_diag is not).
    pub(crate) kernel: KernelView,
    /// Its `error.type`.
    pub(crate) error_type: Option<String>,
}

/// One `tcp.address_skipped` event.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct SkippedView {
    /// `network.peer.address`.
    pub(crate) address: Option<String>,
    /// `http.connection.address_outcome`.
    pub(crate) outcome: Option<String>,
    /// Event time after the start of `tcp.connect`.
    pub(crate) at_ms: f64,
}

/// One `tcp.syn_retransmit` event.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct SynRetransmitView {
    /// `http.connection.tcp.syn_retransmits`: its number, from 1.
    pub(crate) number: Option<i64>,
    /// `http.connection.tcp.rto`, seconds.
    pub(crate) rto_s: Option<f64>,
    /// Event time after the start of `tcp.connect`.
    pub(crate) at_ms: f64,
}

/// The kernel's TCP facts on `tcp.connect`.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct KernelView {
    /// `http.connection.tcp.rtt`, ms.
    pub(crate) rtt_ms: Option<f64>,
    /// `http.connection.tcp.rtt_variance`, ms.
    pub(crate) rtt_variance_ms: Option<f64>,
    /// `http.connection.tcp.congestion_window`, segments.
    pub(crate) congestion_window: Option<i64>,
    /// `http.connection.tcp.mss`, bytes.
    pub(crate) mss: Option<i64>,
    /// `http.connection.tcp.retransmits`.
    pub(crate) retransmits: Option<i64>,
}

/// The `tls.handshake` span.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct TlsView {
    /// Span duration.
    pub(crate) ms: f64,
    /// `tls.protocol.version`.
    pub(crate) version: Option<String>,
    /// `tls.resumed`.
    pub(crate) resumed: Option<bool>,
    /// Its `error.type`.
    pub(crate) error_type: Option<String>,
}

/// Nanoseconds between two span times, as ms.
fn ms_between(from: u64, to: u64) -> f64 {
    round3(to.saturating_sub(from) as f64 / 1e6)
}

fn string(span: &ReceivedSpan, key: &str) -> Option<String> {
    span.attr_str(key).map(str::to_owned)
}

fn event_str(event: &ReceivedEvent, key: &str) -> Option<String> {
    event.attributes.str(key).map(str::to_owned)
}

/// Every span of one scenario run, exported and read back.
#[derive(Debug)]
pub(crate) struct Spans {
    all: Vec<ReceivedSpan>,
}

impl Spans {
    /// Wraps the spans read back from the pipeline.
    pub(crate) fn new(all: Vec<ReceivedSpan>) -> Self {
        Self { all }
    }

    /// The children of `parent`, in start order.
    fn children(&self, parent: &ReceivedSpan) -> Vec<&ReceivedSpan> {
        let id = parent.span_id_hex();
        let mut v: Vec<&ReceivedSpan> = self
            .all
            .iter()
            .filter(|s| s.parent_span_id_hex().as_deref() == Some(id.as_str()))
            .collect();
        v.sort_by_key(|s| s.start_unix_nanos());
        v
    }

    /// The run named `name`: its requests (children of the run span) and
    /// the connections they set up. Empty when the run span is missing.
    pub(crate) fn run(&self, name: &str) -> RunView {
        self.run_under(name, |s| s.attr_str(RUN_ATTRIBUTE) == Some(name))
    }

    /// Like [`run`](Self::run), for the requests under the first span that
    /// `is_run` accepts (e.g. a `conntrace probe` child process's probe span).
    pub(crate) fn run_under(&self, name: &str, is_run: impl Fn(&ReceivedSpan) -> bool) -> RunView {
        let Some(run) = self.all.iter().find(|s| is_run(s)) else {
            return RunView {
                name: name.to_owned(),
                wall_ms: 0.0,
                requests: Vec::new(),
                connections: Vec::new(),
                counters: BTreeMap::new(),
            };
        };
        let t0 = run.start_unix_nanos();
        let request_spans: Vec<&ReceivedSpan> = self
            .children(run)
            .into_iter()
            .filter(|s| s.has_attr(semconv::HTTP_REQUEST_METHOD))
            .collect();
        let mut requests = Vec::new();
        let mut connections = Vec::new();
        for (i, r) in request_spans.iter().enumerate() {
            let setups: Vec<&ReceivedSpan> = self
                .children(r)
                .into_iter()
                .filter(|s| s.name() == semconv::CONNECTION_SETUP_SPAN)
                .collect();
            let mut triggered = Vec::new();
            for setup in setups {
                let view = self.connection(setup, Some(i + 1), t0);
                triggered.extend(view.id);
                connections.push(view);
            }
            requests.push(RequestView {
                index: i + 1,
                start_ms: ms_between(t0, r.start_unix_nanos()),
                total_ms: ms_between(r.start_unix_nanos(), r.end_unix_nanos()),
                status: r.attr_i64(semconv::HTTP_RESPONSE_STATUS_CODE),
                server_address: string(r, semconv::SERVER_ADDRESS),
                resend_count: r.attr_i64(semconv::HTTP_REQUEST_RESEND_COUNT).unwrap_or(0),
                error_type: string(r, semconv::ERROR_TYPE),
                error: (!r.status_message().is_empty()).then(|| r.status_message().to_owned()),
                reused: r.attr_bool(semconv::HTTP_CONNECTION_REUSED),
                miss_reason: string(r, semconv::HTTP_CONNECTION_MISS_REASON),
                connection_id: r.attr_i64(semconv::HTTP_CONNECTION_ID),
                wait_ms: r
                    .attr_f64(semconv::HTTP_CONNECTION_WAIT_TIME)
                    .map(|s| round3(s * 1e3)),
                idle_ms: r
                    .attr_f64(semconv::HTTP_CONNECTION_IDLE_TIME)
                    .map(|s| round3(s * 1e3)),
                body_bytes: r.attr_i64(semconv::HTTP_RESPONSE_BODY_SIZE),
                triggered,
                request_count: r.attr_i64(semconv::HTTP_CONNECTION_REQUEST_COUNT),
                peer_address: string(r, semconv::NETWORK_PEER_ADDRESS),
                previous_id: r.attr_i64(semconv::HTTP_CONNECTION_PREVIOUS_ID),
                previous_request_count: r.attr_i64(semconv::HTTP_CONNECTION_PREVIOUS_REQUEST_COUNT),
                previous_end: string(r, semconv::HTTP_CONNECTION_PREVIOUS_END),
                dns_stale: r.attr_bool(semconv::HTTP_CONNECTION_DNS_STALE),
                stalled: r.attr_bool(semconv::HTTP_CONNECTION_STALLED),
                since_last_receive_ms: r
                    .attr_f64(semconv::HTTP_CONNECTION_TCP_SINCE_LAST_RECEIVE)
                    .map(|s| round3(s * 1e3)),
            });
        }
        connections.sort_by(|a, b| a.start_ms.total_cmp(&b.start_ms));
        RunView {
            name: name.to_owned(),
            wall_ms: ms_between(run.start_unix_nanos(), run.end_unix_nanos()),
            requests,
            connections,
            counters: BTreeMap::new(),
        }
    }

    /// One setup span and its phase children.
    fn connection(&self, setup: &ReceivedSpan, trigger: Option<usize>, t0: u64) -> ConnectionView {
        let phases = self.children(setup);
        let phase = |name: &str| phases.iter().copied().find(|s| s.name() == name);
        let error_type = string(setup, semconv::ERROR_TYPE);
        let failed_phase = phases
            .iter()
            .rev()
            .find(|s| s.has_attr(semconv::ERROR_TYPE))
            .map(|s| s.name().to_owned());
        let outcome = string(setup, semconv::HTTP_CONNECTION_SETUP_OUTCOME)
            .unwrap_or_else(|| semconv::SETUP_OUTCOME_USED.to_owned());
        ConnectionView {
            id: setup.attr_i64(semconv::HTTP_CONNECTION_ID),
            trigger,
            start_ms: ms_between(t0, setup.start_unix_nanos()),
            total_ms: ms_between(setup.start_unix_nanos(), setup.end_unix_nanos()),
            outcome,
            error_type,
            failed_phase,
            server_address: string(setup, semconv::SERVER_ADDRESS),
            peer_address: string(setup, semconv::NETWORK_PEER_ADDRESS),
            peer_port: setup.attr_i64(semconv::NETWORK_PEER_PORT),
            network_type: string(setup, semconv::NETWORK_TYPE),
            proxied: setup.attr_bool(semconv::HTTP_CONNECTION_PROXIED) == Some(true),
            proxy_address: string(setup, semconv::HTTP_CONNECTION_PROXY_ADDRESS),
            proxy_port: setup.attr_i64(semconv::HTTP_CONNECTION_PROXY_PORT),
            address_fallback: setup.attr_bool(semconv::HTTP_CONNECTION_ADDRESS_FALLBACK)
                == Some(true),
            dns_skipped: string(setup, semconv::HTTP_CONNECTION_DNS_SKIPPED),
            dns: phase(semconv::DNS_LOOKUP_SPAN).map(dns_view),
            tcp: phase(semconv::TCP_CONNECT_SPAN).map(tcp_view),
            proxy_connect: phases
                .iter()
                .filter(|s| s.name() == semconv::PROXY_CONNECT_SPAN)
                .map(|s| PhaseView {
                    ms: ms_between(s.start_unix_nanos(), s.end_unix_nanos()),
                    error_type: string(s, semconv::ERROR_TYPE),
                    status: s.attr_i64(semconv::HTTP_RESPONSE_STATUS_CODE),
                })
                .collect(),
            tls: phase(semconv::TLS_HANDSHAKE_SPAN).map(|s| TlsView {
                ms: ms_between(s.start_unix_nanos(), s.end_unix_nanos()),
                version: string(s, semconv::TLS_PROTOCOL_VERSION),
                resumed: s.attr_bool(semconv::TLS_RESUMED),
                error_type: string(s, semconv::ERROR_TYPE),
            }),
        }
    }
}

fn dns_view(s: &ReceivedSpan) -> DnsView {
    let began = s
        .events()
        .into_iter()
        .find(|e| e.name == semconv::EVENT_DNS_LOOKUP_BEGAN);
    DnsView {
        ms: ms_between(s.start_unix_nanos(), s.end_unix_nanos()),
        queued_ms: began.map(|e| ms_between(s.start_unix_nanos(), e.time_unix_nano)),
        answers: s.attr_str_array(semconv::DNS_ANSWERS).unwrap_or_default(),
        address_order: string(s, semconv::HTTP_CONNECTION_ADDRESS_ORDER),
        error_type: string(s, semconv::ERROR_TYPE),
    }
}

fn tcp_view(s: &ReceivedSpan) -> TcpView {
    let start = s.start_unix_nanos();
    let events = s.events();
    TcpView {
        ms: ms_between(start, s.end_unix_nanos()),
        peer_address: string(s, semconv::NETWORK_PEER_ADDRESS),
        addresses: s
            .attr_str_array(semconv::HTTP_CONNECTION_ADDRESSES)
            .unwrap_or_default(),
        address_index: s.attr_i64(semconv::HTTP_CONNECTION_ADDRESS_INDEX),
        address_fallback: s.attr_bool(semconv::HTTP_CONNECTION_ADDRESS_FALLBACK),
        skipped: events
            .iter()
            .filter(|e| e.name == semconv::EVENT_TCP_ADDRESS_SKIPPED)
            .map(|e| SkippedView {
                address: event_str(e, semconv::NETWORK_PEER_ADDRESS),
                outcome: event_str(e, semconv::HTTP_CONNECTION_ADDRESS_OUTCOME),
                at_ms: ms_between(start, e.time_unix_nano),
            })
            .collect(),
        syn_retransmits: s.attr_i64(semconv::HTTP_CONNECTION_TCP_SYN_RETRANSMITS),
        syn_retransmit_events: events
            .iter()
            .filter(|e| e.name == semconv::EVENT_TCP_SYN_RETRANSMIT)
            .map(|e| SynRetransmitView {
                number: e
                    .attributes
                    .i64(semconv::HTTP_CONNECTION_TCP_SYN_RETRANSMITS),
                rto_s: e.attributes.f64(semconv::HTTP_CONNECTION_TCP_RTO),
                at_ms: ms_between(start, e.time_unix_nano),
            })
            .collect(),
        kernel: KernelView {
            rtt_ms: s
                .attr_f64(semconv::HTTP_CONNECTION_TCP_RTT)
                .map(|v| round3(v * 1e3)),
            rtt_variance_ms: s
                .attr_f64(semconv::HTTP_CONNECTION_TCP_RTT_VARIANCE)
                .map(|v| round3(v * 1e3)),
            congestion_window: s.attr_i64(semconv::HTTP_CONNECTION_TCP_CONGESTION_WINDOW),
            mss: s.attr_i64(semconv::HTTP_CONNECTION_TCP_MSS),
            retransmits: s.attr_i64(semconv::HTTP_CONNECTION_TCP_RETRANSMITS),
        },
        error_type: string(s, semconv::ERROR_TYPE),
    }
}
