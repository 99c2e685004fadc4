//! The stack pages someone: the real Prometheus, Alertmanager and pager-log
//! (Debian's `prometheus` and `prometheus-alertmanager`, python3 running
//! deploy/alertmanager/pager_log.py), on loopback with free ports and temp
//! dirs, fed with the library's own metrics; no Docker.
//!
//! What is rewritten in the temp copies of the real configs, and only that:
//! - prometheus.yml: the scrape target and the Alertmanager target (the
//!   loopback ports), scrape and evaluation interval 1 s, the rule file's
//!   path;
//! - rules.yml: every alert's `for:` (10 m / 5 m) becomes 2 s, so the test
//!   ends in seconds; expressions, labels and annotations are untouched;
//! - alertmanager.yml: the webhook host `pager-log:9095` becomes the
//!   loopback pager-log (paths `/page`, `/ticket` kept), `group_wait` 1 s.
//!
//! The metrics: this test's instrumented reqwest client runs against two
//! loopback servers while the test serves its metrics as Prometheus text.
//! The points are the SDK's real export (in-memory exporter, cumulative);
//! names and labels go through the same OTel -> Prometheus translation the
//! deploy checks pin to the collector's (`crate::deploy::prometheus_name`),
//! with `job` / `instance` set as the collector's exporter sets them from
//! service.name / service.instance.id. Histograms are served as `_count`
//! only (the alerts read no bucket). The collector itself is not in the
//! path (its translation is the checked function, not a running collector).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use conntrace_lab::TestServer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::contract::{Kind, OTEL_METRICS};
use crate::deploy::{prometheus_label, prometheus_name};
use crate::support::*;

/// The `job` label the exposition carries (the collector's exporter sets it
/// from the resource's service.name).
const JOB: &str = "paging-e2e";

/// How long the whole path may take once every process listens.
const DEADLINE: Duration = Duration::from_secs(45);

