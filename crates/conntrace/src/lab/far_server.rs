//! Scenario `far-server` (incident 3): an HTTPS server 150 ms away (a
//! delaying proxy), TLS 1.2 and TLS 1.3, with a new connection per request
//! (resumption on and off) and with a pooled connection; and a server whose
//! accept queue is full, so the first SYN is dropped and the connect waits
//! out the 1 s SYN retransmission. All runs go at once (each has its own
//! server and proxy), so the scenario takes as long as the slowest.

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use anyhow::Context as _;
use conntrace_lab::{DelayProxy, FullBacklogListener, HttpVersions, TestServer, TlsVersions};
use futures::future::join_all;
use reqwest_conntrace::ConnTrace;
use reqwest_middleware::ClientWithMiddleware;
use tracing::Instrument as _;

use super::net::{self, Body};
use super::report::{Outcome, TextTable};
use super::runner::Lab;
use super::text::{mean, requests_table};
use super::view::RunView;
use crate::table::fmt_pct;

/// The lab host name.
const HOST: &str = "far.lab.test";
/// The run whose server's accept queue is full.
const RUN_BACKLOG: &str = "accept queue full";
/// When the full listener starts accepting again (before the first SYN
/// retransmission, 1 s after the SYN).
const RELEASE_AFTER: Duration = Duration::from_millis(300);
/// Per-request timeout.
const TIMEOUT: Duration = Duration::from_secs(10);

/// One far-server run.
struct Far {
    /// The run's name.
    name: String,
    /// `1.2` or `1.3`.
    version: &'static str,
    /// Whether the server resumes sessions.
    resumption: bool,
    /// Whether the client keeps connections (else a new one per request).
    pooled: bool,
    server: TestServer,
    proxy: DelayProxy,
    client: ClientWithMiddleware,
    url: String,
}

/// Starts the server, proxy and client of one run.
async fn far(
    trace: &ConnTrace,
    rtt: Duration,
    version: &'static str,
    resumption: bool,
    pooled: bool,
) -> anyhow::Result<Far> {
    let pki = net::pki(HOST)?;
    let server = TestServer::builder()
        .tls(&pki)
        .tls_versions(if version == "1.2" {
            TlsVersions::Tls12Only
        } else {
            TlsVersions::Tls13Only
        })
        .session_resumption(resumption)
        .http_versions(HttpVersions::Http1Only)
        .start()
        .await
        .context("cannot start the lab server")?;
    let proxy = DelayProxy::start(server.addr(), rtt / 2)
        .await
        .context("cannot start the delay proxy")?;
    let mut builder = net::loopback_client(trace, &pki, HOST);
    if !pooled {
        builder = builder.pool_max_idle_per_host(0);
    }
    let client = net::build(builder)?;
    let how = match (pooled, resumption) {
        (true, _) => "pooled",
        (false, true) => "a connection per request",
        (false, false) => "a connection per request, resumption off",
    };
    Ok(Far {
        name: format!("TLS {version}, {how}"),
        version,
        resumption,
        pooled,
        url: format!("https://{HOST}:{}/", proxy.addr().port()),
        server,
        proxy,
        client,
    })
}

/// Mean setup time of the connections whose handshake resumed (or not).
fn setup_ms(run: &RunView, resumed: bool) -> Option<f64> {
    let v: Vec<f64> = run
        .connections
        .iter()
        .filter(|c| c.tls.as_ref().and_then(|t| t.resumed) == Some(resumed))
        .map(|c| c.total_ms)
        .collect();
    (!v.is_empty()).then(|| mean(v))
}

