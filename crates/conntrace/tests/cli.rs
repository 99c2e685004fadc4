//! `conntrace` end to end: the real binary against a real nginx (TLS 1.3,
//! TLS 1.2, HTTP/2) with a certificate made at test time, exporting OTLP/gRPC
//! into an in-process receiver that decodes what arrived; plus the demo, its
//! traces through a third-party collector (rotel), bad-input handling and
//! every `conntrace lab` scenario (in `cli/lab.rs`, part of this one test
//! binary); the fixes from a new-user trial against `conntrace serve` (in
//! `cli/trial.rs`); the HTML pages in headless Chromium and the probe's
//! waterfall (in `cli/view.rs`); the export pipeline against failing
//! collectors (in `cli/collector_faults.rs`).

use std::collections::HashMap;
use std::path::Path;
use std::process::Output;
use std::time::Duration;

use conntrace_lab::nginx::{Nginx, NginxConfig, NginxListener};
use conntrace_lab::{OtlpReceiver, ReceivedSpan, TestPki};
use reqwest_conntrace::semconv;

#[path = "cli/lab.rs"]
mod lab_scenarios;

#[path = "cli/trial.rs"]
mod trial;

#[path = "cli/curl.rs"]
mod curl;

#[path = "cli/collector_faults.rs"]
mod collector_faults;
#[path = "cli/view.rs"]
mod view;

fn conntrace() -> tokio::process::Command {
    let mut c = tokio::process::Command::new(env!("CARGO_BIN_EXE_conntrace"));
    c.env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
        .env_remove("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        .env_remove("OTEL_EXPORTER_OTLP_PROTOCOL")
        .kill_on_drop(true);
    c
}

async fn run(mut cmd: tokio::process::Command) -> Output {
    tokio::time::timeout(Duration::from_secs(120), cmd.output())
        .await
        .expect("conntrace finished in time")
        .expect("conntrace runs")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// `conntrace probe URL --cacert CA --json --mode reuse`: the start of every
/// reuse-mode check against the test nginx (add `-n`, `-c` and outputs).
fn probe_reuse_json(url: &str, ca: &std::path::Path) -> tokio::process::Command {
    let mut cmd = conntrace();
    cmd.arg("probe")
        .arg(url)
        .arg("--cacert")
        .arg(ca)
        .args(["--json", "--mode", "reuse"]);
    cmd
}

/// nginx started with `config` (installed by scripts/test.sh).
async fn start_nginx(config: NginxConfig) -> Nginx {
    Nginx::start(config)
        .await
        .expect("nginx starts (installed by scripts/test.sh)")
}

/// nginx started with `config`, and the URL of `/` on its `listener`.
async fn nginx_serving(config: NginxConfig, listener: NginxListener) -> (Nginx, String) {
    let nginx = start_nginx(config).await;
    let url = nginx.url(listener, "/").expect("listener");
    (nginx, url)
}

struct Lab {
    nginx: Nginx,
    receiver: OtlpReceiver,
    ca: std::path::PathBuf,
}

async fn lab() -> Lab {
    let pki = TestPki::localhost().expect("pki");
    let nginx = start_nginx(NginxConfig::new(&pki)).await;
    let receiver = OtlpReceiver::start().await.expect("receiver");
    let ca = nginx.pki_files().ca.clone();
    Lab {
        nginx,
        receiver,
        ca,
    }
}

impl Lab {
    fn url(&self, listener: NginxListener) -> String {
        self.nginx.url(listener, "/").expect("listener")
    }

    async fn probe(
        &self,
        listener: NginxListener,
        args: &[&str],
    ) -> (serde_json::Value, Vec<ReceivedSpan>) {
        let mut cmd = conntrace();
        cmd.arg("probe")
            .arg(self.url(listener))
            .arg("--cacert")
            .arg(&self.ca)
            .arg("--json")
            .args(args)
            .env("OTEL_EXPORTER_OTLP_ENDPOINT", self.receiver.endpoint())
            .env("OTEL_SERVICE_NAME", "conntrace-test");
        let out = run(cmd).await;
        assert!(out.status.success(), "probe failed: {}", stderr(&out));
        let json: serde_json::Value =
            serde_json::from_slice(&out.stdout).expect("--json output is JSON");
        // The CLI flushes before exiting: everything has arrived.
        let spans = self.receiver.spans();
        (json, spans)
    }
}

fn requests(spans: &[ReceivedSpan]) -> Vec<&ReceivedSpan> {
    let mut v: Vec<&ReceivedSpan> = spans
        .iter()
        .filter(|s| s.attr_str(semconv::HTTP_REQUEST_METHOD).is_some())
        .collect();
    v.sort_by_key(|s| s.start_unix_nanos());
    v
}

fn named<'a>(spans: &'a [ReceivedSpan], name: &str) -> Vec<&'a ReceivedSpan> {
    let mut v: Vec<&ReceivedSpan> = spans.iter().filter(|s| s.name() == name).collect();
    v.sort_by_key(|s| s.start_unix_nanos());
    v
}

fn children<'a>(spans: &'a [ReceivedSpan], parent: &ReceivedSpan) -> Vec<&'a ReceivedSpan> {
    spans
        .iter()
        .filter(|s| s.parent_span_id_hex().as_deref() == Some(parent.span_id_hex().as_str()))
        .collect()
}

/// Fresh mode against nginx TLS 1.3: every request a miss with all three
/// phases under its own setup span; after the first connection, TLS resumes
/// with nginx's tickets (nginx's log agrees).
#[tokio::test]
async fn probe_fresh_mode_against_nginx_tls13() {
    let lab = lab().await;
    let (json, spans) = lab
        .probe(
            NginxListener::Tls13,
            &["--mode", "fresh", "--requests", "5"],
        )
        .await;
    let reqs = requests(&spans);
    assert_eq!(reqs.len(), 5, "one request span per request");
    let setups = named(&spans, semconv::CONNECTION_SETUP_SPAN);
    assert_eq!(setups.len(), 5);
    for (r, s) in reqs.iter().zip(&setups) {
        assert_eq!(r.attr_bool(semconv::HTTP_CONNECTION_REUSED), Some(false));
        assert_eq!(
            s.parent_span_id_hex().as_deref(),
            Some(r.span_id_hex().as_str())
        );
        let kids: Vec<&str> = children(&spans, s).iter().map(|c| c.name()).collect();
        for phase in [
            semconv::DNS_LOOKUP_SPAN,
            semconv::TCP_CONNECT_SPAN,
            semconv::TLS_HANDSHAKE_SPAN,
        ] {
            assert!(kids.contains(&phase), "{phase} missing: {kids:?}");
        }
        assert_eq!(s.attr_str(semconv::TLS_PROTOCOL_VERSION), Some("1.3"));
    }
    let resumed: Vec<Option<bool>> = setups
        .iter()
        .map(|s| s.attr_bool(semconv::TLS_RESUMED))
        .collect();
    assert_eq!(resumed[0], Some(false));
    let log = lab
        .nginx
        .wait_for_access_log(5, Duration::from_secs(5))
        .await;
    let nginx_resumed: Vec<bool> = log.iter().map(|e| e.ssl_session_reused).collect();
    let ours: Vec<bool> = resumed.iter().map(|r| r == &Some(true)).collect();
    assert_eq!(
        ours, nginx_resumed,
        "our tls.resumed matches nginx's $ssl_session_reused"
    );
    assert!(
        ours[1..].iter().all(|r| *r),
        "nginx offers tickets: later handshakes resume"
    );
    assert_eq!(json["modes"][0]["mode"], "fresh");
}

/// Reuse mode: one connection carries the requests, each request's count
/// matching nginx's `$connection_requests` for its connection (by
/// `$remote_port`). hyper-util's pool-return race can really open another
/// connection for a sequential request (nginx sees it): such a request's
/// miss (also when the returning connection still served it), and the
/// extra connection's setup span, are `release_race`, never another
/// reason. When the returning connection served that request, its own
/// connect went to the pool unused, and a later request may find it
/// there: an idle hit (`reused`, no miss reason) that is nginx's first
/// request on it (count 1; seen beside two CPU-burning processes).
#[tokio::test]
async fn probe_reuse_mode_against_nginx_tls13() {
    let lab = lab().await;
    let (_json, spans) = lab
        .probe(
            NginxListener::Tls13,
            &["--mode", "reuse", "--requests", "6"],
        )
        .await;
    let reqs = requests(&spans);
    assert_eq!(reqs.len(), 6);
    let log = lab
        .nginx
        .wait_for_access_log(6, Duration::from_secs(5))
        .await;
    for (i, (r, e)) in reqs.iter().zip(&log).enumerate() {
        let port = r.attr_i64(semconv::NETWORK_LOCAL_PORT).expect("local port");
        assert_eq!(
            port,
            i64::from(e.remote_port),
            "request {i}: nginx's connection"
        );
        let count = r
            .attr_i64(semconv::HTTP_CONNECTION_REQUEST_COUNT)
            .expect("request count");
        assert_eq!(count as u64, e.connection_requests, "request {i}");
        let reused = r.attr_bool(semconv::HTTP_CONNECTION_REUSED);
        let reason = r.attr_str(semconv::HTTP_CONNECTION_MISS_REASON);
        // A release race's unused connect found in the pool: an idle hit
        // on a connection nginx saw no request on before.
        let spare_hit = count == 1
            && reused == Some(true)
            && reason.is_none()
            && reqs[..i].iter().any(|before| {
                before.attr_str(semconv::HTTP_CONNECTION_MISS_REASON)
                    == Some(semconv::MISS_REASON_RELEASE_RACE)
            });
        assert_eq!(reused, Some(count > 1 || spare_hit), "request {i}");
        match (i, count) {
            (0, _) => assert_eq!(reason, Some(semconv::MISS_REASON_COLD)),
            (_, 1) if spare_hit => {}
            (_, 1) => assert_eq!(
                reason,
                Some(semconv::MISS_REASON_RELEASE_RACE),
                "request {i}"
            ),
            // An idle hit, or the race where the returning connection
            // reached the request's checkout first (its connect went on).
            _ => assert!(
                matches!(reason, None | Some(semconv::MISS_REASON_RELEASE_RACE)),
                "request {i}: {reason:?}"
            ),
        }
    }
    let setups = named(&spans, semconv::CONNECTION_SETUP_SPAN);
    assert!(!setups.is_empty());
    for (k, s) in setups.iter().enumerate() {
        let reason = s.attr_str(semconv::HTTP_CONNECTION_MISS_REASON);
        let expected = if k == 0 {
            semconv::MISS_REASON_COLD
        } else {
            semconv::MISS_REASON_RELEASE_RACE
        };
        assert_eq!(reason, Some(expected), "setup {k}");
    }
}

