//! `conntrace lab`: every scenario runs as the real binary, exporting
//! OTLP/gRPC into an in-process receiver; the tests assert the exported
//! spans' attributes and events (miss reasons, phases, fallbacks, SYN
//! retransmits, proxies), against the lab servers' own counters from the
//! `--json` output. The printout is the same spans' verdict, so it is not
//! what is tested here.

use std::process::Output;
use std::time::Duration;

use conntrace_lab::{OtlpReceiver, ReceivedEvent, ReceivedMetric, ReceivedSpan};
use reqwest_conntrace::semconv;
use serde_json::Value;

use super::{assert_one_line_error, children, conntrace, run, stderr};

/// The CLI's own attribute naming a run on its run span.
const RUN_ATTRIBUTE: &str = "conntrace.lab.run";

/// Every scenario name, in `--list` order.
const SCENARIOS: [&str; 16] = [
    "far-server",
    "ipv6-blackhole",
    "idle-expired",
    "discarded",
    "server-closed",
    "new-client",
    "connect-proxy",
    "dns-queue",
    "dead-first-address",
    "cancelled-handshake",
    "redirect-chain",
    "env-proxy",
    "request-limit",
    "goaway",
    "stalled-connection",
    "dns-change",
];

/// One scenario's `--json` document and the spans the receiver got.
struct Ran {
    json: Value,
    spans: Vec<ReceivedSpan>,
    /// Every metric the collector got (the lab's and its children's).
    metrics: Vec<ReceivedMetric>,
}

impl Ran {
    fn run_span(&self, run: &str) -> &ReceivedSpan {
        self.spans
            .iter()
            .find(|s| s.attr_str(RUN_ATTRIBUTE) == Some(run))
            .unwrap_or_else(|| panic!("no run span {run:?}"))
    }

    /// The run's request spans, in start order.
    fn requests(&self, run: &str) -> Vec<&ReceivedSpan> {
        let mut v: Vec<&ReceivedSpan> = children(&self.spans, self.run_span(run))
            .into_iter()
            .filter(|s| s.attr_str(semconv::HTTP_REQUEST_METHOD).is_some())
            .collect();
        v.sort_by_key(|s| s.start_unix_nanos());
        v
    }

    /// The setup spans a request triggered.
    fn setups_of(&self, request: &ReceivedSpan) -> Vec<&ReceivedSpan> {
        let mut v: Vec<&ReceivedSpan> = children(&self.spans, request)
            .into_iter()
            .filter(|s| s.name() == semconv::CONNECTION_SETUP_SPAN)
            .collect();
        v.sort_by_key(|s| s.start_unix_nanos());
        v
    }

    /// Every setup span of the run, in start order.
    fn setups(&self, run: &str) -> Vec<&ReceivedSpan> {
        let mut v: Vec<&ReceivedSpan> = self
            .requests(run)
            .into_iter()
            .flat_map(|r| self.setups_of(r))
            .collect();
        v.sort_by_key(|s| s.start_unix_nanos());
        v
    }

    /// The phase span `name` under `setup`.
    fn phase(&self, setup: &ReceivedSpan, name: &str) -> Option<&ReceivedSpan> {
        let v = self.phases(setup, name);
        assert!(v.len() <= 1, "{} {name} spans under one setup", v.len());
        v.into_iter().next()
    }

    fn phases(&self, setup: &ReceivedSpan, name: &str) -> Vec<&ReceivedSpan> {
        children(&self.spans, setup)
            .into_iter()
            .filter(|s| s.name() == name)
            .collect()
    }

    /// A counter the lab's servers kept for `run` (from `--json`).
    fn counter(&self, run: &str, key: &str) -> u64 {
        self.json["runs"]
            .as_array()
            .and_then(|runs| runs.iter().find(|r| r["name"] == run))
            .and_then(|r| r["counters"][key].as_u64())
            .unwrap_or_else(|| panic!("no counter {key} for run {run:?}"))
    }
}

/// Runs `conntrace lab ARGS --json` with OTLP to a fresh receiver.
async fn lab(args: &[&str]) -> Ran {
    let receiver = OtlpReceiver::start().await.expect("receiver");
    let mut cmd = conntrace();
    cmd.arg("lab")
        .args(args)
        .arg("--json")
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint())
        .env("OTEL_SERVICE_NAME", "conntrace-lab-test");
    let out: Output = run(cmd).await;
    assert!(
        out.status.success(),
        "lab {args:?} failed: {}",
        stderr(&out)
    );
    let json: Value = serde_json::from_slice(&out.stdout).expect("--json output is JSON");
    assert_eq!(json["schema"], "conntrace.lab/v1");
    assert_eq!(json["scenario"], args[0]);
    Ran {
        json,
        spans: receiver.spans(),
        metrics: receiver.metrics(),
    }
}

fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

fn events(span: &ReceivedSpan, name: &str) -> Vec<ReceivedEvent> {
    span.events()
        .into_iter()
        .filter(|e| e.name == name)
        .collect()
}

/// Seconds from the start of `span` to `event`.
fn offset(span: &ReceivedSpan, event: &ReceivedEvent) -> f64 {
    event.time_unix_nano.saturating_sub(span.start_unix_nanos()) as f64 / 1e9
}

fn miss_reasons(requests: &[&ReceivedSpan]) -> Vec<Option<String>> {
    requests
        .iter()
        .map(|r| {
            r.attr_str(semconv::HTTP_CONNECTION_MISS_REASON)
                .map(str::to_owned)
        })
        .collect()
}

fn some(s: &str) -> Option<String> {
    Some(s.to_owned())
}

/// `--list` names all sixteen scenarios, one line each with a description;
/// `--list --json` lists the same.
#[tokio::test]
async fn lab_list_names_every_scenario() {
    let mut cmd = conntrace();
    cmd.args(["lab", "--list"]);
    let out = run(cmd).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), SCENARIOS.len(), "{text}");
    for (line, name) in lines.iter().zip(SCENARIOS) {
        let (first, rest) = line.split_once(' ').expect("name and description");
        assert_eq!(first, name);
        assert!(rest.trim().len() > 20, "a description: {line:?}");
    }
    let mut cmd = conntrace();
    cmd.args(["lab", "--list", "--json"]);
    let out = run(cmd).await;
    let json: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let names: Vec<&str> = json["scenarios"]
        .as_array()
        .expect("scenarios")
        .iter()
        .filter_map(|s| s["name"].as_str())
        .collect();
    assert_eq!(names, SCENARIOS);
}

/// An unknown scenario: one `error:` line naming the valid ones, exit 2
/// (a bad command line).
#[tokio::test]
async fn lab_unknown_scenario_gets_one_line_and_exit_2() {
    let mut cmd = conntrace();
    cmd.args(["lab", "no-such-scenario"]);
    let out = run(cmd).await;
    assert_one_line_error(&out, "unknown scenario");
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    for name in SCENARIOS {
        assert!(err.contains(name), "{err:?} lists {name}");
    }
}

/// Parameters that make reproduction impossible or that a scenario ignores
/// are refused up front, one line each: a --requests below the scenario's
/// minimum names the minimum; --rtt-ms and --requests where the scenario
/// has no use for them name the scenario and the option.
#[tokio::test]
async fn lab_refuses_parameters_it_cannot_use() {
    for (args, expect) in [
        (
            &["new-client", "--requests", "1"][..],
            "new-client needs --requests 2 or more",
        ),
        (
            &["far-server", "--requests", "1"][..],
            "far-server needs --requests 2 or more",
        ),
        (
            &["connect-proxy", "--requests", "1"][..],
            "connect-proxy needs --requests 2 or more",
        ),
        (
            &["idle-expired", "--rtt-ms", "5"][..],
            "idle-expired takes no --rtt-ms",
        ),
        (
            &["dns-queue", "--requests", "3"][..],
            "dns-queue takes no --requests",
        ),
        (
            &["new-client", "--rtt-ms", "5"][..],
            "new-client takes no --rtt-ms",
        ),
        (
            &["cancelled-handshake", "--requests", "2"][..],
            "cancelled-handshake takes no --requests",
        ),
    ] {
        let mut cmd = conntrace();
        cmd.arg("lab").args(args).arg("--json");
        let out = run(cmd).await;
        assert_one_line_error(&out, expect);
        assert!(out.stdout.is_empty(), "{args:?}: nothing ran");
    }
}

