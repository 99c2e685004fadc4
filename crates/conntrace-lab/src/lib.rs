//! Loopback test servers and fault injectors for reqwest-conntrace's tests,
//! examples and the `conntrace demo` command.
//!
//! - [`pki`]: a throw-away CA and leaf certificate ([`TestPki`]).
//! - [`server`]: an HTTP/1.1 + HTTP/2 test server, plain or TLS, that counts
//!   connections and handshakes and records requests ([`TestServer`]).
//! - [`delay_proxy`]: a TCP proxy adding a fixed one-way delay per
//!   direction, to emulate a far server ([`DelayProxy`]).
//! - [`otlp_receiver`]: an in-process OTLP/gRPC + OTLP/HTTP collector
//!   ([`OtlpReceiver`]) and the flattened views of what it received
//!   ([`ReceivedSpan`], [`ReceivedMetric`], [`Attributes`]);
//!   [`spans_from_otlp_json`] reads OTLP JSON files.
//! - [`nginx`]: a real nginx with TLS 1.3 / TLS 1.2 / h2 / plain listeners
//!   and a parsed access log ([`Nginx`]).
//! - [`backlog`]: a listener whose full accept queue drops SYNs, and that
//!   once released can forward to a server ([`FullBacklogListener`]).
//! - [`connect_proxy`]: an HTTP CONNECT / forward proxy ([`ConnectProxy`]).
//! - [`faulty_collector`]: an OTLP/gRPC endpoint that fails like real
//!   collectors do: never reads, never answers, answers an error status,
//!   answers late, speaks TLS ([`FaultyCollector`]).
//!
//! Everything runs on the caller's tokio runtime and listens on loopback only.

pub mod attributes;
pub mod backlog;
pub mod connect_proxy;
pub mod delay_proxy;
pub mod error;
pub mod faulty_collector;
pub mod nginx;
pub mod otlp_receiver;
pub mod pki;
pub mod received_metric;
pub mod received_span;
pub mod server;

pub use attributes::Attributes;
pub use backlog::FullBacklogListener;
pub use connect_proxy::{ConnectProxy, ConnectRecord};
pub use delay_proxy::DelayProxy;
pub use error::LabError;
pub use faulty_collector::{CollectorFault, FaultyCollector};
pub use nginx::{AccessLogEntry, Nginx, NginxConfig, NginxListener};
pub use otlp_receiver::OtlpReceiver;
pub use pki::{PkiFiles, TestPki};
pub use received_metric::{
    HistogramPoint, MetricData, NumberPoint, ReceivedMetric, metrics_from_otlp_json,
};
pub use received_span::{
    ReceivedEvent, ReceivedLink, ReceivedSpan, spans_from_export_request, spans_from_otlp_json,
};
pub use server::{ConnectionEnd, HttpVersions, TestServer, TestServerBuilder, TlsVersions};
