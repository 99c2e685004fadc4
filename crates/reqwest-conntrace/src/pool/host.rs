//! The pool key, as hyper-util keys its pool: scheme, host, port.

use std::sync::{Arc, LazyLock};

use opentelemetry::{KeyValue, StringValue};

use crate::semconv;

/// A pool key as hyper-util keys its pool: scheme, host, port.
///
/// The strings are shared (`Arc<str>`): the key is cloned into the pool
/// maps and its attributes onto every request's metrics and spans, and a
/// shared string is a reference count where a `String` is an allocation
/// (and another one in each exported copy of the span).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct HostKey {
    pub(crate) scheme: Arc<str>,
    pub(crate) host: Arc<str>,
    pub(crate) port: u16,
}

static HTTP: LazyLock<Arc<str>> = LazyLock::new(|| Arc::from("http"));
static HTTPS: LazyLock<Arc<str>> = LazyLock::new(|| Arc::from("https"));

impl HostKey {
    /// The key of `scheme://host:port` (`host` without IPv6 brackets).
    /// `http` and `https` share one string each.
    pub(crate) fn new(scheme: &str, host: &str, port: u16) -> Self {
        let scheme = match scheme {
            "https" => HTTPS.clone(),
            "http" => HTTP.clone(),
            other => Arc::from(other),
        };
        Self {
            scheme,
            host: Arc::from(host),
            port,
        }
    }

    /// `server.address`, `server.port`, `url.scheme` (an array: callers
    /// add them to a vec of their own, no allocation here).
    pub(crate) fn attributes(&self) -> [KeyValue; 3] {
        [
            KeyValue::new(semconv::SERVER_ADDRESS, self.server_address()),
            KeyValue::new(semconv::SERVER_PORT, i64::from(self.port)),
            KeyValue::new(semconv::URL_SCHEME, self.url_scheme()),
        ]
    }

    /// The `server.address` value (shares the key's string).
    pub(crate) fn server_address(&self) -> StringValue {
        StringValue::from(self.host.clone())
    }

    /// The `url.scheme` value (shares the key's string).
    pub(crate) fn url_scheme(&self) -> StringValue {
        StringValue::from(self.scheme.clone())
    }
}
