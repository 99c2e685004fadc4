//! The instrumented rustls configuration: the user's TLS options plus three
//! hooks that time the handshake without ever seeing a secret.
//!
//! - the session store's first call marks the ClientHello (TCP done, TLS
//!   starts) and tells whether a cached session was offered;
//! - the key log's `will_log` marks ServerHello (`CLIENT_HANDSHAKE_TRAFFIC_SECRET`)
//!   and the server's Finished (`CLIENT_TRAFFIC_SECRET_0`) in TLS 1.3 and
//!   always answers `false`, so no secret is handed over; TLS 1.2 calls
//!   `log("CLIENT_RANDOM", ..)` directly, which is dropped unread and only
//!   tells the version;
//! - the certificate verifier wrapper times verification (full handshakes
//!   only: its absence after an offered session means resumption) and learns
//!   the version from which signature check runs.
//!
//! Around a user's own `ClientConfig` ([`TlsSettings::from_rustls_config`])
//! the verifier and the session store cannot be wrapped (rustls keeps the
//! verifier private and `Resumption`'s store opaque), so the user's are kept
//! and three public fields are wrapped instead:
//! - `client_auth_cert_resolver`: its `has_certs` is asked as the
//!   ClientHello is built (TLS starts);
//! - `time_provider`: asked before the ClientHello only when a cached
//!   session was found (resumption offered), and during the handshake just
//!   before the verifier runs (verification begins);
//! - `key_log`: as above, forwarding to the user's key log.

use std::fmt;
use std::sync::Arc;
use std::time::Instant;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::{
    ClientSessionMemoryCache, ClientSessionStore, ResolvesClientCert, Resumption,
    Tls12ClientSessionValue, Tls13ClientSessionValue,
};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::sign::CertifiedKey;
use rustls::time_provider::TimeProvider;
use rustls::{
    ClientConfig, DigitallySignedStruct, KeyLog, NamedGroup, RootCertStore, SignatureScheme,
};

use crate::connect::attempt;
use crate::error::BuildError;
use crate::export::report::TlsVersion;

/// The TLS options of an instrumented client.
///
/// The instrumented client hands reqwest a preconfigured rustls
/// `ClientConfig`, and reqwest then applies none of its own TLS options, so
/// every option a client needs is set here. Defaults match reqwest's: the
/// platform's trusted roots (via `rustls-platform-verifier`), TLS 1.2 and
/// 1.3, ALPN `h2` + `http/1.1`, session resumption with a 256-entry
/// in-memory cache, SNI on.
#[derive(Clone)]
pub struct TlsSettings {
    extra_roots: Vec<CertificateDer<'static>>,
    built_in_roots: bool,
    identity: Option<(Vec<CertificateDer<'static>>, Arc<PrivateKeyDer<'static>>)>,
    min_version: TlsVersion,
    max_version: TlsVersion,
    http1_only: bool,
    http2_only: bool,
    resumption: bool,
    sni: bool,
    partial_chain: bool,
    accept_invalid_certs: bool,
    key_log_file: bool,
    verifier: Option<Arc<dyn ServerCertVerifier>>,
    provider: Option<Arc<CryptoProvider>>,
    /// The user's own rustls configuration ([`TlsSettings::from_rustls_config`]).
    rustls_config: Option<Arc<ClientConfig>>,
}

impl fmt::Debug for TlsSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsSettings")
            .field("extra_roots", &self.extra_roots.len())
            .field("built_in_roots", &self.built_in_roots)
            .field("client_identity", &self.identity.is_some())
            .field("min_version", &self.min_version)
            .field("max_version", &self.max_version)
            .field("http1_only", &self.http1_only)
            .field("http2_only", &self.http2_only)
            .field("resumption", &self.resumption)
            .field("sni", &self.sni)
            .field("partial_chain", &self.partial_chain)
            .field("accept_invalid_certs", &self.accept_invalid_certs)
            .field("custom_verifier", &self.verifier.is_some())
            .field("rustls_config", &self.rustls_config.is_some())
            .finish()
    }
}

