//! TestServer and TestPki.

use std::time::{Duration, Instant};

use conntrace_lab::server::{HEADER_CONNECTION_ID, HEADER_REMOTE_PORT, HEADER_REQUEST_INDEX};
use conntrace_lab::{HttpVersions, TestPki, TestServer, TlsVersions};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::util::{get1, get2, h1, h2, tcp, tls};

/// TLS 1.3-only and 1.2-only servers negotiate the expected version with a
/// client offering both, count accepts and handshakes, and serve `ok`; a
/// client trusting another CA is rejected and counted as a failure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_versions_counters_and_bad_certificate() {
    let pki = TestPki::localhost().expect("pki");
    let client = pki.client_config(&[b"http/1.1"]).expect("client config");
    for (versions, expected) in [
        (TlsVersions::Tls13Only, rustls::ProtocolVersion::TLSv1_3),
        (TlsVersions::Tls12Only, rustls::ProtocolVersion::TLSv1_2),
        (TlsVersions::Both, rustls::ProtocolVersion::TLSv1_3),
    ] {
        let server = TestServer::builder()
            .tls(&pki)
            .tls_versions(versions)
            .start()
            .await
            .expect("server");
        assert!(server.url("/x").starts_with("https://localhost:"));
        let stream = tls(server.addr(), client.clone()).await.expect("handshake");
        assert_eq!(stream.get_ref().1.protocol_version(), Some(expected));
        let mut sender = h1(stream).await;
        let resp = get1(&mut sender, "/", "localhost").await.expect("GET");
        assert_eq!(resp.status, 200);
        assert_eq!(&resp.body[..], b"ok");
        assert_eq!(server.accepted_connections(), 1);
        assert_eq!(server.tls_handshakes(), 1);
        let conns = server.connections();
        let tls_info = conns[0].tls.clone().expect("tls info");
        assert_eq!(tls_info.version, Some(expected));
        assert_eq!(tls_info.alpn.as_deref(), Some("http/1.1"));
    }

    let server = TestServer::builder()
        .tls(&pki)
        .start()
        .await
        .expect("server");
    let other = TestPki::untrusted_other().expect("other pki");
    let err = tls(server.addr(), other.client_config(&[]).expect("config"))
        .await
        .expect_err("a foreign CA must be rejected");
    assert!(err.to_string().contains("UnknownIssuer"), "{err}");
    tokio::time::timeout(Duration::from_secs(2), async {
        while server.tls_handshake_failures() < 1 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("server counts the failed handshake");
    assert_eq!(server.tls_handshakes(), 0);
}

/// With resumption on, a second connection from the same client config
/// resumes (TLS 1.3 ticket, TLS 1.2 session id/ticket) on both sides; off,
/// it does a full handshake.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_resumption_on_and_off() {
    let pki = TestPki::localhost().expect("pki");
    for versions in [TlsVersions::Tls13Only, TlsVersions::Tls12Only] {
        for resumption in [true, false] {
            let server = TestServer::builder()
                .tls(&pki)
                .tls_versions(versions)
                .session_resumption(resumption)
                .start()
                .await
                .expect("server");
            let client = pki.client_config(&[b"http/1.1"]).expect("client config");
            let mut kinds = Vec::new();
            for _ in 0..2 {
                let stream = tls(server.addr(), client.clone()).await.expect("handshake");
                kinds.push(stream.get_ref().1.handshake_kind());
                let mut sender = h1(stream).await;
                // Reading a response also processes the TLS 1.3 tickets.
                get1(&mut sender, "/", "localhost").await.expect("GET");
            }
            let case = format!("{versions:?} resumption={resumption}");
            assert_eq!(kinds[0], Some(rustls::HandshakeKind::Full), "{case}");
            let expected = if resumption {
                rustls::HandshakeKind::Resumed
            } else {
                rustls::HandshakeKind::Full
            };
            assert_eq!(kinds[1], Some(expected), "{case}");
            assert_eq!(server.tls_handshakes(), 2, "{case}");
            assert_eq!(
                server.tls_resumed_handshakes(),
                u64::from(resumption),
                "{case}"
            );
            let requests = server.requests();
            assert_eq!(requests[0].tls_resumed, Some(false), "{case}");
            assert_eq!(requests[1].tls_resumed, Some(resumption), "{case}");
        }
    }
}