/// A 302 chain across 127.0.0.1 to 127.0.0.5, probed twice: the probe's
/// JSON, its metrics and the servers agree on the connections. JSON: one
/// row per hop (10), 5 misses (the first pass) and 5 idle hits (the
/// second), but for hops that hyper-util's pool-return race made miss
/// (`release_race`, each a connect the server accepted); metrics: as many
/// opened as the servers accepted, as many misses as the JSON.
#[tokio::test]
async fn probe_redirect_chain_counts_every_hop() {
    let mut servers = Vec::new();
    for k in 1..=5u8 {
        servers.push(
            conntrace_lab::TestServer::builder()
                .bind(std::net::SocketAddr::from(([127, 0, 0, k], 0)))
                .http_versions(conntrace_lab::HttpVersions::Http1Only)
                .start()
                .await
                .expect("lab server"),
        );
    }
    let mut path = String::new();
    for s in &servers[1..] {
        path.push_str(&format!("redirect/{}/", s.addr()));
    }
    let url = format!("http://{}/{path}", servers[0].addr());
    let receiver = OtlpReceiver::start().await.expect("receiver");
    let mut cmd = conntrace();
    cmd.args(["probe", &url, "--mode", "reuse", "-n", "2", "--json"])
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint())
        .env("OTEL_SERVICE_NAME", "conntrace-test");
    let out = run(cmd).await;
    assert!(out.status.success(), "probe failed: {}", stderr(&out));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let mode = &json["modes"][0];
    let rows = mode["requests"].as_array().expect("rows");
    assert_eq!(rows.len(), 10);
    let resends: Vec<i64> = rows
        .iter()
        .map(|r| r["resend_count"].as_i64().expect("resend_count"))
        .collect();
    assert_eq!(resends, [0, 1, 2, 3, 4, 0, 1, 2, 3, 4]);
    // Every hop's row names its protocol (the servers speak HTTP/1.1 only).
    assert!(rows.iter().all(|r| r["http_version"] == "1.1"), "{rows:#?}");
    // The second pass is idle hits, except where hyper-util's pool-return
    // race made a hop miss (`release_race`: on a loaded machine, the hop's
    // own connect then opened another connection the server accepted).
    let raced = rows[5..]
        .iter()
        .filter(|r| !r["miss_reason"].is_null())
        .inspect(|r| assert_eq!(r["miss_reason"], "release_race", "{rows:#?}"))
        .count();
    let new_in_second_pass = rows[5..].iter().filter(|r| r["reused"] == false).count();
    let totals = &mode["totals"];
    assert_eq!(totals["new_connections"], 5 + new_in_second_pass);
    assert_eq!(totals["pool_misses"], 5 + raced);
    assert_eq!(totals["pool_hits"], 5 - raced);
    let mut accepted = 0;
    for (k, s) in servers.iter().enumerate() {
        accepted += s.accepted_connections();
        assert!(s.accepted_connections() >= 1, "host {}", k + 1);
        assert_eq!(s.requests().len(), 2, "host {}", k + 1);
    }
    // Each miss started a connect that the server accepted (hyper-util
    // finishes a started connect even when a returning connection served
    // the hop).
    assert_eq!(accepted, 5 + raced as u64);
    // The JSON counts them too, used or not.
    assert_eq!(totals["connections_opened"], accepted, "{totals:#?}");
    let opened = receiver
        .wait_for_metric(
            semconv::HTTP_CLIENT_CONNECTIONS_OPENED,
            Duration::from_secs(10),
        )
        .await
        .expect("connections.opened");
    assert_eq!(opened.total(), accepted as f64);
    let misses = receiver
        .wait_for_metric(semconv::HTTP_CLIENT_POOL_MISSES, Duration::from_secs(10))
        .await
        .expect("pool.misses");
    assert_eq!(misses.total(), (5 + raced) as f64);
}

/// HTTP/2 by prior knowledge (`--http2` on plain http, no ALPN): the setup
/// span says `network.protocol.version = 2` and the probe row `http2`;
/// four concurrent requests to a 300 ms endpoint share the one connection
/// (the server accepted one) and none reports the server's response time
/// as `http.connection.wait_time`: they waited for the connection only.
#[tokio::test]
async fn probe_http2_prior_knowledge_is_known_as_http2() {
    let server = conntrace_lab::TestServer::builder()
        .start()
        .await
        .expect("lab server");
    let receiver = OtlpReceiver::start().await.expect("receiver");
    let url = server.url("/delay/300");
    let mut cmd = conntrace();
    cmd.args([
        "probe", &url, "--http2", "--mode", "reuse", "-n", "4", "-c", "4", "--json",
    ])
    .env("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint())
    .env("OTEL_SERVICE_NAME", "conntrace-test");
    let out = run(cmd).await;
    assert!(out.status.success(), "probe failed: {}", stderr(&out));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(server.accepted_connections(), 1);
    let spans = receiver.spans();
    let setups = named(&spans, semconv::CONNECTION_SETUP_SPAN);
    assert_eq!(setups.len(), 1);
    assert_eq!(
        setups[0].attr_str(semconv::NETWORK_PROTOCOL_VERSION),
        Some("2")
    );
    for row in json["modes"][0]["requests"].as_array().expect("rows") {
        assert_eq!(row["http2"], true);
        assert_eq!(row["http_version"], "2");
    }
    let reqs = requests(&spans);
    assert_eq!(reqs.len(), 4);
    for r in reqs {
        let wait = r
            .attr_f64(semconv::HTTP_CONNECTION_WAIT_TIME)
            .expect("wait_time");
        assert!(wait < 0.2, "waited {wait} s: the server's response time");
    }
}

/// Fan-out load (32 concurrent, idle pool 4, 3 waves): every request's
/// serving connection and its request count agree with nginx's access log
/// ($remote_port, $connection_requests).
#[tokio::test]
async fn probe_fanout_agrees_with_nginx_access_log() {
    let lab = lab().await;
    let (_json, spans) = lab
        .probe(
            NginxListener::Tls13,
            &[
                "--mode",
                "reuse",
                "--requests",
                "96",
                "--concurrency",
                "32",
                "--pool-max-idle-per-host",
                "4",
                "--http1",
            ],
        )
        .await;
    let reqs = requests(&spans);
    assert_eq!(reqs.len(), 96);
    let log = lab
        .nginx
        .wait_for_access_log(96, Duration::from_secs(10))
        .await;
    assert_eq!(log.len(), 96);
    let mut nginx_by_port: HashMap<u16, Vec<u64>> = HashMap::new();
    for e in &log {
        nginx_by_port
            .entry(e.remote_port)
            .or_default()
            .push(e.connection_requests);
    }
    let mut ours_by_port: HashMap<u16, Vec<u64>> = HashMap::new();
    for r in &reqs {
        let port = r.attr_i64(semconv::NETWORK_LOCAL_PORT).expect("local port") as u16;
        let count = r
            .attr_i64(semconv::HTTP_CONNECTION_REQUEST_COUNT)
            .expect("count") as u64;
        ours_by_port.entry(port).or_default().push(count);
    }
    for v in nginx_by_port.values_mut().chain(ours_by_port.values_mut()) {
        v.sort_unstable();
    }
    assert_eq!(
        ours_by_port, nginx_by_port,
        "per connection: same requests, same counts"
    );
    let misses = reqs
        .iter()
        .filter(|r| r.attr_bool(semconv::HTTP_CONNECTION_REUSED) == Some(false))
        .count();
    assert!(
        misses > 4,
        "an idle pool of 4 under 32 in flight forces misses: {misses}"
    );
}

/// `conntrace probe URL --mode reuse -n 40 -c 4 --json` against plain
/// HTTP nginx with `keepalive_requests 5`, six runs: every request names
/// the connection nginx served it on, with nginx's request count (also
/// the 5th, whose socket nginx closed right after answering); the probe's
/// documented `pool_hits + pool_misses = succeeded + failed_after_response`
/// holds (nothing failed: 40); and no miss
/// blames the peer or the client's pool for closes that were nginx's
/// request limit (`closed_by_peer`, `pool_closed`).
#[tokio::test]
async fn probe_reuse_against_a_request_limit_names_every_connection() {
    let pki = TestPki::localhost().expect("pki");
    let (nginx, url) = nginx_serving(
        NginxConfig::new(&pki).keepalive_requests(5),
        NginxListener::Plain,
    )
    .await;
    let mut logged = 0;
    for run_index in 0..6 {
        let mut cmd = conntrace();
        cmd.arg("probe")
            .arg(&url)
            .args(["--json", "--mode", "reuse", "-n", "40", "-c", "4"]);
        let out = run(cmd).await;
        assert!(out.status.success(), "probe failed: {}", stderr(&out));
        let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
        let mode = &json["modes"][0];
        let totals = &mode["totals"];
        assert_eq!(totals["succeeded"], 40, "run {run_index}: {totals}");
        assert_eq!(
            totals["failed_after_response"], 0,
            "run {run_index}: {totals}"
        );
        assert_eq!(
            totals["pool_hits"].as_u64().expect("hits")
                + totals["pool_misses"].as_u64().expect("misses"),
            40,
            "run {run_index}: pool_hits + pool_misses = succeeded + failed_after_response: {totals}"
        );
        let log = nginx
            .wait_for_access_log(logged + 40, Duration::from_secs(10))
            .await;
        let this_run = &log[logged..];
        assert_eq!(this_run.len(), 40, "run {run_index}");
        logged = log.len();
        let rows = mode["requests"].as_array().expect("rows");
        for row in rows {
            assert!(row["connection_id"].is_u64(), "run {run_index}: {row}");
            assert_nginx_served(row, this_run, &format!("run {run_index}"));
            assert!(
                !matches!(
                    row["miss_reason"].as_str(),
                    Some(semconv::MISS_REASON_CLOSED_BY_PEER | semconv::MISS_REASON_POOL_CLOSED)
                ),
                "run {run_index}: nginx closed only at its request limit: {row}"
            );
        }
    }
}

/// `conntrace probe --mode both --traces-out T` writes each mode's metrics
/// apart (scope attribute `conntrace.probe.mode`), each counting what
/// nginx served in that mode: the fresh mode's connections opened,
/// requests and connection lifetimes are nginx's 12 connections; the reuse
/// mode's connections opened are the JSON's and at least nginx's distinct
/// connections (an extra connect may go unused), not the two modes summed.
#[tokio::test]
async fn probe_metrics_file_keeps_each_mode_apart() {
    let pki = TestPki::localhost().expect("pki");
    let (nginx, url) = nginx_serving(
        NginxConfig::new(&pki).keepalive_requests(5),
        NginxListener::Plain,
    )
    .await;
    let dir = tempfile::tempdir().expect("tempdir");
    let traces = dir.path().join("t.json");
    let mut cmd = conntrace();
    cmd.arg("probe")
        .arg(&url)
        .args([
            "--json",
            "--mode",
            "both",
            "-n",
            "12",
            "-c",
            "3",
            "--traces-out",
        ])
        .arg(&traces);
    let out = run(cmd).await;
    assert!(out.status.success(), "probe failed: {}", stderr(&out));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    // The modes run one after the other: nginx logs the fresh mode's 12
    // requests first.
    let log = nginx.wait_for_access_log(24, Duration::from_secs(10)).await;
    assert_eq!(log.len(), 24, "{log:?}");
    let served = |entries: &[conntrace_lab::nginx::AccessLogEntry]| {
        let mut c: Vec<u64> = entries.iter().map(|e| e.connection).collect();
        c.sort_unstable();
        c.dedup();
        c.len() as f64
    };
    let metrics = conntrace_lab::metrics_from_otlp_json(
        &std::fs::read_to_string(dir.path().join("t.metrics.json")).expect("metrics file"),
    )
    .expect("an OTLP JSON metrics document");
    let of_mode = |mode: &str, name: &str| {
        let found: Vec<_> = metrics
            .iter()
            .filter(|m| {
                m.name == name && m.scope_attributes.str("conntrace.probe.mode") == Some(mode)
            })
            .collect();
        assert_eq!(found.len(), 1, "{mode} {name}: {metrics:#?}");
        found[0].clone()
    };
    let fresh = served(&log[..12]);
    assert_eq!(fresh, 12.0, "{log:?}");
    assert_eq!(
        of_mode("fresh", "http.client.connections.opened").total(),
        fresh
    );
    assert_eq!(
        of_mode("fresh", "http.client.connection.duration").histogram_count(),
        12
    );
    assert_eq!(
        of_mode("fresh", "http.client.request.duration").histogram_count(),
        12
    );
    let idle_limit = of_mode("fresh", "http.client.pool.idle_limit");
    assert_eq!(idle_limit.total(), 0.0, "the fresh mode's pool of 0");
    let reuse_opened = of_mode("reuse", "http.client.connections.opened").total();
    assert!(reuse_opened >= served(&log[12..]), "{reuse_opened} {log:?}");
    assert_eq!(
        Some(reuse_opened as u64),
        json["modes"][1]["totals"]["connections_opened"].as_u64(),
        "{}",
        json["modes"][1]["totals"]
    );
    assert_eq!(
        of_mode("reuse", "http.client.request.duration").histogram_count(),
        12
    );
    // Every metric of the run is one mode's: none is left without the
    // scope attribute.
    assert!(
        metrics
            .iter()
            .all(|m| m.scope_attributes.str("conntrace.probe.mode").is_some()),
        "{metrics:#?}"
    );
}

/// `conntrace probe https://127.0.0.1:PORT/ -n 2 -c 2 --mode reuse`
/// through a front that holds the second connection 800 ms before passing
/// it to the TLS server, which answers after 300 ms (so the second request
/// starts while the first is in flight, however loaded the machine: it
/// failed once in a CI run beside CPU burners, the first request done
/// before the second began): the second request is served on the first
/// connection (released meanwhile), and the second connect finishes its
/// handshake in the background after both requests are done. The probe
/// waits for it: the traces file holds one setup span per connection the
/// front accepted, each ended without error, and the metrics file counts
/// them all.
#[tokio::test]
async fn probe_keeps_a_connect_that_finishes_after_the_last_request() {
    let pki = TestPki::localhost().expect("pki");
    let server = conntrace_lab::TestServer::builder()
        .tls(&pki)
        .http_versions(conntrace_lab::HttpVersions::Http1Only)
        .delay(Duration::from_millis(300))
        .start()
        .await
        .expect("server");
    let front = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = front.local_addr().expect("addr").port();
    let upstream = server.addr();
    let accepted = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let counted = accepted.clone();
    let front_task = tokio::spawn(async move {
        while let Ok((mut client, _)) = front.accept().await {
            let n = counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
            tokio::spawn(async move {
                if n == 2 {
                    tokio::time::sleep(Duration::from_millis(800)).await;
                }
                if let Ok(mut up) = tokio::net::TcpStream::connect(upstream).await {
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut up).await;
                }
            });
        }
    });
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = dir.path().join("ca.pem");
    std::fs::write(&ca, pki.ca_cert_pem()).expect("ca");
    let traces = dir.path().join("t.json");
    let mut cmd = conntrace();
    cmd.args(["probe", &format!("https://127.0.0.1:{port}/")])
        .args([
            "-n", "2", "-c", "2", "--mode", "reuse", "--json", "--cacert",
        ])
        .arg(&ca)
        .arg("--traces-out")
        .arg(&traces);
    let out = run(cmd).await;
    assert!(out.status.success(), "{}", stderr(&out));
    front_task.abort();
    let accepted = accepted.load(std::sync::atomic::Ordering::SeqCst);
    assert_eq!(accepted, 2, "both requests connected at once");
    // Both requests on one connection: the other one was the late one.
    let served: std::collections::HashSet<u64> =
        server.requests().iter().map(|r| r.connection_id).collect();
    assert_eq!(served.len(), 1, "{:?}", server.requests());
    let spans = conntrace_lab::spans_from_otlp_json(
        &std::fs::read_to_string(&traces).expect("traces file"),
    )
    .expect("OTLP JSON");
    let setups = named(&spans, semconv::CONNECTION_SETUP_SPAN);
    assert_eq!(setups.len() as u64, accepted, "{setups:#?}");
    for setup in &setups {
        assert_ne!(
            setup.status_code(),
            opentelemetry_proto::tonic::trace::v1::status::StatusCode::Error,
            "{setup:#?}"
        );
    }
    let metrics = conntrace_lab::metrics_from_otlp_json(
        &std::fs::read_to_string(dir.path().join("t.metrics.json")).expect("metrics file"),
    )
    .expect("an OTLP JSON metrics document");
    let opened: f64 = metrics
        .iter()
        .filter(|m| m.name == "http.client.connections.opened")
        .map(|m| m.total())
        .sum();
    assert_eq!(opened, accepted as f64, "{metrics:#?}");
}

