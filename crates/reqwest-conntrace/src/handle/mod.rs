//! The [`ConnTrace`] handle: registry, tracer and settings shared by the
//! connector layer, the resolver wrapper, the TLS hooks and the middleware.
//!
//! - [`ConnTrace`] (`conn_trace`): the handle users clone into their
//!   clients, and its public queries;
//! - [`ConnTraceBuilder`] (`builder`): its settings;
//! - [`Inner`] (`inner`): what its clones share, and what each observation
//!   (a connect, a release, a close, the kernel's view) changes in it;
//! - `settle`: a miss whose reason waits for the kernel's view of its
//!   candidate.

mod builder;
mod conn_trace;
mod inner;
mod settle;

pub use builder::ConnTraceBuilder;
pub use conn_trace::{ConnTrace, DEFAULT_POOL_ADVICE_INTERVAL, DEFAULT_REGISTRY_CAPACITY};
pub(crate) use inner::Inner;
#[cfg(feature = "otlp")]
pub(crate) use inner::{global_meter_installed, handles_on_global_meter};
