//! End-to-end tests: real sockets on loopback, spans decoded from what the
//! SDK exported (in-memory exporter) or what an OTLP receiver decoded; and
//! the docker-compose stack's configuration (`deploy`) and its alert path
//! run for real on loopback (`paging`).

mod attribution;
mod collector_faults;
mod contract;
mod cost;
mod deploy;
mod dropin;
mod fanout;
mod kernel;
mod library;
mod metrics;
mod paging;
mod scale;
mod secrets;
mod support;
