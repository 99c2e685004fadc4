//! The state of one connect in flight, shared by the connector layer, the
//! DNS wrapper and the rustls hooks through a thread-local set while the
//! connect future is polled.

use std::cell::RefCell;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use crate::connect::proxy::Candidates;
use crate::export::report::TlsVersion;
use crate::pool::client::ClientState;
use crate::pool::slot::MissSlot;
use crate::request::state::RequestState;

/// One connect: created when reqwest calls the connector (a pool miss),
/// finished when the connect future resolves or is dropped.
#[derive(Debug)]
pub(crate) struct ConnectAttempt {
    pub(crate) id: u64,
    /// When reqwest called the connector (the miss was classified then):
    /// the setup span's start.
    pub(crate) started: Instant,
    /// The request whose poll called the connector, when it went through our
    /// middleware.
    pub(crate) trigger: Option<Arc<RequestState>>,
    /// The client whose connector was called.
    pub(crate) client: Arc<ClientState>,
    /// Why the trigger's pool checkout failed.
    pub(crate) miss: Option<MissSlot>,
    /// `miss` is the one the trigger's span records (its first connect's):
    /// the setup span then carries the reason that span records
    /// ([`SetupReason`](crate::request::pending_setup::SetupReason)).
    pub(crate) trigger_miss: bool,
    /// The client's connect timeout (hyper-util splits it among addresses).
    pub(crate) connect_timeout: Option<std::time::Duration>,
    /// The proxies the client's rules name for the target (which one, if
    /// any, the connect went through is judged from its evidence).
    pub(crate) proxies: Candidates,
    phases: Mutex<Phases>,
}

/// Phase boundaries recorded by the hooks, in the order they happen.
#[derive(Debug, Default, Clone)]
pub(crate) struct Phases {
    pub(crate) dns: Option<DnsPhase>,
    /// First call into the TLS session store: the ClientHello is being built,
    /// so TCP is connected.
    pub(crate) tls_started: Option<Instant>,
    /// The session store handed out a cached session (ticket or session id).
    pub(crate) resumption_offered: bool,
    /// TLS 1.3 handshake secret derived: ServerHello processed.
    pub(crate) server_hello: Option<Instant>,
    /// TLS 1.3 application secret derived: server Finished processed.
    pub(crate) server_finished: Option<Instant>,
    /// Certificate verification: when, and the error text if rejected.
    pub(crate) cert_verified: Option<(Instant, Option<String>)>,
    /// Verification began (the time provider was asked for it) under a
    /// user's own rustls config, whose verifier cannot be wrapped.
    pub(crate) cert_verify_started: Option<Instant>,
    /// The certificate was accepted unverified (`danger_accept_invalid_certs`).
    pub(crate) cert_verification_skipped: bool,
    /// Version learnt from the handshake (signature check or key schedule).
    pub(crate) tls_version: Option<TlsVersion>,
    /// Start of the latest poll of the connect future, and of the one before.
    pub(crate) poll_started: Option<Instant>,
    pub(crate) previous_poll_started: Option<Instant>,
    /// At TLS start: the start of the poll before the one that began TLS.
    /// Through a CONNECT proxy that poll completed the TCP connect and sent
    /// the CONNECT request (see `semconv::PROXY_CONNECT_SPAN`). When the
    /// poll that began TLS is the first one (on loopback the TCP connect,
    /// the CONNECT round trip and the TLS start can all complete in one
    /// poll), that poll's start.
    pub(crate) tunnel_started: Option<Instant>,
    /// At TLS start: the start of the poll that began TLS.
    pub(crate) tls_poll_started: Option<Instant>,
}

