//! The peer of a connect whose connection never came back: TCP connected
//! (the TLS handshake began) but the handshake then hung or failed, so
//! reqwest's connector returned no connection to read the address from.
//!
//! With one candidate address (one DNS answer, an IP literal) the peer is
//! that address. With several, the kernel is asked as soon as the poll that
//! began the handshake returns (the socket is open then): this process's
//! connected TCP sockets to the candidate addresses (a sock_diag dump kept
//! to the socket inodes in `/proc/self/fd`, see `kernel::owned`), minus the
//! connections the registry already knows. The peer is named when every
//! socket left has the same peer; two sockets left with different peers
//! (parallel connects to the same host in their handshakes at once) make it
//! ambiguous, and the candidates are listed instead
//! ([`HTTP_CONNECTION_PEER_CANDIDATES`](crate::semconv::HTTP_CONNECTION_PEER_CANDIDATES)).
//! The request path never waits: the answer arrives on the
//! `conntrace-sock-diag` thread, and a connect that failed before it came
//! ends its spans there.

use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};

use crate::connect::attempt::{ConnectAttempt, Phases};
use crate::handle::Inner;
use crate::kernel::{OwnedLookup, OwnedSocket};

/// What is known of the peer of a connect that never returned a connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Peer {
    /// The address TCP connected to.
    Named(SocketAddr),
    /// More than one of the candidates had a socket of this process that
    /// may be this connect's (sorted).
    Ambiguous(Vec<SocketAddr>),
    /// Not known: no handshake began, the kernel could not tell, or the
    /// connect ended before the kernel answered.
    Unknown,
}

/// A continuation waiting for the peer.
type Then = Box<dyn FnOnce(Peer) + Send + 'static>;

/// Learning the peer of one connect.
pub(crate) struct PeerLookup {
    state: Mutex<State>,
}

enum State {
    /// The kernel has not answered; the connect's end, if it came first.
    Waiting(Option<Then>),
    Answered(Peer),
}

impl std::fmt::Debug for PeerLookup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerLookup").finish_non_exhaustive()
    }
}

impl PeerLookup {
    /// Starts learning the peer of `attempt`, whose TLS handshake began in
    /// the poll that just returned: at once when there is one candidate
    /// address, else from the kernel (queued, never waited for). `None`
    /// when the candidates are unknown (a `ClientBuilder::resolve`
    /// override, no triggering request) or the kernel is off.
    pub(crate) fn start(inner: &Arc<Inner>, attempt: &ConnectAttempt) -> Option<Arc<PeerLookup>> {
        let candidates = candidates(attempt, &attempt.phases())?;
        if let [only] = candidates[..] {
            return Some(Arc::new(PeerLookup {
                state: Mutex::new(State::Answered(Peer::Named(only))),
            }));
        }
        if !inner.kernel.is_available() {
            return None;
        }
        let lookup = Arc::new(PeerLookup {
            state: Mutex::new(State::Waiting(None)),
        });
        let answered = lookup.clone();
        let registry_of = inner.clone();
        inner.kernel.connected_to_then(candidates, move |sockets| {
            let known = |s: &OwnedSocket| registry_of.registry.get(s.local, s.remote).is_some();
            answered.answer(decide(sockets, known));
        });
        Some(lookup)
    }

    /// Runs `then` with the peer: at once if known, else when the kernel
    /// answers (on its thread). A connect that ended before the answer
    /// gets [`Peer::Unknown`]: its socket may have been closed before the
    /// kernel looked.
    pub(crate) fn then(&self, then: impl FnOnce(Peer) + Send + 'static) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        match &*state {
            State::Answered(peer) => {
                let peer = peer.clone();
                drop(state);
                then(peer);
            }
            State::Waiting(_) => *state = State::Waiting(Some(Box::new(then))),
        }
    }

    fn answer(&self, peer: Peer) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        match std::mem::replace(&mut *state, State::Answered(peer.clone())) {
            State::Waiting(Some(then)) => {
                drop(state);
                then(Peer::Unknown);
            }
            State::Waiting(None) | State::Answered(_) => {}
        }
    }
}

impl Drop for PeerLookup {
    /// A waiting end still runs (the kernel's answer was lost): its spans
    /// must end.
    fn drop(&mut self) {
        let state = self.state.get_mut().unwrap_or_else(|e| e.into_inner());
        if let State::Waiting(Some(then)) = std::mem::replace(state, State::Answered(Peer::Unknown))
        {
            then(Peer::Unknown);
        }
    }
}

/// The peer the kernel's answer allows: every socket of this process to a
/// candidate that is not a `known` connection (one the registry holds) has
/// the same peer.
fn decide(lookup: OwnedLookup, known: impl Fn(&OwnedSocket) -> bool) -> Peer {
    let OwnedLookup::Found(sockets) = lookup else {
        return Peer::Unknown;
    };
    let mut peers: Vec<SocketAddr> = sockets
        .iter()
        .filter(|s| !known(s))
        .map(|s| s.remote)
        .collect();
    peers.sort();
    peers.dedup();
    match peers[..] {
        [] => Peer::Unknown,
        [one] => Peer::Named(one),
        _ => Peer::Ambiguous(peers),
    }
}

