//! The handle's OTLP metrics against a loopback server: names, units,
//! bounded attribute sets, and counts checked against the server's own
//! connection counters.

use std::time::Duration;

use conntrace_lab::TestServer;
use reqwest_conntrace::semconv;

use crate::contract::OTEL_METRICS;
use crate::support::*;

fn total(points: &[Point]) -> f64 {
    points.iter().map(|p| p.value).sum()
}

fn total_where(points: &[Point], key: &str, value: &str) -> f64 {
    points
        .iter()
        .filter(|p| p.get(key) == Some(value))
        .map(|p| p.value)
        .sum()
}

/// Two sequential requests (cold miss, hit), a burst of four concurrent ones
/// against an idle limit of one (all_busy misses, connections closed over
/// the limit), one refused request and one by host name (DNS, cold). Every metric is checked against the
/// server's counters and its attribute keys against the contract.
#[tokio::test]
async fn metrics_count_hits_misses_and_connections_with_bounded_attributes() {
    let t = telemetry();
    let server = TestServer::builder()
        .delay(Duration::from_millis(50))
        .start()
        .await
        .expect("server");
    let handle = t.conntrace();
    let client = handle
        .instrument_client(reqwest::Client::builder())
        .pool_max_idle_per_host(1)
        // Both limits known: closes at release are told from expiries.
        .pool_idle_timeout(Some(Duration::from_secs(90)))
        .build_with_middleware()
        .expect("client");
    let url = server.url("/");
    get_sequentially(&client, &url, 2).await;
    let burst = (0..4).map(|_| async {
        let r = client.get(&url).send().await.expect("request");
        r.bytes().await.expect("body")
    });
    futures::future::join_all(burst).await;
    let refused = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr")
    };
    let _ = client
        .get(format!("http://{refused}/"))
        .send()
        .await
        .expect_err("refused");
    // One request by name, for a DNS lookup (a new host: a cold miss).
    let by_name = format!("http://localhost:{}/", server.addr().port());
    get_sequentially(&client, &by_name, 1).await;

    let accepted = server.accepted_connections() as f64;
    assert!(
        accepted >= 3.0,
        "the burst opened connections beyond the first"
    );
    // Connections released over the idle limit close asynchronously, and
    // their lifetimes are recorded when the close is seen: wait for both
    // (all but the one idle connection kept per host: 127.0.0.1 and
    // localhost) before reading.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while (server.closed_connections() as f64) < accepted - 2.0
        || total(&t.metric(semconv::HTTP_CLIENT_CONNECTION_DURATION)) < accepted - 2.0
    {
        assert!(
            std::time::Instant::now() < deadline,
            "over-limit closes not seen within 10 s: server closed {}, durations {}",
            server.closed_connections(),
            total(&t.metric(semconv::HTTP_CLIENT_CONNECTION_DURATION))
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // Names, units, kinds and the attribute contract (contract.rs): every
    // exported metric is in the library's table, and every entry is exported.
    for name in t.metric_names() {
        assert!(
            OTEL_METRICS.iter().any(|m| m.name == name),
            "{name} is exported but not in semconv::METRICS"
        );
    }
    for m in OTEL_METRICS {
        let points = t.metric(m.name);
        // Metrics of a degradation (a full table) are checked where one is
        // provoked (scale.rs).
        if reqwest_conntrace::semconv::DEGRADATION_METRICS.contains(&m.name) {
            continue;
        }
        assert!(!points.is_empty(), "{} exported", m.name);
        for p in &points {
            assert_eq!(p.unit, m.unit, "{} unit", m.name);
            assert_eq!(p.kind, m.instrument, "{} instrument kind", m.name);
            for (k, _) in &p.attributes {
                assert!(m.attributes.contains(&k.as_str()), "{} carries {k}", m.name);
            }
        }
    }

    // Requests: 8 in all; misses = connections the server accepted.
    let durations = t.metric(semconv::HTTP_CLIENT_REQUEST_DURATION);
    assert_eq!(total(&durations), 8.0);
    assert_eq!(
        total_where(&durations, semconv::HTTP_CONNECTION_REUSED, "false"),
        accepted
    );
    assert_eq!(
        total_where(
            &durations,
            semconv::ERROR_TYPE,
            semconv::ERROR_TYPE_CONNECTION_REFUSED
        ),
        1.0
    );
    assert_eq!(total(&t.metric(semconv::HTTP_CLIENT_ACTIVE_REQUESTS)), 0.0);

    // Connections: opened = accepted; the refused connect is a failed setup.
    let opened = t.metric(semconv::HTTP_CLIENT_CONNECTIONS_OPENED);
    assert_eq!(total(&opened), accepted);
    let setup = t.metric(semconv::HTTP_CLIENT_CONNECTION_SETUP_DURATION);
    assert_eq!(total(&setup), accepted + 1.0);
    assert_eq!(
        total_where(
            &setup,
            semconv::ERROR_TYPE,
            semconv::ERROR_TYPE_CONNECTION_REFUSED
        ),
        1.0
    );

    // Pool misses by reason: one cold per host, the rest all_busy; the
    // refused request missed too (a cold host), counted with its error.
    let misses = t.metric(semconv::HTTP_CLIENT_POOL_MISSES);
    let answered: Vec<Point> = misses
        .iter()
        .filter(|p| p.get(semconv::ERROR_TYPE).is_none())
        .cloned()
        .collect();
    assert_eq!(
        total_where(&answered, semconv::HTTP_CONNECTION_MISS_REASON, "cold"),
        2.0
    );
    let failed: Vec<Point> = misses
        .iter()
        .filter(|p| p.get(semconv::ERROR_TYPE) == Some(semconv::ERROR_TYPE_CONNECTION_REFUSED))
        .cloned()
        .collect();
    assert_eq!(
        total(&failed),
        1.0,
        "the refused request's miss: {misses:?}"
    );
    assert_eq!(
        failed[0].get(semconv::HTTP_CONNECTION_MISS_REASON),
        Some("cold")
    );
    assert_eq!(
        total(&misses),
        total(&answered) + 1.0,
        "every miss is answered or the refused one"
    );
    assert!(
        total_where(&misses, semconv::HTTP_CONNECTION_MISS_REASON, "all_busy") >= accepted - 2.0
    );
    let dns = t.metric(semconv::DNS_LOOKUP_DURATION);
    assert_eq!(
        total_where(&dns, semconv::DNS_QUESTION_NAME, "localhost"),
        1.0
    );

    // The idle limit kept one connection; the others were closed at release
    // (the server saw those closes) and their lifetimes counted.
    server_saw_closes(&server, accepted as u64 - 2).await;
    let open = t.metric(semconv::HTTP_CLIENT_OPEN_CONNECTIONS);
    let server_port = server.addr().port().to_string();
    let to_server: Vec<Point> = open
        .into_iter()
        .filter(|p| {
            p.get(semconv::SERVER_PORT) == Some(server_port.as_str())
                && p.get(semconv::SERVER_ADDRESS) == Some("127.0.0.1")
        })
        .collect();
    assert_eq!(
        total_where(&to_server, semconv::HTTP_CONNECTION_STATE, "idle"),
        1.0
    );
    assert_eq!(
        total_where(&to_server, semconv::HTTP_CONNECTION_STATE, "active"),
        0.0
    );
    let closed_by_client = server.closed_connections() as f64;
    assert_eq!(
        closed_by_client,
        accepted - 2.0,
        "server saw the over-limit closes (one idle connection per host kept)"
    );
    assert_eq!(
        total(&t.metric(semconv::HTTP_CLIENT_CONNECTION_DURATION)),
        closed_by_client
    );

    // Little's law gauges and the advice event on the forced misses.
    let peak = t.metric(semconv::HTTP_CLIENT_POOL_PEAK_IN_FLIGHT);
    let peak_to_server = peak
        .iter()
        .find(|p| {
            p.get(semconv::SERVER_ADDRESS) == Some("127.0.0.1")
                && p.get(semconv::SERVER_PORT) == Some(server_port.as_str())
        })
        .expect("peak gauge for the server");
    assert_eq!(peak_to_server.value, 4.0);
    let limit = t.metric(semconv::HTTP_CLIENT_POOL_IDLE_LIMIT);
    assert_eq!(limit[0].value, 1.0);
    let advised: Vec<_> = t
        .requests()
        .into_iter()
        .filter(|s| {
            s.events
                .iter()
                .any(|e| e.name == semconv::EVENT_POOL_ADVICE)
        })
        .collect();
    assert!(!advised.is_empty(), "forced misses carry the pool advice");
    let event = advised[0]
        .events
        .iter()
        .find(|e| e.name == semconv::EVENT_POOL_ADVICE)
        .expect("advice event");
    let suggested = event
        .attributes
        .iter()
        .find(|kv| kv.key.as_str() == semconv::HTTP_CONNECTION_POOL_SUGGESTED_IDLE)
        .map(|kv| kv.value.to_string());
    assert_eq!(suggested.as_deref(), Some("4"));
    let advice = handle.pool_advice();
    assert_eq!(advice.len(), 1, "one host's pool is too small: {advice:?}");
    assert_eq!(
        (
            advice[0].peak_in_flight,
            advice[0].idle_limit,
            advice[0].suggested_max_idle_per_host
        ),
        (4, 1, 4)
    );
    assert!(
        advice[0]
            .to_string()
            .contains("suggested pool_max_idle_per_host >= 4")
    );

    // Dropping the client closes its pool: once the server saw the last
    // connection close, the very next collection counts it closed (the
    // collection waits for the kernel's answer), and the host's
    // open-connection series reports 0 rather than vanishing.
    drop(client);
    server_saw_closes(&server, accepted as u64).await;
    let after = t.metric(semconv::HTTP_CLIENT_OPEN_CONNECTIONS);
    let idle_after: Vec<&Point> = after
        .iter()
        .filter(|p| {
            p.get(semconv::SERVER_PORT) == Some(server_port.as_str())
                && p.get(semconv::SERVER_ADDRESS) == Some("127.0.0.1")
                && p.get(semconv::HTTP_CONNECTION_STATE) == Some("idle")
        })
        .collect();
    assert_eq!(idle_after.len(), 1, "the series is still reported");
    assert_eq!(idle_after[0].value, 0.0, "no connection open any more");
}

/// Waits until `server` has seen `closes` connections end (polled, at
/// most 10 s; the assertions after it fail if they never do).
async fn server_saw_closes(server: &TestServer, closes: u64) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while server.closed_connections() < closes && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// No span records (a sampler that drops everything, no OpenTelemetry
/// layer): the connection-setup work nobody would see is skipped, and the
/// metrics still count every connection, its TLS version, the pool's hits
/// (attributed to the pooled connection) and the misses with their reasons,
/// checked against the servers' accepted connections.
#[tokio::test]
async fn metrics_stay_right_when_no_span_records() {
    let t = metrics_only();
    let pki = conntrace_lab::TestPki::localhost().expect("pki");
    let keep_alive = TestServer::builder()
        .tls(&pki)
        .start()
        .await
        .expect("keep-alive server");
    let closing = TestServer::builder()
        .tls(&pki)
        // Keep-alive off applies to HTTP/1.1 only.
        .http_versions(conntrace_lab::HttpVersions::Http1Only)
        .keep_alive(false)
        .start()
        .await
        .expect("closing server");
    let client = t.client(reqwest::Client::builder(), Some(&pki));
    // By name (a DNS lookup): one cold miss, then two hits.
    get_sequentially(&client, &keep_alive.url("/"), 3).await;
    // By IP, `connection: close` on every response: a cold miss, then two
    // request_limit misses.
    get_sequentially(&client, &closing.ip_url("/"), 3).await;

    assert_eq!(keep_alive.accepted_connections(), 1);
    assert_eq!(closing.accepted_connections(), 3);
    let accepted = 4.0;
    let opened = t.metric(semconv::HTTP_CLIENT_CONNECTIONS_OPENED);
    assert_eq!(total(&opened), accepted);
    let setup = t.metric(semconv::HTTP_CLIENT_CONNECTION_SETUP_DURATION);
    assert_eq!(total(&setup), accepted);
    assert_eq!(
        total_where(&setup, semconv::TLS_PROTOCOL_VERSION, "1.3"),
        accepted,
        "{setup:?}"
    );
    let dns = t.metric(semconv::DNS_LOOKUP_DURATION);
    assert_eq!(
        total_where(&dns, semconv::DNS_QUESTION_NAME, "localhost"),
        1.0
    );
    let durations = t.metric(semconv::HTTP_CLIENT_REQUEST_DURATION);
    assert_eq!(total(&durations), 6.0);
    assert_eq!(
        total_where(&durations, semconv::HTTP_CONNECTION_REUSED, "true"),
        2.0
    );
    assert_eq!(
        total_where(&durations, semconv::HTTP_CONNECTION_REUSED, "false"),
        accepted
    );
    let misses = t.metric(semconv::HTTP_CLIENT_POOL_MISSES);
    assert_eq!(
        total_where(&misses, semconv::HTTP_CONNECTION_MISS_REASON, "cold"),
        2.0
    );
    assert_eq!(
        total_where(
            &misses,
            semconv::HTTP_CONNECTION_MISS_REASON,
            "request_limit"
        ),
        2.0
    );
    assert!(t.spans().is_empty(), "the sampler records no span");
}

/// A client dropped with its handle while its connections are still pooled
/// (three, as the server accepted them): the handle's end ends them, so
/// the next collection has a `http.client.connection.duration` for each.
/// Regression: only closes seen before counted, so a short run's last
/// collection lacked the pooled ones (a probe's metrics file: 5 durations
/// for 58 connections opened).
#[tokio::test]
async fn a_dropped_handle_records_the_duration_of_every_connection_left_open() {
    let t = metrics_only();
    let server = TestServer::builder()
        .http_versions(conntrace_lab::HttpVersions::Http1Only)
        .start()
        .await
        .expect("server");
    let client = t.client(reqwest::Client::builder(), None);
    let url = server.url("/delay/50");
    futures::future::join_all((0..3).map(|_| async {
        client
            .get(&url)
            .send()
            .await
            .expect("request succeeds")
            .bytes()
            .await
            .expect("body")
    }))
    .await;
    assert_eq!(server.accepted_connections(), 3);
    assert_eq!(
        total(&t.metric(semconv::HTTP_CLIENT_CONNECTION_DURATION)),
        0.0,
        "all three still pooled"
    );
    drop(client);
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let durations = total(&t.metric(semconv::HTTP_CLIENT_CONNECTION_DURATION));
        if durations >= 3.0 || std::time::Instant::now() >= deadline {
            assert_eq!(
                durations, 3.0,
                "one duration per connection the server accepted"
            );
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
