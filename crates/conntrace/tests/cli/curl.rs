//! The CLI behaves like curl for the cases a curl user meets first: what
//! `--cacert` trusts, `-k`, plain HTTP to a TLS port, `--http2` against a
//! server without HTTP/2, a CA not given; exit 2 for a bad command line; and
//! no secret of the URL in the JSON, the messages or the traces file.

use std::process::Output;

use conntrace_lab::{HttpVersions, TestPki, TestServer, TlsVersions};

use super::{conntrace, run, stderr};

async fn https_server(pki: &TestPki, http: HttpVersions) -> TestServer {
    TestServer::builder()
        .tls(pki)
        .tls_versions(TlsVersions::Tls13Only)
        .http_versions(http)
        .start()
        .await
        .expect("test server starts")
}

/// `conntrace probe URL --requests 1` plus `extra`.
async fn probe(url: &str, extra: &[&str]) -> Output {
    let mut cmd = conntrace();
    cmd.args(["probe", url, "--requests", "1", "--mode", "fresh"])
        .args(extra);
    run(cmd).await
}

fn write(dir: &std::path::Path, name: &str, pem: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, pem).expect("write pem");
    path.display().to_string()
}

/// One `error:` line on stderr, exit 1, naming `cause` and `fix`.
fn assert_cause_and_fix(out: &Output, cause: &str, fix: &str) {
    let err = stderr(out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "one line: {err:?}");
    assert!(lines[0].contains(cause), "cause {cause:?} in {err:?}");
    assert!(lines[0].contains(fix), "fix {fix:?} in {err:?}");
}

/// `--cacert` holding the server's own certificate: a self-signed
/// `CA:TRUE` one (`openssl req -x509`) and a leaf (partial chain) are
/// trusted, as curl trusts them.
#[tokio::test]
async fn cacert_trusts_a_pinned_self_signed_or_leaf_certificate() {
    let dir = tempfile::tempdir().expect("tempdir");
    let self_signed = TestPki::self_signed_localhost().expect("pki");
    let chained = TestPki::localhost().expect("pki");
    for (name, pki) in [("self-signed.pem", &self_signed), ("leaf.pem", &chained)] {
        let server = https_server(pki, HttpVersions::Http1Only).await;
        let pem = write(dir.path(), name, pki.leaf_cert_pem());
        let out = probe(&server.url("/"), &["--cacert", &pem]).await;
        assert!(out.status.success(), "{name}: {}", stderr(&out));
    }
}

