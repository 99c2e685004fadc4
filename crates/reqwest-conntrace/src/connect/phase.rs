//! What every phase of a finished connect is emitted with (see `setup`):
//! the handle, the tracer, the setup span, the attempt's recorded
//! boundaries and how the connect ended.

use std::time::Instant;

use opentelemetry::Context;
use opentelemetry::global::BoxedTracer;

use crate::connect::attempt::{ConnectAttempt, Phases};
use crate::connect::outcome::{Established, Failure};
use crate::handle::Inner;

/// Where and from what the phases of one finished connect are emitted.
#[derive(Clone, Copy)]
pub(crate) struct PhaseScope<'a> {
    /// The handle: its clock (monotonic to wall time), its phase mode
    /// (spans or events), the kernel view.
    pub(crate) inner: &'a Inner,
    /// The tracer phase spans are built with; `None` when the setup span
    /// does not record (no phase is built then, only the report).
    pub(crate) tracer: Option<&'a BoxedTracer>,
    /// The context holding the setup span the phases go under.
    pub(crate) setup: &'a Context,
    /// The connect.
    pub(crate) attempt: &'a ConnectAttempt,
    /// The boundaries its hooks recorded (monotonic instants).
    pub(crate) phases: &'a Phases,
    /// reqwest's facts about the connection, when the connect was ready.
    pub(crate) established: Option<&'a Established>,
    /// The error the connect failed with (none when it was ready).
    pub(crate) failure: &'a Failure,
    /// When the connect ended, ready or failed (monotonic).
    pub(crate) end: Instant,
}