/// ALPN: Http2Only offers h2 and serves HTTP/2, Http1Only offers
/// http/1.1, Both prefers h2; plain Http2Only serves h2c prior knowledge.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alpn_and_h2c() {
    let pki = TestPki::localhost().expect("pki");
    let offer_both = pki.client_config(&[b"h2", b"http/1.1"]).expect("config");
    for (mode, alpn) in [
        (HttpVersions::Http2Only, "h2"),
        (HttpVersions::Http1Only, "http/1.1"),
        (HttpVersions::Both, "h2"),
    ] {
        let server = TestServer::builder()
            .tls(&pki)
            .http_versions(mode)
            .start()
            .await
            .expect("server");
        let stream = tls(server.addr(), offer_both.clone())
            .await
            .expect("handshake");
        let negotiated = stream.get_ref().1.alpn_protocol().map(|p| p.to_vec());
        assert_eq!(negotiated.as_deref(), Some(alpn.as_bytes()), "{mode:?}");
        if alpn == "h2" {
            let mut sender = h2(stream).await;
            let url = server.url("/a");
            let mut second = sender.clone();
            let (a, b) = tokio::join!(get2(&mut second, &url), get2(&mut sender, &url));
            assert_eq!(&a.body[..], b"ok");
            assert_eq!(&b.body[..], b"ok");
            let requests = server.requests();
            assert!(requests.iter().all(|r| r.version == http::Version::HTTP_2));
            let mut indexes: Vec<u64> = requests.iter().map(|r| r.request_index).collect();
            indexes.sort_unstable();
            assert_eq!(indexes, [1, 2]);
        } else {
            let mut sender = h1(stream).await;
            get1(&mut sender, "/a", "localhost").await.expect("GET");
            assert_eq!(server.requests()[0].version, http::Version::HTTP_11);
        }
        assert_eq!(server.accepted_connections(), 1);
    }

    let server = TestServer::builder()
        .http_versions(HttpVersions::Http2Only)
        .start()
        .await
        .expect("server");
    let mut sender = h2(tcp(server.addr()).await).await;
    let resp = get2(&mut sender, &server.url("/h2c")).await;
    assert_eq!(&resp.body[..], b"ok");
    assert_eq!(server.requests()[0].version, http::Version::HTTP_2);
}

/// Keep-alive: three requests share one connection, and the server's
/// record (remote port, per-connection index, connection id) matches the
/// client's socket and the response headers. Keep-alive off: the server
/// says `connection: close` and closes after each response.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_alive_records_and_keep_alive_off() {
    let server = TestServer::start_plain().await.expect("server");
    assert!(server.url("/p").starts_with("http://127.0.0.1:"));
    let stream = tcp(server.addr()).await;
    let local_port = stream.local_addr().expect("local addr").port();
    let mut sender = h1(stream).await;
    for i in 1..=3u64 {
        let resp = get1(&mut sender, &format!("/r{i}?q=1"), "x")
            .await
            .expect("GET");
        assert_eq!(resp.header_u64(HEADER_REQUEST_INDEX), i);
        assert_eq!(resp.header_u64(HEADER_REMOTE_PORT), u64::from(local_port));
        assert_eq!(resp.header_u64(HEADER_CONNECTION_ID), 1);
    }
    assert_eq!(server.accepted_connections(), 1);
    let records = server.requests();
    assert_eq!(records.len(), 3);
    for (i, r) in records.iter().enumerate() {
        assert_eq!(r.remote_port(), local_port);
        assert_eq!(r.request_index, i as u64 + 1);
        assert_eq!(r.connection_id, 1);
        assert_eq!(r.tls_resumed, None);
    }
    assert_eq!(records[1].path, "/r2?q=1");

    let server = TestServer::builder()
        .keep_alive(false)
        .start()
        .await
        .expect("server");
    let mut sender = h1(tcp(server.addr()).await).await;
    let resp = get1(&mut sender, "/", "x").await.expect("GET");
    assert_eq!(
        resp.headers
            .get(http::header::CONNECTION)
            .map(|v| v.as_bytes()),
        Some(&b"close"[..])
    );
    assert!(
        get1(&mut sender, "/", "x").await.is_err(),
        "connection must be closed"
    );
    let mut sender = h1(tcp(server.addr()).await).await;
    get1(&mut sender, "/", "x")
        .await
        .expect("GET on a new connection");
    assert_eq!(server.accepted_connections(), 2);

    // After shutdown the port refuses connections.
    let addr = server.addr();
    server.shutdown().await;
    assert!(tokio::net::TcpStream::connect(addr).await.is_err());
}