/// The smallest accepted --requests still reproduces, from the spans.
#[tokio::test]
async fn lab_minimum_requests_still_reproduce() {
    for scenario in ["new-client", "connect-proxy"] {
        let ran = lab(&[scenario, "--requests", "2"]).await;
        assert_eq!(
            ran.json["reproduced"], true,
            "{scenario}: {}",
            ran.json["not_reproduced_because"]
        );
    }
}

/// Incident 3, at 250 ms RTT (long enough that the CPU time of a debug
/// build's handshakes, stretched by a loaded machine, stays inside the
/// margins, which scale with the RTT; at 100 ms a full TLS 1.2 setup once
/// took 7 RTT beside two CPU burners): a connection per request is a miss every time
/// with TLS 1.2 costing 3 RTT of setup and TLS 1.3 2 RTT; TLS 1.2
/// resumption saves one; resumed counts match the servers'; pooled runs set
/// up one connection; the full accept queue costs one SYN retransmit (1 s),
/// with the event, the count and the kernel's retransmit count.
#[tokio::test]
async fn lab_far_server() {
    let rtt = 0.250;
    let ran = lab(&["far-server", "--rtt-ms", "250", "--requests", "3"]).await;
    for version in ["1.2", "1.3"] {
        let full_rtts = if version == "1.2" { 3.0 } else { 2.0 };
        // A connection per request, resumption on.
        let run = format!("TLS {version}, a connection per request");
        let reqs = ran.requests(&run);
        assert_eq!(reqs.len(), 3, "{run}");
        assert_eq!(
            miss_reasons(&reqs),
            vec![
                some(semconv::MISS_REASON_COLD),
                some(semconv::MISS_REASON_POOL_DISABLED),
                some(semconv::MISS_REASON_POOL_DISABLED)
            ],
            "{run}: an idle limit of 0 keeps no connection, on purpose"
        );
        assert!(
            reqs.iter()
                .all(|r| r.attr_bool(semconv::HTTP_CONNECTION_REUSED) == Some(false))
        );
        let setups = ran.setups(&run);
        assert_eq!(setups.len(), 3);
        let resumed: Vec<Option<bool>> = setups
            .iter()
            .map(|s| s.attr_bool(semconv::TLS_RESUMED))
            .collect();
        assert_eq!(resumed, vec![Some(false), Some(true), Some(true)], "{run}");
        assert_eq!(ran.counter(&run, "server_tls_resumed"), 2);
        assert_eq!(ran.counter(&run, "server_accepted"), 3);
        for s in &setups {
            assert_eq!(s.attr_str(semconv::TLS_PROTOCOL_VERSION), Some(version));
            assert!(ran.phase(s, semconv::TLS_HANDSHAKE_SPAN).is_some());
        }
        let full = secs(setups[0].duration());
        assert!(
            full >= 0.9 * full_rtts * rtt && full < (full_rtts + 1.5) * rtt,
            "{run}: full setup {full} s for {full_rtts} RTT"
        );
        let resumed_setup = secs(setups[1].duration());
        let resumed_rtts = 2.0;
        assert!(
            resumed_setup >= 0.9 * resumed_rtts * rtt && resumed_setup < 3.5 * rtt,
            "{run}: resumed setup {resumed_setup} s"
        );
        // Resumption off.
        let run = format!("TLS {version}, a connection per request, resumption off");
        let setups = ran.setups(&run);
        assert_eq!(setups.len(), 3);
        assert!(
            setups
                .iter()
                .all(|s| s.attr_bool(semconv::TLS_RESUMED) == Some(false)),
            "{run}"
        );
        assert_eq!(ran.counter(&run, "server_tls_resumed"), 0);
        // Pooled.
        let run = format!("TLS {version}, pooled");
        let reqs = ran.requests(&run);
        assert_eq!(reqs.len(), 3);
        assert_eq!(
            miss_reasons(&reqs),
            vec![some(semconv::MISS_REASON_COLD), None, None]
        );
        assert_eq!(ran.setups(&run).len(), 1);
        assert_eq!(ran.counter(&run, "server_accepted"), 1);
        for hit in &reqs[1..] {
            assert_eq!(hit.attr_bool(semconv::HTTP_CONNECTION_REUSED), Some(true));
            let d = secs(hit.duration());
            assert!(
                d >= 0.9 * rtt && d < 2.0 * rtt,
                "a pooled request costs one RTT: {d}"
            );
        }
    }

    // The full accept queue.
    let run = "accept queue full";
    let reqs = ran.requests(run);
    assert_eq!(reqs.len(), 1);
    assert_eq!(
        reqs[0].attr_i64(semconv::HTTP_RESPONSE_STATUS_CODE),
        Some(200)
    );
    let setups = ran.setups(run);
    assert_eq!(setups.len(), 1);
    let tcp = ran
        .phase(setups[0], semconv::TCP_CONNECT_SPAN)
        .expect("tcp.connect");
    let took = secs(tcp.duration());
    assert!(
        (0.9..=1.5).contains(&took),
        "one SYN retransmission: tcp.connect {took} s"
    );
    assert_eq!(
        tcp.attr_i64(semconv::HTTP_CONNECTION_TCP_SYN_RETRANSMITS),
        Some(1)
    );
    let syn = events(tcp, semconv::EVENT_TCP_SYN_RETRANSMIT);
    assert_eq!(syn.len(), 1, "{syn:?}");
    assert_eq!(
        syn[0]
            .attributes
            .i64(semconv::HTTP_CONNECTION_TCP_SYN_RETRANSMITS),
        Some(1)
    );
    assert_eq!(
        syn[0].attributes.f64(semconv::HTTP_CONNECTION_TCP_RTO),
        Some(1.0)
    );
    let at = offset(tcp, &syn[0]);
    assert!((0.95..=1.05).contains(&at), "retransmit at +{at} s");
    let kernel = tcp.attr_i64(semconv::HTTP_CONNECTION_TCP_RETRANSMITS);
    assert!(
        kernel.is_some_and(|k| k >= 1),
        "the kernel counted the SYN retransmission: {kernel:?}"
    );
    assert_eq!(ran.counter(run, "listener_forwarded"), 1);
    assert_eq!(ran.counter(run, "server_accepted"), 1);
}

