//! Instrumenting an existing `reqwest::ClientBuilder`.

use std::sync::Arc;
use std::time::Duration;

use reqwest::dns::Resolve;

use crate::connect::address::AddressOrder;
use crate::connect::connector::ConnectorLayer;
use crate::connect::dns::TracedResolver;
use crate::connect::tls::TlsSettings;
use crate::error::BuildError;
use crate::handle::ConnTrace;
use crate::pool::client::ClientState;

/// A `reqwest::ClientBuilder` being instrumented: keeps every option already
/// set on it (pool sizes, timeouts, proxies, `resolve` overrides, headers) and
/// adds, at [`build`](Self::build):
/// - the [`ConnectorLayer`] (connection-setup spans, registry),
/// - the [`TracedResolver`] around the resolver set here (or the system one),
/// - the instrumented rustls configuration built from [`TlsSettings`].
///
/// Options this crate must know or must own are set here rather than on
/// reqwest's builder: TLS options (reqwest ignores its own TLS options once
/// given a preconfigured rustls config; `build` carries over the ones
/// reqwest's builder shows, `tls_version_min`/`max`,
/// `tls_danger_accept_invalid_certs`, `tls_sni`, `tls_sslkeylogfile`,
/// `http1_only` and `http2_prior_knowledge` (ALPN), and refuses
/// `tls_danger_accept_invalid_hostnames`; root certificates
/// (`add_root_certificate`), `tls_certs_only`, CRLs and client identities
/// added to reqwest's builder are not visible through reqwest's public API
/// (no getter, not in its `Debug` output, and the builder cannot be
/// cloned for a trial build), so `build` cannot tell they were set and they
/// do not reach the instrumented client: add them through [`TlsSettings`]
/// (`add_root_certificate`, `built_in_roots(false)`, `client_identity`,
/// `certificate_verifier` for CRLs), or build the rustls `ClientConfig`
/// with them and pass it as [`TlsSettings::from_rustls_config`]), the DNS
/// resolver (reqwest's builder cannot hand it back to be wrapped: one set
/// with its `dns_resolver`, or its `hickory_dns`, is replaced by the traced
/// system resolver unless given to [`dns_resolver`](Self::dns_resolver)
/// here), and the
/// connect timeout (to tell a timed-out connect from a cancelled one).
pub struct InstrumentedClientBuilder {
    trace: ConnTrace,
    builder: reqwest::ClientBuilder,
    tls: TlsSettings,
    resolver: Option<Arc<dyn Resolve>>,
    connect_timeout: Option<Duration>,
    idle_timeout: Option<Option<Duration>>,
    max_idle_per_host: Option<usize>,
    address_order: AddressOrder,
    proxy: Option<String>,
}

impl std::fmt::Debug for InstrumentedClientBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InstrumentedClientBuilder")
            .field("builder", &self.builder)
            .field("tls", &self.tls)
            .field("custom_resolver", &self.resolver.is_some())
            .field("connect_timeout", &self.connect_timeout)
            .field("pool_idle_timeout", &self.idle_timeout)
            .field("pool_max_idle_per_host", &self.max_idle_per_host)
            .field("address_order", &self.address_order)
            .field(
                "proxy",
                &self.proxy.as_deref().map(crate::redact::redact_str),
            )
            .finish()
    }
}

/// A reqwest 0.13 `ClientBuilder`: what
/// [`ConnTrace::instrument_client`] takes. This crate instruments reqwest
/// 0.13 (and reqwest-middleware 0.5) only; the trait exists so that a
/// builder from another reqwest version fails to compile with a message
/// naming that requirement instead of a bare type mismatch between two
/// `ClientBuilder`s.
///
/// ```compile_fail
/// struct ClientBuilder; // e.g. reqwest 0.12's
/// reqwest_conntrace::ConnTrace::new().instrument_client(ClientBuilder);
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a reqwest 0.13 `ClientBuilder`: reqwest-conntrace instruments reqwest 0.13 and reqwest-middleware 0.5",
    label = "expected a `reqwest::ClientBuilder` from reqwest 0.13",
    note = "two reqwest versions in one build (see `cargo tree -i reqwest`) mean the app is on another reqwest: upgrade it to reqwest 0.13 and reqwest-middleware 0.5"
)]
pub trait ReqwestClientBuilder {
    /// The builder itself.
    fn into_reqwest(self) -> reqwest::ClientBuilder;
}

impl ReqwestClientBuilder for reqwest::ClientBuilder {
    fn into_reqwest(self) -> reqwest::ClientBuilder {
        self
    }
}

