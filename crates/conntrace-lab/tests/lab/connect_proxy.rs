//! ConnectProxy.

use conntrace_lab::{ConnectProxy, TestPki, TestServer};
use rustls_pki_types::ServerName;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_rustls::TlsConnector;

use crate::util::{get1, h1, tcp};

/// CONNECT opens a tunnel through which a TLS handshake and request to a
/// TestServer succeed; an absolute-form request is forwarded in origin
/// form; an unreachable target gets 502. Counters and targets match.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tunnels_connect_and_forwards_absolute_form() {
    let pki = TestPki::localhost().expect("pki");
    let tls_server = TestServer::builder()
        .tls(&pki)
        .start()
        .await
        .expect("server");
    let proxy = ConnectProxy::start().await.expect("proxy");
    assert!(proxy.url().starts_with("http://127.0.0.1:"));

    let target = format!("localhost:{}", tls_server.addr().port());
    let mut stream = tcp(proxy.addr()).await;
    stream
        .write_all(format!("CONNECT {target} HTTP/1.1\r\nhost: {target}\r\n\r\n").as_bytes())
        .await
        .expect("write CONNECT");
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut byte = [0u8; 1];
        stream
            .read_exact(&mut byte)
            .await
            .expect("read CONNECT reply");
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head).to_string();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let tls = TlsConnector::from(pki.client_config(&[b"http/1.1"]).expect("config"))
        .connect(ServerName::try_from("localhost").expect("name"), stream)
        .await
        .expect("TLS through the tunnel");
    let mut sender = h1(tls).await;
    let resp = get1(&mut sender, "/tunnelled", "localhost")
        .await
        .expect("GET");
    assert_eq!(&resp.body[..], b"ok");
    assert_eq!(proxy.tunnels(), 1);
    assert_eq!(tls_server.tls_handshakes(), 1);

    let plain = TestServer::start_plain().await.expect("server");
    let mut sender = h1(tcp(proxy.addr()).await).await;
    let uri = plain.url("/fwd?x=1");
    let resp = get1(&mut sender, &uri, &plain.addr().to_string())
        .await
        .expect("GET");
    assert_eq!(&resp.body[..], b"ok");
    assert_eq!(plain.requests()[0].path, "/fwd?x=1");
    assert_eq!(proxy.forwarded_requests(), 1);

    let dead = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let dead_addr = dead.local_addr().expect("addr");
    drop(dead);
    let resp = get1(&mut sender, &format!("http://{dead_addr}/"), "x")
        .await
        .expect("GET");
    assert_eq!(resp.status, 502);
    assert_eq!(proxy.failures(), 1);
    assert_eq!(
        proxy.targets(),
        [target, plain.addr().to_string(), dead_addr.to_string()]
    );
}