/// Incident 4: with the resolver's order every connect tries ::1 (which
/// drops SYNs) and falls back to 127.0.0.1 after the 300 ms Happy Eyeballs
/// delay; with ipv4-first every connect is immediate on the first address.
#[tokio::test]
async fn lab_ipv6_blackhole() {
    let ran = lab(&["ipv6-blackhole"]).await;
    let run = "resolver order, IPv6 first";
    let reqs = ran.requests(run);
    assert_eq!(reqs.len(), 8);
    assert!(
        reqs.iter()
            .all(|r| r.attr_i64(semconv::HTTP_RESPONSE_STATUS_CODE) == Some(200))
    );
    let setups = ran.setups(run);
    assert_eq!(setups.len(), 8, "8 parallel fetches, 8 connects");
    assert_eq!(ran.counter(run, "server_accepted"), 8);
    assert_eq!(ran.counter(run, "ipv6_accepted"), 0);
    for s in &setups {
        let dns = ran.phase(s, semconv::DNS_LOOKUP_SPAN).expect("dns.lookup");
        assert_eq!(
            dns.attr_str(semconv::HTTP_CONNECTION_ADDRESS_ORDER),
            Some("keep")
        );
        assert_eq!(
            dns.attr_str_array(semconv::DNS_ANSWERS),
            Some(vec!["::1".to_owned(), "127.0.0.1".to_owned()])
        );
        let tcp = ran
            .phase(s, semconv::TCP_CONNECT_SPAN)
            .expect("tcp.connect");
        assert_eq!(
            tcp.attr_str_array(semconv::HTTP_CONNECTION_ADDRESSES),
            Some(vec!["::1".to_owned(), "127.0.0.1".to_owned()])
        );
        assert_eq!(
            tcp.attr_i64(semconv::HTTP_CONNECTION_ADDRESS_INDEX),
            Some(1)
        );
        assert_eq!(
            tcp.attr_bool(semconv::HTTP_CONNECTION_ADDRESS_FALLBACK),
            Some(true)
        );
        assert_eq!(
            tcp.attr_str(semconv::NETWORK_PEER_ADDRESS),
            Some("127.0.0.1")
        );
        let took = secs(tcp.duration());
        assert!(
            (0.29..=0.9).contains(&took),
            "Happy Eyeballs waits 300 ms: tcp.connect {took} s"
        );
        let skipped = events(tcp, semconv::EVENT_TCP_ADDRESS_SKIPPED);
        assert_eq!(skipped.len(), 1, "{skipped:?}");
        assert_eq!(
            skipped[0].attributes.str(semconv::NETWORK_PEER_ADDRESS),
            Some("::1")
        );
        assert_eq!(
            skipped[0]
                .attributes
                .str(semconv::HTTP_CONNECTION_ADDRESS_OUTCOME),
            Some(semconv::ADDRESS_OUTCOME_OUTRACED)
        );
        assert!(events(tcp, semconv::EVENT_TCP_SYN_RETRANSMIT).is_empty());
        assert_eq!(
            s.attr_bool(semconv::HTTP_CONNECTION_ADDRESS_FALLBACK),
            Some(true)
        );
        assert_eq!(s.attr_str(semconv::NETWORK_TYPE), Some("ipv4"));
    }

    let run = "address order ipv4-first";
    let reqs = ran.requests(run);
    assert_eq!(reqs.len(), 8);
    let setups = ran.setups(run);
    assert!(!setups.is_empty());
    assert_eq!(
        ran.counter(run, "server_accepted"),
        setups.len() as u64,
        "every connect the spans show reached the server"
    );
    for s in &setups {
        let dns = ran.phase(s, semconv::DNS_LOOKUP_SPAN).expect("dns.lookup");
        assert_eq!(
            dns.attr_str(semconv::HTTP_CONNECTION_ADDRESS_ORDER),
            Some("ipv4_first")
        );
        assert_eq!(
            dns.attr_str_array(semconv::DNS_ANSWERS),
            Some(vec!["::1".to_owned(), "127.0.0.1".to_owned()]),
            "answers in the resolver's order"
        );
        let tcp = ran
            .phase(s, semconv::TCP_CONNECT_SPAN)
            .expect("tcp.connect");
        assert_eq!(
            tcp.attr_str_array(semconv::HTTP_CONNECTION_ADDRESSES),
            Some(vec!["127.0.0.1".to_owned(), "::1".to_owned()])
        );
        assert_eq!(
            tcp.attr_i64(semconv::HTTP_CONNECTION_ADDRESS_INDEX),
            Some(0)
        );
        assert_eq!(
            tcp.attr_bool(semconv::HTTP_CONNECTION_ADDRESS_FALLBACK),
            Some(false)
        );
        assert!(events(tcp, semconv::EVENT_TCP_ADDRESS_SKIPPED).is_empty());
        assert!(secs(tcp.duration()) < 0.25, "{:?}", tcp.duration());
        assert_ne!(
            s.attr_bool(semconv::HTTP_CONNECTION_ADDRESS_FALLBACK),
            Some(true)
        );
    }
}

/// A gap longer than the pool idle timeout: the second request is a miss
/// with idle_expired, the third a hit on the second's connection.
#[tokio::test]
async fn lab_idle_expired() {
    let ran = lab(&["idle-expired"]).await;
    let run = "gap longer than the pool idle timeout";
    let reqs = ran.requests(run);
    assert_eq!(reqs.len(), 3);
    assert_eq!(
        miss_reasons(&reqs),
        vec![
            some(semconv::MISS_REASON_COLD),
            some(semconv::MISS_REASON_IDLE_EXPIRED),
            None
        ]
    );
    let gap = reqs[1]
        .start_unix_nanos()
        .saturating_sub(reqs[0].end_unix_nanos()) as f64
        / 1e9;
    assert!(
        gap >= 0.55,
        "the gap outlasts the 300 ms idle timeout: {gap}"
    );
    assert_eq!(
        reqs[1].attr_bool(semconv::HTTP_CONNECTION_REUSED),
        Some(false)
    );
    assert_eq!(
        reqs[2].attr_bool(semconv::HTTP_CONNECTION_REUSED),
        Some(true)
    );
    assert_eq!(
        reqs[2].attr_i64(semconv::HTTP_CONNECTION_ID),
        reqs[1].attr_i64(semconv::HTTP_CONNECTION_ID)
    );
    let idle = reqs[2]
        .attr_f64(semconv::HTTP_CONNECTION_IDLE_TIME)
        .expect("a hit carries its idle time");
    assert!(idle < 0.3, "{idle}");
    assert_eq!(ran.setups(run).len(), 2);
    assert_eq!(ran.counter(run, "server_accepted"), 2);
}

/// A body dropped unread: the next request is a miss with discarded; read
/// to the end, the following request reuses that connection.
#[tokio::test]
async fn lab_discarded() {
    let ran = lab(&["discarded"]).await;
    let run = "body dropped unread, then read";
    let reqs = ran.requests(run);
    assert_eq!(reqs.len(), 3);
    let size = |r: &ReceivedSpan| r.attr_i64(semconv::HTTP_RESPONSE_BODY_SIZE);
    assert!(
        size(reqs[0]).is_some_and(|b| b < 256 * 1024),
        "dropped early: {:?}",
        size(reqs[0])
    );
    assert_eq!(size(reqs[1]), Some(256 * 1024));
    assert_eq!(
        miss_reasons(&reqs),
        vec![
            some(semconv::MISS_REASON_COLD),
            some(semconv::MISS_REASON_DISCARDED),
            None
        ]
    );
    assert_eq!(
        reqs[1].attr_bool(semconv::HTTP_CONNECTION_REUSED),
        Some(false)
    );
    assert_eq!(
        reqs[2].attr_bool(semconv::HTTP_CONNECTION_REUSED),
        Some(true)
    );
    assert_eq!(
        reqs[2].attr_i64(semconv::HTTP_CONNECTION_ID),
        reqs[1].attr_i64(semconv::HTTP_CONNECTION_ID)
    );
    assert_eq!(ran.setups(run).len(), 2);
    assert_eq!(ran.counter(run, "server_accepted"), 2);
}

/// The server's keep-alive timeout (200 ms) under the client's (90 s): the
/// second request finds the pooled connection closed by the server (a miss
/// with closed_by_peer, or a failure on the reused connection with its idle
/// time); with the client's timeout under the server's, idle_expired.
#[tokio::test]
async fn lab_server_closed() {
    let ran = lab(&["server-closed"]).await;
    let run = "client idle timeout 90 s, server 200 ms";
    let reqs = ran.requests(run);
    assert_eq!(reqs.len(), 2);
    assert!(ran.counter(run, "server_closed_before_request_2") >= 1);
    let second = reqs[1];
    if second.attr_str(semconv::ERROR_TYPE).is_some() {
        assert_eq!(
            second.attr_bool(semconv::HTTP_CONNECTION_REUSED),
            Some(true)
        );
        assert!(second.has_attr(semconv::HTTP_CONNECTION_IDLE_TIME));
    } else {
        assert_eq!(
            second.attr_bool(semconv::HTTP_CONNECTION_REUSED),
            Some(false)
        );
        assert_eq!(
            second.attr_str(semconv::HTTP_CONNECTION_MISS_REASON),
            Some(semconv::MISS_REASON_CLOSED_BY_PEER)
        );
    }
    let run = "client idle timeout 100 ms, server 200 ms";
    let reqs = ran.requests(run);
    assert_eq!(reqs.len(), 2);
    assert_eq!(
        miss_reasons(&reqs),
        vec![
            some(semconv::MISS_REASON_COLD),
            some(semconv::MISS_REASON_IDLE_EXPIRED)
        ]
    );
}

