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
    let reports = crate::support::Reports::default();
    let client = reqwest_conntrace::ConnTrace::builder()
        .tracer_provider(&t.provider)
        .on_request_end(reports.callback())
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

    let report = reports.taken()[0].clone();
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

/// Answers every name with `addresses` (port 0: the URL's port is used), in
/// this order.
#[derive(Debug, Clone)]
struct Pinned(Vec<std::net::IpAddr>);

impl reqwest::dns::Resolve for Pinned {
    fn resolve(&self, _name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let addrs: Vec<std::net::SocketAddr> = self
            .0
            .iter()
            .map(|ip| std::net::SocketAddr::new(*ip, 0))
            .collect();
        Box::pin(async move { Ok(Box::new(addrs.into_iter()) as reqwest::dns::Addrs) })
    }
}

/// A TLS server that never answers: accepts TCP on `ip`, reads the
/// ClientHello and holds the connection. Records (its own address, the
/// client's) of every accepted connection.
struct HangingTls {
    addr: std::net::SocketAddr,
    accepted: std::sync::Arc<std::sync::Mutex<Vec<(std::net::SocketAddr, std::net::SocketAddr)>>>,
    task: tokio::task::JoinHandle<()>,
}

impl HangingTls {
    async fn start(ip: std::net::IpAddr) -> HangingTls {
        Self::start_on(std::net::SocketAddr::new(ip, 0)).await
    }

    async fn start_on(addr: std::net::SocketAddr) -> HangingTls {
        use tokio::io::AsyncReadExt;
        let listener = tokio::net::TcpListener::bind(addr).await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let accepted = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let record = accepted.clone();
        let task = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((mut s, client)) = listener.accept().await {
                let local = s.local_addr().expect("accepted local address");
                record.lock().expect("accepted").push((local, client));
                held.push(tokio::spawn(async move {
                    let mut buf = vec![0u8; 4096];
                    // Read the ClientHello (and anything after), never answer.
                    while let Ok(n) = s.read(&mut buf).await {
                        if n == 0 {
                            break;
                        }
                    }
                }));
            }
        });
        HangingTls {
            addr,
            accepted,
            task,
        }
    }
}

impl Drop for HangingTls {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A name resolving to two loopback addresses, one refusing (nothing
/// listens there on the port) and one where a server accepts TCP and never
/// answers the ClientHello: the connect times out in the TLS handshake, no
/// connection comes back from reqwest, yet `tcp.connect` and the failed
/// setup span name the address the server accepted on (its own record of
/// the connection), with the port, and `tcp.connect` says which of the two
/// it was. Both orders: the server's address first, then second; and an
/// IPv6 address first (refused) before the IPv4 one (Happy Eyeballs
/// fallback).
#[tokio::test]
async fn a_hung_tls_handshake_names_the_address_the_server_accepted_on() {
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
    let one = IpAddr::V4(Ipv4Addr::LOCALHOST);
    let two = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));
    let v6 = IpAddr::V6(Ipv6Addr::LOCALHOST);
    // Resolver order [127.0.0.2, 127.0.0.1]: the server on .2 is index 0,
    // on .1 index 1 (after .2 refused); [::1, 127.0.0.1]: index 1.
    for (answers, server_ip, index) in [
        (vec![two, one], two, 0),
        (vec![two, one], one, 1),
        (vec![v6, one], one, 1),
    ] {
        let t = telemetry();
        let server = HangingTls::start(server_ip).await;
        let client = t
            .conntrace()
            .instrument_client(reqwest::Client::builder())
            .dns_resolver(Pinned(answers))
            .connect_timeout(std::time::Duration::from_secs(1))
            .build_with_middleware()
            .expect("client");
        let url = format!("https://hang.test:{}/", server.addr.port());
        let err = client
            .get(&url)
            .send()
            .await
            .expect_err("TLS never answers");
        assert!(
            matches!(&err, reqwest_middleware::Error::Reqwest(e) if e.is_timeout() || e.is_connect()),
            "{err:?}"
        );
        // The setup's spans may end on the kernel's thread, after the
        // request returned.
        assert!(reqwest_conntrace::wait_for_pending_spans(
            std::time::Duration::from_secs(5)
        ));
        let accepted = server.accepted.lock().expect("accepted").clone();
        assert_eq!(accepted.len(), 1, "one TCP connection reached the server");
        let (server_side, _client) = accepted[0];

        let setups = t.setups();
        assert_eq!(setups.len(), 1);
        let setup = &setups[0];
        assert_eq!(
            str_attr(setup, semconv::ERROR_TYPE).as_deref(),
            Some(semconv::ERROR_TYPE_TIMEOUT)
        );
        let tls = t.child(setup, semconv::TLS_HANDSHAKE_SPAN).expect("tls");
        assert!(is_error(&tls), "the handshake is what hung");
        let tcp = t.child(setup, semconv::TCP_CONNECT_SPAN).expect("tcp");
        assert!(!is_error(&tcp), "TCP connected");
        for span in [&tcp, setup] {
            assert_eq!(
                str_attr(span, semconv::NETWORK_PEER_ADDRESS),
                Some(server_side.ip().to_string()),
                "{}: {span:?}",
                span.name
            );
            assert_eq!(
                i64_attr(span, semconv::NETWORK_PEER_PORT),
                Some(i64::from(server_side.port()))
            );
        }
        assert_eq!(
            i64_attr(&tcp, semconv::HTTP_CONNECTION_ADDRESS_INDEX),
            Some(index)
        );
        assert_eq!(
            bool_attr(setup, semconv::HTTP_CONNECTION_ADDRESS_FALLBACK),
            (index > 0).then_some(true)
        );
        assert!(!has(&tcp, semconv::HTTP_CONNECTION_PEER_CANDIDATES));
    }
}

