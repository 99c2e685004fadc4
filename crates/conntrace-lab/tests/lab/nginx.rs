//! The nginx fixture.

use std::time::{Duration, Instant};

use conntrace_lab::{Nginx, NginxConfig, NginxListener, TestPki, TestServer};
use tokio::io::AsyncReadExt;

use crate::util::{get1, get2, h1, h2, tcp, tls};

/// A real nginx serves TLS 1.3 (ticket resumption on the second
/// connection), TLS 1.2 (session resumption), h2 via ALPN and plain HTTP
/// keep-alive; the access log records protocol, resumption, remote port and
/// per-connection request index exactly as the client saw them; `/delay/`
/// is proxied to a TestServer; `keepalive_timeout` closes idle connections.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serves_tls13_tls12_h2_plain_and_logs_each_request() {
    let pki = TestPki::localhost().expect("pki");
    let upstream = TestServer::start_plain().await.expect("upstream");
    let nginx = Nginx::start(
        NginxConfig::new(&pki)
            .keepalive_timeout(Duration::from_millis(500))
            .upstream(upstream.addr()),
    )
    .await
    .unwrap_or_else(|e| panic!("nginx must start (a missing nginx is a failure): {e}"));
    eprintln!("nginx {:?} in {}", nginx.version(), nginx.dir().display());
    assert!(
        nginx
            .url(NginxListener::Tls13, "/")
            .expect("url")
            .starts_with("https://localhost:")
    );

    // TLS 1.3 and 1.2: two connections each from one client config.
    let mut expected_ports = Vec::new();
    for (listener, version) in [
        (NginxListener::Tls13, rustls::ProtocolVersion::TLSv1_3),
        (NginxListener::Tls12, rustls::ProtocolVersion::TLSv1_2),
    ] {
        let client = pki.client_config(&[b"http/1.1"]).expect("config");
        for attempt in 0..2 {
            let addr = nginx.addr(listener).expect("addr");
            let stream = tls(addr, client.clone()).await.expect("handshake");
            let conn = stream.get_ref().1;
            assert_eq!(conn.protocol_version(), Some(version), "{listener:?}");
            let kind = conn.handshake_kind();
            let expected_kind = if attempt == 0 {
                rustls::HandshakeKind::Full
            } else {
                rustls::HandshakeKind::Resumed
            };
            assert_eq!(kind, Some(expected_kind), "{listener:?} attempt {attempt}");
            let port = stream.get_ref().0.local_addr().expect("local").port();
            expected_ports.push((listener, port, attempt == 1));
            let mut sender = h1(stream).await;
            let resp = get1(&mut sender, "/hello", "localhost").await.expect("GET");
            assert_eq!((resp.status.as_u16(), &resp.body[..]), (200, &b"ok\n"[..]));
        }
    }

    // h2 via ALPN.
    let client = pki.client_config(&[b"h2", b"http/1.1"]).expect("config");
    let stream = tls(nginx.h2_addr(), client).await.expect("handshake");
    assert_eq!(stream.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    let mut sender = h2(stream).await;
    let url = nginx.url(NginxListener::H2, "/h2").expect("url");
    let resp = get2(&mut sender, &url).await;
    assert_eq!(&resp.body[..], b"ok\n");

    // Plain keep-alive: three requests on one connection, then /delay/ proxied.
    let plain = nginx.plain_addr().expect("plain listener");
    let stream = tcp(plain).await;
    let plain_port = stream.local_addr().expect("local").port();
    let mut sender = h1(stream).await;
    for _ in 0..3 {
        get1(&mut sender, "/p", "localhost").await.expect("GET");
    }
    let started = Instant::now();
    let resp = get1(&mut sender, "/delay/50", "localhost")
        .await
        .expect("GET /delay");
    assert_eq!(resp.status, 200);
    assert_eq!(&resp.body[..], b"ok");
    assert!(started.elapsed() >= Duration::from_millis(50));
    assert_eq!(upstream.requests()[0].path, "/delay/50");

    let log = nginx.wait_for_access_log(9, Duration::from_secs(2)).await;
    assert_eq!(log.len(), 9, "{log:#?}");
    for (listener, port, resumed) in &expected_ports {
        let entry = log
            .iter()
            .find(|e| e.remote_port == *port)
            .unwrap_or_else(|| panic!("no log line for port {port}: {log:#?}"));
        assert_eq!(entry.listener, Some(*listener));
        assert_eq!(entry.ssl_session_reused, *resumed, "{entry:?}");
        let protocol = if *listener == NginxListener::Tls13 {
            "TLSv1.3"
        } else {
            "TLSv1.2"
        };
        assert_eq!(entry.ssl_protocol.as_deref(), Some(protocol));
        assert_eq!(entry.connection_requests, 1);
        assert_eq!(entry.request_uri, "/hello");
        assert_eq!(entry.status, 200);
    }
    let h2_entry = log
        .iter()
        .find(|e| e.request_uri == "/h2")
        .expect("h2 line");
    assert_eq!(h2_entry.server_protocol, "HTTP/2.0");
    assert_eq!(h2_entry.listener, Some(NginxListener::H2));
    let plain_entries: Vec<_> = log.iter().filter(|e| e.remote_port == plain_port).collect();
    assert_eq!(plain_entries.len(), 4);
    let indexes: Vec<u64> = plain_entries
        .iter()
        .map(|e| e.connection_requests)
        .collect();
    assert_eq!(indexes, [1, 2, 3, 4]);
    assert!(
        plain_entries
            .iter()
            .all(|e| e.connection == plain_entries[0].connection)
    );
    assert!(plain_entries.iter().all(|e| e.ssl_protocol.is_none()));
    assert!(plain_entries[3].request_time_secs >= 0.05);

    // keepalive_timeout 500 ms: an idle connection is closed by nginx.
    let mut idle = tcp(plain).await;
    use tokio::io::AsyncWriteExt;
    idle.write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .expect("write");
    let mut buf = vec![0u8; 1024];
    let n = idle.read(&mut buf).await.expect("read");
    assert!(String::from_utf8_lossy(&buf[..n]).ends_with("ok\n"));
    let idle_from = Instant::now();
    let n = tokio::time::timeout(Duration::from_secs(3), idle.read(&mut buf))
        .await
        .expect("nginx closes the idle connection")
        .unwrap_or(0);
    let waited = idle_from.elapsed();
    eprintln!("nginx keepalive_timeout 500 ms: closed after {waited:?}");
    let problems: Vec<String> = nginx
        .error_log()
        .lines()
        .filter(|l| l.contains("[warn]") || l.contains("[emerg]") || l.contains("[alert]"))
        .map(str::to_owned)
        .collect();
    eprintln!("nginx error log warnings: {problems:#?}");
    assert_eq!(n, 0);
    assert!(
        waited >= Duration::from_millis(400) && waited < Duration::from_millis(1500),
        "{waited:?}"
    );
}

/// `find_binary` finds the nginx installed on this machine.
#[test]
fn nginx_binary_is_found() {
    let bin = Nginx::find_binary().expect("nginx must be installed");
    assert!(bin.is_file());
}