/// A new client per request (one handle): cold, then new_client on every
/// request, each with a full TLS handshake (the server agrees); one shared
/// client: one connection.
#[tokio::test]
async fn lab_new_client() {
    let ran = lab(&["new-client", "--requests", "4"]).await;
    let run = "a new client per request";
    let reqs = ran.requests(run);
    assert_eq!(reqs.len(), 4);
    assert_eq!(
        miss_reasons(&reqs),
        vec![
            some(semconv::MISS_REASON_COLD),
            some(semconv::MISS_REASON_NEW_CLIENT),
            some(semconv::MISS_REASON_NEW_CLIENT),
            some(semconv::MISS_REASON_NEW_CLIENT)
        ]
    );
    let setups = ran.setups(run);
    assert_eq!(setups.len(), 4);
    for s in &setups {
        assert_eq!(s.attr_bool(semconv::TLS_RESUMED), Some(false));
        let tls = ran
            .phase(s, semconv::TLS_HANDSHAKE_SPAN)
            .expect("tls.handshake");
        assert_eq!(
            events(tls, semconv::EVENT_TLS_CERTIFICATE_VERIFIED).len(),
            1,
            "a full handshake verifies the certificate"
        );
    }
    assert_eq!(ran.counter(run, "server_tls_handshakes"), 4);
    assert_eq!(ran.counter(run, "server_tls_resumed"), 0);

    let run = "one shared client";
    let reqs = ran.requests(run);
    assert_eq!(reqs.len(), 4);
    assert_eq!(
        miss_reasons(&reqs),
        vec![some(semconv::MISS_REASON_COLD), None, None, None]
    );
    assert_eq!(ran.setups(run).len(), 1);
    assert_eq!(ran.counter(run, "server_accepted"), 1);
}

/// Through the CONNECT proxy: one tunnel (the proxy's count) and one setup
/// span for 20 https requests, proxied, peer = the proxy, server.address =
/// the target, one proxy.connect before the TLS handshake; plain http is
/// forwarded over one proxied connection without a proxy.connect.
#[tokio::test]
async fn lab_connect_proxy() {
    let ran = lab(&["connect-proxy"]).await;
    let proxy: url::Url = ran.json["config"]["proxy"]
        .as_str()
        .expect("proxy")
        .parse()
        .expect("proxy URL");
    let target: url::Url = ran.json["config"]["url"]
        .as_str()
        .expect("url")
        .parse()
        .expect("target URL");
    let run = "https through a CONNECT tunnel";
    let reqs = ran.requests(run);
    assert_eq!(reqs.len(), 20);
    assert!(
        reqs[1..]
            .iter()
            .all(|r| r.attr_bool(semconv::HTTP_CONNECTION_REUSED) == Some(true))
    );
    let setups = ran.setups(run);
    assert_eq!(setups.len(), 1);
    let s = setups[0];
    assert_eq!(s.attr_bool(semconv::HTTP_CONNECTION_PROXIED), Some(true));
    assert_eq!(s.attr_str(semconv::NETWORK_PEER_ADDRESS), Some("127.0.0.1"));
    assert_eq!(
        s.attr_i64(semconv::NETWORK_PEER_PORT),
        proxy.port().map(i64::from)
    );
    assert_eq!(s.attr_str(semconv::SERVER_ADDRESS), target.host_str());
    assert_eq!(
        s.attr_i64(semconv::SERVER_PORT),
        target.port().map(i64::from)
    );
    let tunnel = ran
        .phase(s, semconv::PROXY_CONNECT_SPAN)
        .expect("one proxy.connect");
    assert_eq!(tunnel.attr_str(semconv::SERVER_ADDRESS), target.host_str());
    let tls = ran
        .phase(s, semconv::TLS_HANDSHAKE_SPAN)
        .expect("tls.handshake");
    assert!(tunnel.end_unix_nanos() <= tls.start_unix_nanos());
    assert_eq!(ran.counter(run, "proxy_tunnels"), 1);
    assert_eq!(ran.counter(run, "proxy_connections"), 1);
    assert_eq!(ran.counter(run, "server_accepted"), 1);

    let run = "plain http forwarded";
    let reqs = ran.requests(run);
    assert_eq!(reqs.len(), 3);
    let setups = ran.setups(run);
    assert_eq!(setups.len(), 1);
    assert_eq!(
        setups[0].attr_bool(semconv::HTTP_CONNECTION_PROXIED),
        Some(true)
    );
    assert!(
        ran.phases(setups[0], semconv::PROXY_CONNECT_SPAN)
            .is_empty()
    );
    assert!(
        ran.phases(setups[0], semconv::TLS_HANDSHAKE_SPAN)
            .is_empty()
    );
    assert_eq!(ran.counter(run, "proxy_forwarded"), 3);
    assert_eq!(ran.counter(run, "server_accepted"), 3);
}

/// A 302 chain across 127.0.0.1 to 127.0.0.5, run three times (the second
/// pass of each relies on hyper-util having pooled every hop's connection):
/// one request span per hop with its `server.address`, `resend_count` 0..4
/// and `url.full`; in the first pass each hop triggered exactly one setup
/// span for its own host, used by it, and the servers accepted one
/// connection each; in the second pass every hop is an idle hit on the
/// connection of the same host, and the servers accepted none and counted
/// the request as the second on that connection.
#[tokio::test]
async fn lab_redirect_chain() {
    for pass in 0..3 {
        let ran = lab(&["redirect-chain"]).await;
        let cold = "first run: every hop on a new connection";
        let warm = "second run: the same chain again";
        let first = ran.requests(cold);
        let second = ran.requests(warm);
        assert_eq!(first.len(), 5, "pass {pass}");
        assert_eq!(second.len(), 5, "pass {pass}");
        for k in 0..5 {
            let host = format!("127.0.0.{}", k + 1);
            let n = k + 1;
            for r in [first[k], second[k]] {
                assert_eq!(r.attr_str(semconv::SERVER_ADDRESS), Some(host.as_str()));
                assert_eq!(
                    r.attr_i64(semconv::HTTP_REQUEST_RESEND_COUNT),
                    (k > 0).then_some(k as i64),
                    "pass {pass} hop {n}"
                );
                let expected_status = if k < 4 { 302 } else { 200 };
                assert_eq!(
                    r.attr_i64(semconv::HTTP_RESPONSE_STATUS_CODE),
                    Some(expected_status)
                );
            }
            let setups = ran.setups_of(first[k]);
            assert_eq!(setups.len(), 1, "pass {pass} hop {n}: one connect");
            let setup = setups[0];
            assert_eq!(setup.attr_str(semconv::SERVER_ADDRESS), Some(host.as_str()));
            assert_eq!(
                setup.attr_str(semconv::NETWORK_PEER_ADDRESS),
                Some(host.as_str())
            );
            assert_eq!(
                setup.attr_bool(semconv::HTTP_CONNECTION_USED_BY_TRIGGER),
                Some(true)
            );
            assert_eq!(
                setup.attr_str(semconv::HTTP_CONNECTION_SETUP_OUTCOME),
                Some(semconv::SETUP_OUTCOME_USED)
            );
            assert_eq!(
                first[k].attr_bool(semconv::HTTP_CONNECTION_REUSED),
                Some(false)
            );
            assert_eq!(
                first[k].attr_i64(semconv::HTTP_CONNECTION_ID),
                setup.attr_i64(semconv::HTTP_CONNECTION_ID)
            );
            assert_eq!(ran.counter(cold, &format!("host_{n}_server_accepted")), 1);
            assert!(ran.setups_of(second[k]).is_empty(), "pass {pass} hop {n}");
            assert_eq!(
                second[k].attr_bool(semconv::HTTP_CONNECTION_REUSED),
                Some(true),
                "pass {pass} hop {n}"
            );
            assert_eq!(
                second[k].attr_str(semconv::HTTP_CONNECTION_MISS_REASON),
                None,
                "pass {pass} hop {n}"
            );
            assert_eq!(
                second[k].attr_i64(semconv::HTTP_CONNECTION_ID),
                first[k].attr_i64(semconv::HTTP_CONNECTION_ID)
            );
            assert_eq!(
                second[k].attr_i64(semconv::HTTP_CONNECTION_REQUEST_COUNT),
                Some(2)
            );
            assert_eq!(ran.counter(warm, &format!("host_{n}_server_accepted")), 0);
            assert_eq!(
                ran.counter(warm, &format!("host_{n}_server_connection_requests")),
                2
            );
        }
        assert_eq!(ran.counter(cold, "server_accepted"), 5);
        assert_eq!(ran.counter(warm, "server_accepted"), 0);
        assert_eq!(ran.json["reproduced"], true);
    }
}