/// `-k`: an untrusted certificate is accepted; without it the error names
/// the cause and both fixes (`--cacert`, `-k`).
#[tokio::test]
async fn insecure_accepts_and_a_missing_ca_names_the_fix() {
    let pki = TestPki::localhost().expect("pki");
    let server = https_server(&pki, HttpVersions::Http1Only).await;
    let out = probe(&server.url("/"), &["-k"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let out = probe(&server.url("/"), &["--insecure", "--json"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let out = probe(&server.url("/"), &[]).await;
    assert_cause_and_fix(&out, "UnknownIssuer", "--cacert");
    assert!(stderr(&out).contains("-k"), "{}", stderr(&out));
}

/// A certificate that does not name the host asked for (the IP literal of a
/// server whose leaf names only `localhost`): the cause in rustls' words
/// and the fix.
#[tokio::test]
async fn a_certificate_for_another_name_names_the_fix() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pki = TestPki::generate(&["localhost"]).expect("pki");
    let ca = write(dir.path(), "ca.pem", pki.ca_cert_pem());
    let server = https_server(&pki, HttpVersions::Http1Only).await;
    let out = probe(&server.url("/"), &["--cacert", &ca]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let out = probe(&server.ip_url("/"), &["--cacert", &ca]).await;
    assert_cause_and_fix(&out, "not valid for name", "does not name this host");
}

/// `--html` on a probe whose first request fails: the page is written
/// from the spans that were exported, the failed request included.
#[tokio::test]
async fn a_failed_probe_still_writes_its_page() {
    let dir = tempfile::tempdir().expect("tempdir");
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    drop(listener);
    let page = dir.path().join("failed.html");
    let page_arg = page.display().to_string();
    let out = probe(&format!("http://127.0.0.1:{port}/"), &["--html", &page_arg]).await;
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("connection refused"),
        "{}",
        stderr(&out)
    );
    let html = std::fs::read_to_string(&page).expect("page written");
    assert!(
        html.contains("connection_refused"),
        "the failed request's error.type is on the page"
    );
}

/// `http://` to a TLS port, and `--http2` against servers without HTTP/2
/// (over TLS: ALPN; over plain HTTP: h2c): one line naming cause and fix.
#[tokio::test]
async fn protocol_mismatches_name_cause_and_fix() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pki = TestPki::localhost().expect("pki");
    let ca = write(dir.path(), "ca.pem", pki.ca_cert_pem());
    let tls = https_server(&pki, HttpVersions::Http1Only).await;
    let plain_url = tls.url("/").replace("https://", "http://");
    let out = probe(&plain_url, &[]).await;
    assert_cause_and_fix(&out, "invalid HTTP version", "use https://");
    let out = probe(&tls.url("/"), &["--cacert", &ca, "--http2"]).await;
    assert_cause_and_fix(&out, "NoApplicationProtocol", "drop --http2");
    let h1 = TestServer::builder()
        .http_versions(HttpVersions::Http1Only)
        .start()
        .await
        .expect("server");
    let out = probe(&h1.url("/"), &["--http2"]).await;
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("drop --http2"), "{err}");
}

/// `http://` to nginx's TLS port, which answers `400` ("The plain HTTP
/// request was sent to HTTPS port") instead of failing: nothing that was
/// asked is probed, so the request fails in one line naming cause and fix,
/// as against a TLS server that fails it; nginx logged that 400.
#[tokio::test]
async fn nginxs_400_for_plain_http_on_its_tls_port_names_the_fix() {
    let pki = TestPki::localhost().expect("pki");
    let nginx = super::start_nginx(conntrace_lab::NginxConfig::new(&pki)).await;
    let url = nginx
        .url(conntrace_lab::NginxListener::Tls13, "/")
        .expect("url")
        .replace("https://", "http://");
    let out = probe(&url, &[]).await;
    assert_cause_and_fix(
        &out,
        "HTTP 400 from the server: the plain HTTP request reached its TLS port",
        "use https://",
    );
    let log = nginx
        .wait_for_access_log(1, std::time::Duration::from_secs(5))
        .await;
    assert_eq!(log.len(), 1, "{log:?}");
    assert_eq!(log[0].status, 400, "{log:?}");
}

/// `http://` to a TLS server that closes without an alert (as OpenSSL's
/// `s_server` does on a plain HTTP request): the fix still says https://;
/// the same close on an `https://` URL does not.
#[tokio::test]
async fn a_silent_close_on_plain_http_suggests_https() {
    use tokio::io::AsyncReadExt;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let closer = tokio::spawn(async move {
        // Read the request (or ClientHello), then close without a byte.
        loop {
            let Ok((mut socket, _)) = listener.accept().await else {
                return;
            };
            let mut buf = [0u8; 1024];
            let _ = socket.read(&mut buf).await;
        }
    });
    let out = probe(&format!("http://127.0.0.1:{port}/"), &[]).await;
    assert_cause_and_fix(
        &out,
        "connection closed before message completed",
        "use https://",
    );
    let out = probe(&format!("https://127.0.0.1:{port}/"), &[]).await;
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(!stderr(&out).contains("use https://"), "{}", stderr(&out));
    closer.abort();
}

/// `--http2` against a server that reads the HTTP/2 preface as the start of
/// an HTTP/1.1 request and waits for the rest (as OpenSSL's `s_server` does
/// behind a TLS handshake that ignores ALPN): the timeout names the fix;
/// the same timeout without `--http2` does not.
#[tokio::test]
async fn http2_timeout_against_a_waiting_server_names_the_fix() {
    use tokio::io::AsyncReadExt;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let waiter = tokio::spawn(async move {
        let mut open = Vec::new();
        loop {
            let Ok((mut socket, _)) = listener.accept().await else {
                return;
            };
            let mut buf = [0u8; 1024];
            let _ = socket.read(&mut buf).await;
            open.push(socket);
        }
    });
    let url = format!("http://127.0.0.1:{port}/");
    let out = probe(&url, &["--http2", "--timeout", "1"]).await;
    assert_cause_and_fix(&out, "timed out", "without --http2");
    let out = probe(&url, &["--timeout", "1"]).await;
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(!stderr(&out).contains("--http2"), "{}", stderr(&out));
    waiter.abort();
}

/// A bad URL and an unknown lab scenario are bad command lines: exit 2,
/// one line pointing to `--help`, like clap's own errors.
#[tokio::test]
async fn bad_url_and_unknown_scenario_exit_2() {
    let out = probe("not a url", &[]).await;
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("conntrace probe --help"));
    // A mistyped URL is echoed without its secrets.
    let out = probe(
        "https://S3CRETu:S3CRETp@localhost:99999/?token=S3CRETt&x=1#access_token=S3CRETf",
        &[],
    )
    .await;
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("token=REDACTED"), "{}", stderr(&out));
    assert!(!stderr(&out).contains("S3CRET"), "{}", stderr(&out));
    let mut cmd = conntrace();
    cmd.args(["lab", "no-such-scenario"]);
    let out = run(cmd).await;
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("conntrace lab --help"));
    let mut cmd = conntrace();
    cmd.args([
        "probe",
        "https://localhost:1/",
        "--cacert",
        "/no/such/ca.pem",
    ]);
    let out = run(cmd).await;
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
}

