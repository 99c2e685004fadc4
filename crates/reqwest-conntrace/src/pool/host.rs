//! The pool key, as hyper-util keys its pool: scheme, host, port.

use opentelemetry::KeyValue;

use crate::semconv;

/// A pool key as hyper-util keys its pool: scheme, host, port.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct HostKey {
    pub(crate) scheme: String,
    pub(crate) host: String,
    pub(crate) port: u16,
}

impl HostKey {
    /// `server.address`, `server.port`, `url.scheme`.
    pub(crate) fn attributes(&self) -> Vec<KeyValue> {
        vec![
            KeyValue::new(semconv::SERVER_ADDRESS, self.host.clone()),
            KeyValue::new(semconv::SERVER_PORT, i64::from(self.port)),
            KeyValue::new(semconv::URL_SCHEME, self.scheme.clone()),
        ]
    }
}
