//! Integration tests of conntrace-lab: every fixture on real loopback sockets.

mod backlog;
mod connect_proxy;
mod delay_proxy;
mod nginx;
mod otlp;
mod server;
mod util;
