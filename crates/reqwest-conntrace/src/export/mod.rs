//! Export: how the facts leave the library besides spans.
//!
//! - `metrics`: the handle's instruments and their observable callbacks;
//! - `report`: [`RequestReport`](crate::RequestReport) and [`OnRequestEnd`](crate::OnRequestEnd), the Rust-side view;
//! - `clock`: monotonic instants mapped to wall-clock span timestamps.

pub(crate) mod clock;
pub(crate) mod metrics;
pub(crate) mod report;
