//! Wrapping a client changes nothing but the telemetry: each TLS option a
//! user may put on reqwest's builder gives the instrumented client the
//! outcome the plain client has, or `build` names the option; the curl-like
//! trust options of `TlsSettings` (partial chain, insecure) do what curl does.

use conntrace_lab::{HttpVersions, TestPki, TestServer, TlsVersions};
use reqwest::tls::Version;
use reqwest_conntrace::{TlsSettings, semconv};

use crate::support::*;

async fn server(pki: &TestPki, tls: TlsVersions, http: HttpVersions) -> TestServer {
    TestServer::builder()
        .tls(pki)
        .tls_versions(tls)
        .http_versions(http)
        .start()
        .await
        .expect("test server starts")
}

/// The same builder options, once plain (trusting `pki`'s CA through
/// reqwest) and once instrumented (trusting it through `TlsSettings`):
/// whether a GET of `url` succeeds, for each.
async fn outcomes(
    t: &Telemetry,
    pki: &TestPki,
    url: &str,
    options: fn(reqwest::ClientBuilder) -> reqwest::ClientBuilder,
) -> (bool, bool) {
    let ca = reqwest::Certificate::from_der(pki.ca_cert_der().as_ref()).expect("ca");
    let plain = options(reqwest::Client::builder().tls_certs_only([ca]))
        .build()
        .expect("plain client");
    let plain_ok = match plain.get(url).send().await {
        Ok(r) => r.bytes().await.is_ok(),
        Err(_) => false,
    };
    let instrumented = t.client(options(reqwest::Client::builder()), Some(pki));
    let instrumented_ok = match instrumented.get(url).send().await {
        Ok(r) => r.bytes().await.is_ok(),
        Err(_) => false,
    };
    (plain_ok, instrumented_ok)
}

/// `tls_version_min(1.3)` on reqwest's builder: a TLS 1.2-only server
/// fails for both clients, a TLS 1.3 one serves both.
#[tokio::test]
async fn tls_version_min_on_reqwest_builder_is_carried_over() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let t = telemetry();
    let pki = TestPki::localhost().expect("pki");
    let old = server(&pki, TlsVersions::Tls12Only, HttpVersions::Http1Only).await;
    let new = server(&pki, TlsVersions::Tls13Only, HttpVersions::Http1Only).await;
    let min13 = |b: reqwest::ClientBuilder| b.tls_version_min(Version::TLS_1_3);
    assert_eq!(
        outcomes(&t, &pki, &old.url("/"), min13).await,
        (false, false)
    );
    assert_eq!(outcomes(&t, &pki, &new.url("/"), min13).await, (true, true));
}

/// `tls_version_max(1.2)`: both clients speak TLS 1.2 to a server offering
/// both, and the span says 1.2.
#[tokio::test]
async fn tls_version_max_on_reqwest_builder_is_carried_over() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let t = telemetry();
    let pki = TestPki::localhost().expect("pki");
    let both = server(&pki, TlsVersions::Both, HttpVersions::Http1Only).await;
    let max12 = |b: reqwest::ClientBuilder| b.tls_version_max(Version::TLS_1_2);
    assert_eq!(
        outcomes(&t, &pki, &both.url("/"), max12).await,
        (true, true)
    );
    let tls = t.named(semconv::TLS_HANDSHAKE_SPAN);
    assert_eq!(
        str_attr(&tls[0], semconv::TLS_PROTOCOL_VERSION).as_deref(),
        Some("1.2")
    );
}

/// `http2_prior_knowledge` over https against an HTTP/1.1-only server:
/// both clients fail (ALPN offers only `h2`, as reqwest's own config does);
/// against an HTTP/2 server both succeed.
#[tokio::test]
async fn http2_prior_knowledge_on_reqwest_builder_offers_only_h2() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let t = telemetry();
    let pki = TestPki::localhost().expect("pki");
    let h1 = server(&pki, TlsVersions::Tls13Only, HttpVersions::Http1Only).await;
    let h2 = server(&pki, TlsVersions::Tls13Only, HttpVersions::Both).await;
    let prior = |b: reqwest::ClientBuilder| b.http2_prior_knowledge();
    assert_eq!(
        outcomes(&t, &pki, &h1.url("/"), prior).await,
        (false, false)
    );
    assert_eq!(outcomes(&t, &pki, &h2.url("/"), prior).await, (true, true));
}