/// Kills and reaps every child process when dropped, on panic too.
#[derive(Default)]
struct Children(Vec<(&'static str, Child)>);

impl Children {
    fn spawn(&mut self, name: &'static str, command: &mut Command) {
        let child = command
            .stdin(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {name}: {e}"));
        self.0.push((name, child));
    }

    /// Fails if a child already exited (a bad flag or config, a port taken).
    fn assert_running(&mut self) {
        for (name, child) in &mut self.0 {
            if let Ok(Some(status)) = child.try_wait() {
                panic!("{name} exited early: {status}");
            }
        }
    }
}

impl Drop for Children {
    fn drop(&mut self) {
        for (_, child) in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The binary at `path`; fails naming the Debian package when missing.
fn binary(path: &str, package: &str) -> PathBuf {
    let p = PathBuf::from(path);
    assert!(
        p.is_file(),
        "{path} missing: install the Debian package `{package}` (scripts/test.sh does)"
    );
    p
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port()
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf()
}

fn yaml(rel: &str) -> serde_norway::Value {
    let path = repo_root().join(rel);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{rel}: {e}"));
    serde_norway::from_str(&text).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

fn write_yaml(path: &Path, value: &serde_norway::Value) {
    std::fs::write(path, serde_norway::to_string(value).expect("yaml")).expect("write config");
}

/// `value[key]` for a mapping, as a mutable reference; panics naming `key`.
fn at<'a>(value: &'a mut serde_norway::Value, key: &str) -> &'a mut serde_norway::Value {
    value
        .get_mut(key)
        .unwrap_or_else(|| panic!("no `{key}` in the config"))
}

fn escape(value: &str) -> String {
    value
        .replace('\\', r"\\")
        .replace('"', "\\\"")
        .replace('\n', r"\n")
}

/// Prometheus text exposition of every point the library exports now.
fn exposition(t: &Telemetry) -> String {
    let mut out = String::new();
    for m in OTEL_METRICS {
        let mut name = prometheus_name(m.name, m.unit, m.instrument);
        if m.instrument == Kind::Histogram {
            name.push_str("_count");
        }
        for p in t.metric(m.name) {
            let mut labels = format!("job=\"{JOB}\",instance=\"1\"");
            for (k, v) in &p.attributes {
                let _ = write!(labels, ",{}=\"{}\"", prometheus_label(k), escape(v));
            }
            let _ = writeln!(out, "{name}{{{labels}}} {}", p.value);
        }
    }
    out
}

/// Serves [`exposition`] on `listener`, one connection at a time (one
/// scraper), forever.
async fn serve_metrics(listener: tokio::net::TcpListener, t: &Telemetry) {
    loop {
        let Ok((mut stream, _)) = listener.accept().await else {
            continue;
        };
        let mut request = Vec::new();
        let mut buf = [0u8; 4096];
        while !request.windows(4).any(|w| w == b"\r\n\r\n") {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => request.extend_from_slice(&buf[..n]),
            }
        }
        let body = exposition(t);
        let head = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        );
        let _ = stream.write_all(head.as_bytes()).await;
        let _ = stream.write_all(body.as_bytes()).await;
        let _ = stream.shutdown().await;
    }
}

/// Bursts of `burst` concurrent requests to `url`, `pause` apart, forever.
async fn bursts(
    client: &reqwest_middleware::ClientWithMiddleware,
    url: &str,
    burst: usize,
    pause: Duration,
) {
    loop {
        let requests = (0..burst).map(|_| async {
            if let Ok(r) = client.get(url).send().await {
                let _ = r.bytes().await;
            }
        });
        futures::future::join_all(requests).await;
        tokio::time::sleep(pause).await;
    }
}

/// GETs `url` as text (for diagnostics and the runbook).
async fn get(url: &str) -> Result<(u16, String), reqwest::Error> {
    // A plain client (not instrumented: these requests are not the
    // workload); reqwest is built without a default rustls provider.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let r = reqwest::get(url).await?;
    let status = r.status().as_u16();
    Ok((status, r.text().await?))
}

/// The pager-log line for `receiver` announcing `alertname` firing for
/// `host:port`, if printed.
fn pager_line(log: &str, receiver: &str, alertname: &str, host_port: &str) -> Option<String> {
    log.lines()
        .find(|l| {
            l.starts_with(&format!("[{receiver}] FIRING {alertname} "))
                && l.contains(&format!("{JOB} -> {host_port}:"))
        })
        .map(str::to_owned)
}

/// Every line of the pager-log is one alert, routed by its severity: a
/// line holding two alerts, or a warning on the pager, fails.
fn assert_routed_by_severity(log: &str) {
    for line in log.lines().filter(|l| !l.is_empty()) {
        let routed = (line.starts_with("[page] ") && line.contains(" severity=page: "))
            || (line.starts_with("[ticket] ") && line.contains(" severity=warning: "));
        assert!(
            routed && line.matches(" | runbook: ").count() == 1,
            "not one alert routed by severity: {line}\n{log}"
        );
    }
}

/// Pool misses page; in-flight above the idle limit opens a ticket.
///
/// Host A (four concurrent requests every 100 ms, idle limit 1: ~30
/// requests/s, most of them pool misses) crosses the page alert
/// `HttpClientPoolMissRatioHigh` (miss ratio > 20 % at > 1 request/s).
/// Host B (three concurrent requests every 4 s, idle limit 1: under 1
/// request/s, so no page) crosses only the warning
/// `HttpClientInFlightAboveIdleLimit` (peak in flight 3 > idle limit 1).
/// Asserts that Alertmanager's route sends the page for host A to
/// `/page` and the warning for host B to `/ticket` (each line naming the
/// alert, severity, service and host), that no warning reaches the pager,
/// and that the page's runbook URL, built from RUNBOOK_BASE_URL (here the
/// pager-log's own README server), answers 200 with the runbook section.
#[tokio::test]
async fn pool_miss_alert_pages_through_alertmanager_with_a_runbook_that_resolves() {
    let prometheus = binary("/usr/bin/prometheus", "prometheus");
    let alertmanager = binary(
        "/usr/bin/prometheus-alertmanager",
        "prometheus-alertmanager",
    );
    let python = binary("/usr/bin/python3", "python3");

    // The library's real metrics, from real traffic.
    let t = metrics_only();
    let handle = t.conntrace();
    let client = |()| {
        handle
            .instrument_client(reqwest::Client::builder())
            .pool_max_idle_per_host(1)
            .build_with_middleware()
            .expect("client")
    };
    let (client_a, client_b) = (client(()), client(()));
    let server_a = TestServer::builder()
        .delay(Duration::from_millis(50))
        .start()
        .await
        .expect("server a");
    let server_b = TestServer::builder()
        .delay(Duration::from_millis(50))
        .start()
        .await
        .expect("server b");
    let (url_a, url_b) = (server_a.url("/"), server_b.url("/"));
    let host_a = server_a.addr().to_string();
    let host_b = server_b.addr().to_string();
    let metrics_listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind metrics");
    let metrics_addr = metrics_listener.local_addr().expect("metrics addr");

    let dir = tempfile::tempdir().expect("temp dir");
    let (prom_port, am_port, pager_port) = (free_port(), free_port(), free_port());
    let runbook_base = format!("http://127.0.0.1:{pager_port}/README.md");

    // rules.yml: only the alerts' `for:`.
    let mut rules = yaml("deploy/prometheus/rules.yml");
    let mut alerts = 0;
    for group in at(&mut rules, "groups").as_sequence_mut().expect("groups") {
        for rule in at(group, "rules").as_sequence_mut().expect("rules") {
            if rule.get("alert").is_some() {
                *at(rule, "for") = "2s".into();
                alerts += 1;
            }
        }
    }
    assert!(alerts >= 2, "rules.yml has the page and warning alerts");
    let rules_path = dir.path().join("rules.yml");
    write_yaml(&rules_path, &rules);

    // prometheus.yml: targets, intervals, rule path.
    let mut prom = yaml("deploy/prometheus/prometheus.yml");
    {
        let global = at(&mut prom, "global");
        *at(global, "scrape_interval") = "1s".into();
        *at(global, "evaluation_interval") = "1s".into();
    }
    *at(&mut prom, "rule_files") = vec![rules_path.display().to_string()].into();
    let alerting = &mut at(at(&mut prom, "alerting"), "alertmanagers")[0];
    *at(&mut at(alerting, "static_configs")[0], "targets") =
        vec![format!("127.0.0.1:{am_port}")].into();
    let scrape = &mut at(&mut prom, "scrape_configs")[0];
    *at(&mut at(scrape, "static_configs")[0], "targets") = vec![metrics_addr.to_string()].into();
    let prom_path = dir.path().join("prometheus.yml");
    write_yaml(&prom_path, &prom);

    // alertmanager.yml: webhook host, group_wait.
    let mut am = yaml("deploy/alertmanager/alertmanager.yml");
    *at(at(&mut am, "route"), "group_wait") = "1s".into();
    let mut webhooks = 0;
    for receiver in at(&mut am, "receivers")
        .as_sequence_mut()
        .expect("receivers")
    {
        for hook in at(receiver, "webhook_configs")
            .as_sequence_mut()
            .expect("webhook_configs")
        {
            let url = at(hook, "url");
            let text = url.as_str().expect("webhook url").to_owned();
            assert!(
                text.contains("pager-log:9095"),
                "webhook {text} is not the compose pager-log"
            );
            *url = text
                .replace("pager-log:9095", &format!("127.0.0.1:{pager_port}"))
                .into();
            webhooks += 1;
        }
    }
    assert_eq!(webhooks, 2, "a page and a ticket webhook");
    let am_path = dir.path().join("alertmanager.yml");
    write_yaml(&am_path, &am);

    let started = Instant::now();
    let mut children = Children::default();
    let pager_log_path = dir.path().join("pager-log.out");
    children.spawn(
        "pager_log.py",
        Command::new(&python)
            .arg("-u")
            .arg(repo_root().join("deploy/alertmanager/pager_log.py"))
            .env("PAGER_LOG_PORT", pager_port.to_string())
            .env("PAGER_LOG_DOCS", repo_root())
            .stdout(std::fs::File::create(&pager_log_path).expect("pager log file"))
            .stderr(Stdio::null()),
    );
    std::fs::create_dir(dir.path().join("am-data")).expect("am dir");
    children.spawn(
        "prometheus-alertmanager",
        Command::new(&alertmanager)
            .arg(format!("--config.file={}", am_path.display()))
            .arg(format!(
                "--storage.path={}",
                dir.path().join("am-data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{am_port}"))
            // No gossip port (9094): a single instance.
            .arg("--cluster.listen-address=")
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
    );
    std::fs::create_dir(dir.path().join("prom-data")).expect("prom dir");
    children.spawn(
        "prometheus",
        Command::new(&prometheus)
            .arg(format!("--config.file={}", prom_path.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("prom-data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{prom_port}"))
            // Prometheus 2 (Debian 12) expands ${RUNBOOK_BASE_URL} in
            // external labels behind this flag; Prometheus 3 (the compose
            // image) always does.
            .arg("--enable-feature=expand-external-labels")
            .env("RUNBOOK_BASE_URL", &runbook_base)
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
    );

    let wait = async {
        let start = Instant::now();
        loop {
            children.assert_running();
            let log = std::fs::read_to_string(&pager_log_path).unwrap_or_default();
            // A misrouted alert fails now, not at the deadline.
            assert_routed_by_severity(&log);
            let page = pager_line(&log, "page", "HttpClientPoolMissRatioHigh", &host_a);
            let ticket = pager_line(&log, "ticket", "HttpClientInFlightAboveIdleLimit", &host_b);
            if let (Some(page), Some(ticket)) = (page, ticket) {
                return (log, page, ticket);
            }
            if start.elapsed() > DEADLINE {
                let prom_alerts = get(&format!("http://127.0.0.1:{prom_port}/api/v1/alerts")).await;
                let am_alerts = get(&format!("http://127.0.0.1:{am_port}/api/v2/alerts")).await;
                panic!(
                    "no page for {host_a} and ticket for {host_b} within {DEADLINE:?}\n\
                     pager-log:\n{log}\nPrometheus alerts: {prom_alerts:?}\n\
                     Alertmanager alerts: {am_alerts:?}\nexposition:\n{}",
                    exposition(&t)
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    };
    let (log, page, ticket) = tokio::select! {
        r = wait => r,
        _ = serve_metrics(metrics_listener, &t) => unreachable!("serves forever"),
        _ = bursts(&client_a, &url_a, 4, Duration::from_millis(100)) => unreachable!("runs forever"),
        _ = bursts(&client_b, &url_b, 3, Duration::from_secs(4)) => unreachable!("runs forever"),
    };
    eprintln!("pager-log after {:?}:\n{log}", started.elapsed());
    assert!(page.contains("severity=page"), "{page}");
    assert!(ticket.contains("severity=warning"), "{ticket}");
    assert_routed_by_severity(&log);
    assert!(
        !log.lines()
            .any(|l| l.starts_with("[page]") && l.contains(&format!("-> {host_b}:"))),
        "host B (under 1 request/s) paged:\n{log}"
    );

    // The runbook link: RUNBOOK_BASE_URL + the README section, and it
    // resolves (the running pager_log.py serves the repository's README).
    let runbook = page
        .rsplit("| runbook: ")
        .next()
        .expect("runbook field")
        .trim();
    assert_eq!(
        runbook,
        format!("{runbook_base}#alerting-on-pool-misses"),
        "{page}"
    );
    let start = Instant::now();
    let (status, body) = loop {
        children.assert_running();
        match get(runbook).await {
            Ok(r) => break r,
            Err(e) if start.elapsed() > Duration::from_secs(10) => {
                panic!("runbook {runbook}: {e}")
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    };
    assert_eq!(status, 200, "runbook {runbook}");
    assert!(
        body.lines()
            .any(|l| l.trim() == "## Alerting on pool misses"),
        "runbook {runbook} has no `## Alerting on pool misses` section"
    );
    drop(children);
}