/// A proxy from `HTTPS_PROXY` (the scenario runs `conntrace probe`
/// children with it set, exporting to its own receiver; its `--json` runs
/// are those spans read back): the open tunnel's setup names the proxy the
/// proxy's log says it answered 200 for, has a `proxy.connect` phase and
/// no `dns_skipped = override`; a 407 refusal and a 502 refusal (the
/// proxy's log shows one each) fail the request and the setup with the
/// proxy's error.type, the `proxy.connect` phase carrying 407 for the first.
#[tokio::test]
async fn lab_env_proxy() {
    let ran = lab(&["env-proxy"]).await;
    let port = |key: &str| -> i64 {
        let url: url::Url = ran.json["config"][key]
            .as_str()
            .expect("proxy")
            .parse()
            .expect("proxy URL");
        i64::from(url.port().expect("port"))
    };
    let run = |name: &str| -> Value {
        ran.json["runs"]
            .as_array()
            .and_then(|runs| runs.iter().find(|r| r["name"] == name))
            .cloned()
            .unwrap_or_else(|| panic!("no run {name:?}"))
    };
    let tunnel = run("HTTPS_PROXY, tunnel open");
    assert_eq!(
        ran.counter("HTTPS_PROXY, tunnel open", "proxy_connects_answered_200"),
        1
    );
    assert_eq!(
        ran.counter("HTTPS_PROXY, tunnel open", "server_accepted"),
        1
    );
    assert_eq!(tunnel["requests"][0]["status"], 200);
    let c = &tunnel["connections"][0];
    assert_eq!(c["proxied"], true);
    assert_eq!(c["proxy_address"], "127.0.0.1");
    assert_eq!(c["proxy_port"], port("proxy"));
    assert_eq!(c["peer_port"], port("proxy"));
    assert_ne!(c["dns_skipped"], semconv::DNS_SKIPPED_OVERRIDE);
    assert_eq!(c["proxy_connect"].as_array().map(Vec::len), Some(1));
    assert_eq!(c["proxy_connect"][0]["error_type"], Value::Null);

    for (name, counter, proxy, error_type, status) in [
        (
            "HTTPS_PROXY answering 407",
            "proxy_connects_answered_407",
            "refusing_proxy",
            semconv::ERROR_TYPE_PROXY_AUTH_REQUIRED,
            Value::from(407),
        ),
        (
            "HTTPS_PROXY answering 502",
            "proxy_connects_answered_502",
            "proxy",
            semconv::ERROR_TYPE_PROXY_CONNECT_REFUSED,
            Value::Null,
        ),
    ] {
        assert_eq!(ran.counter(name, counter), 1, "{name}");
        let r = run(name);
        assert_eq!(r["requests"][0]["error_type"], error_type, "{name}");
        assert_eq!(r["requests"][0]["body_bytes"], Value::Null, "{name}");
        let c = &r["connections"][0];
        assert_eq!(c["error_type"], error_type, "{name}");
        assert_eq!(c["proxied"], true, "{name}");
        assert_eq!(c["proxy_port"], port(proxy), "{name}");
        assert_eq!(c["failed_phase"], semconv::PROXY_CONNECT_SPAN, "{name}");
        assert_eq!(c["proxy_connect"][0]["error_type"], error_type, "{name}");
        assert_eq!(c["proxy_connect"][0]["status"], status, "{name}");
        assert_eq!(c["tcp"]["error_type"], Value::Null, "{name}");
        // It answered: TCP to it connected, and its address is the peer.
        assert_eq!(
            (c["peer_address"].as_str(), c["peer_port"].as_i64()),
            (Some("127.0.0.1"), Some(port(proxy))),
            "{name}"
        );
    }
    assert_eq!(ran.json["reproduced"], true);
    // The children's spans reached the lab's collector too, whole.
    assert_child_runs_whole(&ran.spans, &ran.json);
    let delivery = &ran.json["telemetry"]["delivery"];
    assert_eq!(
        delivery["spans_exported"],
        ran.spans.len(),
        "every span the collector got is counted: {delivery}"
    );
    assert_eq!(delivery["spans_ended"], ran.spans.len(), "{delivery}");
    assert_eq!(delivery["spans_failed"], 0, "{delivery}");
    // And the children's metrics (each exports its own to the collector).
    assert_child_request_metrics(&ran.metrics);
}

/// `metrics` hold the env-proxy children's request durations
/// (`http.client.request.duration` under the probe's scope attribute
/// `conntrace.probe.mode = reuse`): one request answered 200 through the
/// tunnel, one failed with each refusing proxy's error.type. Returns how
/// many requests they count in all.
fn assert_child_request_metrics(metrics: &[ReceivedMetric]) -> u64 {
    let points: Vec<_> = metrics
        .iter()
        .filter(|m| {
            m.name == "http.client.request.duration"
                && m.scope_attributes.str("conntrace.probe.mode") == Some("reuse")
        })
        .flat_map(|m| m.histogram_points())
        .collect();
    let has = |error_type: Option<&str>, status: Option<i64>| {
        points.iter().any(|p| {
            p.attributes.str("error.type") == error_type
                && p.attributes.i64("http.response.status_code") == status
        })
    };
    assert!(has(None, Some(200)), "the tunnel's request: {points:#?}");
    for error_type in [
        semconv::ERROR_TYPE_PROXY_AUTH_REQUIRED,
        semconv::ERROR_TYPE_PROXY_CONNECT_REFUSED,
    ] {
        assert!(has(Some(error_type), None), "{error_type}: {points:#?}");
    }
    points.iter().map(|p| p.count).sum()
}

/// The env-proxy runs, in order: each is one `conntrace probe` child.
const ENV_PROXY_RUNS: [&str; 3] = [
    "HTTPS_PROXY, tunnel open",
    "HTTPS_PROXY answering 407",
    "HTTPS_PROXY answering 502",
];

/// `span`'s ancestors in `spans`, nearest first.
fn ancestors<'a>(spans: &'a [ReceivedSpan], span: &ReceivedSpan) -> Vec<&'a ReceivedSpan> {
    let mut out: Vec<&ReceivedSpan> = Vec::new();
    let mut parent = span.parent_span_id_hex();
    while let Some(id) = parent {
        let Some(p) = spans.iter().find(|s| s.span_id_hex() == id) else {
            break;
        };
        out.push(p);
        parent = p.parent_span_id_hex();
    }
    out
}