/// `http2_prior_knowledge` on plain http (h2c): the connection speaks
/// HTTP/2 without ALPN, and its setup span says so, as the request span and
/// the response do (`network.protocol.version = 2`).
#[tokio::test]
async fn h2c_prior_knowledge_connection_says_http2() {
    let t = telemetry();
    let h2c = TestServer::builder()
        .http_versions(HttpVersions::Http2Only)
        .start()
        .await
        .expect("h2c server starts");
    let client = t.client(reqwest::Client::builder().http2_prior_knowledge(), None);
    let response = client.get(h2c.url("/")).send().await.expect("h2c GET");
    assert_eq!(response.version(), reqwest::Version::HTTP_2);
    response.bytes().await.expect("body");
    let setup = t.named(semconv::CONNECTION_SETUP_SPAN);
    assert_eq!(setup.len(), 1);
    assert_eq!(
        str_attr(&setup[0], semconv::NETWORK_PROTOCOL_VERSION).as_deref(),
        Some("2")
    );
    let requests = t.requests();
    assert_eq!(
        str_attr(&requests[0], semconv::NETWORK_PROTOCOL_VERSION).as_deref(),
        Some("2")
    );
}

/// `tls_sni(false)` and `tls_sslkeylogfile(true)` on reqwest's builder no
/// longer fail `build`; requests succeed as with the plain client.
#[tokio::test]
async fn sni_and_key_log_options_on_reqwest_builder_are_carried_over() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let t = telemetry();
    let pki = TestPki::localhost().expect("pki");
    let s = server(&pki, TlsVersions::Tls13Only, HttpVersions::Http1Only).await;
    let no_sni = |b: reqwest::ClientBuilder| b.tls_sni(false);
    assert_eq!(outcomes(&t, &pki, &s.url("/"), no_sni).await, (true, true));
    let key_log = |b: reqwest::ClientBuilder| b.tls_sslkeylogfile(true);
    assert_eq!(outcomes(&t, &pki, &s.url("/"), key_log).await, (true, true));
}

/// `tls_danger_accept_invalid_certs(true)` on reqwest's builder, no CA
/// trusted: both clients get 200; the handshake is still measured and says
/// verification was skipped.
#[tokio::test]
async fn accept_invalid_certs_on_reqwest_builder_is_carried_over_and_visible() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let t = telemetry();
    let pki = TestPki::localhost().expect("pki");
    let s = server(&pki, TlsVersions::Tls13Only, HttpVersions::Http1Only).await;
    let plain = reqwest::Client::builder()
        .tls_danger_accept_invalid_certs(true)
        .build()
        .expect("plain");
    assert_eq!(
        plain.get(s.url("/")).send().await.expect("plain").status(),
        200
    );
    let client = t.client(
        reqwest::Client::builder().tls_danger_accept_invalid_certs(true),
        None,
    );
    assert_eq!(
        client
            .get(s.url("/"))
            .send()
            .await
            .expect("instrumented")
            .status(),
        200
    );
    let tls = &t.named(semconv::TLS_HANDSHAKE_SPAN)[0];
    assert_eq!(
        bool_attr(tls, semconv::HTTP_CONNECTION_TLS_VERIFICATION_SKIPPED),
        Some(true)
    );
    assert!(
        !tls.events
            .iter()
            .any(|e| e.name == semconv::EVENT_TLS_CERTIFICATE_VERIFIED),
        "nothing was verified"
    );
    assert!(duration(tls) > std::time::Duration::ZERO);
}

/// `tls_danger_accept_invalid_hostnames`, which the instrumented client
/// cannot honour, fails `build` naming the option.
#[test]
fn accept_invalid_hostnames_on_reqwest_builder_is_refused_by_name() {
    let err = reqwest_conntrace::ConnTrace::new()
        .instrument_client(reqwest::Client::builder().tls_danger_accept_invalid_hostnames(true))
        .build()
        .expect_err("refused");
    assert!(
        err.to_string()
            .contains("tls_danger_accept_invalid_hostnames"),
        "{err}"
    );
}