/// `conntrace probe URL --mode reuse -n 24 -c 4 --pool-max-idle-per-host 2`
/// against plain HTTP nginx with `keepalive_requests 3`, eight runs: the
/// idle pool turns connections away while nginx ends others at its limit.
/// Every row names nginx's connection and request count; a miss that names
/// a previous connection as ended (`previous.end`) names one that served
/// no later request (nginx's log: no request on its port after the miss
/// started), with nginx's request count for it; and `release_race` is read
/// while another request was in flight only when the connection it names
/// served its next request (nginx's port and count) to a request that
/// started after the miss (none in flight took it: it was on its way back).
#[tokio::test]
async fn probe_small_pool_against_a_request_limit_names_only_ended_connections() {
    RequestLimitRuns::small_pool(NginxListener::Plain, 24, 4, 8)
        .check()
        .await;
}

/// The same over TLS 1.3 with `-n 28 -c 7`, six runs. The slower connects
/// let connections lose the pool race (into the pool unused, learned only
/// at their trigger's response) while others are released, and let
/// requests start on a connection between a miss and the kernel's answer
/// about it: where a busy connection was once named ended at the idle
/// limit with 0 requests, and a miss named a close its connection
/// announced two responses after it.
#[tokio::test]
async fn probe_small_pool_over_tls_against_a_request_limit_names_only_ended_connections() {
    RequestLimitRuns::small_pool(NginxListener::Tls13, 28, 7, 6)
        .check()
        .await;
}

/// Concurrent redirect chains against nginx's request limit: `conntrace
/// probe URL --mode reuse -n 9 -c 3` where URL is four redirects on one
/// host (`/hop/hop/hop/hop/`, five requests a call), nginx
/// `keepalive_requests 5`, default idle pool, ten runs. The middleware
/// drops each 3xx body (hyper had read it all and keeps the connection),
/// so a hop's miss often finds the connection another chain's hop is on,
/// its 5th request in flight: checked as the small-pool runs above (every
/// row is nginx's port and count; a named ended connection served no
/// later request and nginx's count for it). A tester saw such a miss name
/// the busy connection `discarded` or `closed_by_peer` with 4 requests
/// (5 of 85 runs of a 5-host chain).
#[tokio::test]
async fn probe_redirect_chains_against_a_request_limit_name_only_ended_connections() {
    RequestLimitRuns {
        listener: NginxListener::Plain,
        keepalive_requests: 5,
        path: "/hop/hop/hop/hop/",
        hops: 5,
        calls: 9,
        concurrency: 3,
        idle_pool: None,
        loopback_hosts: 1,
        runs: 10,
    }
    .check()
    .await;
}

/// The tester's case itself: the chain crosses five hosts (pool keys,
/// `127.0.0.1` to `127.0.0.5` on one nginx, `keepalive_requests 5`), three
/// chains at a time, each request matched to nginx's log by its client
/// port and the address it reached.
#[tokio::test]
async fn probe_redirect_chains_across_hosts_against_a_request_limit_name_only_ended_connections() {
    RequestLimitRuns {
        listener: NginxListener::Plain,
        keepalive_requests: 5,
        path: "/to/127.0.0.2/to/127.0.0.3/to/127.0.0.4/to/127.0.0.5/",
        hops: 5,
        calls: 9,
        concurrency: 3,
        idle_pool: None,
        loopback_hosts: 5,
        runs: 10,
    }
    .check()
    .await;
}

/// Probe runs against nginx's request limit, each row checked against
/// nginx's access log (see the tests above).
struct RequestLimitRuns {
    listener: NginxListener,
    /// nginx's `keepalive_requests`.
    keepalive_requests: u32,
    /// The path probed: `/`, or a redirect chain (`/hop/...`).
    path: &'static str,
    /// Requests per call: 1, or the chain's hops plus its last request.
    hops: usize,
    /// Calls per run (`-n`).
    calls: usize,
    /// `-c`.
    concurrency: usize,
    /// `--pool-max-idle-per-host`; `None`: reqwest's default.
    idle_pool: Option<u32>,
    /// nginx's plain listener on `127.0.0.1` up to `127.0.0.<n>`.
    loopback_hosts: u8,
    runs: usize,
}

impl RequestLimitRuns {
    /// `runs` probe runs of `calls` requests, `concurrency` at a time,
    /// idle pool 2, against nginx's `listener` with `keepalive_requests 3`.
    fn small_pool(listener: NginxListener, calls: usize, concurrency: usize, runs: usize) -> Self {
        Self {
            listener,
            keepalive_requests: 3,
            path: "/",
            hops: 1,
            calls,
            concurrency,
            idle_pool: Some(2),
            loopback_hosts: 1,
            runs,
        }
    }