impl Default for TlsSettings {
    fn default() -> Self {
        Self {
            extra_roots: Vec::new(),
            built_in_roots: true,
            identity: None,
            min_version: TlsVersion::Tls12,
            max_version: TlsVersion::Tls13,
            http1_only: false,
            http2_only: false,
            resumption: true,
            sni: true,
            partial_chain: false,
            accept_invalid_certs: false,
            key_log_file: false,
            verifier: None,
            provider: None,
            rustls_config: None,
        }
    }
}

impl TlsSettings {
    /// Settings with reqwest's defaults (see the type's docs).
    pub fn new() -> Self {
        Self::default()
    }

    /// Uses the application's own rustls `ClientConfig`, as
    /// `reqwest::ClientBuilder::tls_backend_preconfigured` would: its roots,
    /// CRLs, client identity, verifier, versions, ALPN, session store and
    /// key log are kept as they are, and the handshake hooks are wrapped
    /// around them. This is where trust set up outside reqwest (custom
    /// roots, CRLs, a client certificate, an own `ServerCertVerifier`)
    /// goes. As with reqwest, TLS options on reqwest's builder do not apply
    /// to it, and no other option of `TlsSettings` may be set with it
    /// (`build` fails with [`BuildError::Tls`]).
    ///
    /// rustls keeps a config's certificate verifier private and its session
    /// store opaque, so neither is wrapped; the hooks use the config's
    /// public `client_auth_cert_resolver` (asked as the ClientHello is
    /// built: TLS start), `time_provider` (asked before the ClientHello only
    /// when a cached session is offered, and just before the verifier runs)
    /// and `key_log` (ServerHello, server Finished, version) instead. What
    /// the `tls.handshake` span shows differs in one point: the
    /// `tls.certificate_verified` event is at the moment verification
    /// began, emitted once the handshake completed, and a rejection is the
    /// `tls.certificate_rejected` event at that moment with the handshake's
    /// error text (no time for the verifier's own answer). `tls.resumed`,
    /// the TCP/TLS split, ServerHello and Finished are as with the built
    /// configuration. One more difference: a session cached by another
    /// `ClientConfig` sharing the same store is not offered (rustls ties a
    /// session to the config's client certificate resolver, which is
    /// wrapped here).
    pub fn from_rustls_config(config: ClientConfig) -> Self {
        Self {
            rustls_config: Some(Arc::new(config)),
            ..Self::default()
        }
    }

    /// Whether this is a user's own rustls configuration
    /// ([`from_rustls_config`](Self::from_rustls_config)).
    pub(crate) fn is_rustls_config(&self) -> bool {
        self.rustls_config.is_some()
    }

    /// Some option besides the user's rustls configuration differs from
    /// its default.
    fn customized(&self) -> bool {
        let d = Self::default();
        !self.extra_roots.is_empty()
            || self.built_in_roots != d.built_in_roots
            || self.identity.is_some()
            || self.min_version != d.min_version
            || self.max_version != d.max_version
            || self.http1_only
            || self.http2_only
            || self.resumption != d.resumption
            || self.sni != d.sni
            || self.partial_chain
            || self.accept_invalid_certs
            || self.key_log_file
            || self.verifier.is_some()
            || self.provider.is_some()
    }

    /// Trusts one more root certificate (DER). Default: none beyond the
    /// built-in roots.
    pub fn add_root_certificate(mut self, cert: CertificateDer<'static>) -> Self {
        self.extra_roots.push(cert);
        self
    }

    /// Trusts every certificate in a PEM bundle.
    ///
    /// # Errors
    /// [`BuildError::InvalidCertificate`] when the PEM does not parse or holds
    /// no certificate.
    pub fn add_root_certificates_pem(mut self, pem: &[u8]) -> Result<Self, BuildError> {
        use rustls::pki_types::pem::PemObject;
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(pem)
            .collect::<Result<_, _>>()
            .map_err(|e| BuildError::InvalidCertificate(e.to_string()))?;
        if certs.is_empty() {
            return Err(BuildError::InvalidCertificate(
                "no CERTIFICATE block in the PEM data".to_owned(),
            ));
        }
        self.extra_roots.extend(certs);
        Ok(self)
    }

    /// Whether the platform's trusted roots are used besides the added ones
    /// (reqwest's `tls_certs_only` is `false` here). Default: `true`.
    pub fn built_in_roots(mut self, enabled: bool) -> Self {
        self.built_in_roots = enabled;
        self
    }

