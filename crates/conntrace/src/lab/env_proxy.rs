//! Scenario `env-proxy`: a proxy taken from the environment, the way most
//! deployments set one (`HTTPS_PROXY`, which reqwest reads by default). The
//! environment must be set before the process starts, so each run is a
//! `conntrace probe` child process with `HTTPS_PROXY` pointing at the lab's
//! CONNECT proxy, exporting its spans to the scenario's OTLP receiver,
//! which hands them on to the lab's own outputs (traces file, page,
//! collector), and its metrics to the lab's collector (without one: to the
//! receiver, and from there into the lab's metrics file):
//! - a working tunnel: the setup span is proxied, names the proxy
//!   (`http.connection.proxy.address` / `.port`), has a `proxy.connect`
//!   phase, and no false `dns_skipped = override`;
//! - a proxy answering `CONNECT` with `407`: `error.type =
//!   proxy_auth_required` on the request, the setup and the failed
//!   `proxy.connect` phase (which carries the status code);
//! - a proxy answering `502` (its upstream connect failed):
//!   `proxy_connect_refused`.
//!
//! The proxy's own `CONNECT` log is the truth the spans are compared with.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use anyhow::Context as _;
use conntrace_lab::{ConnectProxy, OtlpReceiver, TestPki};
use reqwest_conntrace::semconv;

use super::net;
use super::report::Outcome;
use super::runner::Lab;
use super::text::requests_table;
use super::view::{RunView, Spans};

/// The target's name (resolved by the proxy, not the client).
const HOST: &str = "localhost";
/// The working tunnel's run.
const RUN_TUNNEL: &str = "HTTPS_PROXY, tunnel open";
/// The 407 run.
const RUN_407: &str = "HTTPS_PROXY answering 407";
/// The 502 run.
const RUN_502: &str = "HTTPS_PROXY answering 502";
/// Longest a child probe may take.
const CHILD_DEADLINE: Duration = Duration::from_secs(30);

/// Runs `conntrace probe url -n 1 --mode reuse` with `HTTPS_PROXY=proxy`
/// and every other proxy variable removed, exporting its spans to
/// `receiver` (its metrics to the lab's collector, or without one to
/// `receiver` too); returns the spans it exported, once taken into the
/// lab's outputs with its last metrics collection.
async fn probe_through(
    lab: &mut Lab,
    receiver: &OtlpReceiver,
    proxy: &str,
    url: &str,
    cacert: &std::path::Path,
) -> anyhow::Result<Spans> {
    receiver.clear();
    let exe = std::env::current_exe().context("cannot find the conntrace binary")?;
    let mut command = tokio::process::Command::new(exe);
    command
        .args([
            "probe", url, "-n", "1", "--mode", "reuse", "--json", "--cacert",
        ])
        .arg(cacert)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true);
    for name in [
        "ALL_PROXY",
        "all_proxy",
        "HTTP_PROXY",
        "http_proxy",
        "https_proxy",
        "NO_PROXY",
        "no_proxy",
    ] {
        command.env_remove(name);
    }
    // Its spans go to the receiver: the lab reads them, then hands them on
    // to its own outputs.
    command
        .env("HTTPS_PROXY", proxy)
        .env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", receiver.endpoint())
        .env("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "grpc");
    // Its metrics go to the lab's collector directly when there is one
    // (the child reads the variables the lab read), else to the receiver,
    // for the lab's metrics file.
    let collector = crate::telemetry::otlp_endpoint().is_some();
    if !collector {
        command
            .env("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", receiver.endpoint())
            .env("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", "grpc");
    }
    // Its exit status is the probe's verdict on the request (1 when it
    // failed, as it must here); the spans are what the lab reads.
    tokio::time::timeout(CHILD_DEADLINE, command.status())
        .await
        .context("the conntrace probe child did not finish in 30 s")?
        .context("cannot run conntrace probe")?;
    if let Some(metrics) = receiver.last_metrics_export().filter(|_| !collector) {
        lab.add_child_metrics(metrics);
    }
    let spans = receiver.spans();
    lab.add_child_spans(&spans).await;
    Ok(Spans::new(spans))
}