/// The DNS phase of a connect.
#[derive(Debug, Clone)]
pub(crate) struct DnsPhase {
    pub(crate) name: String,
    /// When reqwest asked the resolver.
    pub(crate) asked: Instant,
    /// When the lookup actually began (after queueing for a blocking thread),
    /// when the resolver can tell.
    pub(crate) began: Option<Instant>,
    pub(crate) answered: Option<Instant>,
    pub(crate) answers: Vec<SocketAddr>,
    /// The answers in the order handed to the connector (after the
    /// address-order policy).
    pub(crate) connect_order: Vec<SocketAddr>,
    /// The policy that produced `connect_order`.
    pub(crate) order: crate::connect::address::AddressOrder,
    pub(crate) error: Option<(&'static str, String)>,
    /// The resolver's newest answer for `name`, which this lookup's answer
    /// now is: the connection made from it is judged by it (`dns_stale`).
    pub(crate) newest: Option<Arc<crate::pool::answers::HostAnswer>>,
}

impl ConnectAttempt {
    pub(crate) fn new(
        id: u64,
        started: Instant,
        trigger: Option<Arc<RequestState>>,
        client: Arc<ClientState>,
        miss: Option<MissSlot>,
        connect_timeout: Option<std::time::Duration>,
        proxies: Candidates,
    ) -> Self {
        Self {
            id,
            started,
            trigger,
            client,
            miss,
            trigger_miss: false,
            connect_timeout,
            proxies,
            phases: Mutex::new(Phases::default()),
        }
    }

    /// Notes the start of a poll of the connect future.
    pub(crate) fn mark_poll(&self, now: Instant) {
        let mut p = self.phases();
        p.previous_poll_started = p.poll_started.replace(now);
    }

    /// Locks the phase record. A poisoned lock (a panic elsewhere while
    /// holding it) still yields the data: telemetry must not panic.
    pub(crate) fn phases(&self) -> MutexGuard<'_, Phases> {
        self.phases.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Marks TLS start on the first call only.
    pub(crate) fn mark_tls_started(&self) {
        let mut p = self.phases();
        if p.tls_started.is_none() {
            p.tls_started = Some(Instant::now());
            p.tunnel_started = p.previous_poll_started.or(p.poll_started);
            p.tls_poll_started = p.poll_started;
        }
    }
}

thread_local! {
    static CURRENT: RefCell<Option<Arc<ConnectAttempt>>> = const { RefCell::new(None) };
}

/// Runs `f` with the connect attempt being polled on this thread, if any.
pub(crate) fn with_current<R>(f: impl FnOnce(&Arc<ConnectAttempt>) -> R) -> Option<R> {
    CURRENT
        .try_with(|c| c.borrow().as_ref().map(f))
        .ok()
        .flatten()
}

/// Makes `attempt` the current one on this thread until dropped; restores
/// the previous one (connects can nest when a proxy connector is layered).
pub(crate) struct AttemptScope {
    previous: Option<Arc<ConnectAttempt>>,
}

impl AttemptScope {
    pub(crate) fn enter(attempt: &Arc<ConnectAttempt>) -> Self {
        let previous = CURRENT
            .try_with(|c| c.borrow_mut().replace(attempt.clone()))
            .ok()
            .flatten();
        Self { previous }
    }
}

impl Drop for AttemptScope {
    fn drop(&mut self) {
        let previous = self.previous.take();
        let _ = CURRENT.try_with(|c| *c.borrow_mut() = previous);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use super::*;
    use crate::pool::client::ClientState;

    fn attempt() -> ConnectAttempt {
        ConnectAttempt::new(
            1,
            Instant::now(),
            None,
            Arc::new(ClientState::new(None, None)),
            None,
            None,
            Candidates::default(),
        )
    }

    /// The tunnel starts with the poll before the one that began TLS.
    #[test]
    fn tunnel_starts_with_the_poll_before_tls() {
        let a = attempt();
        let t0 = Instant::now();
        a.mark_poll(t0);
        a.mark_poll(t0 + Duration::from_millis(1));
        a.mark_tls_started();
        assert_eq!(a.phases().tunnel_started, Some(t0));
    }

    /// One poll that connected, tunneled and began TLS (loopback): the
    /// tunnel starts with that poll instead of being lost.
    #[test]
    fn tunnel_in_the_first_poll_starts_with_it() {
        let a = attempt();
        let t0 = Instant::now();
        a.mark_poll(t0);
        a.mark_tls_started();
        assert_eq!(a.phases().tunnel_started, Some(t0));
    }
}