/// The idle timeout closes an idle keep-alive connection after ~N ms
/// (HTTP/1 raw socket sees EOF; HTTP/2 gets GOAWAY and EOF), not before, and
/// a request in flight longer than N is not cut.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_timeout_closes_idle_connections() {
    let idle = Duration::from_millis(200);
    let server = TestServer::builder()
        .idle_timeout(Some(idle))
        .start()
        .await
        .expect("server");
    let mut stream = tcp(server.addr()).await;
    let mut buf = vec![0u8; 4096];
    // A slow request (300 ms > idle timeout) is answered in full.
    stream
        .write_all(b"GET /delay/300 HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .expect("write");
    let n = stream.read(&mut buf).await.expect("read");
    assert!(
        String::from_utf8_lossy(&buf[..n]).ends_with("ok"),
        "slow request answered"
    );
    // A quick follow-up 100 ms later still uses the same connection.
    tokio::time::sleep(Duration::from_millis(100)).await;
    stream
        .write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .expect("write");
    let n = stream.read(&mut buf).await.expect("read");
    assert!(String::from_utf8_lossy(&buf[..n]).ends_with("ok"));
    let idle_from = Instant::now();
    let n = tokio::time::timeout(Duration::from_secs(2), stream.read(&mut buf))
        .await
        .expect("server closes within 2 s")
        .expect("read");
    let waited = idle_from.elapsed();
    eprintln!("test server idle timeout 200 ms: HTTP/1 closed after {waited:?}");
    assert_eq!(
        n,
        0,
        "EOF expected, got {:?}",
        String::from_utf8_lossy(&buf[..n])
    );
    assert!(
        waited >= Duration::from_millis(180) && waited < Duration::from_millis(500),
        "closed after {waited:?}"
    );
    assert_eq!(server.accepted_connections(), 1);
    assert_eq!(server.closed_connections(), 1);

    let server = TestServer::builder()
        .http_versions(HttpVersions::Http2Only)
        .idle_timeout(Some(idle))
        .start()
        .await
        .expect("server");
    let mut sender = h2(tcp(server.addr()).await).await;
    get2(&mut sender, &server.url("/")).await;
    let idle_from = Instant::now();
    tokio::time::timeout(Duration::from_secs(2), async {
        while server.closed_connections() < 1 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("h2 connection closed");
    let waited = idle_from.elapsed();
    eprintln!("test server idle timeout 200 ms: HTTP/2 closed after {waited:?}");
    assert!(
        waited >= Duration::from_millis(150) && waited < Duration::from_millis(600),
        "{waited:?}"
    );
}

/// `/bytes/<n>`, `/delay/<ms>`, the fixed delay and the body size are
/// honoured; request bodies are counted; an IPv6 bind works when `::1` exists.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routes_delay_body_size_and_ipv6() {
    let server = TestServer::builder()
        .body_size(1000)
        .delay(Duration::from_millis(50))
        .start()
        .await
        .expect("server");
    let mut sender = h1(tcp(server.addr()).await).await;
    let started = Instant::now();
    let resp = get1(&mut sender, "/", "x").await.expect("GET");
    let plain = started.elapsed();
    assert_eq!(resp.body.len(), 1000);
    assert!(plain >= Duration::from_millis(50), "{plain:?}");
    let started = Instant::now();
    let resp = get1(&mut sender, "/delay/100", "x").await.expect("GET");
    let delayed = started.elapsed();
    assert!(delayed >= Duration::from_millis(150), "{delayed:?}");
    assert!(delayed < Duration::from_millis(400), "{delayed:?}");
    assert_eq!(resp.body.len(), 1000);
    let resp = get1(&mut sender, "/bytes/123456", "x").await.expect("GET");
    assert_eq!(resp.body.len(), 123_456);
    let resp = get1(&mut sender, "/delay/abc", "x").await.expect("GET");
    assert_eq!(resp.status, 400);

    // Request body bytes are read and recorded.
    let mut stream = tcp(server.addr()).await;
    stream
        .write_all(b"POST /up HTTP/1.1\r\nhost: x\r\ncontent-length: 5\r\n\r\nhello")
        .await
        .expect("write");
    let mut buf = vec![0u8; 2048];
    let _ = stream.read(&mut buf).await.expect("read");
    let post = server
        .requests()
        .into_iter()
        .find(|r| r.path == "/up")
        .expect("POST seen");
    assert_eq!((post.method.as_str(), post.body_bytes), ("POST", 5));

    if std::net::TcpListener::bind("[::1]:0").is_ok() {
        let pki = TestPki::localhost().expect("pki");
        let server = TestServer::builder()
            .bind("[::1]:0".parse().expect("addr"))
            .tls(&pki)
            .start()
            .await
            .expect("server on ::1");
        assert!(server.ip_url("/").starts_with("https://[::1]:"));
        let stream = tls(server.addr(), pki.client_config(&[]).expect("config"))
            .await
            .expect("TLS over ::1");
        let mut sender = h1(stream).await;
        get1(&mut sender, "/", "localhost")
            .await
            .expect("GET over ::1");
        assert!(server.requests()[0].peer.is_ipv6());
    }
}

/// `/gate/<name>/<n>` answers nobody until `n` requests to that path are
/// in, then everybody; a bad count is 400.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gate_route_holds_a_wave_until_it_is_all_in() {
    let server = TestServer::start_plain().await.expect("server");
    let addr = server.addr();
    let first = tokio::spawn(async move {
        let mut sender = h1(tcp(addr).await).await;
        get1(&mut sender, "/gate/w/2", "x").await.expect("GET")
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!first.is_finished(), "held until the second request");
    let mut sender = h1(tcp(addr).await).await;
    let second = get1(&mut sender, "/gate/w/2", "x").await.expect("GET");
    let first = first.await.expect("join");
    assert_eq!((first.status.as_u16(), second.status.as_u16()), (200, 200));
    assert_eq!(&first.body[..], b"ok");
    let bad = get1(&mut sender, "/gate/w/0", "x").await.expect("GET");
    assert_eq!(bad.status, 400);
}

/// PEM files are written where `write_to_dir` says, and hold the chain and key.
#[test]
fn pki_files_are_written() {
    let pki = TestPki::generate(&["example.test", "10.1.2.3"]).expect("pki");
    assert_eq!(pki.names(), ["example.test", "10.1.2.3"]);
    let dir = tempfile::tempdir().expect("tempdir");
    let files = pki.write_to_dir(dir.path()).expect("write");
    let cert = std::fs::read_to_string(&files.cert).expect("cert.pem");
    assert_eq!(cert.matches("BEGIN CERTIFICATE").count(), 2, "leaf + CA");
    assert!(cert.starts_with(pki.leaf_cert_pem()));
    let key = std::fs::read_to_string(&files.key).expect("key.pem");
    assert!(key.contains("BEGIN PRIVATE KEY"));
    assert_eq!(
        std::fs::read_to_string(&files.ca).expect("ca.pem"),
        pki.ca_cert_pem()
    );
    assert_eq!(pki.leaf_chain_der()[1], pki.ca_cert_der());
    assert!(TestPki::generate(&[]).is_err());
}

/// Reads one raw HTTP/1.1 response head and its 2-byte body from `sock`.
async fn read_ok_response(sock: &mut (impl tokio::io::AsyncRead + Unpin)) -> String {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 1024];
    while !buf.ends_with(b"\r\n\r\nok") {
        let n = sock.read(&mut chunk).await.expect("read response");
        assert!(
            n > 0,
            "closed mid-response: {:?}",
            String::from_utf8_lossy(&buf)
        );
        buf.extend_from_slice(&chunk[..n]);
    }
    String::from_utf8_lossy(&buf).to_ascii_lowercase()
}