/// The probe child's requests as a run named `name`.
fn view(spans: &Spans, name: &str) -> RunView {
    spans.run_under(name, |s| s.attr_str("conntrace.probe.mode").is_some())
}

/// A port nothing listens on (bound, then released).
fn dead_port() -> anyhow::Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").context("cannot bind")?;
    Ok(listener.local_addr().context("no local address")?.port())
}

/// Runs the scenario.
pub(super) async fn run(lab: &mut Lab) -> anyhow::Result<Outcome> {
    let pki: TestPki = net::pki(HOST)?;
    let server = net::start(net::https_server(&pki)).await?;
    let receiver = OtlpReceiver::start()
        .await
        .context("cannot start the OTLP receiver")?;
    let cacert = CaFile::write(&pki)?;
    let url = format!("https://{HOST}:{}/", server.addr().port());
    let dead_url = format!("https://{HOST}:{}/", dead_port()?);

    let open = ConnectProxy::start()
        .await
        .context("cannot start the CONNECT proxy")?;
    let mut tunnel = view(
        &probe_through(lab, &receiver, &open.url(), &url, &cacert.0).await?,
        RUN_TUNNEL,
    );
    let auth = ConnectProxy::start_refusing(reqwest::StatusCode::PROXY_AUTHENTICATION_REQUIRED)
        .await
        .context("cannot start the refusing proxy")?;
    let mut refused_407 = view(
        &probe_through(lab, &receiver, &auth.url(), &url, &cacert.0).await?,
        RUN_407,
    );
    let mut refused_502 = view(
        &probe_through(lab, &receiver, &open.url(), &dead_url, &cacert.0).await?,
        RUN_502,
    );

    let log = open.connect_log();
    let count = |log: &[conntrace_lab::ConnectRecord], status: u16| {
        log.iter().filter(|r| r.status == status).count() as u64
    };
    tunnel
        .counters
        .insert("proxy_connects_answered_200".into(), count(&log, 200));
    tunnel
        .counters
        .insert("server_accepted".into(), server.accepted_connections());
    refused_407.counters.insert(
        "proxy_connects_answered_407".into(),
        count(&auth.connect_log(), 407),
    );
    refused_502
        .counters
        .insert("proxy_connects_answered_502".into(), count(&log, 502));

    let proxy_port = |p: &ConnectProxy| i64::from(p.addr().port());
    let reproduced = check_tunnel(&tunnel, proxy_port(&open))
        .and_then(|()| {
            check_refused(
                &refused_407,
                semconv::ERROR_TYPE_PROXY_AUTH_REQUIRED,
                Some(407),
                proxy_port(&auth),
            )
        })
        .and_then(|()| {
            check_refused(
                &refused_502,
                semconv::ERROR_TYPE_PROXY_CONNECT_REFUSED,
                None,
                proxy_port(&open),
            )
        });
    let findings = vec![
        format!(
            "with HTTPS_PROXY set (reqwest reads it by default): {}",
            describe(&tunnel)
        ),
        format!(
            "a proxy answering CONNECT with 407 (its log: {} answered 407): {}",
            count(&auth.connect_log(), 407),
            describe(&refused_407)
        ),
        format!(
            "a proxy answering CONNECT with 502, its upstream connect having failed (its log: {} answered 502): {}",
            count(&log, 502),
            describe(&refused_502)
        ),
    ];
    Ok(Outcome {
        config: serde_json::json!({
            "url": url,
            "unreachable_url": dead_url,
            "proxy": open.url(),
            "refusing_proxy": auth.url(),
        }),
        tables: vec![
            requests_table(format!("run: {RUN_TUNNEL}"), &tunnel),
            requests_table(format!("run: {RUN_407}"), &refused_407),
            requests_table(format!("run: {RUN_502}"), &refused_502),
        ],
        runs: vec![tunnel, refused_407, refused_502],
        findings,
        fix: None,
        reproduced,
    })
}

