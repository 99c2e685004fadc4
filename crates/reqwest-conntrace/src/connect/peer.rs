//! The peer of a connect whose connection never came back: TCP connected
//! (the TLS handshake began) but the handshake then hung or failed, so
//! reqwest's connector returned no connection to read the address from.
//!
//! With one candidate address (one DNS answer, an IP literal), when no
//! other may exist, the peer is that address. With several, or with one
//! beside addresses not shown (a name connected to without a lookup: a
//! `resolve` override, or a proxy configured by IP that the connect may
//! or may not have gone through), the kernel is asked, off the request path,
//! while the handshake is still running: this process's connected TCP
//! sockets to the candidate addresses (a sock_diag dump kept to the socket
//! inodes in `/proc/self/fd`, see `kernel::owned`), minus the connections
//! the registry already knows. The peer is named when every socket left has
//! the same peer; sockets left with different peers (parallel connects to
//! the same host in their handshakes at once) make it ambiguous, and the
//! candidates are listed instead
//! ([`HTTP_CONNECTION_PEER_CANDIDATES`](crate::semconv::HTTP_CONNECTION_PEER_CANDIDATES)).
//!
//! The question is asked only of a handshake still running [`ASK_AFTER`]
//! after it began (or halfway to the connect timeout, if sooner): the
//! descriptor scan is linear in the process's open files (tens of ms with
//! thousands), and a handshake that completes needs none of it. An answer
//! counts only if it came before the connect ended: after the end, the
//! socket may have been closed before the kernel looked.

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use crate::connect::attempt::{ConnectAttempt, Phases};
use crate::handle::Inner;
use crate::kernel::{OwnedLookup, OwnedSocket};

/// How long a TLS handshake runs before the kernel is asked which address
/// its TCP connection went to: a cost bound (most handshakes finish within
/// a few round trips), not a correctness one.
pub(crate) const ASK_AFTER: Duration = Duration::from_millis(200);

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

/// Learning the peer of one connect.
#[derive(Debug, Default)]
pub(crate) struct PeerLookup {
    /// The answer, once known.
    answer: OnceLock<Peer>,
    /// The connect ended: a later answer is not wanted.
    settled: AtomicBool,
}

impl PeerLookup {
    /// Starts learning the peer of `attempt`, whose TLS handshake began in
    /// the poll that just returned: at once when there is one candidate
    /// address, else from the kernel (queued for later, never waited for).
    /// `None` when the candidates are unknown (a `ClientBuilder::resolve`
    /// override, no triggering request) or the kernel is off.
    pub(crate) fn start(inner: &Arc<Inner>, attempt: &ConnectAttempt) -> Option<Arc<PeerLookup>> {
        let ((candidates, complete), tls_started) = {
            let phases = attempt.phases();
            (candidates(attempt, &phases)?, phases.tls_started?)
        };
        let lookup = Arc::new(PeerLookup::default());
        if let ([only], true) = (&candidates[..], complete) {
            let _ = lookup.answer.set(Peer::Named(*only));
            return Some(lookup);
        }
        if !inner.kernel.is_available() {
            return None;
        }
        let left = attempt
            .connect_timeout
            .map(|t| (attempt.started + t).saturating_duration_since(tls_started));
        let due = tls_started + left.map_or(ASK_AFTER, |l| ASK_AFTER.min(l / 2));
        let (wanted, answered) = (lookup.clone(), lookup.clone());
        let registry_of = inner.clone();
        inner.kernel.connected_to_then(
            candidates,
            due,
            move || !wanted.settled.load(Ordering::Acquire),
            move |sockets| {
                let known = |s: &OwnedSocket| registry_of.registry.get(s.local, s.remote).is_some();
                if !answered.settled.load(Ordering::Acquire) {
                    let _ = answered.answer.set(decide(sockets, known));
                }
            },
        );
        Some(lookup)
    }

    /// The connect ended: the peer as known now ([`Peer::Unknown`] if the
    /// kernel has not answered yet; it is then not asked at all, or its
    /// answer is dropped).
    pub(crate) fn settle(&self) -> Peer {
        self.settled.store(true, Ordering::Release);
        self.answer.get().cloned().unwrap_or(Peer::Unknown)
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
/// handed to it (the target's name with its port; a proxy's name with the
/// port configured for it), or the IP literals it may have been given (the
/// target's, the configured proxies'), with the port hyper-util uses (the
/// URL's, or the answer's own when the URL had none: both are kept when
/// they differ). Second: whether the list is complete (a name connected
/// to without a lookup, an override or a proxy whose address is not
/// shown, may be missing). `None` when unknown.
fn candidates(attempt: &ConnectAttempt, phases: &Phases) -> Option<(Vec<SocketAddr>, bool)> {
    let target = &attempt.trigger.as_ref()?.host;
    let same = |a: &str, b: &str| a.eq_ignore_ascii_case(b);
    let mut all = Vec::new();
    let complete = match &phases.dns {
        Some(dns) => {
            let mut ports: Vec<u16> = attempt
                .proxies
                .known
                .iter()
                .filter(|c| same(&c.host, &dns.name))
                .map(|c| c.port)
                .collect();
            if same(&dns.name, &target.host) {
                ports.push(target.port);
            }
            for a in &dns.connect_order {
                all.extend(ports.iter().map(|p| SocketAddr::new(a.ip(), *p)));
                if a.port() != 0 {
                    all.push(*a);
                }
            }
            !ports.is_empty()
        }
        None => {
            let literal = |host: &str, port| {
                host.trim_start_matches('[')
                    .trim_end_matches(']')
                    .parse::<IpAddr>()
                    .ok()
                    .map(|ip| SocketAddr::new(ip, port))
            };
            let target_literal = literal(&target.host, target.port);
            all.extend(target_literal);
            let mut complete = target_literal.is_some() && !attempt.proxies.unknown;
            for c in &attempt.proxies.known {
                match literal(&c.host, c.port) {
                    Some(a) => all.push(a),
                    None => complete = false,
                }
            }
            complete
        }
    };
    all.sort();
    all.dedup();
    (!all.is_empty()).then_some((all, complete))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::TcpState;

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
    fn an_end_after_the_answer_gets_the_peer_before_it_unknown() {
        let answered = PeerLookup::default();
        let _ = answered.answer.set(Peer::Named(addr("127.0.0.1:443")));
        assert_eq!(answered.settle(), Peer::Named(addr("127.0.0.1:443")));
        let waiting = PeerLookup::default();
        assert_eq!(waiting.settle(), Peer::Unknown);
        assert!(waiting.settled.load(Ordering::Acquire), "no longer wanted");
    }
}