/// curl's `--cacert` trust: a leaf certificate trusted as itself (partial
/// chain), and a self-signed `CA:TRUE` certificate used as the server's own.
/// Without `partial_chain` both fail as reqwest does (`UnknownIssuer`,
/// `CaUsedAsEndEntity`).
#[tokio::test]
async fn partial_chain_trusts_a_pinned_leaf_or_self_signed_certificate() {
    let t = telemetry();
    let chained = TestPki::localhost().expect("pki");
    let self_signed = TestPki::self_signed_localhost().expect("pki");
    for pki in [&chained, &self_signed] {
        let s = server(pki, TlsVersions::Tls13Only, HttpVersions::Http1Only).await;
        let pinned = |partial| {
            TlsSettings::new()
                .built_in_roots(false)
                .partial_chain(partial)
                .add_root_certificates_pem(pki.leaf_cert_pem().as_bytes())
                .expect("pem")
        };
        let strict = t
            .conntrace()
            .instrument_client(reqwest::Client::builder())
            .tls(pinned(false))
            .build_with_middleware()
            .expect("client");
        strict
            .get(s.url("/"))
            .send()
            .await
            .expect_err("not a chain");
        let curl_like = t
            .conntrace()
            .instrument_client(reqwest::Client::builder().resolve("other.test", s.addr()))
            .tls(pinned(true))
            .build_with_middleware()
            .expect("client");
        let response = curl_like.get(s.url("/")).send().await.expect("pinned");
        assert_eq!(response.status(), 200);
        // The name is still checked.
        let by_other_name = curl_like
            .get(s.url("/").replace("localhost", "other.test"))
            .send()
            .await;
        assert!(
            by_other_name.is_err(),
            "other.test is not in the certificate"
        );
    }
}

/// A verifier of the user's own (here webpki with the test CA, what
/// reqwest builds for `tls_certs_only` + `add_crl`) is used and wrapped:
/// the request succeeds with the `tls.certificate_verified` event, and the
/// same verifier with another CA rejects with the rejection event.
#[tokio::test]
async fn own_certificate_verifier_is_wrapped_by_the_hooks() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let t = telemetry();
    let pki = TestPki::localhost().expect("pki");
    let other = TestPki::untrusted_other().expect("pki");
    let s = server(&pki, TlsVersions::Tls13Only, HttpVersions::Http1Only).await;
    for (trusted, ok) in [(&pki, true), (&other, false)] {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(trusted.ca_cert_der()).expect("root");
        let verifier = rustls::client::WebPkiServerVerifier::builder(std::sync::Arc::new(roots))
            .build()
            .expect("verifier");
        let client = t
            .conntrace()
            .instrument_client(reqwest::Client::builder())
            .tls(TlsSettings::new().certificate_verifier(verifier))
            .build_with_middleware()
            .expect("client");
        assert_eq!(client.get(s.url("/")).send().await.is_ok(), ok);
    }
    let handshakes = t.named(semconv::TLS_HANDSHAKE_SPAN);
    let event = |name: &str| {
        handshakes
            .iter()
            .filter(|h| h.events.iter().any(|e| e.name == name))
            .count()
    };
    assert_eq!(event(semconv::EVENT_TLS_CERTIFICATE_VERIFIED), 1);
    assert_eq!(event(semconv::EVENT_TLS_CERTIFICATE_REJECTED), 1);
}

/// A key log of the application's own that counts what rustls hands it.
#[derive(Debug, Default)]
struct CountingKeyLog(std::sync::atomic::AtomicUsize);

impl rustls::KeyLog for CountingKeyLog {
    fn log(&self, _label: &str, _client_random: &[u8], _secret: &[u8]) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
    fn will_log(&self, _label: &str) -> bool {
        true
    }
}

