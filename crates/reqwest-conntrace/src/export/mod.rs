//! Export: how the facts leave the library besides spans.
//!
//! - `metrics`: the handle's instruments and their observable callbacks;
//! - `report`: [`RequestReport`](crate::RequestReport) and [`OnRequestEnd`](crate::OnRequestEnd), the Rust-side view;
//! - `clock`: monotonic instants mapped to wall-clock span timestamps;
//! - `pending`: spans that end off the request path, and [`wait_for_pending_spans`](crate::wait_for_pending_spans), which waits for them before a flush;
//! - `sampling`: [`KeepConnectionSetups`](crate::KeepConnectionSetups), the sampler that keeps every connection setup while requests are head-sampled.

pub(crate) mod clock;
pub(crate) mod metrics;
pub(crate) mod pending;
pub(crate) mod report;
pub(crate) mod sampling;
