//! The request side: what happens on the path of one request, from the
//! middleware's span to the end of the response body.
//!
//! - `middleware`: [`ConnTraceMiddleware`](crate::ConnTraceMiddleware), the request span and the hand-off to reqwest;
//! - `method`: the `http.request.method` value and the known-method set that names the span;
//! - `state`: one request in flight, the thread-local current request, its pending setup spans;
//! - `pending_setup`: setup spans held open until their trigger's fate and its miss reason are known;
//! - `redirect`: redirect hops sent as physical requests of their own;
//! - `attribution`: pool attribution of a response (its connection, the miss reason);
//! - `connection_headers`: what a response's headers announce of its connection (close, keep-alive timeout);
//! - `failure`: the connection a failed request failed on, and how it ended;
//! - `stall_evidence`: the kernel's evidence for a request that gave up (unacknowledged data, quiet time, retransmits);
//! - `end`: the guard that ends a request once, and its report;
//! - `body`: the response body wrapper that ends the request at end of stream, error or drop;
//! - `put_back`: when hyper-util may have put an HTTP/1.1 connection back, from how its body was read;
//! - `fanout`: [`fan_out`](crate::fan_out), batch futures under one parent span.

pub(crate) mod attribution;
pub(crate) mod body;
pub(crate) mod connection_headers;
pub(crate) mod end;
pub(crate) mod failure;
pub(crate) mod fanout;
pub(crate) mod method;
pub(crate) mod middleware;
pub(crate) mod pending_setup;
pub(crate) mod put_back;
pub(crate) mod redirect;
pub(crate) mod stall_evidence;
pub(crate) mod state;