    /// Presents a client certificate chain and key (mutual TLS). Default: none.
    pub fn client_identity(
        mut self,
        chain: Vec<CertificateDer<'static>>,
        key: PrivateKeyDer<'static>,
    ) -> Self {
        self.identity = Some((chain, Arc::new(key)));
        self
    }

    /// Lowest TLS version offered. Default: [`TlsVersion::Tls12`].
    pub fn min_version(mut self, v: TlsVersion) -> Self {
        self.min_version = v;
        self
    }

    /// Highest TLS version offered. Default: [`TlsVersion::Tls13`].
    pub fn max_version(mut self, v: TlsVersion) -> Self {
        self.max_version = v;
        self
    }

    /// Offers only `http/1.1` in ALPN. Set automatically when the client is
    /// HTTP/1-only. Default: `false` (ALPN `h2`, `http/1.1`).
    pub fn http1_only(mut self, on: bool) -> Self {
        self.http1_only = on;
        self
    }

    /// Offers only `h2` in ALPN, as reqwest does for a client built with
    /// `http2_prior_knowledge` (set automatically then), so a server without
    /// HTTP/2 refuses the handshake (`no_application_protocol`) instead of
    /// failing the first request. Default: `false`.
    pub fn http2_only(mut self, on: bool) -> Self {
        self.http2_only = on;
        self
    }

    /// Trusts an added root certificate also when the server presents it
    /// as its own end-entity certificate (a pinned self-signed certificate,
    /// `CA:TRUE` or not, or a pinned leaf): the certificate must be
    /// byte-identical to an added one and name the server; its validity
    /// dates are not checked. Chains ending at an added intermediate are
    /// trusted either way (the anchor is its name and key). This is what
    /// curl does with `--cacert` (OpenSSL's `X509_V_FLAG_PARTIAL_CHAIN`,
    /// set by curl since 7.68.0). Default: `false` (reqwest's behaviour:
    /// such certificates fail with `CaUsedAsEndEntity` or `UnknownIssuer`).
    pub fn partial_chain(mut self, on: bool) -> Self {
        self.partial_chain = on;
        self
    }

    /// Accepts any server certificate, expired, self-signed or for another
    /// name (curl's `-k/--insecure`, reqwest's
    /// `tls_danger_accept_invalid_certs`). The handshake's signatures are
    /// still checked against the presented key, the TLS phase is still
    /// timed, and the `tls.handshake` span carries
    /// `http.connection.tls.verification_skipped = true` instead of the
    /// `tls.certificate_verified` event. Default: `false`.
    pub fn danger_accept_invalid_certs(mut self, on: bool) -> Self {
        self.accept_invalid_certs = on;
        self
    }

    /// Verifies server certificates with `verifier` instead of the
    /// platform's roots and the added ones: the way to carry over what
    /// reqwest's builder would build from options this crate has no setter
    /// for, e.g. CRLs (`add_crl`, `tls_crls_only`:
    /// `rustls::client::WebPkiServerVerifier::builder(roots).with_crls(crls).build()`)
    /// or an own trust policy. The handshake hooks wrap it (verification is
    /// timed, rejections are events); [`partial_chain`](Self::partial_chain)
    /// still trusts pinned end-entity certificates first, and
    /// [`danger_accept_invalid_certs`](Self::danger_accept_invalid_certs)
    /// replaces it. Default: none (platform verifier with the added roots).
    pub fn certificate_verifier(mut self, verifier: Arc<dyn ServerCertVerifier>) -> Self {
        self.verifier = Some(verifier);
        self
    }

    /// Writes the TLS secrets to the file named by `SSLKEYLOGFILE` (NSS key
    /// log format, for Wireshark), as reqwest's `tls_sslkeylogfile` does;
    /// the handshake is timed all the same. Default: `false` (no secret
    /// leaves rustls).
    pub fn key_log_file(mut self, on: bool) -> Self {
        self.key_log_file = on;
        self
    }

    /// TLS session resumption (TLS 1.3 tickets, RFC 8446 §2.2; TLS 1.2
    /// session ids and tickets). Default: `true`.
    pub fn session_resumption(mut self, on: bool) -> Self {
        self.resumption = on;
        self
    }

    /// Sends SNI (RFC 6066). Default: `true`.
    pub fn sni(mut self, on: bool) -> Self {
        self.sni = on;
        self
    }