    async fn check(self) {
        let Self {
            listener,
            keepalive_requests,
            path,
            hops,
            calls,
            concurrency,
            idle_pool,
            loopback_hosts,
            runs,
        } = self;
        let requests_per_run = calls * hops;
        let pki = TestPki::localhost().expect("pki");
        let nginx = start_nginx(
            NginxConfig::new(&pki)
                .keepalive_requests(keepalive_requests)
                .loopback_hosts(loopback_hosts),
        )
        .await;
        let url = nginx.url(listener, path).expect("listener");
        let dir = tempfile::tempdir().expect("tempdir");
        let mut logged = 0;
        for run_index in 0..runs {
            let traces = dir.path().join(format!("t{run_index}.json"));
            let mut cmd = probe_reuse_json(&url, &nginx.pki_files().ca);
            cmd.arg("-n")
                .arg(calls.to_string())
                .arg("-c")
                .arg(concurrency.to_string());
            if let Some(pool) = idle_pool {
                cmd.arg("--pool-max-idle-per-host").arg(pool.to_string());
            }
            cmd.arg("--traces-out").arg(&traces);
            let out = run(cmd).await;
            assert!(out.status.success(), "probe failed: {}", stderr(&out));
            let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
            let rows = json["modes"][0]["requests"]
                .as_array()
                .expect("rows")
                .clone();
            assert_eq!(rows.len(), requests_per_run, "run {run_index}");
            let log = nginx
                .wait_for_access_log(logged + requests_per_run, Duration::from_secs(10))
                .await;
            let this_run = log[logged..].to_vec();
            assert_eq!(this_run.len(), requests_per_run, "run {run_index}");
            logged = log.len();
            let spans = conntrace_lab::spans_from_otlp_json(
                &std::fs::read_to_string(&traces).expect("traces file"),
            )
            .expect("OTLP JSON");
            let ms = |row: &serde_json::Value, key: &str| row[key].as_f64().expect("ms");
            let mut unsure_discarded = 0;
            for row in &rows {
                let (port, count) =
                    assert_nginx_served(row, &this_run, &format!("run {run_index}"));
                let start = ms(row, "start_ms");
                let server = peer_ip(row).to_string();
                let span = requests(&spans)
                    .into_iter()
                    .find(|s| {
                        s.attr_i64(semconv::NETWORK_LOCAL_PORT) == Some(port as i64)
                            && s.attr_i64(semconv::HTTP_CONNECTION_REQUEST_COUNT)
                                == Some(count as i64)
                            && s.attr_str(semconv::NETWORK_PEER_ADDRESS) == Some(server.as_str())
                    })
                    .unwrap_or_else(|| panic!("run {run_index}: no span for {row}"));
                if row["miss_reason"] == semconv::MISS_REASON_RELEASE_RACE {
                    let others: Vec<&serde_json::Value> = rows
                        .iter()
                        .filter(|o| o["index"] != row["index"])
                        .filter(|o| {
                            ms(o, "start_ms") <= start
                                && start < ms(o, "start_ms") + ms(o, "total_ms")
                        })
                        .collect();
                    if !others.is_empty() {
                        // With others in flight, only a connection none of them
                        // took was on its way back to the pool: the request
                        // nginx served next on it (by port and count) is this
                        // one (the returning connection served its waiting
                        // checkout) or started after it.
                        let previous = span.attr_i64(semconv::HTTP_CONNECTION_PREVIOUS_ID);
                        let previous_count =
                            span.attr_i64(semconv::HTTP_CONNECTION_PREVIOUS_REQUEST_COUNT);
                        let next_row = rows.iter().find(|o| {
                            o["connection_id"].as_i64() == previous
                                && o["connection_request_count"].as_i64()
                                    == previous_count.map(|c| c + 1)
                        });
                        let next_start = next_row.map(|o| ms(o, "start_ms"));
                        let served_this = next_row.is_some_and(|o| o["index"] == row["index"]);
                        assert!(
                            served_this || next_start.is_some_and(|s| s > start),
                            "run {run_index}: release_race while others were in flight, naming connection {previous:?} (count {previous_count:?}), whose next request {next_row:?} did not start after it: {row} {others:?}"
                        );
                    }
                }
                if span
                    .attr_str(semconv::HTTP_CONNECTION_PREVIOUS_END)
                    .is_none()
                {
                    continue;
                }
                let previous = span
                    .attr_i64(semconv::HTTP_CONNECTION_PREVIOUS_ID)
                    .expect("previous id");
                let previous_count = span
                    .attr_i64(semconv::HTTP_CONNECTION_PREVIOUS_REQUEST_COUNT)
                    .expect("previous count");
                let previous_row = rows
                    .iter()
                    .find(|o| o["connection_id"].as_i64() == Some(previous));
                // A connection that carried no row (pooled unused) has no port
                // in the rows: nginx served nothing on it, as its count says.
                let Some(previous_row) = previous_row else {
                    assert_eq!(previous_count, 0, "run {run_index}: {row}");
                    continue;
                };
                let previous_port = previous_row["local_port"].as_u64().expect("port");
                let previous_server = peer_ip(previous_row);
                let served: Vec<u64> = this_run
                    .iter()
                    .filter(|e| {
                        u64::from(e.remote_port) == previous_port
                            && e.server_addr == previous_server
                    })
                    .map(|e| e.connection_requests)
                    .collect();
                // The one unsure label let through, by its exact shape
                // (REFERENCE section 11, "A redirect's dropped body can
                // name a connection its next hop still used"): `discarded`
                // naming a connection whose next request, a redirect hop
                // that started after this miss, was its last one. At most
                // one per run.
                let next_hop_after = rows.iter().any(|o| {
                    o["connection_id"].as_i64() == Some(previous)
                        && o["connection_request_count"].as_i64() == Some(previous_count + 1)
                        && o["resend_count"].as_i64().is_some_and(|n| n > 0)
                        && ms(o, "start_ms") > start
                });
                if row["miss_reason"] == semconv::MISS_REASON_DISCARDED
                    && next_hop_after
                    && served.iter().copied().max() == Some(previous_count as u64 + 1)
                {
                    unsure_discarded += 1;
                    assert!(
                        unsure_discarded <= 1,
                        "run {run_index}: a second discarded miss naming a connection its next hop used: {row}"
                    );
                    continue;
                }
                assert_eq!(
                    Some(previous_count as u64),
                    served.iter().copied().max(),
                    "run {run_index}: {row} names connection {previous} ended after {previous_count} requests; nginx served {served:?} on it"
                );
                let later: Vec<&serde_json::Value> = rows
                    .iter()
                    .filter(|o| {
                        o["connection_id"].as_i64() == Some(previous) && ms(o, "start_ms") > start
                    })
                    .collect();
                assert!(
                    later.is_empty(),
                    "run {run_index}: {row} names connection {previous} as ended, yet it served {later:?}"
                );
            }
        }
    }
}

/// Asserts that nginx's access log `log` holds the request `row` (a probe
/// JSON row) says it was: its client port, its count on the connection and
/// the address it reached (`$remote_port`, `$connection_requests`,
/// `$server_addr`); returns the port and count.
fn assert_nginx_served(
    row: &serde_json::Value,
    log: &[conntrace_lab::nginx::AccessLogEntry],
    context: &str,
) -> (u64, u64) {
    let port = row["local_port"].as_u64().expect("local_port");
    let count = row["connection_request_count"].as_u64().expect("count");
    let server = peer_ip(row);
    assert!(
        log.iter().any(|e| u64::from(e.remote_port) == port
            && e.connection_requests == count
            && e.server_addr == server),
        "{context}: nginx served no request {count} on port {port} at {server}: {row}\n{log:?}"
    );
    (port, count)
}

/// The server address a probe JSON row's connection reached.
fn peer_ip(row: &serde_json::Value) -> std::net::IpAddr {
    row["peer_address"]
        .as_str()
        .and_then(|a| a.parse::<std::net::SocketAddr>().ok())
        .map(|a| a.ip())
        .unwrap_or_else(|| panic!("peer_address: {row}"))
}

/// TLS 1.2-only nginx: version 1.2 on every setup, as nginx logs it.
#[tokio::test]
async fn probe_against_nginx_tls12() {
    let lab = lab().await;
    let (_json, spans) = lab
        .probe(
            NginxListener::Tls12,
            &["--mode", "fresh", "--requests", "3"],
        )
        .await;
    let setups = named(&spans, semconv::CONNECTION_SETUP_SPAN);
    assert_eq!(setups.len(), 3);
    for s in &setups {
        assert_eq!(s.attr_str(semconv::TLS_PROTOCOL_VERSION), Some("1.2"));
    }
    let log = lab
        .nginx
        .wait_for_access_log(3, Duration::from_secs(5))
        .await;
    assert!(
        log.iter()
            .all(|e| e.ssl_protocol.as_deref() == Some("TLSv1.2"))
    );
}

/// HTTP/2 nginx: concurrent requests all served by one connection.
#[tokio::test]
async fn probe_against_nginx_http2_uses_one_connection() {
    let lab = lab().await;
    let (_json, spans) = lab
        .probe(
            NginxListener::H2,
            &["--mode", "reuse", "--requests", "16", "--concurrency", "8"],
        )
        .await;
    let reqs = requests(&spans);
    assert_eq!(reqs.len(), 16);
    let ids: std::collections::BTreeSet<i64> = reqs
        .iter()
        .map(|r| r.attr_i64(semconv::HTTP_CONNECTION_ID).expect("id"))
        .collect();
    assert_eq!(ids.len(), 1, "{ids:?}");
    assert!(
        reqs.iter()
            .all(|r| r.attr_str(semconv::NETWORK_PROTOCOL_VERSION) == Some("2"))
    );
    let log = lab
        .nginx
        .wait_for_access_log(16, Duration::from_secs(5))
        .await;
    let ports: std::collections::BTreeSet<u16> = log.iter().map(|e| e.remote_port).collect();
    assert_eq!(ports.len(), 1);
    assert!(log.iter().all(|e| e.server_protocol == "HTTP/2.0"));
}

fn assert_one_line_error(out: &Output, expect: &str) {
    assert!(!out.status.success(), "must exit non-zero");
    let err = stderr(out);
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "one line on stderr: {err:?}");
    assert!(lines[0].starts_with("error:"), "{err:?}");
    assert!(
        lines[0].to_lowercase().contains(expect),
        "{err:?} should mention {expect:?}"
    );
    assert!(!err.contains("panicked"), "{err:?}");
}

/// Bad input: one clear line on stderr and a non-zero exit.
#[tokio::test]
async fn bad_input_gets_one_clear_line() {
    let lab = lab().await;
    // Not a URL.
    let mut cmd = conntrace();
    cmd.args(["probe", "not a url", "--requests", "1"]);
    assert_one_line_error(&run(cmd).await, "url");
    // Refused port.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr").port()
    };
    let mut cmd = conntrace();
    cmd.args([
        "probe",
        &format!("http://127.0.0.1:{port}/"),
        "--requests",
        "1",
    ]);
    assert_one_line_error(&run(cmd).await, "refused");
    // Certificate from another CA.
    let dir = tempfile::tempdir().expect("tempdir");
    let other = TestPki::untrusted_other()
        .expect("pki")
        .write_to_dir(dir.path())
        .expect("write");
    let mut cmd = conntrace();
    cmd.args([
        "probe",
        &lab.url(NginxListener::Tls13),
        "--requests",
        "1",
        "--cacert",
    ])
    .arg(&other.ca);
    assert_one_line_error(&run(cmd).await, "certificate");
    // --cacert that is not PEM.
    let junk = dir.path().join("junk.pem");
    std::fs::write(&junk, b"not a certificate").expect("write");
    let mut cmd = conntrace();
    cmd.args([
        "probe",
        &lab.url(NginxListener::Tls13),
        "--requests",
        "1",
        "--cacert",
    ])
    .arg(&junk);
    assert_one_line_error(&run(cmd).await, "certificate");
    // Collector down: the probe runs, then export fails, said once.
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr").port()
    };
    let mut cmd = conntrace();
    cmd.args([
        "probe",
        &lab.url(NginxListener::Tls13),
        "--requests",
        "1",
        "--cacert",
    ])
    .arg(&lab.ca)
    .env(
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        format!("http://127.0.0.1:{closed}"),
    )
    .env("OTEL_EXPORTER_OTLP_TIMEOUT", "2000");
    let out = run(cmd).await;
    assert!(!out.status.success(), "collector down must exit non-zero");
    assert!(
        stderr(&out).to_lowercase().contains("export"),
        "{}",
        stderr(&out)
    );
}

