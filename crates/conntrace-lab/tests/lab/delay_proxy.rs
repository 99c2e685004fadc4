//! DelayProxy.

use std::time::{Duration, Instant};

use conntrace_lab::{DelayProxy, TestServer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use crate::util::{get1, h1, tcp};

/// 125 ms each way (RTT 250 ms: at 100 ms a starved thread still pushed a
/// request past the next round trip under load). Each check below is "N round trips, not
/// N + 1": at least N RTT, and less than N + 1 RTT (an extra round trip
/// cannot take less), the widest margin that still tells them apart, so a
/// loaded machine's scheduling delays fit inside it.
const ONE_WAY: Duration = Duration::from_millis(125);

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Through a 125 ms one-way proxy (RTT 250 ms): a new connection's first
/// request costs ~2 RTT (handshake charge + request), each further request
/// on the connection ~1 RTT, and a 1 MB response (many chunks) ~1 RTT too,
/// i.e. chunks are pipelined, not delayed one after the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adds_one_rtt_per_round_trip() {
    let server = TestServer::start_plain().await.expect("server");
    let proxy = DelayProxy::start(server.addr(), ONE_WAY)
        .await
        .expect("proxy");
    let rtt = proxy.rtt();
    assert_eq!(rtt, Duration::from_millis(250));
    let margin = rtt;

    let started = Instant::now();
    let mut sender = h1(tcp(proxy.addr()).await).await;
    let resp = get1(&mut sender, "/", "x").await.expect("first GET");
    let first = started.elapsed();
    assert_eq!(&resp.body[..], b"ok");

    let mut again = Vec::new();
    for _ in 0..3 {
        let started = Instant::now();
        get1(&mut sender, "/", "x").await.expect("GET");
        again.push(started.elapsed());
    }
    let started = Instant::now();
    let resp = get1(&mut sender, "/bytes/1000000", "x")
        .await
        .expect("GET 1 MB");
    let bulk = started.elapsed();
    assert_eq!(resp.body.len(), 1_000_000);
    eprintln!(
        "delay proxy rtt={}ms: first request {:.1} ms, reused {:?} ms, 1 MB {:.1} ms",
        rtt.as_millis(),
        ms(first),
        again
            .iter()
            .map(|d| (ms(*d) * 10.0).round() / 10.0)
            .collect::<Vec<_>>(),
        ms(bulk)
    );
    assert!(
        first >= rtt * 2 && first < rtt * 2 + margin,
        "first {first:?}"
    );
    for d in &again {
        assert!(*d >= rtt && *d < rtt + margin, "reused {d:?}");
    }
    // Pipelined: about one RTT. Delayed chunk by chunk it would take one
    // RTT per chunk (dozens for 1 MB); 5 RTT leaves room for the CPU time
    // of copying 1 MB on a loaded machine and still tells them apart.
    assert!(bulk >= rtt && bulk < rtt * 5, "1 MB took {bulk:?}");
    assert_eq!(proxy.connections(), 1);
    assert_eq!(server.accepted_connections(), 1);
    assert!(proxy.bytes_to_client() > 1_000_000);
}

/// Without the handshake charge the first request costs 1 RTT; EOF and
/// half-close travel through (client shuts down writing, upstream reads
/// EOF, answers, closes; the client reads the answer then EOF); connections
/// to a dead upstream are counted as failures.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_close_and_no_handshake_mode() {
    let upstream = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let upstream_addr = upstream.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((mut s, _)) = upstream.accept().await {
            tokio::spawn(async move {
                let mut got = Vec::new();
                s.read_to_end(&mut got).await.expect("read to EOF");
                s.write_all(format!("got {} bytes", got.len()).as_bytes())
                    .await
                    .expect("write");
                s.shutdown().await.expect("shutdown");
            });
        }
    });
    let proxy = DelayProxy::start_without_handshake_delay(upstream_addr, ONE_WAY)
        .await
        .expect("proxy");
    let started = Instant::now();
    let mut client = tcp(proxy.addr()).await;
    client.write_all(b"hello").await.expect("write");
    client.shutdown().await.expect("half-close");
    let mut answer = String::new();
    client
        .read_to_string(&mut answer)
        .await
        .expect("read to EOF");
    let took = started.elapsed();
    assert_eq!(answer, "got 5 bytes");
    // One round trip: request + EOF travel together, answer + EOF back.
    assert!(took >= proxy.rtt() && took < proxy.rtt() * 2, "{took:?}");

    let dead = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let dead_addr = dead.local_addr().expect("addr");
    drop(dead);
    let proxy = DelayProxy::start(dead_addr, ONE_WAY).await.expect("proxy");
    let mut client = tcp(proxy.addr()).await;
    let mut buf = [0u8; 16];
    let n = client.read(&mut buf).await.unwrap_or(0);
    assert_eq!(n, 0, "closed when the upstream is unreachable");
    assert_eq!(proxy.connections(), 1);
    assert_eq!(proxy.upstream_failures(), 1);
}
