//! The pool model: what the handle knows about each client's connections,
//! from which a miss's reason and the pool advice are read.
//!
//! - `model`: each client's connections per host (the pool history) and
//!   the miss-reason decision table's first rows;
//! - `losses`: losses of a connection known without the kernel (rows 4-7), each named by one miss;
//! - `kernel_decision`: a miss decided from the kernel's view of its candidate (rows 8-10f);
//! - `end_report`: the kernel's report of a TLS socket's end: whose close it was;
//! - `previous`: the previous connection a miss names, read from its record;
//! - `host`: the pool key (scheme, host, port);
//! - `slot`: the miss of one connect (reason, previous connection) and the slot it is decided into;
//! - `client`: one instrumented client instance and its pool settings;
//! - `inferred`: pool limits inferred from the closes a client's pool makes;
//! - `record`: one connection as the handle saw it set up and used;
//! - `registry`: live connections by socket address pair;
//! - `advice`: per-host in-flight load and the pool-size advice (Little's law);
//! - `in_flight`: the requests to a host in flight at a miss, with their starts.

pub(crate) mod advice;
pub(crate) mod answers;
pub(crate) mod client;
pub(crate) mod end_report;
pub(crate) mod host;
pub(crate) mod in_flight;
pub(crate) mod inferred;
pub(crate) mod kernel_decision;
pub(crate) mod losses;
pub(crate) mod model;
pub(crate) mod previous;
pub(crate) mod record;
pub(crate) mod registry;
pub(crate) mod slot;