/// Every integer in `text`, in order.
fn integers(text: &str) -> Vec<i64> {
    text.split(|c: char| !c.is_ascii_digit())
        .filter(|t| !t.is_empty())
        .map(|t| t.parse().expect("integer"))
        .collect()
}

/// The demo's text output reads in one pass: every row of the comparison
/// table is defined in the legend under it, and per phase the
/// reconciliation lines repeat the table's figures and add up: the
/// connections the server accepted = the misses (one connect each) plus or
/// minus the connects the line names; of those, served calls + served none
/// = accepted, split into first calls of new connections + spare ones later
/// taken from the idle pool; connections used = opened in the measured part
/// + kept from the warm-up.
#[tokio::test]
async fn demo_text_defines_every_figure_and_its_connections_add_up() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cmd = conntrace();
    cmd.args([
        "demo",
        "--duration",
        "2",
        "--warmup",
        "1",
        "--quiet",
        "--traces-out",
    ])
    .arg(dir.path().join("traces.json"));
    let out = run(cmd).await;
    assert!(out.status.success(), "demo failed: {}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let lines: Vec<&str> = text.lines().collect();
    let legend_at = lines
        .iter()
        .position(|l| *l == "legend:")
        .unwrap_or_else(|| panic!("no legend:\n{text}"));
    let legend: Vec<&str> = lines[legend_at + 1..]
        .iter()
        .take_while(|l| l.starts_with("  "))
        .copied()
        .collect();
    // The comparison table: the box-drawn rows just above the legend.
    let mut table: HashMap<String, Vec<String>> = HashMap::new();
    for row in lines[..legend_at]
        .iter()
        .rev()
        .take_while(|l| !l.is_empty())
        .filter(|l| l.starts_with('│') && l.contains('┆'))
    {
        let cells: Vec<String> = row
            .trim_matches('│')
            .split('┆')
            .map(|c| c.trim().to_owned())
            .collect();
        table.insert(cells[0].clone(), cells[1..].to_vec());
    }
    assert!(table.len() > 10, "comparison rows:\n{text}");
    for label in table.keys().filter(|l| !l.is_empty()) {
        assert!(
            legend.iter().any(|l| l
                .strip_prefix("  ")
                .and_then(|l| l.strip_prefix(label.as_str()))
                .is_some_and(|rest| rest.starts_with(": ") && rest.len() > 10)),
            "row {label:?} is not defined in the legend:\n{}",
            legend.join("\n")
        );
    }
    let cell = |row: &str, phase: usize| -> i64 { integers(&table[row][phase])[0] };
    let opened_lines: Vec<usize> = lines
        .iter()
        .enumerate()
        .filter(|(_, l)| l.starts_with("  connections opened (server) "))
        .map(|(i, _)| i)
        .collect();
    assert_eq!(
        opened_lines.len(),
        2,
        "one reconciliation per phase:\n{text}"
    );
    let mut served_none = Vec::new();
    for (phase, &at) in opened_lines.iter().enumerate() {
        let line = lines[at];
        let (counts, rest) = line.split_once(" waited for busy").expect("misses");
        let n = integers(counts);
        let (opened, new, waited) = (n[0], n[1], n[2]);
        assert_eq!(opened, cell("connections opened (server)", phase), "{line}");
        let misses = integers(&table["misses: new conn. / waited for busy"][phase]);
        assert_eq!((new, waited), (misses[0], misses[1]), "{line}");
        let adjust = integers(rest.split(':').next().unwrap_or_default());
        let adjust = match (rest.starts_with(" + "), rest.starts_with(" - ")) {
            (true, _) => adjust[0],
            (_, true) => -adjust[0],
            _ => 0,
        };
        assert_eq!(opened, new + waited + adjust, "{line}");
        let mut next = at + 1;
        let mut served = 0;
        if opened > 0 {
            let of = integers(lines[next]);
            assert!(lines[next].starts_with("  of those "), "{}", lines[next]);
            let (total, used, first, spare, none) = (of[0], of[1], of[2], of[3], of[4]);
            assert_eq!(total, opened, "{}", lines[next]);
            assert_eq!(first + spare, used, "{}", lines[next]);
            assert_eq!(used + none, opened, "{}", lines[next]);
            served = used;
            served_none.push(none);
            next += 1;
        }
        assert!(
            lines[next].starts_with("  connections used "),
            "{}",
            lines[next]
        );
        let u = integers(lines[next]);
        assert_eq!(
            u[0],
            cell("connections used (TLS resumed)", phase),
            "{}",
            lines[next]
        );
        assert_eq!(u[1], served, "{}", lines[next]);
        assert_eq!(u[0], u[1] + u[2], "{}", lines[next]);
        if opened == 0 {
            served_none.push(0);
        }
    }
    // The conclusion counts the small pool's connections that served no
    // call as its reconciliation does (not "every connect of a call that
    // waited for a busy connection went unused": some serve later calls).
    let conclusion = lines
        .iter()
        .find(|l| l.starts_with("conclusion: "))
        .unwrap_or_else(|| panic!("no conclusion:\n{text}"));
    let (said, _) = conclusion
        .split_once(" of them served no call at all")
        .unwrap_or_else(|| panic!("{conclusion}"));
    assert_eq!(
        integers(said).last().copied(),
        served_none.first().copied(),
        "{conclusion}"
    );
}

/// The demo (shortened): the small pool misses more than the right-sized
/// one, and without an endpoint it writes the spans as OTLP JSON that
/// decodes into request spans with pool attributes.
#[tokio::test]
async fn demo_replays_incident_2_and_writes_otlp_json() {
    let dir = tempfile::tempdir().expect("tempdir");
    let traces = dir.path().join("traces.json");
    let mut cmd = conntrace();
    // The right-sized pool with headroom: on a loaded machine the calls
    // slow down and more of them are in flight at once (Little's law), which
    // pushed the peak past the default 10 and drew advice in 3 of 5 runs
    // beside two CPU burners.
    cmd.args([
        "demo",
        "--duration",
        "3",
        "--right-pool",
        "25",
        "--json",
        "--quiet",
        "--traces-out",
    ])
    .arg(&traces);
    let out = run(cmd).await;
    assert!(out.status.success(), "demo failed: {}", stderr(&out));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let phases = json["phases"].as_array().expect("phases");
    assert_eq!(phases.len(), 2);
    // Each phase names its own URL: one delay-proxy port per phase.
    let urls: Vec<&str> = phases
        .iter()
        .map(|p| p["url"].as_str().expect("phase url"))
        .collect();
    assert_ne!(urls[0], urls[1], "two hosts");
    assert_eq!(json["config"]["urls"], serde_json::json!(urls));
    let small = phases[0]["miss_ratio"].as_f64().expect("ratio");
    let right = phases[1]["miss_ratio"].as_f64().expect("ratio");
    assert!(small > right, "small pool {small} vs right-sized {right}");
    let spans =
        conntrace_lab::spans_from_otlp_json(&std::fs::read_to_string(&traces).expect("file"))
            .expect("OTLP JSON");
    let reqs = requests(&spans);
    assert!(!reqs.is_empty());
    assert!(
        reqs.iter()
            .all(|r| r.attr_bool(semconv::HTTP_CONNECTION_REUSED).is_some())
    );
    assert!(!named(&spans, semconv::CONNECTION_SETUP_SPAN).is_empty());
    assert!(Path::new(&traces).exists());

    // The library's pool advice for the small pool only, and the tail math.
    let advice = phases[0]["advice"].as_str().expect("small pool is advised");
    assert!(advice.contains("idle limit 2"), "{advice}");
    assert!(
        phases[1]["advice"].is_null(),
        "right-sized pool is not advised"
    );
    // One number: the advice states the peak the table shows (the
    // library's, over the whole phase), and suggests it.
    let peak = phases[0]["in_flight_peak"].as_u64().expect("peak");
    assert!(
        advice.contains(&format!("observed peak in flight {peak},"))
            && advice.ends_with(&format!(">= {peak}")),
        "table peak {peak} vs advice {advice}"
    );
    for p in phases {
        let tail = &p["tail"];
        assert_eq!(tail["quantile"].as_f64(), Some(0.998));
        assert!(
            tail["predicted_fanout_p99_ms"]
                .as_f64()
                .expect("prediction")
                > 0.0
        );
    }

    // Fan-out spans name the batches that paid for new connections.
    let fan_outs = named(&spans, "fan_out");
    assert!(!fan_outs.is_empty());
    assert!(
        fan_outs
            .iter()
            .any(|f| f.attr_i64(semconv::FAN_OUT_BATCHES_WITH_NEW_CONNECTION) > Some(0))
    );

    // Metrics beside the traces: request durations split by reuse, misses
    // by reason, the idle-limit gauge per phase.
    let metrics_path = json["telemetry"]["metrics_file"]
        .as_str()
        .expect("metrics file");
    let metrics = conntrace_lab::metrics_from_otlp_json(
        &std::fs::read_to_string(metrics_path).expect("metrics file"),
    )
    .expect("OTLP JSON metrics");
    let metric = |name: &str| {
        metrics
            .iter()
            .find(|m| m.name == name)
            .unwrap_or_else(|| panic!("{name} exported"))
    };
    let durations = metric(semconv::HTTP_CLIENT_REQUEST_DURATION);
    assert!(
        durations
            .histogram_points()
            .iter()
            .any(|p| p.attributes.bool(semconv::HTTP_CONNECTION_REUSED) == Some(false))
    );
    assert!(metric(semconv::HTTP_CLIENT_POOL_MISSES).total() > 0.0);
    let mut limits: Vec<f64> = metric(semconv::HTTP_CLIENT_POOL_IDLE_LIMIT)
        .number_points()
        .iter()
        .map(|p| p.value)
        .collect();
    limits.sort_by(f64::total_cmp);
    assert_eq!(limits, vec![2.0, 25.0]);
}

