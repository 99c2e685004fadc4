//! The connect side: what happens when the pool misses and reqwest's
//! connector opens a new connection.
//!
//! - `connector`: the tower layer around reqwest's connector, one setup span per connect;
//! - `attempt`: one connect in flight, the thread-local current attempt the hooks write into;
//! - `dns`: the resolver wrapper and the system resolver;
//! - `address`: address order as hyper-util tries it, the winner, skipped addresses, SYN retransmits;
//! - `tcp`: the end of a `tcp.connect` span (kernel facts, retransmit events);
//! - `peer`: the address TCP connected to when the connection never came back (the handshake hung or failed);
//! - `proxy`: which proxy a connect goes through;
//! - `tls`: [`TlsSettings`](crate::TlsSettings) and the rustls hooks that time the handshake;
//! - `outcome`: how a connect ended (ready with reqwest's facts, or failed with its error);
//! - `setup`: the `http.connection_setup` span, and the sequence of its phase children (or events);
//! - `phase`: what every phase is emitted with (the tracer, the setup span, the recorded boundaries);
//! - `attributes`: peer, network type and proxy attributes the phases, the setup span and the metrics share;
//! - `phase_dns`: the `dns.lookup` phase, and why a connect had none;
//! - `phase_tcp`: the `tcp.connect` phase (its attributes, `tcp.address_skipped` events), ended now or after the kernel answers;
//! - `phase_tunnel`: the `proxy.connect` phase (the `CONNECT` tunnel), when it began;
//! - `phase_tls`: the `tls.handshake` phase and its events;
//! - `setup_attributes`: the setup span's own attributes once its phases are emitted;
//! - `setup_metrics`: the setup duration, DNS duration and connections-opened metrics.

pub(crate) mod address;
pub(crate) mod attempt;
pub(crate) mod attributes;
pub(crate) mod connector;
pub(crate) mod dns;
pub(crate) mod outcome;
pub(crate) mod peer;
pub(crate) mod phase;
pub(crate) mod phase_dns;
pub(crate) mod phase_tcp;
pub(crate) mod phase_tls;
pub(crate) mod phase_tunnel;
pub(crate) mod proxy;
pub(crate) mod setup;
pub(crate) mod setup_attributes;
pub(crate) mod setup_metrics;
pub(crate) mod tcp;
pub(crate) mod tls;