    /// The rustls crypto provider. Default: the process-wide default
    /// provider if one is installed, else `ring`.
    pub fn crypto_provider(mut self, provider: Arc<CryptoProvider>) -> Self {
        self.provider = Some(provider);
        self
    }

    /// Builds the instrumented rustls configuration.
    pub(crate) fn build_config(&self) -> Result<ClientConfig, BuildError> {
        if let Some(config) = &self.rustls_config {
            if self.customized() {
                return Err(BuildError::Tls(rustls::Error::General(
                    "TlsSettings::from_rustls_config takes no other TlsSettings option: set it on the rustls ClientConfig".to_owned(),
                )));
            }
            return Ok(wrap_user_config((**config).clone()));
        }
        let provider = self
            .provider
            .clone()
            .or_else(|| CryptoProvider::get_default().cloned())
            .unwrap_or_else(|| Arc::new(rustls::crypto::ring::default_provider()));
        let versions: Vec<&'static rustls::SupportedProtocolVersion> = [
            (TlsVersion::Tls12, &rustls::version::TLS12),
            (TlsVersion::Tls13, &rustls::version::TLS13),
        ]
        .into_iter()
        .filter(|(v, _)| rank(*v) >= rank(self.min_version) && rank(*v) <= rank(self.max_version))
        .map(|(_, p)| p)
        .collect();
        if versions.is_empty() {
            return Err(BuildError::Tls(rustls::Error::General(
                "min_version is above max_version".to_owned(),
            )));
        }
        let inner: Arc<dyn ServerCertVerifier> = if let Some(v) = &self.verifier {
            v.clone()
        } else if self.built_in_roots {
            Arc::new(
                rustls_platform_verifier::Verifier::new_with_extra_roots(
                    self.extra_roots.iter().cloned(),
                    provider.clone(),
                )
                .map_err(|e| BuildError::Verifier(e.to_string()))?,
            )
        } else {
            let mut roots = RootCertStore::empty();
            for c in &self.extra_roots {
                roots
                    .add(c.clone())
                    .map_err(|e| BuildError::InvalidCertificate(e.to_string()))?;
            }
            rustls::client::WebPkiServerVerifier::builder_with_provider(
                Arc::new(roots),
                provider.clone(),
            )
            .build()
            .map_err(|e| BuildError::Verifier(e.to_string()))?
        };
        let inner: Arc<dyn ServerCertVerifier> = if self.accept_invalid_certs {
            Arc::new(AcceptAnyCertificate {
                provider: provider.clone(),
            })
        } else if self.partial_chain && !self.extra_roots.is_empty() {
            Arc::new(PinnedEndEntity {
                pinned: self.extra_roots.clone(),
                inner,
            })
        } else {
            inner
        };
        let builder = ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(&versions)?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(VerifierHook {
                inner,
                skipped: self.accept_invalid_certs,
            }));
        let mut config = match &self.identity {
            Some((chain, key)) => builder.with_client_auth_cert(chain.clone(), key.clone_key())?,
            None => builder.with_no_client_auth(),
        };
        config.alpn_protocols = if self.http1_only {
            vec![b"http/1.1".to_vec()]
        } else if self.http2_only {
            vec![b"h2".to_vec()]
        } else {
            vec![b"h2".to_vec(), b"http/1.1".to_vec()]
        };
        config.enable_sni = self.sni;
        let store: Arc<dyn ClientSessionStore> = if self.resumption {
            Arc::new(ClientSessionMemoryCache::new(256))
        } else {
            Arc::new(NoSessionStore)
        };
        config.resumption = Resumption::store(Arc::new(SessionStoreHook { inner: store }));
        config.key_log = Arc::new(KeyLogHook {
            sink: self
                .key_log_file
                .then(|| Arc::new(rustls::KeyLogFile::new()) as Arc<dyn KeyLog>),
        });
        Ok(config)
    }
}

/// The user's configuration with the hooks around its public fields (see
/// the module docs); its verifier and session store stay as they are.
fn wrap_user_config(mut config: ClientConfig) -> ClientConfig {
    config.client_auth_cert_resolver = Arc::new(ClientHelloHook {
        inner: config.client_auth_cert_resolver.clone(),
    });
    config.time_provider = Arc::new(TimeHook {
        inner: config.time_provider.clone(),
    });
    config.key_log = Arc::new(KeyLogHook {
        sink: Some(config.key_log.clone()),
    });
    config
}