/// One line: the request's result and its setup span's proxy facts.
fn describe(run: &RunView) -> String {
    let request = run.requests.first();
    let setup = run.connections.first();
    format!(
        "request {}, setup span proxied = {}, proxy {}:{}, dns_skipped {}, proxy.connect {}",
        request
            .map(|r| match (&r.error_type, r.status) {
                (Some(e), _) => format!("failed with error.type = {e}"),
                (None, Some(s)) => format!("answered {s}"),
                (None, None) => "without result".to_owned(),
            })
            .unwrap_or_else(|| "missing".to_owned()),
        setup.is_some_and(|c| c.proxied),
        setup
            .and_then(|c| c.proxy_address.as_deref())
            .unwrap_or("?"),
        setup
            .and_then(|c| c.proxy_port)
            .map_or("?".to_owned(), |p| p.to_string()),
        setup.and_then(|c| c.dns_skipped.as_deref()).unwrap_or("-"),
        setup
            .and_then(|c| c.proxy_connect.first())
            .map(|p| match (&p.error_type, p.status) {
                (Some(e), Some(s)) => format!("failed: {e}, status {s}"),
                (Some(e), None) => format!("failed: {e}"),
                (None, _) => format!("{:.1} ms", p.ms),
            })
            .unwrap_or_else(|| "absent".to_owned()),
    )
}

fn check_tunnel(run: &RunView, proxy_port: i64) -> Result<(), String> {
    let Some(c) = run.connections.first() else {
        return Err(format!("{}: no setup span", run.name));
    };
    if !run.requests.first().is_some_and(|r| r.ok()) {
        return Err(format!("{}: the request failed", run.name));
    }
    if !c.proxied || c.proxy_port != Some(proxy_port) || c.proxy_connect.len() != 1 {
        return Err(format!(
            "{}: proxied = {}, proxy port {:?} (expected {proxy_port}), {} proxy.connect span(s)",
            run.name,
            c.proxied,
            c.proxy_port,
            c.proxy_connect.len()
        ));
    }
    if c.dns_skipped.as_deref() == Some(semconv::DNS_SKIPPED_OVERRIDE) {
        return Err(format!(
            "{}: dns_skipped = override, but no override exists",
            run.name
        ));
    }
    Ok(())
}

fn check_refused(
    run: &RunView,
    error_type: &str,
    status: Option<i64>,
    proxy_port: i64,
) -> Result<(), String> {
    let Some(r) = run.requests.first() else {
        return Err(format!("{}: no request span", run.name));
    };
    let Some(c) = run.connections.first() else {
        return Err(format!("{}: no setup span", run.name));
    };
    let phase = c.proxy_connect.first();
    let ok = r.error_type.as_deref() == Some(error_type)
        && c.error_type.as_deref() == Some(error_type)
        && c.proxy_port == Some(proxy_port)
        && phase.is_some_and(|p| p.error_type.as_deref() == Some(error_type) && p.status == status);
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{}: request error.type {:?}, setup error.type {:?}, proxy port {:?}, proxy.connect {:?} (expected {error_type}, port {proxy_port}, status {status:?})",
            run.name,
            r.error_type,
            c.error_type,
            c.proxy_port,
            phase.map(|p| (&p.error_type, p.status))
        ))
    }
}

/// The lab CA written to a temporary file for the child's `--cacert`;
/// removed on drop.
struct CaFile(PathBuf);

impl CaFile {
    fn write(pki: &TestPki) -> anyhow::Result<Self> {
        let path = std::env::temp_dir().join(format!(
            "conntrace-lab-env-proxy-{}.pem",
            std::process::id()
        ));
        std::fs::write(&path, pki.ca_cert_pem())
            .with_context(|| format!("cannot write {}", path.display()))?;
        Ok(Self(path))
    }
}

impl Drop for CaFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}
