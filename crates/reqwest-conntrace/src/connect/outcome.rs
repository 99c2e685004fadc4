//! How a connect ended, as its phases and its setup span read it: ready
//! (reqwest's `Connected`), or failed with an error and what it showed.

use std::net::SocketAddr;

use crate::connect::peer::Peer;
use crate::error::ProxyRefusal;
use crate::semconv;

/// Facts about a finished connect read from reqwest's `Connected`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Established {
    pub(crate) local: Option<SocketAddr>,
    pub(crate) remote: Option<SocketAddr>,
    pub(crate) http2: bool,
    pub(crate) proxied: bool,
}

impl Established {
    /// A connection with no socket addresses, not through a proxy: a local
    /// transport (reqwest's `unix_socket`: a Unix domain socket; a named
    /// pipe on Windows).
    pub(crate) fn local_transport(&self) -> bool {
        self.local.is_none() && self.remote.is_none() && !self.proxied
    }
}

/// What a failed connect's error showed (see `proxy`).
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct FailureFacts {
    /// The proxy refused the `CONNECT` (the error came from its answer).
    pub(crate) refusal: Option<ProxyRefusal>,
    /// hyper-util's `CONNECT` tunnel failed.
    pub(crate) tunnel_failed: bool,
    /// The address a refused TCP connect went to.
    pub(crate) refused_at: Option<SocketAddr>,
}

/// How a connect ended, for the phase that was running.
pub(crate) enum Ending<'a> {
    Ready(&'a Established),
    Failed {
        error_type: &'static str,
        message: String,
        /// What the error showed.
        facts: FailureFacts,
        /// The address TCP connected to, when the handshake after it failed.
        peer: Peer,
    },
}

/// The error a connect ended with, as the phases report it: none for a
/// ready connect (a phase it left unfinished reads as cancelled).
#[derive(Debug, Default, Clone)]
pub(crate) struct Failure {
    /// The connect's `error.type`.
    pub(crate) error_type: Option<&'static str>,
    /// The connect's error message.
    pub(crate) message: Option<String>,
}

impl Failure {
    /// `error.type` and message for a phase (or setup span) that did not
    /// finish: the connect's error (its type as the message when it had
    /// none), else `cancelled`, the connect abandoned before it finished.
    pub(crate) fn or_cancel(&self) -> (&'static str, String) {
        match (self.error_type, &self.message) {
            (Some(t), Some(m)) => (t, m.clone()),
            (Some(t), None) => (t, t.to_owned()),
            _ => (
                semconv::ERROR_TYPE_CANCELLED,
                "connect abandoned before it finished".to_owned(),
            ),
        }
    }
}