/// `spans` (a sink of `conntrace lab env-proxy`) hold its three child
/// probes' spans as the children exported them: every parent present, one
/// `probe reuse` root per run with its request under it (the request's
/// error.type as the lab's `--json` run says), and the one `proxy.connect`
/// the refusing proxy's log says it answered 407, with that status, under
/// the 407 run's setup span and request.
fn assert_child_runs_whole(spans: &[ReceivedSpan], json: &Value) {
    for s in spans {
        if let Some(parent) = s.parent_span_id_hex() {
            assert!(
                spans
                    .iter()
                    .any(|p| p.span_id_hex() == parent && p.trace_id_hex() == s.trace_id_hex()),
                "{} has its parent in its trace",
                s.name()
            );
        }
    }
    let mut roots: Vec<&ReceivedSpan> = spans
        .iter()
        .filter(|s| s.attr_str("conntrace.probe.mode") == Some("reuse"))
        .collect();
    roots.sort_by_key(|s| s.start_unix_nanos());
    assert_eq!(roots.len(), ENV_PROXY_RUNS.len(), "one probe per run");
    for (root, run) in roots.iter().zip(ENV_PROXY_RUNS) {
        let requests: Vec<&ReceivedSpan> = children(spans, root)
            .into_iter()
            .filter(|s| s.attr_str(semconv::HTTP_REQUEST_METHOD).is_some())
            .collect();
        assert_eq!(requests.len(), 1, "{run}");
        let in_json = json["runs"]
            .as_array()
            .and_then(|runs| runs.iter().find(|r| r["name"] == run))
            .map(|r| r["requests"][0]["error_type"].as_str().map(str::to_owned))
            .unwrap_or_else(|| panic!("no run {run:?}"));
        assert_eq!(
            requests[0].attr_str(semconv::ERROR_TYPE).map(str::to_owned),
            in_json,
            "{run}"
        );
    }
    let answered_407: Vec<&ReceivedSpan> = spans
        .iter()
        .filter(|s| {
            s.name() == semconv::PROXY_CONNECT_SPAN
                && s.attr_i64(semconv::HTTP_RESPONSE_STATUS_CODE) == Some(407)
        })
        .collect();
    let logged = json["runs"]
        .as_array()
        .and_then(|runs| runs.iter().find(|r| r["name"] == ENV_PROXY_RUNS[1]))
        .and_then(|r| r["counters"]["proxy_connects_answered_407"].as_u64())
        .expect("the refusing proxy's count");
    assert_eq!(answered_407.len() as u64, logged, "as the proxy's log");
    let phase = answered_407[0];
    assert_eq!(
        phase.attr_str(semconv::ERROR_TYPE),
        Some(semconv::ERROR_TYPE_PROXY_AUTH_REQUIRED)
    );
    let chain = ancestors(spans, phase);
    let names: Vec<&str> = chain.iter().map(|s| s.name()).collect();
    assert_eq!(chain.len(), 3, "setup, request, probe: {names:?}");
    assert_eq!(names[0], semconv::CONNECTION_SETUP_SPAN, "{names:?}");
    assert_eq!(
        chain[1].attr_str(semconv::ERROR_TYPE),
        Some(semconv::ERROR_TYPE_PROXY_AUTH_REQUIRED),
        "the request"
    );
    assert_eq!(
        chain[2].span_id_hex(),
        roots[1].span_id_hex(),
        "the 407 run's probe"
    );
}

/// `conntrace lab env-proxy --json --traces-out T --html P` without a
/// collector: the file holds the child probes' spans whole (as
/// [`assert_child_runs_whole`] checks), the metrics file beside it each
/// child's requests once, `spans_written` counts the spans, `conntrace
/// view T` draws them, and the lab's page holds each child's trace.
#[tokio::test]
async fn lab_env_proxy_writes_its_child_runs_to_the_traces_file_and_page() {
    let dir = tempfile::tempdir().expect("tempdir");
    let traces = dir.path().join("ep.json");
    let page = dir.path().join("ep.html");
    let mut cmd = conntrace();
    cmd.args(["lab", "env-proxy", "--json", "--traces-out"])
        .arg(&traces)
        .arg("--html")
        .arg(&page);
    let out = run(cmd).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let json: Value = serde_json::from_slice(&out.stdout).expect("--json output is JSON");
    assert_eq!(json["reproduced"], true);
    let spans =
        conntrace_lab::spans_from_otlp_json(&std::fs::read_to_string(&traces).expect("traces"))
            .expect("OTLP JSON");
    assert_child_runs_whole(&spans, &json);
    let t = &json["telemetry"];
    assert_eq!(t["sink"], "file", "{t}");
    assert_eq!(t["spans_written"], spans.len(), "{t}");
    // The metrics file beside it holds each child's last collection once:
    // three requests.
    let metrics = conntrace_lab::metrics_from_otlp_json(
        &std::fs::read_to_string(dir.path().join("ep.metrics.json")).expect("metrics file"),
    )
    .expect("an OTLP JSON metrics document");
    assert_eq!(assert_child_request_metrics(&metrics), 3, "{metrics:#?}");
    assert_eq!(t["delivery"]["spans_exported"], spans.len(), "{t}");
    // The lab's page: every child's trace, from all the spans.
    assert!(
        stderr(&out).contains(&format!("drawn from {} span(s)", spans.len())),
        "{}",
        stderr(&out)
    );
    let html = std::fs::read_to_string(&page).expect("page");
    for root in spans
        .iter()
        .filter(|s| s.attr_str("conntrace.probe.mode").is_some())
    {
        let id = format!("\"trace_id\":\"{}\"", root.trace_id_hex());
        assert!(html.contains(&id), "the page draws trace {id}");
    }
    // `conntrace view` takes the file.
    let mut cmd = conntrace();
    cmd.arg("view")
        .arg(&traces)
        .arg("--html")
        .arg(dir.path().join("view.html"));
    let out = run(cmd).await;
    assert!(out.status.success(), "view: {}", stderr(&out));
    let line = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        line.contains(&format!("3 trace(s) drawn from {} span(s)", spans.len())),
        "{line}"
    );
}

/// `conntrace probe URL --requests 1` with `HTTPS_PROXY=proxy` the only
/// proxy setting of its environment.
async fn probe_through(proxy: &str, url: &str) -> Output {
    let mut cmd = conntrace();
    cmd.args(["probe", url, "--requests", "1"])
        .env("HTTPS_PROXY", proxy)
        .env_remove("ALL_PROXY")
        .env_remove("all_proxy")
        .env_remove("https_proxy")
        .env_remove("NO_PROXY")
        .env_remove("no_proxy");
    run(cmd).await
}

/// `HTTPS_PROXY` names a proxy that is down (nothing listens on its
/// port); `conntrace probe https://localhost:PORT/ -n 1`, the target
/// listening. The refused connection was the one to the proxy: the target
/// accepted nothing. The one-line error names the proxy and its address
/// (the chain alone names only the target URL), and exits non-zero.
#[tokio::test]
async fn probe_error_for_a_refused_proxy_names_the_proxy() {
    let proxy_port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr").port()
    };
    let target = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    target.set_nonblocking(true).expect("nonblocking");
    let target_port = target.local_addr().expect("addr").port();
    let out = probe_through(
        &format!("http://127.0.0.1:{proxy_port}"),
        &format!("https://localhost:{target_port}/"),
    )
    .await;
    assert!(!out.status.success(), "must exit non-zero");
    assert!(
        matches!(target.accept(), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
        "the target was never contacted"
    );
    let err = stderr(&out);
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "one line: {err:?}");
    let line = lines[0].to_lowercase();
    assert!(line.contains("refused"), "{err:?}");
    assert!(
        line.contains("proxy") && line.contains(&format!("127.0.0.1:{proxy_port}")),
        "the line names the proxy that refused (127.0.0.1:{proxy_port}): {err:?}"
    );
}

/// `HTTPS_PROXY` names a proxy that answers the CONNECT with 407, then one
/// with 502 (its log shows the answer): one line naming the proxy, the
/// refusal and a fix for each (credentials; the proxy's rules or
/// `NO_PROXY`). Regression: the 502 line had no fix.
#[tokio::test]
async fn probe_error_for_a_proxy_refusing_the_tunnel_names_a_fix() {
    for (status, cause, fix) in [
        (
            reqwest::StatusCode::PROXY_AUTHENTICATION_REQUIRED,
            "asks for credentials (407)",
            "fix: give the proxy's credentials",
        ),
        (
            reqwest::StatusCode::BAD_GATEWAY,
            "refused the CONNECT tunnel",
            "fix: the proxy would not open a tunnel to this host",
        ),
    ] {
        let proxy = conntrace_lab::ConnectProxy::start_refusing(status)
            .await
            .expect("proxy");
        let out = probe_through(&proxy.url(), "https://localhost:9/").await;
        assert_eq!(out.status.code(), Some(1), "{status}: {}", stderr(&out));
        let log = proxy.connect_log();
        assert_eq!(
            log.iter().map(|r| r.status).collect::<Vec<_>>(),
            vec![status.as_u16()],
            "the proxy answered the one CONNECT"
        );
        let err = stderr(&out);
        let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
        assert_eq!(lines.len(), 1, "one line: {err:?}");
        for part in [cause, fix, &format!("proxy {}", proxy.addr())] {
            assert!(lines[0].contains(part), "{status}: {part:?} in {err:?}");
        }
    }
}

