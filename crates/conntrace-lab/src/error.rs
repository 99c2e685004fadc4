//! The one error type of this crate.

use std::time::Duration;

/// Everything that can go wrong while starting or driving a lab fixture.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LabError {
    /// An I/O operation failed; `what` says which one (bind, connect, write a file, ...).
    #[error("{what}: {source}")]
    Io {
        /// The operation that failed, in words.
        what: String,
        /// The underlying operating-system error.
        #[source]
        source: std::io::Error,
    },
    /// Generating a certificate or key with rcgen failed.
    #[error("certificate generation failed: {0}")]
    Certificate(#[from] rcgen::Error),
    /// rustls rejected a configuration (bad key, no usable protocol version, ...).
    #[error("TLS configuration failed: {0}")]
    Tls(#[from] rustls::Error),
    /// The gRPC server of the OTLP receiver failed to start.
    #[error("gRPC transport failed: {0}")]
    Grpc(#[from] tonic::transport::Error),
    /// An OTLP JSON document could not be parsed.
    #[error("OTLP JSON could not be parsed: {0}")]
    Json(#[from] serde_json::Error),
    /// No nginx binary was found in `PATH` nor at `/usr/sbin/nginx`.
    /// Tests treat this as a failure, never as a reason to skip.
    #[error("nginx binary not found (searched: {searched})")]
    NginxMissing {
        /// The places that were searched, comma separated.
        searched: String,
    },
    /// nginx started but exited, or never accepted connections on its ports.
    #[error("nginx failed: {message}\n--- nginx error log ---\n{error_log}")]
    NginxFailed {
        /// What went wrong, in words.
        message: String,
        /// The content of nginx's error log (and stderr) at the time of failure.
        error_log: String,
    },
    /// Something did not happen within the allowed time.
    #[error("timed out after {after:?} waiting for {what}")]
    Timeout {
        /// What was being waited for.
        what: String,
        /// How long was waited.
        after: Duration,
    },
    /// A caller-supplied value was not usable (e.g. an empty name list).
    #[error("invalid configuration: {0}")]
    InvalidConfig(String),
}

impl LabError {
    /// Wraps an I/O error with a description of the operation that failed.
    pub(crate) fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        Self::Io {
            what: what.into(),
            source,
        }
    }
}