/// Answers `first` to the first lookup and `later` to every other one.
#[derive(Debug, Clone)]
struct FirstThen {
    first: Vec<std::net::IpAddr>,
    later: Vec<std::net::IpAddr>,
    asked: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl reqwest::dns::Resolve for FirstThen {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let n = self.asked.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let ips = if n == 0 { &self.first } else { &self.later };
        Pinned(ips.clone()).resolve(name)
    }
}

/// The process holds a second connected socket to one of the resolved
/// addresses while a handshake hangs on the other: a busy pooled connection
/// (its request still being answered). The kernel shows both sockets; the
/// registry knows the pooled one, so the hung connect is named by the
/// other, the address the hanging server accepted on, not left ambiguous.
#[tokio::test]
async fn a_pooled_connection_to_the_other_address_does_not_blur_a_hung_handshake() {
    use std::net::{IpAddr, Ipv4Addr, SocketAddr};
    let one = IpAddr::V4(Ipv4Addr::LOCALHOST);
    let two = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));
    let t = telemetry();
    let pki = TestPki::generate(&["both.test"]).expect("pki");
    let good = TestServer::builder()
        .bind(SocketAddr::new(one, 0))
        .tls(&pki)
        .http_versions(HttpVersions::Http1Only)
        .start()
        .await
        .expect("server");
    let port = good.addr().port();
    let hanging = HangingTls::start_on(SocketAddr::new(two, port)).await;
    let client = t
        .conntrace()
        .instrument_client(reqwest::Client::builder())
        .tls(trust(&pki))
        .dns_resolver(FirstThen {
            first: vec![one],
            later: vec![two, one],
            asked: Default::default(),
        })
        .connect_timeout(std::time::Duration::from_secs(1))
        .build_with_middleware()
        .expect("client");
    // The first request holds its connection to 127.0.0.1 for 3 s.
    let slow = tokio::spawn({
        let client = client.clone();
        let url = format!("https://both.test:{port}/delay/3000");
        async move { client.get(&url).send().await.map(|r| r.status()) }
    });
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while good.request_count() == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "first request never arrived"
        );
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    // So the second needs a new connection: [127.0.0.2 (hangs), 127.0.0.1].
    let err = client
        .get(format!("https://both.test:{port}/"))
        .send()
        .await
        .expect_err("TLS never answers on 127.0.0.2");
    assert!(
        matches!(&err, reqwest_middleware::Error::Reqwest(e) if e.is_timeout() || e.is_connect()),
        "{err:?}"
    );
    assert_eq!(
        slow.await.expect("join").expect("slow request").as_u16(),
        200
    );
    assert!(reqwest_conntrace::wait_for_pending_spans(
        std::time::Duration::from_secs(5)
    ));
    let accepted = hanging.accepted.lock().expect("accepted").clone();
    assert_eq!(accepted.len(), 1);
    assert_eq!(good.accepted_connections(), 1);

    let setups = t.setups();
    assert_eq!(setups.len(), 2);
    let failed = setups
        .iter()
        .find(|s| has(s, semconv::ERROR_TYPE))
        .expect("the hung connect's setup");
    let tcp = t.child(failed, semconv::TCP_CONNECT_SPAN).expect("tcp");
    assert_eq!(
        str_attr(&tcp, semconv::NETWORK_PEER_ADDRESS),
        Some(accepted[0].0.ip().to_string()),
        "{tcp:?}"
    );
    assert_eq!(
        i64_attr(&tcp, semconv::NETWORK_PEER_PORT),
        Some(i64::from(accepted[0].0.port()))
    );
    assert!(
        !has(&tcp, semconv::HTTP_CONNECTION_PEER_CANDIDATES),
        "{tcp:?}"
    );
}