impl ConnTrace {
    /// Starts instrumenting `builder` (a reqwest 0.13 `ClientBuilder`); see
    /// [`InstrumentedClientBuilder`].
    pub fn instrument_client(
        &self,
        builder: impl ReqwestClientBuilder,
    ) -> InstrumentedClientBuilder {
        InstrumentedClientBuilder {
            trace: self.clone(),
            builder: builder.into_reqwest(),
            tls: TlsSettings::default(),
            resolver: None,
            connect_timeout: None,
            idle_timeout: None,
            max_idle_per_host: None,
            address_order: AddressOrder::Keep,
            proxy: None,
        }
    }
}

/// Reads the TLS options reqwest's `ClientBuilder` shows in its `Debug`
/// output and carries them over to `tls`. reqwest applies none of its TLS
/// options to a preconfigured rustls config, so each one it shows is either
/// carried over here or refused with [`BuildError::TlsOptionOnReqwestBuilder`].
fn carry_over_tls(described: &str, mut tls: TlsSettings) -> Result<TlsSettings, BuildError> {
    use crate::export::report::TlsVersion;
    if described.contains("tls_danger_accept_invalid_hostnames: true") {
        return Err(BuildError::TlsOptionOnReqwestBuilder(
            "tls_danger_accept_invalid_hostnames",
        ));
    }
    // The user's own rustls config: reqwest applies none of its TLS
    // options to a preconfigured config, and neither does this crate.
    if tls.is_rustls_config() {
        return Ok(tls);
    }
    let version = |field: &str| -> Result<Option<TlsVersion>, BuildError> {
        let Some(at) = described.find(&format!("{field}: Version(")) else {
            return Ok(None);
        };
        let rest = &described[at + field.len() + ": Version(".len()..];
        match rest.split(')').next() {
            Some("Tls1_2") => Ok(Some(TlsVersion::Tls12)),
            Some("Tls1_3") => Ok(Some(TlsVersion::Tls13)),
            // TLS 1.0/1.1: rustls offers neither.
            _ => Err(BuildError::TlsOptionOnReqwestBuilder(
                if field == "tls_version_min" {
                    "tls_version_min (below TLS 1.2)"
                } else {
                    "tls_version_max (below TLS 1.2)"
                },
            )),
        }
    };
    if let Some(v) = version("tls_version_min")? {
        tls = tls.min_version(v);
    }
    if let Some(v) = version("tls_version_max")? {
        tls = tls.max_version(v);
    }
    if described.contains("tls_danger_accept_invalid_certs: true") {
        tls = tls.danger_accept_invalid_certs(true);
    }
    // reqwest always prints tls_sni; only `false` was set by the user.
    if described.contains("tls_sni: false") {
        tls = tls.sni(false);
    }
    if described.contains("tls_sslkeylogfile: true") {
        tls = tls.key_log_file(true);
    }
    if described.contains("http1_only: true") {
        tls = tls.http1_only(true);
    }
    if described.contains("http2_prior_knowledge: true") {
        tls = tls.http2_only(true);
    }
    Ok(tls)
}

/// Whether reqwest's `ClientBuilder`, as its `Debug` output `described`
/// shows it, adds `Connection: close` to every request without a
/// `Connection` header of its own (`default_headers`, which reqwest fills
/// in after the middleware saw the request). The output lists them as
/// `default_headers: {"name": "value", ..}` (http's `HeaderMap` `Debug`,
/// one entry per value); a value marked sensitive shows as `Sensitive`
/// and is not read.
fn default_connection_close(described: &str) -> bool {
    const FIELD: &str = "default_headers: {";
    let Some(at) = described.find(FIELD) else {
        return false;
    };
    let mut rest = &described[at + FIELD.len()..];
    // One `"name": value` entry at a time, until the map's `}`.
    while let Some(entry) = rest.strip_prefix('"') {
        let Some((name, after)) = entry.split_once("\": ") else {
            return false;
        };
        let (value, after) = match after.strip_prefix('"') {
            Some(quoted) => match debug_quoted(quoted) {
                Some(split) => split,
                None => return false,
            },
            None => {
                let end = after.find([',', '}']).unwrap_or(after.len());
                (String::new(), &after[end..])
            }
        };
        if name.eq_ignore_ascii_case("connection")
            && crate::request::connection_headers::lists_token(&value, "close")
        {
            return true;
        }
        rest = match after.strip_prefix(", ") {
            Some(next) => next,
            None => return false,
        };
    }
    false
}