/// Wraps the client certificate resolver of a user's configuration: rustls
/// asks `has_certs` as it builds the ClientHello.
#[derive(Debug)]
struct ClientHelloHook {
    inner: Arc<dyn ResolvesClientCert>,
}

impl ResolvesClientCert for ClientHelloHook {
    fn resolve(
        &self,
        root_hint_subjects: &[&[u8]],
        sigschemes: &[SignatureScheme],
    ) -> Option<Arc<CertifiedKey>> {
        self.inner.resolve(root_hint_subjects, sigschemes)
    }

    fn only_raw_public_keys(&self) -> bool {
        self.inner.only_raw_public_keys()
    }

    fn has_certs(&self) -> bool {
        attempt::with_current(|a| a.mark_tls_started());
        self.inner.has_certs()
    }
}

/// Wraps the time provider of a user's configuration. rustls asks it
/// before the ClientHello only when the session store returned a session it
/// can offer, and during the handshake just before the verifier runs
/// (TLS 1.3: after ServerHello, before the server's Finished; TLS 1.2:
/// before the key schedule, whose `CLIENT_RANDOM` tells the version); later
/// calls (saving a session or ticket) are not marked.
#[derive(Debug)]
struct TimeHook {
    inner: Arc<dyn TimeProvider>,
}

impl TimeProvider for TimeHook {
    fn current_time(&self) -> Option<UnixTime> {
        let now = Instant::now();
        attempt::with_current(|a| {
            let mut p = a.phases();
            if p.tls_started.is_none() {
                p.resumption_offered = true;
            } else if p.cert_verify_started.is_none()
                && p.server_finished.is_none()
                && (p.server_hello.is_some() || p.tls_version.is_none())
            {
                p.cert_verify_started = Some(now);
            }
        });
        self.inner.current_time()
    }
}

fn rank(v: TlsVersion) -> u8 {
    match v {
        TlsVersion::Tls12 => 2,
        TlsVersion::Tls13 => 3,
    }
}

/// Session store that remembers nothing (resumption off), still hooked so the
/// ClientHello is timed.
#[derive(Debug)]
struct NoSessionStore;

