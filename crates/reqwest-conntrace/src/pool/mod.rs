//! The pool model: what the handle knows about each client's connections,
//! from which a miss's reason and the pool advice are read.
//!
//! - `model`: each client's connections per host and the miss-reason decision table;
//! - `host`: the pool key (scheme, host, port);
//! - `slot`: the miss of one connect (reason, previous connection) and the slot it is decided into;
//! - `client`: one instrumented client instance and its pool settings;
//! - `inferred`: pool limits inferred from the closes a client's pool makes;
//! - `registry`: live connections by socket address pair;
//! - `advice`: per-host in-flight load and the pool-size advice (Little's law).

pub(crate) mod advice;
pub(crate) mod answers;
pub(crate) mod client;
pub(crate) mod host;
pub(crate) mod inferred;
pub(crate) mod model;
pub(crate) mod registry;
pub(crate) mod slot;