/// DNS behind a saturated blocking pool: dns.lookup_began ~0.8 s after the
/// lookup was asked; with a 300 ms connect timeout the request and the
/// setup fail with timeout in dns.lookup, and no tcp.connect starts.
#[tokio::test]
async fn lab_dns_queue() {
    let ran = lab(&["dns-queue"]).await;
    let run = "lookup queued behind a busy blocking pool";
    let reqs = ran.requests(run);
    assert_eq!(reqs.len(), 1);
    assert_eq!(
        reqs[0].attr_i64(semconv::HTTP_RESPONSE_STATUS_CODE),
        Some(200)
    );
    let setups = ran.setups(run);
    assert_eq!(setups.len(), 1);
    let dns = ran
        .phase(setups[0], semconv::DNS_LOOKUP_SPAN)
        .expect("dns.lookup");
    let began = events(dns, semconv::EVENT_DNS_LOOKUP_BEGAN);
    assert_eq!(began.len(), 1);
    let queued = offset(dns, &began[0]);
    assert!(
        (0.6..=1.2).contains(&queued),
        "queued behind the 800 ms blocking task: {queued} s"
    );
    assert!(secs(dns.duration()) >= queued);

    let run = "connect timeout shorter than the queueing";
    let reqs = ran.requests(run);
    assert_eq!(reqs.len(), 1);
    assert_eq!(
        reqs[0].attr_str(semconv::ERROR_TYPE),
        Some(semconv::ERROR_TYPE_TIMEOUT)
    );
    let setups = ran.setups(run);
    assert_eq!(setups.len(), 1);
    let s = setups[0];
    assert_eq!(
        s.attr_str(semconv::ERROR_TYPE),
        Some(semconv::ERROR_TYPE_TIMEOUT)
    );
    assert_eq!(
        s.attr_str(semconv::HTTP_CONNECTION_SETUP_OUTCOME),
        Some(semconv::SETUP_OUTCOME_FAILED)
    );
    let took = secs(s.duration());
    assert!((0.28..=0.6).contains(&took), "the 300 ms timeout: {took}");
    let dns = ran.phase(s, semconv::DNS_LOOKUP_SPAN).expect("dns.lookup");
    assert_eq!(
        dns.attr_str(semconv::ERROR_TYPE),
        Some(semconv::ERROR_TYPE_TIMEOUT)
    );
    assert!(ran.phase(s, semconv::TCP_CONNECT_SPAN).is_none());
}

/// A dead first address with a 1 s connect timeout: the setup falls back
/// to the second address after half the timeout; 127.0.0.2 is skipped as
/// timed_out.
#[tokio::test]
async fn lab_dead_first_address() {
    let ran = lab(&["dead-first-address"]).await;
    let run = "dead address first";
    let reqs = ran.requests(run);
    assert_eq!(reqs.len(), 1);
    assert_eq!(
        reqs[0].attr_i64(semconv::HTTP_RESPONSE_STATUS_CODE),
        Some(200)
    );
    let setups = ran.setups(run);
    assert_eq!(setups.len(), 1);
    let s = setups[0];
    assert_eq!(
        s.attr_bool(semconv::HTTP_CONNECTION_ADDRESS_FALLBACK),
        Some(true)
    );
    assert_eq!(s.attr_str(semconv::NETWORK_PEER_ADDRESS), Some("127.0.0.1"));
    let tcp = ran
        .phase(s, semconv::TCP_CONNECT_SPAN)
        .expect("tcp.connect");
    assert_eq!(
        tcp.attr_str_array(semconv::HTTP_CONNECTION_ADDRESSES),
        Some(vec!["127.0.0.2".to_owned(), "127.0.0.1".to_owned()])
    );
    assert_eq!(
        tcp.attr_i64(semconv::HTTP_CONNECTION_ADDRESS_INDEX),
        Some(1)
    );
    let took = secs(tcp.duration());
    assert!(
        (0.45..=0.8).contains(&took),
        "half of the 1 s connect timeout: {took}"
    );
    let skipped = events(tcp, semconv::EVENT_TCP_ADDRESS_SKIPPED);
    assert_eq!(skipped.len(), 1);
    assert_eq!(
        skipped[0].attributes.str(semconv::NETWORK_PEER_ADDRESS),
        Some("127.0.0.2")
    );
    assert_eq!(
        skipped[0]
            .attributes
            .str(semconv::HTTP_CONNECTION_ADDRESS_OUTCOME),
        Some(semconv::ADDRESS_OUTCOME_TIMED_OUT)
    );
    let at = offset(tcp, &skipped[0]);
    assert!((0.45..=0.6).contains(&at), "given up at +{at} s");
    assert!(events(tcp, semconv::EVENT_TCP_SYN_RETRANSMIT).is_empty());
    assert_eq!(ran.counter(run, "dead_accepted"), 0);
    assert_eq!(ran.counter(run, "server_accepted"), 1);
}

/// A request timeout mid-handshake: the request fails with timeout, its
/// connect's setup and tls.handshake end cancelled (TCP had finished), the
/// next request is a miss; with a connect timeout the setup says timeout.
#[tokio::test]
async fn lab_cancelled_handshake() {
    let ran = lab(&["cancelled-handshake", "--rtt-ms", "100"]).await;
    let run = "request timeout mid-handshake";
    let reqs = ran.requests(run);
    assert_eq!(reqs.len(), 2);
    assert_eq!(
        reqs[0].attr_str(semconv::ERROR_TYPE),
        Some(semconv::ERROR_TYPE_TIMEOUT)
    );
    assert!(!reqs[0].has_attr(semconv::HTTP_CONNECTION_REUSED));
    let first = ran.setups_of(reqs[0]);
    assert_eq!(first.len(), 1);
    let s = first[0];
    assert_eq!(
        s.attr_str(semconv::ERROR_TYPE),
        Some(semconv::ERROR_TYPE_CANCELLED)
    );
    assert_eq!(
        s.attr_str(semconv::HTTP_CONNECTION_SETUP_OUTCOME),
        Some(semconv::SETUP_OUTCOME_CANCELLED)
    );
    // The timeout runs from the request's start; the connect begins a
    // little later (more so on a loaded machine), so measure from there.
    let took = s
        .end_unix_nanos()
        .saturating_sub(reqs[0].start_unix_nanos()) as f64
        / 1e9;
    assert!(
        (0.12..=0.3).contains(&took),
        "ended at the 125 ms timeout: {took} s after the request started"
    );
    let tcp = ran
        .phase(s, semconv::TCP_CONNECT_SPAN)
        .expect("tcp.connect");
    assert!(!tcp.has_attr(semconv::ERROR_TYPE), "TCP had connected");
    let tls = ran
        .phase(s, semconv::TLS_HANDSHAKE_SPAN)
        .expect("tls.handshake");
    assert_eq!(
        tls.attr_str(semconv::ERROR_TYPE),
        Some(semconv::ERROR_TYPE_CANCELLED)
    );
    assert_eq!(
        reqs[1].attr_i64(semconv::HTTP_RESPONSE_STATUS_CODE),
        Some(200)
    );
    assert_eq!(
        reqs[1].attr_bool(semconv::HTTP_CONNECTION_REUSED),
        Some(false)
    );
    assert_eq!(
        reqs[1].attr_str(semconv::HTTP_CONNECTION_MISS_REASON),
        Some(semconv::MISS_REASON_COLD),
        "the client never had a connection to the host"
    );
    let second = ran.setups_of(reqs[1]);
    assert_eq!(second.len(), 1);
    assert!(!second[0].has_attr(semconv::ERROR_TYPE));
    assert_eq!(ran.counter(run, "proxy_connections"), 2);
    assert_eq!(ran.counter(run, "server_tls_handshakes"), 1);

    let run = "connect timeout mid-handshake";
    let reqs = ran.requests(run);
    assert_eq!(reqs.len(), 1);
    assert_eq!(
        reqs[0].attr_str(semconv::ERROR_TYPE),
        Some(semconv::ERROR_TYPE_TIMEOUT)
    );
    let setups = ran.setups(run);
    assert_eq!(setups.len(), 1);
    assert_eq!(
        setups[0].attr_str(semconv::ERROR_TYPE),
        Some(semconv::ERROR_TYPE_TIMEOUT)
    );
    assert_eq!(
        setups[0].attr_str(semconv::HTTP_CONNECTION_SETUP_OUTCOME),
        Some(semconv::SETUP_OUTCOME_FAILED)
    );
    let tls = ran
        .phase(setups[0], semconv::TLS_HANDSHAKE_SPAN)
        .expect("tls.handshake");
    assert_eq!(
        tls.attr_str(semconv::ERROR_TYPE),
        Some(semconv::ERROR_TYPE_TIMEOUT)
    );
}