// ---------------------------------------------------------------------------
// Interop through a third-party collector: rotel (a Rust OTLP collector
// shipped on PyPI with its binary; scripts/test.sh installs the pinned
// version). The demo exports OTLP/gRPC to rotel, rotel forwards to our
// receiver: what arrives must be the same trace the demo reported.
// ---------------------------------------------------------------------------

/// The rotel collector binary: `$ROTEL_AGENT` when set (scripts/test.sh
/// sets it), else `rotel-agent` inside the `rotel` Python package of the
/// virtual environment scripts/test.sh creates (`target/venv`), else of
/// `python3`. Panics (the test fails, it does not skip) when it is missing.
fn rotel_agent() -> std::path::PathBuf {
    if let Some(path) = std::env::var_os("ROTEL_AGENT") {
        return path.into();
    }
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/venv/bin/python");
    let python = if venv.is_file() {
        venv
    } else {
        "python3".into()
    };
    let out = std::process::Command::new(python)
        .args([
            "-c",
            "import os, rotel; print(os.path.join(os.path.dirname(rotel.__file__), 'rotel-agent'))",
        ])
        .output()
        .expect("python3 runs");
    assert!(
        out.status.success(),
        "rotel is not installed (bash scripts/test.sh installs rotel==0.0.1a15 into target/venv): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let path = std::path::PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    assert!(path.is_file(), "no rotel-agent at {}", path.display());
    path
}

/// A loopback port that was free a moment ago (rotel takes fixed ports).
fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}

/// A running rotel, killed on drop (kill_on_drop).
struct Rotel {
    _child: tokio::process::Child,
    grpc_port: u16,
    _dir: tempfile::TempDir,
}

impl Rotel {
    /// Starts the rotel binary `agent` with its OTLP receiver on loopback
    /// and its OTLP/gRPC exporter sending everything to `export_to`;
    /// returns once it listens.
    async fn start(agent: &std::path::Path, export_to: &str) -> Rotel {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = dir.path().join("rotel.out");
        let grpc_port = free_port();
        let mut cmd = tokio::process::Command::new(agent);
        cmd.arg("start")
            .arg("--otlp-grpc-endpoint")
            .arg(format!("127.0.0.1:{grpc_port}"))
            .arg("--otlp-http-endpoint")
            .arg(format!("127.0.0.1:{}", free_port()))
            .args(["--exporter", "otlp", "--otlp-exporter-protocol", "grpc"])
            .arg("--otlp-exporter-endpoint")
            .arg(export_to)
            // rotel gzips what it exports (0.0.1a15 sends gzip even with
            // --otlp-exporter-compression none); the lab receiver accepts it.
            // Its defaults are shared files in /tmp.
            .arg("--pid-file")
            .arg(dir.path().join("rotel.pid"))
            .arg("--log-file")
            .arg(dir.path().join("rotel.log"))
            .stdin(std::process::Stdio::null())
            .stdout(std::fs::File::create(&log).expect("log file"))
            .stderr(std::fs::File::create(dir.path().join("rotel.err")).expect("log file"))
            .kill_on_drop(true);
        let mut child = cmd.spawn().expect("rotel-agent starts");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(status) = child.try_wait().expect("rotel status") {
                panic!(
                    "rotel exited ({status}): {}",
                    std::fs::read_to_string(&log).unwrap_or_default()
                );
            }
            if tokio::net::TcpStream::connect(("127.0.0.1", grpc_port))
                .await
                .is_ok()
            {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "rotel did not listen on {grpc_port} in 10 s"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Rotel {
            _child: child,
            grpc_port,
            _dir: dir,
        }
    }

    fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.grpc_port)
    }

    /// rotel's output so far, for failure messages.
    fn log(&self) -> String {
        ["rotel.out", "rotel.err", "rotel.log"]
            .iter()
            .map(|f| std::fs::read_to_string(self._dir.path().join(f)).unwrap_or_default())
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// Runs the shortened demo exporting OTLP/gRPC to `endpoint`; returns its
/// `--json` report.
async fn demo_exporting_to(endpoint: &str, service: &str) -> serde_json::Value {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cmd = conntrace();
    cmd.args([
        "demo",
        "--duration",
        "2",
        "--warmup",
        "0.5",
        "--json",
        "--quiet",
        "--traces-out",
    ])
    .arg(dir.path().join("unused.json"))
    .env("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
    .env("OTEL_SERVICE_NAME", service);
    let out = run(cmd).await;
    assert!(out.status.success(), "demo failed: {}", stderr(&out));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(report["telemetry"]["sink"], "otlp", "{report}");
    assert!(report["telemetry"]["error"].is_null(), "{report}");
    report
}

/// Every span the receiver gets, once nothing new has arrived for 3 s
/// (rotel batches for 200 ms before it forwards).
async fn settled_spans(receiver: &OtlpReceiver) -> Vec<ReceivedSpan> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let mut seen = 0;
    loop {
        let spans = receiver
            .wait_for_spans(seen + 1, Duration::from_secs(3))
            .await;
        if (spans.len() == seen && seen > 0) || tokio::time::Instant::now() >= deadline {
            return spans;
        }
        seen = spans.len();
    }
}

/// The OTLP type of an attribute value.
fn value_type(v: &opentelemetry_proto::tonic::common::v1::any_value::Value) -> &'static str {
    use opentelemetry_proto::tonic::common::v1::any_value::Value;
    match v {
        Value::StringValue(_) => "string",
        Value::BoolValue(_) => "bool",
        Value::IntValue(_) => "int",
        Value::DoubleValue(_) => "double",
        Value::ArrayValue(_) => "array",
        Value::KvlistValue(_) => "kvlist",
        Value::BytesValue(_) => "bytes",
        Value::StringValueStrindex(_) => "strindex",
    }
}