/// A URL with secrets in the user info and in signed-URL and token
/// parameters: neither `--json`, nor stderr, nor the traces file holds
/// them, on success and on a failure.
#[tokio::test]
async fn no_secret_in_json_messages_or_traces_file() {
    const MARK: &str = "S3CRETx";
    let dir = tempfile::tempdir().expect("tempdir");
    let pki = TestPki::localhost().expect("pki");
    let ca = write(dir.path(), "ca.pem", pki.ca_cert_pem());
    let server = https_server(&pki, HttpVersions::Http1Only).await;
    let query = format!(
        "?X-Amz-Signature={MARK}1&X-Amz-Credential={MARK}2&sig={MARK}3&access_token={MARK}4&X-Goog-Credential={MARK}5&page=1"
    );
    let port = server.addr().port();
    let good = format!("https://{MARK}u:{MARK}p@localhost:{port}/{query}");
    let bad = format!("https://{MARK}u:{MARK}p@localhost:{port}/{query}");
    for (url, trust) in [(good, true), (bad, false)] {
        let traces = dir.path().join("traces.json");
        let traces_arg = traces.display().to_string();
        let mut args = vec!["--json", "--traces-out", &traces_arg];
        if trust {
            args.extend(["--cacert", &ca]);
        }
        let out = probe(&url, &args).await;
        assert_eq!(out.status.success(), trust, "{}", stderr(&out));
        let file = std::fs::read_to_string(&traces).expect("traces file written");
        assert!(
            file.contains("REDACTED"),
            "url.full is in the file, redacted"
        );
        for (what, text) in [
            ("stdout", String::from_utf8_lossy(&out.stdout).into_owned()),
            ("stderr", stderr(&out)),
            ("traces file", file),
        ] {
            assert!(!text.contains(MARK), "{what} leaks a secret: {text}");
        }
    }
}
