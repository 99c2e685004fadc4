//! Export: how the facts leave the library besides spans.
//!
//! - `metrics`: the handle's instruments and their observable callbacks;
//! - `report`: [`RequestReport`](crate::RequestReport) and [`OnRequestEnd`](crate::OnRequestEnd), the Rust-side view;
//! - `clock`: monotonic instants mapped to wall-clock span timestamps;
//! - `phases`: [`ConnectionPhases`](crate::ConnectionPhases), a connection's phases written as child spans or as events of its setup span, and the shared end of a setup span whose `tcp.connect` event waits for the kernel;
//! - `pending`: spans that end off the request path, and [`wait_for_pending_spans`](crate::wait_for_pending_spans), which waits for them before a flush;
//! - `sampling`: [`KeepConnectionSetups`](crate::KeepConnectionSetups), the sampler that keeps every connection setup while requests are head-sampled.

pub(crate) mod clock;
pub(crate) mod metrics;
pub(crate) mod pending;
pub(crate) mod phases;
pub(crate) mod report;
pub(crate) mod sampling;