/// The idle close is a FIN by default (the client reads EOF) and an RST
/// with `idle_close_with_reset` (the client's read fails with
/// `ConnectionReset`); the connection record says which.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_close_with_fin_or_reset() {
    for reset in [false, true] {
        let server = TestServer::builder()
            .http_versions(HttpVersions::Http1Only)
            .idle_timeout(Some(Duration::from_millis(100)))
            .idle_close_with_reset(reset)
            .start()
            .await
            .expect("server");
        let mut sock = tcp(server.addr()).await;
        sock.write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .expect("request");
        read_ok_response(&mut sock).await;
        let mut byte = [0u8; 1];
        let read = sock.read(&mut byte).await;
        if reset {
            let err = read.expect_err("reset");
            assert_eq!(err.kind(), std::io::ErrorKind::ConnectionReset);
        } else {
            assert_eq!(read.expect("FIN"), 0);
        }
        let expected = if reset {
            conntrace_lab::ConnectionEnd::IdleReset
        } else {
            conntrace_lab::ConnectionEnd::IdleTimeout
        };
        let deadline = Instant::now() + Duration::from_secs(2);
        while server.connections()[0].end.is_none() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let record = &server.connections()[0];
        assert_eq!(record.end, Some(expected));
        assert_eq!(record.requests, 1);
    }
}