/// The text of a `Debug`-quoted string whose opening quote was stripped
/// (`\"` and `\\` unescaped; other escapes, which header values do not
/// need, kept as written) and what follows its closing quote.
fn debug_quoted(quoted: &str) -> Option<(String, &str)> {
    let mut text = String::new();
    let mut chars = quoted.char_indices();
    while let Some((i, c)) = chars.next() {
        match c {
            '"' => return Some((text, &quoted[i + 1..])),
            '\\' => match chars.next()? {
                (_, e @ ('"' | '\\')) => text.push(e),
                (_, e) => {
                    text.push('\\');
                    text.push(e);
                }
            },
            c => text.push(c),
        }
    }
    None
}

impl InstrumentedClientBuilder {
    /// TLS options of the client. Default: [`TlsSettings::default`].
    pub fn tls(mut self, tls: TlsSettings) -> Self {
        self.tls = tls;
        self
    }

    /// The resolver to wrap (what `ClientBuilder::dns_resolver` would take).
    /// Default: [`SystemResolver`](crate::SystemResolver), like reqwest's default.
    pub fn dns_resolver<R: Resolve + 'static>(mut self, resolver: R) -> Self {
        self.resolver = Some(Arc::new(resolver));
        self
    }

    /// Connect timeout (sets reqwest's `connect_timeout`); a connect abandoned
    /// at it is reported as `error.type = timeout`. Default: none.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = Some(timeout);
        self
    }

    /// The pool's idle timeout (sets reqwest's `pool_idle_timeout`): idle
    /// connections older than this are dropped, and a miss that follows is
    /// reported as `idle_expired`. `None` keeps idle connections forever.
    /// Set it here rather than on reqwest's builder, where this crate cannot
    /// read it: left unset, the idle timeout is unknown to this crate and is
    /// inferred from the idle connections the pool closes (Linux: the
    /// kernel dates the close): the miss that follows is `idle_expired`
    /// with `http.connection.pool.limits = inferred` (`pool_closed`,
    /// `unknown`, when the close cannot be dated); no keep-alive mismatch
    /// is flagged. Default: reqwest's, 90 s.
    pub fn pool_idle_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.idle_timeout = Some(timeout);
        self
    }

    /// Most idle connections kept per host (sets reqwest's
    /// `pool_max_idle_per_host`): a connection released while the pool
    /// already holds this many idle ones is closed, and the miss that follows
    /// is reported as `all_busy`. Set it here rather than on reqwest's
    /// builder, where this crate cannot read it: left unset, the limit is
    /// inferred from the connections the pool closes at release (Linux:
    /// the kernel dates the close; the limit is at most the idle count
    /// then): the miss it explains is `all_busy` and the
    /// `http.client.pool.idle_limit` gauge and pool advice carry
    /// `http.connection.pool.limits = inferred`; a close that cannot be
    /// dated leaves it unknown (`all_busy` when the idle timeout is known,
    /// else `pool_closed`, with `http.connection.pool.limits = unknown`).
    /// Default: reqwest's, unlimited.
    pub fn pool_max_idle_per_host(mut self, max: usize) -> Self {
        self.max_idle_per_host = Some(max);
        self
    }

    /// The order resolved addresses are tried in (see [`AddressOrder`]).
    /// Default: [`AddressOrder::Keep`].
    pub fn address_order(mut self, order: AddressOrder) -> Self {
        self.address_order = order;
        self
    }

    /// Sends every request through the HTTP proxy at `url` (`http://host:port`;
    /// reqwest's `Proxy::all`): `https` targets through a CONNECT tunnel,
    /// `http` targets in absolute form. Set here, the proxy is known to the
    /// connection-setup span (`http.connection.proxied`, the
    /// `proxy.connect` phase). Default: none (reqwest's system proxy
    /// detection still applies).
    pub fn proxy(mut self, url: impl Into<String>) -> Self {
        self.proxy = Some(url.into());
        self
    }

    /// Applies more reqwest options to the wrapped builder.
    pub fn map_reqwest(
        mut self,
        f: impl FnOnce(reqwest::ClientBuilder) -> reqwest::ClientBuilder,
    ) -> Self {
        self.builder = f(self.builder);
        self
    }

    /// Builds the instrumented `reqwest::Client`. Wrap it with
    /// [`ConnTrace::middleware`] (or use [`build_with_middleware`](Self::build_with_middleware))
    /// for request spans and pool attribution.
    ///
    /// # Errors
    /// [`BuildError`] when the TLS settings are invalid, a TLS option was set
    /// on reqwest's builder instead of [`TlsSettings`], or reqwest fails.
    pub fn build(self) -> Result<reqwest::Client, BuildError> {
        let described = format!("{:?}", self.builder);
        let tls = carry_over_tls(&described, self.tls)?;
        let config = tls.build_config()?;
        let resolver = match self.resolver {
            Some(r) => TracedResolver::new(r),
            None => TracedResolver::system(),
        }
        .address_order(self.address_order);
        let proxy = match &self.proxy {
            Some(p) => Some(
                url::Url::parse(p)
                    .ok()
                    .filter(|u| u.scheme() == "http" && u.host().is_some())
                    .ok_or_else(|| BuildError::InvalidProxy(crate::redact::redact_str(p)))?,
            ),
            None => None,
        };
        // Pool settings not given here are unknown (reqwest's builder may
        // hold them, unreadably): no decision assumes reqwest's defaults.
        let client = Arc::new(
            ClientState::new(self.idle_timeout, self.max_idle_per_host)
                .with_default_connection_close(default_connection_close(&described)),
        );
        let layer = ConnectorLayer::for_client(self.trace.clone(), client)
            .connect_timeout(self.connect_timeout)
            .http2_prior_knowledge(described.contains("http2_prior_knowledge: true"));
        let proxy_rules = layer.proxy_rules();
        let mut builder = self
            .builder
            .tls_backend_preconfigured(config)
            .dns_resolver(Arc::new(resolver))
            .connector_layer(layer);
        if let Some(t) = self.connect_timeout {
            builder = builder.connect_timeout(t);
        }
        if let Some(t) = self.idle_timeout {
            builder = builder.pool_idle_timeout(t);
        }
        if let Some(max) = self.max_idle_per_host {
            builder = builder.pool_max_idle_per_host(max);
        }
        let rules = proxy.as_ref().map(crate::connect::proxy::ProxyRules::all);
        if let Some(p) = proxy {
            builder = builder.proxy(reqwest::Proxy::all(p.as_str())?);
        }
        // Redirect hops as requests of their own (see `redirect`).
        if let Some(policy) = crate::request::redirect::takeover_policy(&described) {
            builder = builder.redirect(policy);
        }
        self.trace.inner().count_client();
        let client = builder.build()?;
        let _ = proxy_rules
            .set(rules.unwrap_or_else(|| crate::connect::proxy::ProxyRules::of_client(&client)));
        Ok(client)
    }

    /// Builds the client wrapped in a `reqwest_middleware` client with
    /// [`ConnTrace::middleware`] as its only middleware.
    ///
    /// # Errors
    /// As [`build`](Self::build).
    pub fn build_with_middleware(
        self,
    ) -> Result<reqwest_middleware::ClientWithMiddleware, BuildError> {
        let middleware = self.trace.middleware();
        let client = self.build()?;
        Ok(reqwest_middleware::ClientBuilder::new(client)
            .with(middleware)
            .build())
    }
}