impl ClientSessionStore for NoSessionStore {
    fn set_kx_hint(&self, _: ServerName<'static>, _: NamedGroup) {}
    fn kx_hint(&self, _: &ServerName<'_>) -> Option<NamedGroup> {
        None
    }
    fn set_tls12_session(&self, _: ServerName<'static>, _: Tls12ClientSessionValue) {}
    fn tls12_session(&self, _: &ServerName<'_>) -> Option<Tls12ClientSessionValue> {
        None
    }
    fn remove_tls12_session(&self, _: &ServerName<'static>) {}
    fn insert_tls13_ticket(&self, _: ServerName<'static>, _: Tls13ClientSessionValue) {}
    fn take_tls13_ticket(&self, _: &ServerName<'static>) -> Option<Tls13ClientSessionValue> {
        None
    }
}

/// Wraps the session store: its lookups happen while the ClientHello is built.
#[derive(Debug)]
struct SessionStoreHook {
    inner: Arc<dyn ClientSessionStore>,
}

fn on_hello_lookup(offered: bool) {
    attempt::with_current(|a| {
        a.mark_tls_started();
        if offered {
            a.phases().resumption_offered = true;
        }
    });
}

impl ClientSessionStore for SessionStoreHook {
    fn set_kx_hint(&self, server_name: ServerName<'static>, group: NamedGroup) {
        self.inner.set_kx_hint(server_name, group)
    }
    fn kx_hint(&self, server_name: &ServerName<'_>) -> Option<NamedGroup> {
        on_hello_lookup(false);
        self.inner.kx_hint(server_name)
    }
    fn set_tls12_session(&self, server_name: ServerName<'static>, value: Tls12ClientSessionValue) {
        self.inner.set_tls12_session(server_name, value)
    }
    fn tls12_session(&self, server_name: &ServerName<'_>) -> Option<Tls12ClientSessionValue> {
        let v = self.inner.tls12_session(server_name);
        on_hello_lookup(v.is_some());
        v
    }
    fn remove_tls12_session(&self, server_name: &ServerName<'static>) {
        self.inner.remove_tls12_session(server_name)
    }
    fn insert_tls13_ticket(
        &self,
        server_name: ServerName<'static>,
        value: Tls13ClientSessionValue,
    ) {
        self.inner.insert_tls13_ticket(server_name, value)
    }
    fn take_tls13_ticket(
        &self,
        server_name: &ServerName<'static>,
    ) -> Option<Tls13ClientSessionValue> {
        let v = self.inner.take_tls13_ticket(server_name);
        on_hello_lookup(v.is_some());
        v
    }
}

/// Key log that never takes a secret: `will_log` answers `false` after noting
/// which TLS 1.3 stage was reached; TLS 1.2's direct `log` is dropped unread.
/// With `sink` (the user asked for `SSLKEYLOGFILE`, or the user's own
/// config's key log), `will_log` answers as the sink does and secrets go
/// there only.
#[derive(Debug)]
struct KeyLogHook {
    sink: Option<Arc<dyn KeyLog>>,
}

impl KeyLog for KeyLogHook {
    fn log(&self, label: &str, client_random: &[u8], secret: &[u8]) {
        // Without a key log file only TLS 1.2 reaches here (1.3 asks
        // will_log first and we say no). The secret is not read, copied or
        // stored here.
        if let Some(sink) = &self.sink {
            sink.log(label, client_random, secret);
        }
        if label == "CLIENT_RANDOM" {
            attempt::with_current(|a| {
                let mut p = a.phases();
                if p.tls_version.is_none() {
                    p.tls_version = Some(TlsVersion::Tls12);
                }
            });
        }
    }

    fn will_log(&self, label: &str) -> bool {
        let now = Instant::now();
        attempt::with_current(|a| {
            let mut p = a.phases();
            match label {
                "CLIENT_HANDSHAKE_TRAFFIC_SECRET" if p.server_hello.is_none() => {
                    p.server_hello = Some(now);
                    p.tls_version = Some(TlsVersion::Tls13);
                }
                "CLIENT_TRAFFIC_SECRET_0" if p.server_finished.is_none() => {
                    p.server_finished = Some(now);
                }
                _ => {}
            }
        });
        self.sink.as_ref().is_some_and(|sink| sink.will_log(label))
    }
}

/// Wraps the certificate verifier to time verification and learn the version.
#[derive(Debug)]
struct VerifierHook {
    inner: Arc<dyn ServerCertVerifier>,
    /// The inner verifier accepts anything (`danger_accept_invalid_certs`).
    skipped: bool,
}

impl ServerCertVerifier for VerifierHook {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let result = self.inner.verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        );
        let at = Instant::now();
        attempt::with_current(|a| {
            let mut p = a.phases();
            p.cert_verified = Some((at, result.as_ref().err().map(|e| e.to_string())));
            p.cert_verification_skipped = self.skipped;
        });
        result
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        attempt::with_current(|a| a.phases().tls_version = Some(TlsVersion::Tls12));
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        attempt::with_current(|a| a.phases().tls_version = Some(TlsVersion::Tls13));
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }

    fn requires_raw_public_keys(&self) -> bool {
        self.inner.requires_raw_public_keys()
    }

    fn root_hint_subjects(&self) -> Option<&[rustls::DistinguishedName]> {
        self.inner.root_hint_subjects()
    }
}

/// Accepts an end-entity certificate byte-identical to a pinned one when it
/// names the server; anything else goes to the inner verifier.
#[derive(Debug)]
struct PinnedEndEntity {
    pinned: Vec<CertificateDer<'static>>,
    inner: Arc<dyn ServerCertVerifier>,
}

impl ServerCertVerifier for PinnedEndEntity {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        if self
            .pinned
            .iter()
            .any(|p| p.as_ref() == end_entity.as_ref())
        {
            let parsed = rustls::server::ParsedCertificate::try_from(end_entity)?;
            rustls::client::verify_server_name(&parsed, server_name)?;
            return Ok(ServerCertVerified::assertion());
        }
        self.inner
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// Accepts every certificate; still checks the handshake signatures with
/// the provider's algorithms (a peer must hold the key it presents).
#[derive(Debug)]
struct AcceptAnyCertificate {
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for AcceptAnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}