/// Every address the connector may have connected to: the DNS answers
/// handed to it, or the IP literal it was given, with the port hyper-util
/// uses (the URL's, or the answer's own when the URL had none: both are
/// kept when they differ). Through a proxy these are the proxy's. `None`
/// when unknown.
fn candidates(attempt: &ConnectAttempt, phases: &Phases) -> Option<Vec<SocketAddr>> {
    let (host, port) = match (&attempt.proxy, &attempt.trigger) {
        (Some(route), _) => (route.host.as_str(), route.port),
        (None, Some(t)) => (t.host.host.as_str(), t.host.port),
        (None, None) => return None,
    };
    let mut all = Vec::new();
    match &phases.dns {
        Some(dns) => {
            for a in &dns.connect_order {
                all.push(SocketAddr::new(a.ip(), port));
                if a.port() != 0 {
                    all.push(*a);
                }
            }
        }
        None => {
            let ip: IpAddr = host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .parse()
                .ok()?;
            all.push(SocketAddr::new(ip, port));
        }
    }
    all.sort();
    all.dedup();
    (!all.is_empty()).then_some(all)
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::kernel::TcpState;

    fn waiting() -> PeerLookup {
        PeerLookup {
            state: Mutex::new(State::Waiting(None)),
        }
    }

    fn addr(s: &str) -> SocketAddr {
        s.parse().expect("test address")
    }

    fn socket(local_port: u16, remote: &str) -> OwnedSocket {
        OwnedSocket {
            local: SocketAddr::from(([127, 0, 0, 1], local_port)),
            remote: addr(remote),
            state: TcpState::Established,
        }
    }

    #[test]
    fn one_peer_left_is_named_several_are_ambiguous() {
        let nothing_known = |_: &OwnedSocket| false;
        let found = |s: Vec<OwnedSocket>| OwnedLookup::Found(s);
        assert_eq!(
            decide(found(vec![socket(1, "127.0.0.2:443")]), nothing_known),
            Peer::Named(addr("127.0.0.2:443"))
        );
        // Two sockets to the same address: whichever is ours, that is its peer.
        assert_eq!(
            decide(
                found(vec![socket(1, "127.0.0.2:443"), socket(2, "127.0.0.2:443")]),
                nothing_known
            ),
            Peer::Named(addr("127.0.0.2:443"))
        );
        assert_eq!(
            decide(
                found(vec![socket(1, "127.0.0.2:443"), socket(2, "127.0.0.1:443")]),
                nothing_known
            ),
            Peer::Ambiguous(vec![addr("127.0.0.1:443"), addr("127.0.0.2:443")])
        );
        // A pooled connection the registry knows is not ours.
        let pooled = |s: &OwnedSocket| s.local.port() == 2;
        assert_eq!(
            decide(
                found(vec![socket(1, "127.0.0.2:443"), socket(2, "127.0.0.1:443")]),
                pooled
            ),
            Peer::Named(addr("127.0.0.2:443"))
        );
        assert_eq!(decide(found(vec![]), nothing_known), Peer::Unknown);
        assert_eq!(decide(OwnedLookup::TimedOut, nothing_known), Peer::Unknown);
        assert_eq!(
            decide(OwnedLookup::Unavailable, nothing_known),
            Peer::Unknown
        );
    }

    #[test]
    fn an_end_after_the_answer_gets_the_peer() {
        let lookup = waiting();
        lookup.answer(Peer::Named(addr("127.0.0.1:443")));
        let got = Arc::new(Mutex::new(None));
        let sink = got.clone();
        lookup.then(move |p| *sink.lock().expect("lock") = Some(p));
        assert_eq!(
            *got.lock().expect("lock"),
            Some(Peer::Named(addr("127.0.0.1:443")))
        );
    }

    /// The connect ended first: its socket may have been closed before the
    /// kernel looked, so the answer is not trusted.
    #[test]
    fn an_end_before_the_answer_gets_unknown_once() {
        let lookup = waiting();
        let runs = Arc::new(AtomicUsize::new(0));
        let got = Arc::new(Mutex::new(None));
        let (sink, count) = (got.clone(), runs.clone());
        lookup.then(move |p| {
            count.fetch_add(1, Ordering::SeqCst);
            *sink.lock().expect("lock") = Some(p);
        });
        assert_eq!(runs.load(Ordering::SeqCst), 0, "waits for the kernel");
        lookup.answer(Peer::Named(addr("127.0.0.1:443")));
        drop(lookup);
        assert_eq!(runs.load(Ordering::SeqCst), 1);
        assert_eq!(*got.lock().expect("lock"), Some(Peer::Unknown));
    }

    #[test]
    fn a_lost_answer_still_runs_the_end() {
        let lookup = waiting();
        let runs = Arc::new(AtomicUsize::new(0));
        let count = runs.clone();
        lookup.then(move |p| {
            assert_eq!(p, Peer::Unknown);
            count.fetch_add(1, Ordering::SeqCst);
        });
        drop(lookup);
        assert_eq!(runs.load(Ordering::SeqCst), 1);
    }
}