impl CountingKeyLog {
    fn count(&self) -> usize {
        self.0.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// The application's rustls `ClientConfig`: roots of `pki` when `trusted`,
/// rustls' default session cache, `key_log` as its key log.
fn own_config(
    pki: &TestPki,
    trusted: bool,
    key_log: std::sync::Arc<CountingKeyLog>,
) -> rustls::ClientConfig {
    let mut roots = rustls::RootCertStore::empty();
    if trusted {
        roots.add(pki.ca_cert_der()).expect("root");
    }
    let mut config = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.key_log = key_log;
    config
}

/// Every error's text in the chain, joined.
fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// One server with `versions`: the plain client with the application's
/// config, then the instrumented one twice (a full handshake, a resumed one).
async fn own_config_served(
    pki: &TestPki,
    versions: TlsVersions,
    version: &str,
    expected_events: &[&str],
) {
    let t = telemetry();
    let s = server(pki, versions, HttpVersions::Http1Only).await;
    let url = s.url("/");
    let plain_log = std::sync::Arc::new(CountingKeyLog::default());
    let plain = reqwest::Client::builder()
        .tls_backend_preconfigured(own_config(pki, true, plain_log.clone()))
        .build()
        .expect("plain client");
    let plain_status = plain
        .get(&url)
        .send()
        .await
        .expect("plain request")
        .status();
    assert_eq!(plain_status, 200);
    assert!(plain_log.count() > 0, "the plain client logs the secrets");

    let log = std::sync::Arc::new(CountingKeyLog::default());
    // No idle pool: the second request needs a second connection.
    let client = t
        .conntrace()
        .instrument_client(reqwest::Client::builder())
        .pool_max_idle_per_host(0)
        .tls(TlsSettings::from_rustls_config(own_config(
            pki,
            true,
            log.clone(),
        )))
        .build_with_middleware()
        .expect("client");
    for _ in 0..2 {
        let response = client.get(&url).send().await.expect("request");
        assert_eq!(response.status(), plain_status);
        response.bytes().await.expect("body");
    }
    assert_eq!(
        log.count(),
        2 * plain_log.count(),
        "the config's key log gets what the plain client's gets, per handshake"
    );
    assert_eq!(s.tls_handshakes(), 3);
    assert_eq!(s.tls_resumed_handshakes(), 1, "the config's session store");

    let mut handshakes = t.named(semconv::TLS_HANDSHAKE_SPAN);
    handshakes.sort_by_key(|h| h.start_time);
    assert_eq!(handshakes.len(), 2);
    let events = |h: &opentelemetry_sdk::trace::SpanData| -> Vec<String> {
        h.events.iter().map(|e| e.name.to_string()).collect()
    };
    let full = &handshakes[0];
    assert!(duration(full) > std::time::Duration::ZERO);
    assert_eq!(events(full), expected_events, "{full:#?}");
    assert!(
        full.events
            .iter()
            .all(|e| e.timestamp >= full.start_time && e.timestamp <= full.end_time)
    );
    assert_eq!(bool_attr(full, semconv::TLS_RESUMED), Some(false));
    assert_eq!(
        str_attr(full, semconv::TLS_PROTOCOL_VERSION).as_deref(),
        Some(version)
    );
    let resumed = &handshakes[1];
    assert_eq!(
        bool_attr(resumed, semconv::TLS_RESUMED),
        Some(true),
        "{resumed:#?}"
    );
    assert!(!events(resumed).contains(&semconv::EVENT_TLS_CERTIFICATE_VERIFIED.to_owned()));
    // TLS starts where TCP ends.
    let tcp = t.named(semconv::TCP_CONNECT_SPAN);
    assert_eq!(tcp.len(), 2);
    for (tcp, tls) in tcp.iter().zip(&handshakes) {
        assert!(tcp.end_time <= tls.start_time);
    }
}

/// The application's own rustls `ClientConfig` (its CA, its key log,
/// rustls' default session cache) through `TlsSettings::from_rustls_config`
/// gets the status the plain reqwest client with that config gets (200),
/// with a timed `tls.handshake` (ServerHello, verification, Finished);
/// the config's key log still receives the secrets, and the second
/// connection resumes from the config's own session store (the server
/// counts one resumed handshake). Without the CA in the config both
/// clients fail the same way (`UnknownIssuer`), and the span shows the
/// rejection.
#[tokio::test]
async fn own_rustls_client_config_keeps_its_trust_and_gets_the_hooks() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let pki = TestPki::localhost().expect("pki");
    // TLS 1.2 has no ServerHello or Finished marks (its key schedule logs
    // only `CLIENT_RANDOM`, at the end).
    for (versions, version, expected_events) in [
        (
            TlsVersions::Tls13Only,
            "1.3",
            &[
                semconv::EVENT_TLS_SERVER_HELLO,
                semconv::EVENT_TLS_CERTIFICATE_VERIFIED,
                semconv::EVENT_TLS_SERVER_FINISHED,
            ][..],
        ),
        (
            TlsVersions::Tls12Only,
            "1.2",
            &[semconv::EVENT_TLS_CERTIFICATE_VERIFIED][..],
        ),
    ] {
        own_config_served(&pki, versions, version, expected_events).await;
    }
    let t = telemetry();
    let s = server(&pki, TlsVersions::Tls13Only, HttpVersions::Http1Only).await;
    let url = s.url("/");

    // Without the CA: both fail, with the same cause.
    let plain = reqwest::Client::builder()
        .tls_backend_preconfigured(own_config(&pki, false, Default::default()))
        .build()
        .expect("plain client");
    let plain_error = chain(&plain.get(&url).send().await.expect_err("untrusted"));
    let client = t
        .conntrace()
        .instrument_client(reqwest::Client::builder())
        .tls(TlsSettings::from_rustls_config(own_config(
            &pki,
            false,
            Default::default(),
        )))
        .build_with_middleware()
        .expect("client");
    let error = chain(&client.get(&url).send().await.expect_err("untrusted"));
    assert!(plain_error.contains("UnknownIssuer"), "{plain_error}");
    assert!(error.contains("UnknownIssuer"), "{error}");
    let rejected = t
        .named(semconv::TLS_HANDSHAKE_SPAN)
        .into_iter()
        .filter(|h| {
            h.events
                .iter()
                .any(|e| e.name == semconv::EVENT_TLS_CERTIFICATE_REJECTED)
        })
        .count();
    assert_eq!(rejected, 1);

    // No other TlsSettings option goes with it.
    let err = t
        .conntrace()
        .instrument_client(reqwest::Client::builder())
        .tls(TlsSettings::from_rustls_config(own_config(&pki, true, Default::default())).sni(false))
        .build()
        .expect_err("mixed settings");
    assert!(err.to_string().contains("from_rustls_config"), "{err}");
}

/// A redirect to a port nobody listens on: the call fails as it does with
/// reqwest following the redirect itself (an uninstrumented client, same
/// URL): a connect error naming the call's own URL (reqwest sets the
/// request's URL on an error that carries none), not the hop's.
/// Regression: the error named the hop's URL.
#[tokio::test]
async fn a_failed_redirect_hop_fails_the_call_as_reqwest_does() {
    let server = TestServer::builder()
        .http_versions(HttpVersions::Http1Only)
        .start()
        .await
        .expect("server");
    let refused = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr").port()
    };
    let url = format!("http://{}/redirect/127.0.0.1:{refused}/x", server.addr());
    let _ = rustls::crypto::ring::default_provider().install_default();
    let plain = reqwest::Client::new()
        .get(&url)
        .send()
        .await
        .expect_err("refused");
    let t = telemetry();
    let client = t.client(reqwest::Client::builder(), None);
    let err = client.get(&url).send().await.expect_err("refused");
    let reqwest_middleware::Error::Reqwest(ours) = &err else {
        panic!("a reqwest error, as without the middleware: {err:?}");
    };
    assert_eq!(
        (ours.url(), ours.is_connect(), ours.is_redirect()),
        (plain.url(), plain.is_connect(), plain.is_redirect()),
        "ours {ours:?}, reqwest's {plain:?}"
    );
    assert_eq!(ours.url().map(|u| u.as_str()), Some(url.as_str()));
    assert_eq!(server.request_count(), 2, "the redirect, once per client");
}