/// Runs the scenario.
pub(super) async fn run(lab: &mut Lab) -> anyhow::Result<Outcome> {
    let rtt = lab.rtt();
    let rtt_ms = rtt.as_secs_f64() * 1e3;
    let n = lab.requests();
    let trace = ConnTrace::new();
    let mut runs = Vec::new();
    for version in ["1.2", "1.3"] {
        for (resumption, pooled) in [(true, false), (false, false), (true, true)] {
            runs.push(far(&trace, rtt, version, resumption, pooled).await?);
        }
    }
    let pki = net::pki(HOST)?;
    let upstream = TestServer::builder()
        .tls(&pki)
        .tls_versions(TlsVersions::Tls13Only)
        .http_versions(HttpVersions::Http1Only)
        .start()
        .await
        .context("cannot start the lab server")?;
    let mut backlog = FullBacklogListener::start(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)))
        .await
        .context("cannot fill a listener's accept queue")?;
    let backlog_client = net::build(net::loopback_client(&trace, &pki, HOST))?;
    let backlog_url = format!("https://{HOST}:{}/", backlog.addr().port());

    let far_runs = join_all(runs.iter().map(|f| {
        let span = lab.run_span(&f.name);
        net::fetch_in_turn(&f.client, &f.url, n, Some(TIMEOUT)).instrument(span)
    }));
    let backlog_span = lab.run_span(RUN_BACKLOG);
    backlog.release_to(upstream.addr(), RELEASE_AFTER);
    let backlog_run = net::fetch(&backlog_client, &backlog_url, Some(TIMEOUT), Body::Read)
        .instrument(backlog_span);
    futures::join!(far_runs, backlog_run);

    let spans = lab.spans().await;
    let mut problems = Vec::new();
    let mut views = Vec::new();
    let mut summary = TextTable {
        title: format!(
            "{n} sequential request(s) per run, {} ms RTT (delay proxy)",
            rtt.as_millis()
        ),
        header: vec![
            "run",
            "new conns",
            "TLS full",
            "TLS resumed",
            "per request ms",
            "setup ms",
            "setup RTTs",
            "handshake share",
        ],
        right: vec![1, 2, 3, 4, 5, 6, 7],
        rows: Vec::new(),
    };
    for f in &runs {
        let mut v = spans.run(&f.name);
        v.counters
            .insert("server_accepted".into(), f.server.accepted_connections());
        v.counters
            .insert("server_tls_handshakes".into(), f.server.tls_handshakes());
        v.counters.insert(
            "server_tls_resumed".into(),
            f.server.tls_resumed_handshakes(),
        );
        v.counters
            .insert("proxy_connections".into(), f.proxy.connections());
        let conns = v.connections.len();
        let full = v
            .connections
            .iter()
            .filter(|c| c.tls.as_ref().and_then(|t| t.resumed) == Some(false))
            .count();
        let resumed = v
            .connections
            .iter()
            .filter(|c| c.tls.as_ref().and_then(|t| t.resumed) == Some(true))
            .count();
        let setup = mean(v.connections.iter().map(|c| c.total_ms));
        let requests_ms: f64 = v.requests.iter().map(|r| r.total_ms).sum();
        let setups_ms: f64 = v.connections.iter().map(|c| c.total_ms).sum();
        summary.rows.push(vec![
            f.name.clone(),
            conns.to_string(),
            full.to_string(),
            resumed.to_string(),
            format!("{:.1}", mean(v.requests.iter().map(|r| r.total_ms))),
            format!("{setup:.1}"),
            format!("{:.1}", setup / rtt_ms),
            fmt_pct(if requests_ms > 0.0 {
                setups_ms / requests_ms
            } else {
                0.0
            }),
        ]);
        let expected_conns = if f.pooled { 1 } else { n };
        if v.requests.len() != n || v.requests.iter().any(|r| !r.ok()) {
            problems.push(format!("{}: not all {n} requests succeeded", f.name));
        }
        if conns != expected_conns {
            problems.push(format!(
                "{}: {conns} connections, expected {expected_conns}",
                f.name
            ));
        }
        if v.connections
            .iter()
            .any(|c| c.tls.as_ref().and_then(|t| t.version.as_deref()) != Some(f.version))
        {
            problems.push(format!("{}: a handshake was not TLS {}", f.name, f.version));
        }
        if !f.resumption && resumed > 0 {
            problems.push(format!("{}: {resumed} resumed without resumption", f.name));
        }
        // The signals themselves: a resumed handshake where resumption is
        // on, and idle hits on the pooled connection.
        if f.resumption && !f.pooled && resumed == 0 {
            problems.push(format!("{}: no handshake resumed", f.name));
        }
        let hits = v
            .requests
            .iter()
            .filter(|r| r.reused == Some(true) && r.miss_reason.is_none())
            .count();
        if f.pooled && (hits == 0 || hits != n - 1) {
            problems.push(format!(
                "{}: {hits} idle hit(s) of {n} request(s) on the pooled connection",
                f.name
            ));
        }
        views.push(v);
    }
    let mut findings = Vec::new();
    for version in ["1.2", "1.3"] {
        let find = |resumption: bool, pooled: bool| {
            runs.iter()
                .zip(&views)
                .find(|(f, _)| {
                    f.version == version && f.resumption == resumption && f.pooled == pooled
                })
                .map(|(_, v)| v)
        };
        let (Some(fresh), Some(off), Some(pooled)) =
            (find(true, false), find(false, false), find(true, true))
        else {
            continue;
        };
        let fresh_total: f64 = fresh.requests.iter().map(|r| r.total_ms).sum();
        let pooled_total: f64 = pooled.requests.iter().map(|r| r.total_ms).sum();
        let first = pooled.requests.first().map_or(0.0, |r| r.total_ms);
        let rest = mean(pooled.requests.iter().skip(1).map(|r| r.total_ms));
        findings.push(format!(
            "TLS {version}: a connection per request cost {:.1} ms per request ({:.1} ms of it setup, {:.1} RTT); pooled: {first:.1} ms for the first, then {rest:.1} ms each ({:.1} RTT): {:.1}x faster over {n} request(s)",
            mean(fresh.requests.iter().map(|r| r.total_ms)),
            mean(fresh.connections.iter().map(|c| c.total_ms)),
            mean(fresh.connections.iter().map(|c| c.total_ms)) / rtt_ms,
            rest / rtt_ms,
            if pooled_total > 0.0 { fresh_total / pooled_total } else { 0.0 },
        ));
        let full_ms = setup_ms(fresh, false).or_else(|| setup_ms(off, false));
        if let (Some(full_ms), Some(resumed_ms)) = (full_ms, setup_ms(fresh, true)) {
            findings.push(format!(
                "TLS {version} resumption: a resumed setup took {resumed_ms:.1} ms ({:.1} RTT), a full one {full_ms:.1} ms ({:.1} RTT): {:.1} RTT saved per new connection; with resumption off every handshake was full (the server counted {} resumed)",
                resumed_ms / rtt_ms,
                full_ms / rtt_ms,
                (full_ms - resumed_ms) / rtt_ms,
                off.counters.get("server_tls_resumed").unwrap_or(&0)
            ));
        }
    }
    let kernel_rtts: Vec<f64> = views
        .iter()
        .flat_map(|v| &v.connections)
        .filter_map(|c| c.tcp.as_ref().and_then(|t| t.kernel.rtt_ms))
        .collect();
    let kernel_rtt = if kernel_rtts.is_empty() {
        String::new()
    } else {
        format!(
            ", and the kernel's smoothed RTT on tcp.connect (http.connection.tcp.rtt) is loopback's, {:.3} ms on average: against a real far server both would show the {} ms",
            mean(kernel_rtts),
            rtt.as_millis()
        )
    };
    findings.push(format!(
        "the delay proxy charges the TCP handshake's round trip to the first TLS flight (userspace cannot delay a SYN), so tcp.connect is ~0 ms here and tls.handshake includes that RTT{kernel_rtt}"
    ));

    let mut queue = spans.run(RUN_BACKLOG);
    queue
        .counters
        .insert("listener_forwarded".into(), backlog.forwarded_connections());
    queue
        .counters
        .insert("server_accepted".into(), upstream.accepted_connections());
    match queue.connections.first().and_then(|c| c.tcp.as_ref()) {
        Some(t) => {
            let events = &t.syn_retransmit_events;
            let first = events.first().map_or("none".to_owned(), |e| {
                format!(
                    "#{} at +{:.1} ms, rto {} s",
                    e.number.unwrap_or(0),
                    e.at_ms,
                    e.rto_s.unwrap_or(0.0)
                )
            });
            let kernel = match t.kernel.retransmits {
                Some(k) => format!("the kernel counted {k} retransmission(s) on the socket"),
                None => "the kernel's retransmit count is not on the span (no sock_diag view)"
                    .to_owned(),
            };
            findings.push(format!(
                "accept queue full: the listener dropped the first SYN and accepted again after {} ms; tcp.connect took {:.1} ms: {} tcp.syn_retransmit event(s) ({first}); {kernel}; the listener then forwarded {} connection(s) to the server",
                RELEASE_AFTER.as_millis(),
                t.ms,
                events.len(),
                backlog.forwarded_connections()
            ));
            if events.is_empty() || !(900.0..=1500.0).contains(&t.ms) {
                problems.push(format!(
                    "{RUN_BACKLOG}: tcp.connect {:.1} ms with {} tcp.syn_retransmit event(s)",
                    t.ms,
                    events.len()
                ));
            }
            if t.kernel.retransmits.is_none_or(|k| k < 1) {
                problems.push(format!(
                    "{RUN_BACKLOG}: kernel retransmits {:?}, expected at least 1",
                    t.kernel.retransmits
                ));
            }
        }
        None => problems.push(format!("{RUN_BACKLOG}: no tcp.connect span")),
    }
    let mut tables = vec![summary];
    tables.push(requests_table(format!("run: {RUN_BACKLOG}"), &queue));
    views.push(queue);
    Ok(Outcome {
        config: serde_json::json!({
            "rtt_ms": rtt.as_millis() as u64,
            "requests_per_run": n,
            "backlog_release_after_ms": RELEASE_AFTER.as_millis() as u64,
        }),
        runs: views,
        tables,
        findings,
        fix: Some(
            "keep connections: one pooled connection per host pays the handshake once instead of per request; keep TLS session resumption on (TLS 1.2 saves a round trip per new connection); on the server, size the accept backlog (listen backlog, net.core.somaxconn) for reconnect bursts, a dropped SYN costs 1 s".to_owned(),
        ),
        reproduced: if problems.is_empty() {
            Ok(())
        } else {
            Err(problems.join("; "))
        },
    })
}