/// Answers the `n`th lookup with `answers[n % answers.len()]`.
#[derive(Debug, Clone)]
struct Rotating {
    answers: Vec<Vec<std::net::IpAddr>>,
    asked: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl reqwest::dns::Resolve for Rotating {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let n = self.asked.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Pinned(self.answers[n % self.answers.len()].clone()).resolve(name)
    }
}

/// Two connects to the same host hang in their handshakes at once, one on
/// each resolved address (each server accepted one): the kernel shows this
/// process connected to both addresses and neither socket is a known
/// connection, so neither `tcp.connect` names a peer; each lists both
/// addresses as `http.connection.peer_candidates` instead of guessing.
#[tokio::test]
async fn parallel_hung_handshakes_to_both_addresses_are_ambiguous_not_guessed() {
    use std::net::{IpAddr, Ipv4Addr, SocketAddr};
    let one = IpAddr::V4(Ipv4Addr::LOCALHOST);
    let two = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));
    let t = telemetry();
    let first = HangingTls::start(one).await;
    let port = first.addr.port();
    let second = HangingTls::start_on(SocketAddr::new(two, port)).await;
    let client = t
        .conntrace()
        .instrument_client(reqwest::Client::builder())
        .dns_resolver(Rotating {
            answers: vec![vec![one, two], vec![two, one]],
            asked: Default::default(),
        })
        .connect_timeout(std::time::Duration::from_secs(1))
        .build_with_middleware()
        .expect("client");
    let url = format!("https://both.test:{port}/");
    let (a, b) = tokio::join!(client.get(&url).send(), client.get(&url).send());
    assert!(a.is_err() && b.is_err(), "neither handshake is answered");
    assert!(reqwest_conntrace::wait_for_pending_spans(
        std::time::Duration::from_secs(5)
    ));
    assert_eq!(first.accepted.lock().expect("accepted").len(), 1);
    assert_eq!(second.accepted.lock().expect("accepted").len(), 1);

    let setups = t.setups();
    assert_eq!(setups.len(), 2);
    for setup in &setups {
        assert_eq!(
            str_attr(setup, semconv::ERROR_TYPE).as_deref(),
            Some(semconv::ERROR_TYPE_TIMEOUT)
        );
        assert!(!has(setup, semconv::NETWORK_PEER_ADDRESS), "{setup:?}");
        let tcp = t.child(setup, semconv::TCP_CONNECT_SPAN).expect("tcp");
        assert!(!has(&tcp, semconv::NETWORK_PEER_ADDRESS), "{tcp:?}");
        assert!(!has(&tcp, semconv::HTTP_CONNECTION_ADDRESS_INDEX));
        let candidates = match attr(&tcp, semconv::HTTP_CONNECTION_PEER_CANDIDATES) {
            Some(opentelemetry::Value::Array(opentelemetry::Array::String(v))) => {
                v.iter().map(|s| s.as_str().to_owned()).collect::<Vec<_>>()
            }
            other => panic!("peer candidates: {other:?}"),
        };
        assert_eq!(candidates, vec!["127.0.0.1", "127.0.0.2"]);
    }
}
