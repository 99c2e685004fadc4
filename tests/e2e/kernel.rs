//! The kernel's view of a new connection on `tcp.connect`, checked against
//! what `ss -ti` prints for the same socket.

use std::process::Command;

use conntrace_lab::{HttpVersions, TestPki, TestServer, TlsVersions};
use reqwest_conntrace::semconv;

use crate::support::*;

/// `ss`'s numbers for one established socket: (mss, cwnd, total retransmits).
fn ss_numbers(local_port: u16, remote: std::net::SocketAddr) -> (i64, i64, i64) {
    let out = Command::new("ss")
        .args([
            "-tinH",
            "state",
            "established",
            "sport",
            "=",
            &format!(":{local_port}"),
            "dport",
            "=",
            &format!(":{}", remote.port()),
        ])
        .output()
        .expect("ss (iproute2) runs; scripts/test.sh installs it");
    let text = String::from_utf8_lossy(&out.stdout);
    let field = |name: &str| -> Option<&str> {
        text.split_whitespace()
            .find_map(|w| w.strip_prefix(name).filter(|v| !v.is_empty()))
    };
    let mss = field("mss:")
        .and_then(|v| v.parse().ok())
        .expect("mss in ss output");
    let cwnd = field("cwnd:")
        .and_then(|v| v.parse().ok())
        .expect("cwnd in ss output");
    // `retrans:cur/total`, absent when both are 0.
    let retrans = field("retrans:")
        .and_then(|v| v.split('/').nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    (mss, cwnd, retrans)
}

/// A TLS connection's `tcp.connect` span carries the kernel's RTT, RTT
/// variance, congestion window, MSS and retransmit count; MSS and
/// retransmits equal `ss -ti`'s for the same (still pooled) socket, whose
/// window can only have grown since, and the report's `tcp_facts()` holds
/// the same values.
#[tokio::test]
async fn tcp_connect_carries_the_kernels_view_matching_ss() {
    let t = telemetry();
    let pki = TestPki::localhost().expect("pki");
    let server = TestServer::builder()
        .tls(&pki)
        .tls_versions(TlsVersions::Tls13Only)
        .http_versions(HttpVersions::Http1Only)
        .start()
        .await
        .expect("server");
    let reports = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let sink = reports.clone();
    let client = reqwest_conntrace::ConnTrace::builder()
        .tracer_provider(&t.provider)
        .on_request_end(move |r: &reqwest_conntrace::RequestReport| {
            sink.lock().expect("reports").push(r.clone())
        })
        .build()
        .instrument_client(reqwest::Client::builder())
        .tls(trust(&pki))
        .build_with_middleware()
        .expect("client");
    get_sequentially(&client, &server.url("/"), 1).await;

    let setup = &t.setups()[0];
    let tcp = t
        .child(setup, semconv::TCP_CONNECT_SPAN)
        .expect("tcp.connect");
    let rtt = f64_attr(&tcp, semconv::HTTP_CONNECTION_TCP_RTT).expect("rtt");
    assert!(rtt > 0.0 && rtt < 0.1, "loopback RTT in seconds: {rtt}");
    assert!(f64_attr(&tcp, semconv::HTTP_CONNECTION_TCP_RTT_VARIANCE).is_some());
    let mss = i64_attr(&tcp, semconv::HTTP_CONNECTION_TCP_MSS).expect("mss");
    let cwnd = i64_attr(&tcp, semconv::HTTP_CONNECTION_TCP_CONGESTION_WINDOW).expect("cwnd");
    let retrans = i64_attr(&tcp, semconv::HTTP_CONNECTION_TCP_RETRANSMITS).expect("retransmits");
    assert!(
        !has(&tcp, semconv::HTTP_CONNECTION_TCP_SYN_RETRANSMITS),
        "a fast loopback connect waited out no SYN retransmission"
    );

    let local_port = i64_attr(setup, semconv::NETWORK_LOCAL_PORT).expect("local port") as u16;
    let (ss_mss, ss_cwnd, ss_retrans) = ss_numbers(local_port, server.addr());
    assert_eq!((ss_mss, ss_retrans), (mss, retrans));
    // The window may grow with the request's data after the connect (slow
    // start); without loss it never shrinks.
    assert!(
        ss_cwnd >= cwnd && cwnd >= 10,
        "cwnd at connect {cwnd} (initial window 10, RFC 6928), now {ss_cwnd}"
    );

    let report = reports.lock().expect("reports")[0].clone();
    let facts = report
        .connection
        .expect("attributed")
        .setup
        .tcp_facts()
        .cloned()
        .expect("kernel answered");
    let info = facts.info.expect("tcp_info of an established socket");
    assert_eq!(
        (i64::from(info.send_mss), i64::from(info.congestion_window)),
        (mss, cwnd)
    );
}
