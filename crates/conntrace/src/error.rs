//! One-line descriptions of errors for stderr and the `error` fields of
//! `--json` output.

use std::error::Error as StdError;

/// The error's text and its sources, `": "`-joined, each source's text
/// left out when an outer message already contains it.
pub(crate) fn chain_text(err: &(dyn StdError + 'static)) -> String {
    let mut text = err.to_string();
    let mut current = err.source();
    while let Some(e) = current {
        let s = e.to_string();
        if !s.is_empty() && !text.contains(&s) {
            text.push_str(": ");
            text.push_str(&s);
        }
        current = e.source();
    }
    one_line(&text)
}

/// An `anyhow` error as one line (context first, then causes).
pub(crate) fn anyhow_line(err: &anyhow::Error) -> String {
    let mut text = err.to_string();
    for cause in err.chain().skip(1) {
        let s = cause.to_string();
        if !s.is_empty() && !text.contains(&s) {
            text.push_str(": ");
            text.push_str(&s);
        }
    }
    one_line(&text)
}

/// Collapses line breaks so a message stays on one line.
pub(crate) fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// A failed request as one line: a plain-words lead from the library's
/// `error.type` classification, then the error chain.
pub(crate) fn request_failure(err: &(dyn StdError + 'static), error_type: Option<&str>) -> String {
    let lead = match error_type {
        Some("dns_error") => Some("cannot resolve the host name"),
        Some("connection_refused") => Some("connection refused"),
        Some("connection_reset") => Some("connection reset by the peer"),
        Some("tls_certificate_invalid") => Some("the server's certificate was rejected"),
        Some("tls_error") => Some("TLS handshake failed"),
        Some("timeout") => Some("timed out"),
        _ => None,
    };
    let chain = chain_text(err);
    match lead {
        Some(lead) => format!("{lead}: {chain}"),
        None => chain,
    }
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
}
