//! Pictures of the spans a run exported: a self-contained HTML page (a
//! timeline of traces on a shared time axis with connection phases, pool
//! misses and the links from each request to the connection that served
//! it, miss rates per batch, calls in flight against the idle limit) and
//! the probe's terminal waterfall.
//!
//! - [`HtmlArg`]: `--html FILE` of `demo`, `probe` and `lab`; the page is
//!   made from the very spans the run exported (the in-memory copy of what
//!   went to the collector or the traces file), so it cannot disagree with
//!   a trace viewer;
//! - [`ViewArgs`] / [`run`]: `conntrace view TRACES.json --html FILE`, the
//!   same page from an OTLP JSON traces file;
//! - [`waterfall`]: `conntrace probe --waterfall`.
//!
//! The page is drawn in the browser by D3 (vendored in `assets/`, ISC
//! licence, carried into every page) from the model in [`model`].

mod command;
mod html;
mod model;
mod page;
pub(crate) mod waterfall;

pub(crate) use command::{ViewArgs, run};
pub(crate) use html::HtmlArg;