/// Over TLS the idle close sends close_notify first by default (the
/// client reads a clean end), and none with
/// `idle_close_without_close_notify` (rustls reports the bare FIN as
/// `UnexpectedEof`); the record says `IdleTimeout` either way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_idle_close_with_or_without_close_notify() {
    let pki = TestPki::localhost().expect("pki");
    for abrupt in [false, true] {
        let server = TestServer::builder()
            .tls(&pki)
            .http_versions(HttpVersions::Http1Only)
            .idle_timeout(Some(Duration::from_millis(100)))
            .idle_close_without_close_notify(abrupt)
            .start()
            .await
            .expect("server");
        let mut stream = tls(
            server.addr(),
            pki.client_config(&[b"http/1.1"]).expect("config"),
        )
        .await
        .expect("handshake");
        stream
            .write_all(b"GET / HTTP/1.1\r\nhost: localhost\r\n\r\n")
            .await
            .expect("request");
        read_ok_response(&mut stream).await;
        let mut byte = [0u8; 1];
        let read = stream.read(&mut byte).await;
        if abrupt {
            let err = read.expect_err("no close_notify");
            assert_eq!(err.kind(), std::io::ErrorKind::UnexpectedEof, "{err}");
        } else {
            assert_eq!(read.expect("close_notify, then FIN"), 0);
        }
        let deadline = Instant::now() + Duration::from_secs(2);
        while server.connections()[0].end.is_none() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(
            server.connections()[0].end,
            Some(conntrace_lab::ConnectionEnd::IdleTimeout)
        );
    }
}

/// `max_requests_per_connection(2)`: the second response on a connection
/// says `Connection: close` and the server closes it; `keep_alive_header`
/// advertises `Keep-Alive: timeout=N`; `stall_after(1)` never answers the
/// second request but records it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_limit_keep_alive_header_and_stall() {
    let server = TestServer::builder()
        .http_versions(HttpVersions::Http1Only)
        .max_requests_per_connection(Some(2))
        .keep_alive_header(Some(7))
        .start()
        .await
        .expect("server");
    let mut sock = tcp(server.addr()).await;
    for i in 1..=2 {
        sock.write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .expect("request");
        let head = read_ok_response(&mut sock).await;
        assert!(head.contains("keep-alive: timeout=7"), "{head}");
        assert_eq!(head.contains("connection: close"), i == 2, "{head}");
    }
    let mut byte = [0u8; 1];
    assert_eq!(
        sock.read(&mut byte).await.expect("FIN"),
        0,
        "closed at the limit"
    );
    let deadline = Instant::now() + Duration::from_secs(2);
    while server.connections()[0].end.is_none() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(
        server.connections()[0].end,
        Some(conntrace_lab::ConnectionEnd::RequestLimit)
    );

    let stalled = TestServer::builder()
        .http_versions(HttpVersions::Http1Only)
        .stall_after(Some(1))
        .start()
        .await
        .expect("server");
    let mut sock = tcp(stalled.addr()).await;
    sock.write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .expect("request");
    read_ok_response(&mut sock).await;
    sock.write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .expect("request 2");
    let silent = tokio::time::timeout(Duration::from_millis(300), sock.read(&mut byte)).await;
    assert!(
        silent.is_err(),
        "no answer to the stalled request: {silent:?}"
    );
    assert_eq!(
        stalled.request_count(),
        2,
        "the stalled request was recorded"
    );
}
