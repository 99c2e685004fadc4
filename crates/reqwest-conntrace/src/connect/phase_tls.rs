//! The `tls.handshake` phase: from the ClientHello to the connect's end;
//! its SNI, resumption, negotiated version and ALPN, and its events
//! (ServerHello, certificate verified or rejected, server Finished).

use std::time::Duration;

use opentelemetry::KeyValue;

use crate::connect::phase::PhaseScope;
use crate::export::phases::PhaseRecord;
use crate::export::report::TlsVersion;
use crate::semconv;

/// What the TLS phase leaves for the setup span, the metrics and the report.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TlsOutcome {
    /// From the ClientHello to the connect's end; `None` without TLS.
    pub(crate) duration: Option<Duration>,
    /// Whether a ready connect's handshake resumed a session (no
    /// certificate verified after one was offered).
    pub(crate) resumed: Option<bool>,
    /// The negotiated version, when the hooks saw it (or a resumed
    /// session's ServerHello implies TLS 1.3).
    pub(crate) version: Option<TlsVersion>,
}

/// Emits the `tls.handshake` phase of a connect that began TLS (when the
/// setup span records), ended at the connect's end (failed there unless
/// the connect was ready), and returns what it showed.
pub(crate) fn emit_tls_phase(scope: &PhaseScope<'_>) -> TlsOutcome {
    let inner = scope.inner;
    let phases = scope.phases;
    let established = scope.established;
    let end = scope.end;
    let mut outcome = TlsOutcome {
        duration: None,
        resumed: None,
        version: phases.tls_version,
    };
    let Some(tls_start) = phases.tls_started else {
        return outcome;
    };
    let resumed = phases.resumption_offered
        && phases.cert_verified.is_none()
        && phases.cert_verify_started.is_none();
    if established.is_some() {
        outcome.resumed = Some(resumed);
        if outcome.version.is_none() && resumed {
            // A resumed 1.2 session logs CLIENT_RANDOM (seen by the key
            // log hook); a resumed 1.3 one derives the handshake secret.
            outcome.version = phases.server_hello.map(|_| TlsVersion::Tls13);
        }
    }
    if let Some(tracer) = scope.tracer {
        let mut phase = PhaseRecord::start(
            tracer,
            inner.phases,
            scope.setup,
            semconv::TLS_HANDSHAKE_SPAN,
            inner.clock.wall(tls_start),
            handshake_attributes(scope, resumed, outcome.version),
        );
        if let Some(t) = phases.server_hello {
            phase.add_event(semconv::EVENT_TLS_SERVER_HELLO, inner.clock.wall(t), vec![]);
        }
        add_certificate_event(scope, &mut phase);
        if let Some(t) = phases.server_finished {
            phase.add_event(
                semconv::EVENT_TLS_SERVER_FINISHED,
                inner.clock.wall(t),
                vec![],
            );
        }
        if established.is_none() {
            let (t, m) = scope.failure.or_cancel();
            phase.fail(t, &m);
        }
        phase.end(inner.clock.wall(end));
    }
    outcome.duration = Some(end.saturating_duration_since(tls_start));
    outcome
}

/// The `tls.handshake` phase's attributes: protocol, resumption offered,
/// SNI (the target's host, else the name resolved), verification skipped,
/// and, for a ready connect, resumed and ALPN; the `version`, when known.
fn handshake_attributes(
    scope: &PhaseScope<'_>,
    resumed: bool,
    version: Option<TlsVersion>,
) -> Vec<KeyValue> {
    let phases = scope.phases;
    let sni = scope
        .attempt
        .trigger
        .as_ref()
        .map(|t| t.host.host.to_string())
        .or_else(|| phases.dns.as_ref().map(|d| d.name.clone()));
    let mut attrs = vec![
        KeyValue::new(semconv::TLS_PROTOCOL_NAME, "tls"),
        KeyValue::new(
            semconv::HTTP_CONNECTION_TLS_RESUMPTION_OFFERED,
            phases.resumption_offered,
        ),
    ];
    if let Some(name) = &sni {
        attrs.push(KeyValue::new(semconv::SERVER_ADDRESS, name.clone()));
    }
    if phases.cert_verification_skipped {
        attrs.push(KeyValue::new(
            semconv::HTTP_CONNECTION_TLS_VERIFICATION_SKIPPED,
            true,
        ));
    }
    if let Some(e) = scope.established {
        attrs.push(KeyValue::new(semconv::TLS_RESUMED, resumed));
        attrs.push(KeyValue::new(
            semconv::TLS_NEXT_PROTOCOL,
            if e.http2 { "h2" } else { "http/1.1" },
        ));
    }
    if let Some(v) = version {
        attrs.push(KeyValue::new(semconv::TLS_PROTOCOL_VERSION, v.as_str()));
    }
    attrs
}

/// Adds the certificate's event to the phase: `tls.certificate_verified`
/// or `tls.certificate_rejected` (with the verifier's message) when the
/// verifier hook answered; with a user's own rustls config, where only the
/// start of verification is seen, the handshake's outcome tells the answer.
/// None when verification was skipped.
fn add_certificate_event(scope: &PhaseScope<'_>, phase: &mut PhaseRecord) {
    let inner = scope.inner;
    let phases = scope.phases;
    let failure = scope.failure;
    match &phases.cert_verified {
        Some((_, None)) if phases.cert_verification_skipped => {}
        Some((t, None)) => phase.add_event(
            semconv::EVENT_TLS_CERTIFICATE_VERIFIED,
            inner.clock.wall(*t),
            vec![],
        ),
        Some((t, Some(message))) => phase.add_event(
            semconv::EVENT_TLS_CERTIFICATE_REJECTED,
            inner.clock.wall(*t),
            vec![
                KeyValue::new(semconv::ERROR_TYPE, semconv::ERROR_TYPE_TLS_CERTIFICATE),
                KeyValue::new(semconv::EXCEPTION_MESSAGE, message.clone()),
            ],
        ),
        // A user's own rustls config: only the start of verification
        // is seen; the handshake's outcome tells the verifier's answer.
        None => match (phases.cert_verify_started, &failure.message) {
            (Some(t), _) if scope.established.is_some() => phase.add_event(
                semconv::EVENT_TLS_CERTIFICATE_VERIFIED,
                inner.clock.wall(t),
                vec![],
            ),
            (Some(t), Some(message))
                if failure.error_type == Some(semconv::ERROR_TYPE_TLS_CERTIFICATE) =>
            {
                phase.add_event(
                    semconv::EVENT_TLS_CERTIFICATE_REJECTED,
                    inner.clock.wall(t),
                    vec![
                        KeyValue::new(semconv::ERROR_TYPE, semconv::ERROR_TYPE_TLS_CERTIFICATE),
                        KeyValue::new(semconv::EXCEPTION_MESSAGE, message.clone()),
                    ],
                )
            }
            _ => {}
        },
    }
}
