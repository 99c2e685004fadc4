//! FullBacklogListener.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use conntrace_lab::FullBacklogListener;
use tokio::net::TcpStream;

async fn connect_time_with_release_after(addr: &str, release_after: Duration) -> Duration {
    let addr: SocketAddr = addr.parse().expect("addr");
    let mut listener = FullBacklogListener::start(addr)
        .await
        .expect("backlog listener");
    assert!(listener.filler_connections() >= 1);
    let target = listener.addr();
    let started = Instant::now();
    let connect = tokio::spawn(async move {
        TcpStream::connect(target)
            .await
            .expect("connect eventually succeeds");
        started.elapsed()
    });
    tokio::time::sleep(release_after).await;
    assert!(
        !connect.is_finished(),
        "the SYN must be dropped while the queue is full"
    );
    listener.release();
    let took = tokio::time::timeout(Duration::from_secs(5), connect)
        .await
        .expect("connect within 5 s")
        .expect("connect task");
    assert!(listener.accepted_after_release() >= 1);
    took
}

/// With the accept queue full the kernel drops the SYN; once the listener
/// accepts again (after 300 ms), the client connects at its first SYN
/// retransmission, ~1 s after it started (IPv4, and IPv6 when available).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_syn_costs_one_second() {
    let v6 = std::net::TcpListener::bind("[::1]:0").is_ok();
    let (t4, t6) = tokio::join!(
        connect_time_with_release_after("127.0.0.1:0", Duration::from_millis(300)),
        async {
            if v6 {
                Some(connect_time_with_release_after("[::1]:0", Duration::from_millis(300)).await)
            } else {
                None
            }
        }
    );
    eprintln!("connect through a full backlog: IPv4 {t4:?}, IPv6 {t6:?}");
    for t in std::iter::once(t4).chain(t6) {
        assert!(
            t >= Duration::from_millis(900) && t <= Duration::from_millis(1500),
            "connect took {t:?}"
        );
    }
}

/// `release_to` forwards the client that waited out the dropped SYN to the
/// upstream server (which answers it), while the listener's own fillers are
/// only held, never forwarded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn released_listener_forwards_clients_to_upstream() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let server = conntrace_lab::TestServer::start_plain()
        .await
        .expect("server");
    let mut listener = FullBacklogListener::start("127.0.0.1:0".parse().expect("addr"))
        .await
        .expect("backlog listener");
    listener.release_to(server.addr(), Duration::from_millis(200));
    let started = Instant::now();
    let mut stream =
        tokio::time::timeout(Duration::from_secs(5), TcpStream::connect(listener.addr()))
            .await
            .expect("connect within 5 s")
            .expect("connect");
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(900) && took <= Duration::from_millis(1500),
        "connect waited out one SYN retransmission: {took:?}"
    );
    stream
        .write_all(b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        .await
        .expect("write");
    let mut response = String::new();
    stream
        .read_to_string(&mut response)
        .await
        .expect("read to close");
    assert!(response.starts_with("HTTP/1.1 200"), "{response:?}");
    assert_eq!(listener.forwarded_connections(), 1);
    assert_eq!(
        server.accepted_connections(),
        1,
        "fillers are not forwarded"
    );
    assert!(
        listener.accepted_after_release() >= 2,
        "fillers and client accepted"
    );
}