/// Collector down: the scenario still concludes from its in-memory copy of
/// the spans, then says in one line that the export failed, and exits 1.
#[tokio::test]
async fn lab_with_the_collector_down_still_concludes_and_exits_1() {
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr").port()
    };
    let mut cmd = conntrace();
    cmd.args(["lab", "discarded", "--json"])
        .env(
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            format!("http://127.0.0.1:{closed}"),
        )
        .env("OTEL_EXPORTER_OTLP_TIMEOUT", "1000");
    let out = run(cmd).await;
    assert_one_line_error(&out, "export");
    assert_eq!(out.status.code(), Some(1));
    let json: Value = serde_json::from_slice(&out.stdout).expect("--json output is JSON");
    assert_eq!(
        json["reproduced"], true,
        "concluded from the in-memory spans"
    );
    assert!(json["telemetry"]["error"].is_string());
}

/// The server ends each connection after 5 requests (`Connection: close`):
/// requests 6 and 11 are `request_limit` misses naming the connection of
/// the request before them, which carried 5; the server closed 2 at its
/// limit and accepted 3 (its own counts).
#[tokio::test]
async fn lab_request_limit() {
    let ran = lab(&["request-limit"]).await;
    let run = "server closes each connection after 5 requests";
    let reqs = ran.requests(run);
    assert_eq!(reqs.len(), 11);
    assert_eq!(ran.json["reproduced"], true, "{}", ran.json);
    for at in [5, 10] {
        let (before, r) = (reqs[at - 1], reqs[at]);
        assert_eq!(
            r.attr_str(semconv::HTTP_CONNECTION_MISS_REASON),
            Some(semconv::MISS_REASON_REQUEST_LIMIT)
        );
        assert_eq!(
            r.attr_i64(semconv::HTTP_CONNECTION_PREVIOUS_ID),
            before.attr_i64(semconv::HTTP_CONNECTION_ID)
        );
        assert_eq!(
            r.attr_i64(semconv::HTTP_CONNECTION_PREVIOUS_REQUEST_COUNT),
            Some(5)
        );
        assert_eq!(
            r.attr_str(semconv::HTTP_CONNECTION_PREVIOUS_END),
            Some(semconv::CONNECTION_END_CONNECTION_CLOSE)
        );
    }
    assert_eq!(ran.counter(run, "server_accepted"), 3);
    assert_eq!(ran.counter(run, "server_closed_at_limit"), 2);
    assert_eq!(
        ran.setups(run).len() as u64,
        ran.counter(run, "server_accepted")
    );
}

/// HTTP/2 GOAWAY after 3 streams: each request that opened a new
/// connection after the first is `request_limit` (the GOAWAY came with its
/// previous connection's last response) with `previous.end = goaway` naming
/// the previous request's connection; none is `all_busy`.
#[tokio::test]
async fn lab_goaway() {
    let ran = lab(&["goaway"]).await;
    let run = "HTTP/2 server sends GOAWAY after 3 streams";
    let reqs = ran.requests(run);
    assert_eq!(reqs.len(), 7);
    assert_eq!(ran.json["reproduced"], true, "{}", ran.json);
    let mut new_connections = 0;
    for pair in reqs.windows(2) {
        let (before, r) = (pair[0], pair[1]);
        assert_ne!(
            r.attr_str(semconv::HTTP_CONNECTION_MISS_REASON),
            Some(semconv::MISS_REASON_ALL_BUSY)
        );
        if r.attr_i64(semconv::HTTP_CONNECTION_REQUEST_COUNT) == Some(1) {
            new_connections += 1;
            assert_eq!(
                r.attr_str(semconv::HTTP_CONNECTION_MISS_REASON),
                Some(semconv::MISS_REASON_REQUEST_LIMIT)
            );
            assert_eq!(
                r.attr_str(semconv::HTTP_CONNECTION_PREVIOUS_END),
                Some(semconv::CONNECTION_END_GOAWAY)
            );
            assert_eq!(
                r.attr_i64(semconv::HTTP_CONNECTION_PREVIOUS_ID),
                before.attr_i64(semconv::HTTP_CONNECTION_ID)
            );
        }
    }
    assert!(new_connections >= 1);
    assert_eq!(
        new_connections + 1,
        ran.counter(run, "server_accepted"),
        "one miss per connection the server accepted after the first"
    );
}

/// A stalled HTTP/2 peer: requests 2 and 3 time out on request 1's
/// connection, named, marked stalled, with nothing received for at least
/// their 300 ms; the server got all three on one connection.
#[tokio::test]
async fn lab_stalled_connection() {
    let ran = lab(&["stalled-connection"]).await;
    let run = "HTTP/2 peer stops answering after one request";
    let reqs = ran.requests(run);
    assert_eq!(reqs.len(), 3);
    assert_eq!(ran.json["reproduced"], true, "{}", ran.json);
    let first = reqs[0].attr_i64(semconv::HTTP_CONNECTION_ID);
    assert!(first.is_some());
    for r in &reqs[1..] {
        assert_eq!(
            r.attr_str(semconv::ERROR_TYPE),
            Some(semconv::ERROR_TYPE_TIMEOUT)
        );
        assert_eq!(r.attr_i64(semconv::HTTP_CONNECTION_ID), first);
        assert_eq!(r.attr_bool(semconv::HTTP_CONNECTION_STALLED), Some(true));
        let quiet = r
            .attr_f64(semconv::HTTP_CONNECTION_TCP_SINCE_LAST_RECEIVE)
            .expect("kernel evidence");
        assert!(quiet >= 0.29, "{quiet}");
    }
    assert_eq!(ran.counter(run, "server_accepted"), 1);
    assert_eq!(ran.counter(run, "server_requests"), 3);
}

/// DNS moves the name from 127.0.0.1 to 127.0.0.2: requests after the
/// change that go out on the pooled connection to the old address carry
/// `dns_stale`, those to the new one do not; the servers' counts agree.
#[tokio::test]
async fn lab_dns_change() {
    let ran = lab(&["dns-change"]).await;
    let run = "the name moves to another address under a pooled connection";
    let reqs = ran.requests(run);
    assert_eq!(reqs.len(), 4);
    assert_eq!(ran.json["reproduced"], true, "{}", ran.json);
    let mut on_old = 0;
    for r in &reqs[1..] {
        match r.attr_str(semconv::NETWORK_PEER_ADDRESS) {
            Some("127.0.0.1") => {
                on_old += 1;
                assert_eq!(r.attr_bool(semconv::HTTP_CONNECTION_DNS_STALE), Some(true));
            }
            Some("127.0.0.2") => {
                assert_eq!(r.attr_bool(semconv::HTTP_CONNECTION_DNS_STALE), None);
            }
            other => panic!("peer {other:?}"),
        }
    }
    assert!(on_old >= 1);
    assert_eq!(ran.counter(run, "old_address_requests"), 1 + on_old);
    assert_eq!(
        ran.counter(run, "new_address_requests"),
        3 - on_old,
        "the servers' own counts"
    );
}
