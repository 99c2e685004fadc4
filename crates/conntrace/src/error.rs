//! One-line descriptions of errors for stderr and the `error` fields of
//! `--json` output.

use std::error::Error as StdError;

use reqwest_conntrace::UrlRedaction;

/// A bad command line found after parsing (a URL that is not one, an
/// unknown scenario, an unreadable `--cacert`): `main` prints it as one
/// line pointing to `--help` and exits 2, as for clap's own errors.
#[derive(Debug)]
pub(crate) struct Usage(pub(crate) String);

impl std::fmt::Display for Usage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl StdError for Usage {}

/// Marks `err` as a bad command line (exit 2); its one-line text is kept.
pub(crate) fn usage(err: anyhow::Error) -> anyhow::Error {
    anyhow::Error::new(Usage(anyhow_line(&err)))
}

/// The error's text and its sources, `": "`-joined, each source's text
/// left out when an outer message already contains it; redacted by the
/// library's one redaction (reqwest errors rebuilt from their redacted URL).
pub(crate) fn chain_text(err: &(dyn StdError + 'static)) -> String {
    one_line(&UrlRedaction::new().error_text(err))
}

/// An `anyhow` error as one line (context first, then causes), every URL
/// in it redacted.
pub(crate) fn anyhow_line(err: &anyhow::Error) -> String {
    let mut text = err.to_string();
    for cause in err.chain().skip(1) {
        let s = cause.to_string();
        if !s.is_empty() && !text.contains(&s) {
            text.push_str(": ");
            text.push_str(&s);
        }
    }
    one_line(&UrlRedaction::new().redact_text(&text))
}

/// Collapses line breaks so a message stays on one line.
pub(crate) fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// A failed request as one line: a plain-words lead from the library's
/// `error.type` classification, then the error chain. `proxy`: the proxy
/// (`host:port`) the request's own failed connect went to, named first,
/// since the chain names only the target's URL.
pub(crate) fn request_failure(
    err: &(dyn StdError + 'static),
    error_type: Option<&str>,
    proxy: Option<&str>,
) -> String {
    let lead = match error_type {
        Some("dns_error") => Some("cannot resolve the host name"),
        Some("connection_refused") => Some("connection refused"),
        Some("connection_reset") => Some("connection reset by the peer"),
        Some("incomplete_body") => Some("the server closed the connection mid-body"),
        Some("tls_certificate_invalid") => Some("the server's certificate was rejected"),
        Some("tls_error") => Some("TLS handshake failed"),
        Some("timeout") => Some("timed out"),
        Some("proxy_auth_required") => Some("the proxy asks for credentials (407)"),
        Some("proxy_connect_refused") => Some("the proxy refused the CONNECT tunnel"),
        Some("proxy_connect_failed") => Some(
            "the proxy gave no usable answer to CONNECT (it closed first, or its headers passed 8 KiB)",
        ),
        _ => None,
    };
    let chain = chain_text(err);
    let text = match (lead, proxy) {
        (Some(lead), Some(p)) => format!("through the proxy {p}: {lead}: {chain}"),
        (None, Some(p)) => format!("through the proxy {p}: {chain}"),
        (Some(lead), None) => format!("{lead}: {chain}"),
        (None, None) => chain,
    };
    let fix = fix(&text).or_else(|| {
        // A TLS server that reads a plain HTTP request as a broken
        // ClientHello may close without an alert (OpenSSL's `s_server`
        // does; curl says "Empty reply from server").
        (text.contains("connection closed before message completed") && is_plain_http(err))
            .then_some(
                "the server closed the connection without an answer; if that port speaks TLS, use https://",
            )
    })
    .or_else(|| {
        // The proxy itself failed: the target was never asked.
        proxy?;
        match error_type? {
            "proxy_auth_required" => Some(
                "give the proxy's credentials as the user and password of its URL (or check the ones given there)",
            ),
            "proxy_connect_refused" => Some(
                "the proxy would not open a tunnel to this host (its status is in the proxy's log; hyper-util keeps none); check the proxy's rules for this host and port, or list the host in NO_PROXY to go direct",
            ),
            "connection_refused" | "connection_reset" | "dns_error" | "timeout"
            | "proxy_connect_failed" => Some(
                "check the proxy (HTTPS_PROXY, HTTP_PROXY, ALL_PROXY or the client's proxy setting), or list the host in NO_PROXY to go direct",
            ),
            _ => None,
        }
    });
    match fix {
        Some(fix) => format!("{text}; fix: {fix}"),
        None => text,
    }
}

/// Whether the failed request's URL (from the `reqwest::Error` in the
/// chain) is `http://`.
fn is_plain_http(err: &(dyn StdError + 'static)) -> bool {
    let mut current = Some(err);
    while let Some(e) = current {
        let reqwest = match e.downcast_ref::<reqwest_middleware::Error>() {
            Some(reqwest_middleware::Error::Reqwest(r)) => Some(r),
            _ => e.downcast_ref::<reqwest::Error>(),
        };
        if let Some(url) = reqwest.and_then(reqwest::Error::url) {
            return url.scheme() == "http";
        }
        current = e.source();
    }
    false
}

/// What to do about a failed request, from its error text: the causes a
/// curl user meets (plain HTTP to a TLS port, HTTP/2 forced on a server
/// without it, a certificate not trusted here).
fn fix(text: &str) -> Option<&'static str> {
    const CAUSES: &[(&str, &str)] = &[
        (
            "invalid HTTP version parsed",
            "the server did not answer in HTTP/1.x; if that port speaks TLS, use https://",
        ),
        // The reverse: https:// to a port that speaks plain HTTP. Its
        // answer to the ClientHello (`HTTP/1.1 400 ...`) is not a TLS
        // record; rustls 0.23 names the record's bad content type
        // (`InvalidMessage::InvalidContentType`).
        (
            "InvalidContentType",
            "the server did not answer in TLS; if that port speaks plain HTTP, use http://",
        ),
        (
            "NoApplicationProtocol",
            "the server does not offer HTTP/2 (ALPN h2); drop --http2",
        ),
        (
            "http2 error",
            "the server did not speak HTTP/2; drop --http2 (on http:// it means h2c by prior knowledge)",
        ),
        (
            "UnknownIssuer",
            "the certificate is not signed by a CA trusted here; pass that CA (or the server's own certificate) with --cacert FILE, or skip verification with -k",
        ),
        (
            "CaUsedAsEndEntity",
            "the server presents a CA certificate as its own; pass that certificate with --cacert FILE, or skip verification with -k",
        ),
        // rustls 0.23 prints the `*Context` variants of `CertificateError`
        // in words ("certificate not valid for name ...", "certificate
        // expired: ..."), the others by their variant name.
        (
            "NotValidForName",
            "the certificate does not name this host; use a name it was issued for, or skip verification with -k",
        ),
        (
            "not valid for name",
            "the certificate does not name this host; use a name it was issued for, or skip verification with -k",
        ),
        (
            "Expired",
            "the certificate has expired (or the clock is wrong); skip verification with -k to probe anyway",
        ),
        (
            "certificate expired",
            "the certificate has expired (or the clock is wrong); skip verification with -k to probe anyway",
        ),
        (
            "certificate not valid yet",
            "the certificate is not valid yet (or the clock is wrong); skip verification with -k to probe anyway",
        ),
        // A trusted certificate carries the issuer's name but another key
        // (a regenerated CA, or another test certificate with the same
        // subject): webpki reports the signature check that failed.
        (
            "UnsupportedSignatureAlgorithmForPublicKey",
            "a certificate trusted here has the issuer's name but not its key; pass the CA that signed it (or the server's own certificate) with --cacert FILE, or skip verification with -k",
        ),
        (
            "BadSignature",
            "a certificate trusted here has the issuer's name but not its key; pass the CA that signed it (or the server's own certificate) with --cacert FILE, or skip verification with -k",
        ),
    ];
    // A GOAWAY or RST_STREAM frame *received* ("connection error received",
    // "stream error received") came from a peer that speaks HTTP/2: such an
    // error is the server's choice (a request limit, a refused stream), not
    // a missing HTTP/2.
    let peer_spoke_http2 = text.contains("error received");
    CAUSES
        .iter()
        .filter(|(cause, _)| !(peer_spoke_http2 && *cause == "http2 error"))
        .find(|(cause, _)| text.contains(cause))
        .map(|(_, fix)| *fix)
}

/// Tidies an OpenTelemetry export error's debug-style text, e.g.
/// `Operation failed: errs: [Err(InternalFailure("X: Y: Y: Z"))]` becomes
/// `X: Y: Z`.
pub(crate) fn export_failure(detail: &str) -> String {
    let inner = detail
        .rfind("(\"")
        .and_then(|i| {
            let rest = &detail[i + 2..];
            rest.rfind('"').map(|j| &rest[..j])
        })
        .unwrap_or(detail);
    let mut parts: Vec<&str> = Vec::new();
    for part in inner.split(": ") {
        if parts.last() != Some(&part) {
            parts.push(part);
        }
    }
    one_line(&parts.join(": "))
}

/// The exit code of a finished run: prints the telemetry export failure, if
/// any, as one `error:` line; success only when the run was `ok` and the
/// spans were delivered.
pub(crate) fn exit_code(ok: bool, telemetry_error: Option<&str>) -> std::process::ExitCode {
    if let Some(t) = telemetry_error {
        eprintln!("error: {t}");
    }
    if ok && telemetry_error.is_none() {
        std::process::ExitCode::SUCCESS
    } else {
        std::process::ExitCode::FAILURE
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tidies_export_errors() {
        assert_eq!(
            export_failure(
                "Operation failed: errs: [Err(InternalFailure(\"gRPC code: Unavailable: tcp connect error: tcp connect error: refused (os error 111)\"))]"
            ),
            "gRPC code: Unavailable: tcp connect error: refused (os error 111)"
        );
        assert_eq!(export_failure("plain"), "plain");
    }

    #[test]
    fn an_http2_error_the_server_sent_does_not_blame_http2_support() {
        let goaway = "error sending request: client error (SendRequest): http2 error: connection error received: not a result of an error";
        assert_eq!(fix(goaway), None);
        let reset = "http2 error: stream error received: refused stream before processing any application logic";
        assert_eq!(fix(reset), None);
        let local = "http2 error: connection error detected: frame with invalid size";
        assert!(fix(local).is_some_and(|f| f.contains("drop --http2")));
    }

    /// The certificate errors as rustls itself prints them (its `*Context`
    /// variants in words) get their fix.
    #[test]
    fn rustls_certificate_errors_get_a_fix() {
        use rustls::CertificateError as C;
        use rustls::pki_types::{ServerName, UnixTime};
        let name = ServerName::try_from("127.0.0.1").expect("name");
        let at = |s| UnixTime::since_unix_epoch(std::time::Duration::from_secs(s));
        for (err, fix_words) in [
            (
                C::NotValidForNameContext {
                    expected: name,
                    presented: vec!["DnsName(\"localhost\")".to_owned()],
                },
                "does not name this host",
            ),
            (
                C::ExpiredContext {
                    time: at(2_000),
                    not_after: at(1_000),
                },
                "has expired",
            ),
            (
                C::NotValidYetContext {
                    time: at(1_000),
                    not_before: at(2_000),
                },
                "not valid yet",
            ),
            (C::BadSignature, "--cacert"),
        ] {
            let err = rustls::Error::InvalidCertificate(err);
            let line = request_failure(&err, Some("tls_certificate_invalid"), None);
            assert!(line.contains("; fix: "), "{line}");
            assert!(line.contains(fix_words), "{fix_words:?} in {line}");
        }
    }
}