#[cfg(test)]
mod tests {
    use super::default_connection_close;
    use reqwest::header::{CONNECTION, HeaderMap, HeaderValue};

    /// What reqwest's own builder shows with `headers` as its default
    /// headers, read back as this crate's builder reads it.
    fn reads_close(headers: &[(&str, &str, bool)]) -> bool {
        let mut map = HeaderMap::new();
        for (name, value, sensitive) in headers {
            let mut value = HeaderValue::from_str(value).expect("valid value");
            value.set_sensitive(*sensitive);
            map.append(
                reqwest::header::HeaderName::from_bytes(name.as_bytes()).expect("valid name"),
                value,
            );
        }
        let builder = reqwest::Client::builder().default_headers(map);
        default_connection_close(&format!("{builder:?}"))
    }

    #[test]
    fn a_default_connection_close_is_read_from_reqwests_builder() {
        assert!(!default_connection_close(&format!(
            "{:?}",
            reqwest::Client::builder()
        )));
        assert!(reads_close(&[(CONNECTION.as_str(), "close", false)]));
        assert!(reads_close(&[
            ("x-token", "s3cret, \"connection\": \"x", true),
            ("user-agent", "a \"quoted\", agent", false),
            (CONNECTION.as_str(), "keep-alive, Close", false),
        ]));
        assert!(!reads_close(&[(CONNECTION.as_str(), "keep-alive", false)]));
        // A value that only looks like the entry is not it.
        assert!(!reads_close(&[(
            "x-note",
            "\"connection\": \"close\"",
            false
        )]));
        assert!(!reads_close(&[("x-connection", "close", false)]));
    }
}