/// Per span name, what every span of that name carries: attribute keys
/// with their OTLP value types, and event names.
type Shapes = std::collections::BTreeMap<
    String,
    (
        std::collections::BTreeSet<(String, &'static str)>,
        std::collections::BTreeSet<String>,
    ),
>;

fn shape(
    span: &ReceivedSpan,
) -> (
    std::collections::BTreeSet<(String, &'static str)>,
    std::collections::BTreeSet<String>,
) {
    let attrs = span
        .attributes()
        .as_slice()
        .iter()
        .filter_map(|kv| {
            let v = kv.value.as_ref()?.value.as_ref()?;
            Some((kv.key.clone(), value_type(v)))
        })
        .collect();
    let events = span.events().into_iter().map(|e| e.name).collect();
    (attrs, events)
}

/// The shapes common to all spans of each name (the intersection), so
/// attributes that only some spans have (errors, idle time) drop out.
fn common_shapes(spans: &[ReceivedSpan]) -> Shapes {
    let mut out = Shapes::new();
    for s in spans {
        let (attrs, events) = shape(s);
        out.entry(s.name().to_owned())
            .and_modify(|(a, e)| {
                a.retain(|x| attrs.contains(x));
                e.retain(|x| events.contains(x));
            })
            .or_insert((attrs, events));
    }
    out
}

fn demo_attr(span: &ReceivedSpan, key: &str) -> String {
    span.attributes()
        .display(key)
        .unwrap_or_else(|| panic!("{} has no {key}", span.name()))
}

/// The real `conntrace demo` exporting through rotel into the lab
/// receiver: the spans arrive complete (the counts the demo itself
/// reported for the same run), as one consistent tree (parents and links
/// resolve, every connection setup has its phases), with the attribute
/// types, events, scopes and resource of a direct export (reference run
/// into a second receiver).
#[tokio::test]
async fn demo_traces_pass_intact_through_a_third_party_collector() {
    let agent = rotel_agent();
    // Reference: the same demo exporting straight into a receiver.
    let direct = OtlpReceiver::start().await.expect("receiver");
    demo_exporting_to(&direct.endpoint(), "conntrace-direct").await;
    let reference = direct.spans();
    assert!(!reference.is_empty(), "the direct export arrived");

    let receiver = OtlpReceiver::start().await.expect("receiver");
    let rotel = Rotel::start(&agent, &receiver.endpoint()).await;
    let report = demo_exporting_to(&rotel.endpoint(), "conntrace-interop").await;
    let spans = settled_spans(&receiver).await;
    assert!(
        receiver.trace_exports() > 0,
        "rotel exported nothing to the receiver: {}",
        rotel.log()
    );

    // Metrics through rotel too: request durations split by reuse, whose
    // miss count equals the GET spans that were not reused.
    let durations = receiver
        .wait_for_metric(
            semconv::HTTP_CLIENT_REQUEST_DURATION,
            Duration::from_secs(10),
        )
        .await
        .unwrap_or_else(|| panic!("no request-duration metric via rotel: {}", rotel.log()));
    let points = durations.histogram_points();
    assert!(
        points
            .iter()
            .all(|p| p.attributes.bool(semconv::HTTP_CONNECTION_REUSED).is_some()),
        "every point says hit or miss"
    );
    let misses: u64 = points
        .iter()
        .filter(|p| p.attributes.bool(semconv::HTTP_CONNECTION_REUSED) == Some(false))
        .map(|p| p.count)
        .sum();
    let missed_gets = requests(&spans)
        .iter()
        .filter(|r| r.attr_bool(semconv::HTTP_CONNECTION_REUSED) == Some(false))
        .count() as u64;
    assert_eq!(misses, missed_gets, "metric misses = span misses");

    // Complete: per phase, the measured fan-outs' batch spans carry exactly
    // the pool outcomes the demo counted in its own report.
    let by_id: HashMap<String, &ReceivedSpan> =
        spans.iter().map(|s| (s.span_id_hex(), s)).collect();
    assert_eq!(by_id.len(), spans.len(), "no span arrived twice");
    for phase in report["phases"].as_array().expect("phases") {
        let name = phase["name"].as_str().expect("name");
        let fanouts: Vec<&ReceivedSpan> = named(&spans, "user_request")
            .into_iter()
            .filter(|f| f.attr_str("demo.phase") == Some(name))
            .filter(|f| f.attr_bool("demo.warmup") == Some(false))
            .collect();
        assert_eq!(
            fanouts.len() as u64,
            phase["fanouts"].as_u64().expect("n"),
            "{name}"
        );
        for f in &fanouts {
            assert_eq!(
                demo_attr(f, "demo.pool_max_idle_per_host"),
                phase["pool_max_idle_per_host"].to_string(),
                "{name}"
            );
        }
        // user_request > fan_out (the library's helper) > batch > GET.
        let batches: Vec<&ReceivedSpan> = fanouts
            .iter()
            .flat_map(|f| children(&spans, f))
            .filter(|f| f.name() == "fan_out")
            .flat_map(|f| children(&spans, f))
            .filter(|b| b.name() == "batch")
            .collect();
        assert_eq!(
            batches.len() as u64,
            phase["calls"].as_u64().expect("n"),
            "{name}"
        );
        let gets: Vec<&ReceivedSpan> = batches
            .iter()
            .flat_map(|b| children(&spans, b))
            .filter(|g| g.attr_str(semconv::HTTP_REQUEST_METHOD) == Some("GET"))
            .collect();
        assert_eq!(gets.len(), batches.len(), "{name}: one request per batch");
        // The demo's outcome counts, read off the GET spans: an idle hit is
        // reused with no miss reason, a wait for a busy connection reused
        // with one, or a new connection's later request (it waited for the
        // request that had it first).
        let count = |reused: bool, reason: bool| {
            gets.iter()
                .filter(|g| g.attr_bool(semconv::HTTP_CONNECTION_REUSED) == Some(reused))
                .filter(|g| g.has_attr(semconv::HTTP_CONNECTION_MISS_REASON) == reason)
                .count() as u64
        };
        let new_not_first = gets
            .iter()
            .filter(|g| g.attr_bool(semconv::HTTP_CONNECTION_REUSED) == Some(false))
            .filter(|g| g.attr_i64(semconv::HTTP_CONNECTION_REQUEST_COUNT) > Some(1))
            .count() as u64;
        assert_eq!(
            count(true, false),
            phase["pool_hits"].as_u64().expect("n"),
            "{name}"
        );
        assert_eq!(
            count(true, true) + new_not_first,
            phase["misses_waited_for_busy"].as_u64().expect("n"),
            "{name}"
        );
        assert_eq!(count(false, false), 0, "{name}: every miss says why");
        // A batch is flagged as paying for a new connection exactly when
        // its GET was not reused.
        for b in &batches {
            let get = children(&spans, b)
                .into_iter()
                .find(|g| g.attr_str(semconv::HTTP_REQUEST_METHOD).is_some())
                .expect("the batch's GET");
            assert_eq!(
                b.attr_bool(semconv::FAN_OUT_BATCH_NEW_CONNECTION),
                get.attr_bool(semconv::HTTP_CONNECTION_REUSED).map(|r| !r),
                "{name}"
            );
        }
        let reused_false = gets
            .iter()
            .filter(|g| g.attr_bool(semconv::HTTP_CONNECTION_REUSED) == Some(false))
            .count() as u64;
        assert_eq!(
            reused_false - new_not_first,
            phase["misses_new_connection"].as_u64().expect("n")
        );
        let connections: std::collections::BTreeSet<i64> = gets
            .iter()
            .map(|g| {
                g.attr_i64(semconv::HTTP_CONNECTION_ID)
                    .expect("connection id")
            })
            .collect();
        assert_eq!(
            connections.len() as u64,
            phase["connections_used"].as_u64().expect("n"),
            "{name}"
        );
    }

    // One consistent tree: parents and links resolve within the trace.
    for s in &spans {
        if let Some(parent) = s.parent_span_id_hex() {
            let p = by_id
                .get(&parent)
                .unwrap_or_else(|| panic!("{}: parent {parent} missing", s.name()));
            assert_eq!(p.trace_id_hex(), s.trace_id_hex(), "{}", s.name());
        }
        for link in s.links() {
            let target = by_id
                .get(&link.span_id_hex)
                .unwrap_or_else(|| panic!("{}: linked span missing", s.name()));
            assert_eq!(target.name(), semconv::CONNECTION_SETUP_SPAN);
            assert_eq!(target.trace_id_hex(), link.trace_id_hex);
        }
    }
    let setups = named(&spans, semconv::CONNECTION_SETUP_SPAN);
    assert!(!setups.is_empty());
    for setup in &setups {
        let parent = setup
            .parent_span_id_hex()
            .and_then(|p| by_id.get(&p).copied())
            .expect("a setup has a parent");
        assert!(
            parent.attr_str(semconv::HTTP_REQUEST_METHOD).is_some(),
            "a setup hangs under the request that started it, not {}",
            parent.name()
        );
        let kids: Vec<&str> = children(&spans, setup).iter().map(|c| c.name()).collect();
        assert!(kids.contains(&semconv::TCP_CONNECT_SPAN), "{kids:?}");
        assert!(kids.contains(&semconv::TLS_HANDSHAKE_SPAN), "{kids:?}");
        // The demo resolves localhost through an override: no DNS phase,
        // and the setup says why.
        assert_eq!(
            kids.contains(&semconv::DNS_LOOKUP_SPAN),
            !setup.has_attr(semconv::HTTP_CONNECTION_DNS_SKIPPED),
            "{kids:?}"
        );
    }

    // Intact: every span name of the direct export arrives, and each span
    // carries every attribute (with the same OTLP type) and event that all
    // spans of its name carry in the direct export.
    let expected = common_shapes(&reference);
    let got_names: std::collections::BTreeSet<&str> = spans.iter().map(|s| s.name()).collect();
    let want_names: std::collections::BTreeSet<&str> =
        expected.keys().map(String::as_str).collect();
    assert_eq!(got_names, want_names);
    // The kernel's facts on tcp.connect are there only when the kernel
    // answered in time (a lookup queued over 1 s on a saturated machine is
    // given up): a span has all of them or none, and at least one span
    // arrives with all of them.
    let kernel_facts = [
        semconv::HTTP_CONNECTION_TCP_RTT,
        semconv::HTTP_CONNECTION_TCP_RTT_VARIANCE,
        semconv::HTTP_CONNECTION_TCP_CONGESTION_WINDOW,
        semconv::HTTP_CONNECTION_TCP_MSS,
        semconv::HTTP_CONNECTION_TCP_RETRANSMITS,
    ];
    let mut with_kernel_facts = 0;
    for s in &spans {
        let (attrs, events) = shape(s);
        let (want_attrs, want_events) = &expected[s.name()];
        let without_kernel =
            s.name() == semconv::TCP_CONNECT_SPAN && kernel_facts.iter().all(|k| !s.has_attr(k));
        with_kernel_facts += usize::from(s.name() == semconv::TCP_CONNECT_SPAN && !without_kernel);
        let missing: Vec<_> = want_attrs
            .difference(&attrs)
            .filter(|(k, _)| !(without_kernel && kernel_facts.contains(&k.as_str())))
            .collect();
        assert!(
            missing.is_empty(),
            "{}: lost or retyped {missing:?}",
            s.name()
        );
        let missing: Vec<_> = want_events.difference(&events).collect();
        assert!(missing.is_empty(), "{}: lost events {missing:?}", s.name());
        assert_eq!(s.resource().str("service.name"), Some("conntrace-interop"));
    }
    let reference_has_facts = expected[semconv::TCP_CONNECT_SPAN]
        .0
        .iter()
        .any(|(k, _)| k == semconv::HTTP_CONNECTION_TCP_RTT);
    assert!(
        with_kernel_facts > 0 || !reference_has_facts,
        "no tcp.connect arrived with the kernel's facts"
    );
    let scopes = |v: &[ReceivedSpan]| -> std::collections::BTreeSet<(String, String)> {
        v.iter()
            .map(|s| (s.scope_name().to_owned(), s.scope_version().to_owned()))
            .collect()
    };
    assert_eq!(scopes(&spans), scopes(&reference));
}

/// `conntrace demo` keeps every request of its small-pool phase attributed:
/// the connects that lose hyper-util's race to a freed connection go into
/// the pool unused, where the full idle pool closes them at once; the pool
/// model releases them there, so the history forgets them instead of
/// counting them open until it overflows its 64 connections per host (it
/// did: a third of the phase's requests were untracked, with `cold` setup
/// spans in a warm pool). No request span is untracked, and as many setup
/// spans as requests say `cold`.
#[tokio::test]
async fn demo_keeps_every_miss_attributed_for_its_whole_run() {
    let dir = tempfile::tempdir().expect("tempdir");
    let traces = dir.path().join("traces.json");
    let mut cmd = conntrace();
    // Twice the default load (20 fan-outs/s of 8 calls), so that the pool
    // history overflows on a loaded machine too: with the defaults and two
    // CPU burners beside it, an 8 s run stayed under 64 "open" connections.
    cmd.args([
        "demo",
        "--duration",
        "5",
        "--rate",
        "20",
        "--batches",
        "8",
        "--right-pool",
        "25",
        "--json",
        "--quiet",
        "--traces-out",
    ])
    .arg(&traces);
    let out = run(cmd).await;
    assert!(out.status.success(), "demo failed: {}", stderr(&out));
    let spans =
        conntrace_lab::spans_from_otlp_json(&std::fs::read_to_string(&traces).expect("file"))
            .expect("OTLP JSON");
    let reqs = requests(&spans);
    let untracked = reqs
        .iter()
        .filter(|r| r.attr_str(semconv::HTTP_CONNECTION_UNTRACKED).is_some())
        .count();
    assert_eq!(untracked, 0, "of {} request spans", reqs.len());
    // Every connect starts from one request's miss: as many connects say
    // `cold` as requests do.
    let cold = |list: Vec<&ReceivedSpan>| {
        list.iter()
            .filter(|s| {
                s.attr_str(semconv::HTTP_CONNECTION_MISS_REASON) == Some(semconv::MISS_REASON_COLD)
            })
            .count()
    };
    assert_eq!(
        cold(named(&spans, semconv::CONNECTION_SETUP_SPAN)),
        cold(reqs),
        "connects labelled cold vs requests labelled cold"
    );
}

/// `conntrace probe URL --mode reuse -n 40 -c 8` (HTTP/2 by ALPN) against
/// nginx with `keepalive_requests 5`, three runs: eight streams at a time on
/// connections nginx ends (GOAWAY) after five, so it refuses the rest
/// unprocessed and hyper-util resends them on a new connection, some
/// through a second connect. Found by a tester: those calls' spans blamed
/// a retry middleware placed after ours (10 of 10 runs), though the probe
/// has none and nginx served exactly one request per span. Now a call that
/// opened two connections names the connection the server ended
/// (`http.connection.previous.id` on its `http.connection.unseen_requests`
/// event), one nginx served its limit on, or, when that end was not known
/// yet as the call returned, names both causes without claiming either;
/// nginx's log has one request per answered span.
#[tokio::test]
async fn h2_resends_after_goaway_name_the_ended_connection_not_a_middleware() {
    let pki = TestPki::localhost().expect("pki");
    let (nginx, url) = nginx_serving(
        NginxConfig::new(&pki).keepalive_requests(5),
        NginxListener::H2,
    )
    .await;
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut logged, mut resent) = (0, 0);
    for run_index in 0..3 {
        let traces = dir.path().join(format!("t{run_index}.json"));
        let mut cmd = probe_reuse_json(&url, &nginx.pki_files().ca);
        cmd.args(["-n", "40", "-c", "8"])
            .args(["--timeout", "5", "--traces-out"])
            .arg(&traces);
        // hyper-util's own pool fails a few requests under this churn
        // before handing them a connection (REFERENCE, known limits): the
        // probe then exits non-zero; its rows and spans are still written.
        let out = run(cmd).await;
        let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
        let rows = json["modes"][0]["requests"]
            .as_array()
            .expect("rows")
            .clone();
        assert_eq!(rows.len(), 40, "run {run_index}");
        let answered = rows
            .iter()
            .filter(|r| r["status"].as_u64() == Some(200))
            .count();
        let spans = conntrace_lab::spans_from_otlp_json(
            &std::fs::read_to_string(&traces).expect("traces file"),
        )
        .expect("OTLP JSON");
        let spans = requests(&spans);
        assert_eq!(spans.len(), 40, "run {run_index}");
        let log = nginx
            .wait_for_access_log(logged + answered, Duration::from_secs(10))
            .await;
        let this_run = log[logged..].to_vec();
        logged = log.len();
        // A request the client gave up on (hyper-util's churn failures)
        // nginx logs as 499.
        assert_eq!(
            this_run.iter().filter(|e| e.status == 200).count(),
            answered,
            "run {run_index}: one request served per answered span: {this_run:?}"
        );
        for span in spans
            .iter()
            .filter(|s| s.attr_i64(semconv::HTTP_CONNECTION_CONNECTS).is_some())
        {
            let event = span
                .events()
                .into_iter()
                .find(|e| e.name == semconv::EVENT_UNSEEN_REQUESTS)
                .expect("the unseen send is named");
            let message = event
                .attributes
                .str(semconv::EXCEPTION_MESSAGE)
                .unwrap_or("")
                .to_owned();
            let Some(ended) = event.attributes.i64(semconv::HTTP_CONNECTION_PREVIOUS_ID) else {
                // The server's end not known yet when the call returned:
                // both causes named, neither claimed.
                assert!(
                    message.contains("GOAWAY") && message.contains("which one is not known"),
                    "run {run_index}: the probe has no middleware after ours: {message}"
                );
                continue;
            };
            let port = rows
                .iter()
                .find(|r| r["connection_id"].as_i64() == Some(ended))
                .and_then(|r| r["local_port"].as_u64())
                .expect("the ended connection served rows");
            let served = this_run
                .iter()
                .filter(|e| u64::from(e.remote_port) == port)
                .map(|e| e.connection_requests)
                .max();
            assert_eq!(
                served,
                Some(5),
                "run {run_index}: connection {ended} (port {port}) was ended by nginx at its limit: {message}"
            );
            resent += 1;
        }
    }
    assert!(
        resent > 0,
        "no call named the connection its server ended in 3 runs of 40"
    );
}

/// `conntrace probe URL --mode reuse -c 16 -n 16 --json` (HTTP/2 by ALPN)
/// against nginx with `keepalive_requests 5`, repeated until a stream is
/// refused by nginx's GOAWAY: the JSON and the failed request spans.
async fn h2_burst_with_a_refused_stream() -> (serde_json::Value, Vec<ReceivedSpan>) {
    let pki = TestPki::localhost().expect("pki");
    let (nginx, url) = nginx_serving(
        NginxConfig::new(&pki).keepalive_requests(5),
        NginxListener::H2,
    )
    .await;
    for _ in 0..10 {
        let receiver = OtlpReceiver::start().await.expect("receiver");
        let mut cmd = probe_reuse_json(&url, &nginx.pki_files().ca);
        cmd.args(["-c", "16", "-n", "16"])
            .env("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint());
        let out = run(cmd).await;
        let json: serde_json::Value =
            serde_json::from_slice(&out.stdout).expect("--json output is JSON");
        let failed: Vec<ReceivedSpan> = receiver
            .spans()
            .into_iter()
            .filter(|s| {
                s.attr_str(semconv::HTTP_REQUEST_METHOD).is_some()
                    && s.attr_str(semconv::ERROR_TYPE) == Some(semconv::ERROR_TYPE_HTTP2_GOAWAY)
            })
            .collect();
        if !failed.is_empty() {
            return (json, failed);
        }
    }
    panic!("no stream refused in 10 bursts");
}

fn failed_rows(json: &serde_json::Value) -> Vec<&serde_json::Value> {
    json["modes"][0]["requests"]
        .as_array()
        .expect("rows")
        .iter()
        .filter(|r| !r["error_type"].is_null())
        .collect()
}

/// The probe's JSON names the connection a failed request was sent on, as
/// the request's own span does: an HTTP/2 burst against nginx with
/// `keepalive_requests 5` has streams refused by the GOAWAY (`error_type
/// http2_goaway`); the failed rows carry the same `connection_id`s their
/// spans name (and `reused`, the peer address, with them), and no pool
/// outcome of their own (`wait_ms` null). (A refused request whose own
/// connect had not finished names no connection on its span under load,
/// and then none in the JSON either: the two agree either way.)
#[tokio::test]
async fn probe_json_names_the_connection_a_failed_request_was_sent_on() {
    let (json, failed) = h2_burst_with_a_refused_stream().await;
    let mut named: Vec<Option<i64>> = failed
        .iter()
        .map(|s| s.attr_i64(semconv::HTTP_CONNECTION_ID))
        .collect();
    assert!(
        named.iter().any(Option::is_some),
        "no refused stream names its connection: {failed:?}"
    );
    let rows = failed_rows(&json);
    let mut in_json: Vec<Option<i64>> = Vec::new();
    for row in rows {
        let id = row["connection_id"].as_i64();
        if id.is_some() {
            assert!(row["reused"].is_boolean(), "{row}");
            assert!(row["peer_address"].is_string(), "{row}");
        }
        assert!(row["wait_ms"].is_null(), "{row}");
        in_json.push(id);
    }
    named.sort_unstable();
    in_json.sort_unstable();
    assert_eq!(in_json, named, "the JSON names what the spans name");
}

/// In the same run, the refused stream's error line does not end with "fix:
/// the server did not speak HTTP/2; drop --http2": no --http2 was given, and
/// the server spoke HTTP/2 on the very connection; the GOAWAY is an error
/// frame the server sent, not a missing HTTP/2.
#[tokio::test]
async fn probe_error_hint_does_not_blame_http2_support_for_a_goaway() {
    let (json, _) = h2_burst_with_a_refused_stream().await;
    for row in failed_rows(&json) {
        let error = row["error"].as_str().expect("error line");
        assert!(
            !error.contains("did not speak HTTP/2"),
            "no --http2 given, the server spoke HTTP/2: {error}"
        );
    }
}

/// `conntrace probe URL --mode reuse -c 8 -n 40 --json` (HTTP/2 by ALPN)
/// against nginx with `keepalive_requests 5`, three runs: every answered
/// row is a request nginx served (its access log, by `local_port` and
/// `connection_request_count`), and its `miss_reason` is the one its
/// request span records (matched by `connection_id` and request count):
/// the probe awaits each report's settled reason before it prints, also a
/// miss decided after its response (the kernel's answer, responses to the
/// host still in flight: REFERENCE section 14) when the run has one. The
/// waves do not force that case (this passed 8 of 8 runs before the fix
/// too); `attribution::a_report_waits_for_its_http2_request_limit_miss_decided_after_the_response`
/// in the e2e tests forces it.
///
/// hyper-util's pool (0.1.21, under reqwest 0.13.5) itself fails a few of
/// these requests: waves of 8 against this nginx failed 11 of 40,000
/// requests with reqwest alone (no conntrace), 8 of 40,000 instrumented:
/// `client error (Canceled)` ("connection was not ready", "ALPN upgraded
/// to HTTP/2", "connection closed"), 1 stuck until its timeout, and (1 of
/// 90 runs of this test) a pool waiter handed a connection the GOAWAY had
/// closed ("checked out connection was closed"). A run
/// may therefore have up to 2 failed rows, each one of those (probe exit
/// code 1, `--timeout 5` so a stuck one costs 5 s, not 30); every other
/// row is compared. CI failed once on such a timeout before.
#[tokio::test]
async fn probe_json_miss_reasons_are_the_spans_under_an_http2_request_limit() {
    let pki = TestPki::localhost().expect("pki");
    let (nginx, url) = nginx_serving(
        NginxConfig::new(&pki).keepalive_requests(5),
        NginxListener::H2,
    )
    .await;
    let (mut logged, mut compared) = (0, 0);
    for run_index in 0..3 {
        let receiver = OtlpReceiver::start().await.expect("receiver");
        let mut cmd = probe_reuse_json(&url, &nginx.pki_files().ca);
        cmd.args(["-c", "8", "-n", "40"])
            .args(["--timeout", "5"])
            .env("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint());
        let out = run(cmd).await;
        let json: serde_json::Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("JSON ({e}): {}", stderr(&out)));
        let failed = failed_rows(&json);
        let upstream = |row: &&serde_json::Value| {
            let error = row["error"].as_str().unwrap_or("");
            error.contains("client error (Canceled)")
                || error.contains("checked out connection was closed")
                || row["error_type"] == semconv::ERROR_TYPE_TIMEOUT
        };
        assert!(
            failed.len() <= 2 && failed.iter().all(upstream),
            "run {run_index}: only hyper-util's own rare failures: {failed:?}"
        );
        assert_eq!(
            out.status.code(),
            Some(if failed.is_empty() { 0 } else { 1 }),
            "run {run_index}: {}",
            stderr(&out)
        );
        // The CLI flushes before exiting: every span has arrived.
        let spans = receiver.spans();
        let spans = requests(&spans);
        let rows = json["modes"][0]["requests"].as_array().expect("rows");
        assert_eq!(rows.len(), spans.len(), "run {run_index}: a row per span");
        let answered: Vec<&serde_json::Value> =
            rows.iter().filter(|r| r["error_type"].is_null()).collect();
        let mut log = nginx
            .wait_for_access_log(logged + answered.len(), Duration::from_secs(10))
            .await;
        if !failed.is_empty() {
            // A request stuck until its timeout may have been served: its
            // line comes now, not in the next run's share.
            log = nginx
                .wait_for_access_log(log.len() + failed.len(), Duration::from_secs(1))
                .await;
        }
        let this_run = &log[logged..];
        // Lines nginx wrote with a 200; a stream the client reset before
        // its answer (hyper-util giving up on a connection the GOAWAY
        // ended) is logged 499 and is no answered row.
        let served = this_run.iter().filter(|e| e.status == 200).count();
        assert!(
            (answered.len()..=answered.len() + failed.len()).contains(&served),
            "run {run_index}: nginx served the {} answered: {this_run:?}",
            answered.len(),
        );
        logged = log.len();
        for row in answered {
            let (_, count) = assert_nginx_served(row, this_run, &format!("run {run_index}"));
            let id = row["connection_id"].as_i64().expect("connection_id");
            let span = spans
                .iter()
                .find(|s| {
                    s.attr_i64(semconv::HTTP_CONNECTION_ID) == Some(id)
                        && s.attr_i64(semconv::HTTP_CONNECTION_REQUEST_COUNT) == Some(count as i64)
                })
                .unwrap_or_else(|| panic!("run {run_index}: no span for {row}"));
            assert_eq!(
                row["miss_reason"].as_str(),
                span.attr_str(semconv::HTTP_CONNECTION_MISS_REASON),
                "run {run_index}: the JSON says what the span says: {row}"
            );
            compared += usize::from(row["miss_reason"].is_string());
        }
    }
    assert!(compared >= 3 * 8, "misses compared: {compared}");
}
