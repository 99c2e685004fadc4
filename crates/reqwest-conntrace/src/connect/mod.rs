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
//! - `setup`: the `http.connection_setup` span and its phase children (or events).

pub(crate) mod address;
pub(crate) mod attempt;
pub(crate) mod connector;
pub(crate) mod dns;
pub(crate) mod peer;
pub(crate) mod proxy;
pub(crate) mod setup;
pub(crate) mod tcp;
pub(crate) mod tls;
