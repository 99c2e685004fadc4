//! `OtlpReceiver`: an in-process OTLP collector on loopback that keeps every
//! exported span and metric for tests to inspect.
//!
//! It listens for OTLP/gRPC on one port ([`OtlpReceiver::endpoint`]) and
//! OTLP/HTTP on another ([`OtlpReceiver::http_endpoint`]: `POST /v1/traces`
//! and `POST /v1/metrics`, protobuf or JSON bodies). Both accept gzip, as
//! collectors send it: the OpenTelemetry Collector's and rotel's OTLP
//! exporters compress with gzip by default.

use std::convert::Infallible;
use std::io::Read as _;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use opentelemetry_proto::tonic::collector::metrics::v1::metrics_service_server::{
    MetricsService, MetricsServiceServer,
};
use opentelemetry_proto::tonic::collector::metrics::v1::{
    ExportMetricsServiceRequest, ExportMetricsServiceResponse,
};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use prost::Message;
use tokio::net::TcpListener;
use tokio::sync::Notify;
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;
use tonic::codec::CompressionEncoding;

use crate::received_metric::flatten_resource_metrics;
use crate::received_span::flatten_resource_spans;
use crate::{LabError, ReceivedMetric, ReceivedSpan};

#[derive(Debug, Default)]
struct Store {
    spans: Mutex<Vec<ReceivedSpan>>,
    metrics: Mutex<Vec<ReceivedMetric>>,
    /// The last metrics export as received (see `OtlpReceiver::last_metrics_export`).
    last_metrics_export: Mutex<Option<ExportMetricsServiceRequest>>,
    trace_exports: AtomicU64,
    metric_exports: AtomicU64,
    http_exports: AtomicU64,
    changed: Notify,
}

impl Store {
    fn add_traces(&self, request: ExportTraceServiceRequest) {
        let spans = flatten_resource_spans(request.resource_spans);
        if let Ok(mut all) = self.spans.lock() {
            all.extend(spans);
        }
        self.trace_exports.fetch_add(1, Ordering::SeqCst);
        self.changed.notify_waiters();
    }

    fn add_metrics(&self, request: ExportMetricsServiceRequest) {
        if let Ok(mut last) = self.last_metrics_export.lock() {
            *last = Some(request.clone());
        }
        let metrics = flatten_resource_metrics(request.resource_metrics);
        if let Ok(mut all) = self.metrics.lock() {
            all.extend(metrics);
        }
        self.metric_exports.fetch_add(1, Ordering::SeqCst);
        self.changed.notify_waiters();
    }
}

#[derive(Debug)]
struct GrpcSink(Arc<Store>);

#[tonic::async_trait]
impl TraceService for GrpcSink {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        self.0.add_traces(request.into_inner());
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

#[tonic::async_trait]
impl MetricsService for GrpcSink {
    async fn export(
        &self,
        request: tonic::Request<ExportMetricsServiceRequest>,
    ) -> Result<tonic::Response<ExportMetricsServiceResponse>, tonic::Status> {
        self.0.add_metrics(request.into_inner());
        Ok(tonic::Response::new(ExportMetricsServiceResponse {
            partial_success: None,
        }))
    }
}

/// A running OTLP receiver. Dropping it stops both listeners.
#[derive(Debug)]
pub struct OtlpReceiver {
    grpc_addr: SocketAddr,
    http_addr: SocketAddr,
    store: Arc<Store>,
    tasks: Vec<JoinHandle<()>>,
}

impl OtlpReceiver {
    /// Starts the gRPC and HTTP listeners on `127.0.0.1`, random free ports.
    ///
    /// # Errors
    /// [`LabError::Io`] if a port cannot be bound.
    pub async fn start() -> Result<OtlpReceiver, LabError> {
        Self::start_on(SocketAddr::from((Ipv4Addr::LOCALHOST, 0))).await
    }

    /// As [`start`](Self::start) with the gRPC listener on `grpc_addr`
    /// (e.g. the port of a receiver that was stopped: a collector coming
    /// back).
    ///
    /// # Errors
    /// [`LabError::Io`] if a port cannot be bound.
    pub async fn start_on(grpc_addr: SocketAddr) -> Result<OtlpReceiver, LabError> {
        let store = Arc::new(Store::default());
        let loopback = SocketAddr::from((Ipv4Addr::LOCALHOST, 0));

        let incoming = tonic::transport::server::TcpIncoming::bind(grpc_addr)
            .map_err(|e| LabError::io("bind OTLP/gRPC receiver", e))?
            .with_nodelay(Some(true));
        let grpc_addr = incoming
            .local_addr()
            .map_err(|e| LabError::io("read OTLP/gRPC receiver address", e))?;
        let router = tonic::transport::Server::builder()
            .add_service(
                TraceServiceServer::new(GrpcSink(store.clone()))
                    .accept_compressed(CompressionEncoding::Gzip),
            )
            .add_service(
                MetricsServiceServer::new(GrpcSink(store.clone()))
                    .accept_compressed(CompressionEncoding::Gzip),
            );
        let grpc_task = tokio::spawn(async move {
            if let Err(e) = router.serve_with_incoming(incoming).await {
                tracing::warn!(error = %e, "OTLP/gRPC receiver stopped");
            }
        });

        let listener = TcpListener::bind(loopback)
            .await
            .map_err(|e| LabError::io("bind OTLP/HTTP receiver", e))?;
        let http_addr = listener
            .local_addr()
            .map_err(|e| LabError::io("read OTLP/HTTP receiver address", e))?;
        let http_task = tokio::spawn(http_accept_loop(listener, store.clone()));

        Ok(OtlpReceiver {
            grpc_addr,
            http_addr,
            store,
            tasks: vec![grpc_task, http_task],
        })
    }

    /// The OTLP/gRPC endpoint, `http://127.0.0.1:PORT` (for
    /// `OTEL_EXPORTER_OTLP_ENDPOINT` or an exporter's `with_endpoint`).
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.grpc_addr)
    }

    /// The OTLP/HTTP base endpoint, `http://127.0.0.1:PORT`; signals are
    /// posted to `/v1/traces` and `/v1/metrics` under it.
    pub fn http_endpoint(&self) -> String {
        format!("http://{}", self.http_addr)
    }

    /// The gRPC listening address.
    pub fn grpc_addr(&self) -> SocketAddr {
        self.grpc_addr
    }

    /// The HTTP listening address.
    pub fn http_addr(&self) -> SocketAddr {
        self.http_addr
    }

    /// Every span received so far, in arrival order.
    pub fn spans(&self) -> Vec<ReceivedSpan> {
        self.store
            .spans
            .lock()
            .map(|s| s.clone())
            .unwrap_or_default()
    }

    /// The received spans named `name`.
    pub fn spans_named(&self, name: &str) -> Vec<ReceivedSpan> {
        self.spans()
            .into_iter()
            .filter(|s| s.name() == name)
            .collect()
    }

    /// Every metric received so far (one entry per metric per export), in
    /// arrival order.
    pub fn metrics(&self) -> Vec<ReceivedMetric> {
        self.store
            .metrics
            .lock()
            .map(|m| m.clone())
            .unwrap_or_default()
    }

    /// The last metrics export received since the start or the last
    /// [`clear`](Self::clear), as the exporter sent it (resources, scopes
    /// and data points unflattened): what a process that exports
    /// cumulative metrics at its shutdown last knew. `None` when none came.
    pub fn last_metrics_export(&self) -> Option<ExportMetricsServiceRequest> {
        self.store
            .last_metrics_export
            .lock()
            .ok()
            .and_then(|last| last.clone())
    }

    /// Trace export calls received (gRPC and HTTP).
    pub fn trace_exports(&self) -> u64 {
        self.store.trace_exports.load(Ordering::SeqCst)
    }

    /// Metric export calls received (gRPC and HTTP).
    pub fn metric_exports(&self) -> u64 {
        self.store.metric_exports.load(Ordering::SeqCst)
    }

    /// Export calls received over OTLP/HTTP (traces and metrics).
    pub fn http_exports(&self) -> u64 {
        self.store.http_exports.load(Ordering::SeqCst)
    }

    /// Waits until at least `min_count` spans have arrived or `timeout`
    /// passes, then returns all spans received (possibly fewer than
    /// `min_count`: the caller asserts).
    pub async fn wait_for_spans(&self, min_count: usize, timeout: Duration) -> Vec<ReceivedSpan> {
        let deadline = Instant::now() + timeout;
        loop {
            let changed = self.store.changed.notified();
            let spans = self.spans();
            if spans.len() >= min_count || Instant::now() >= deadline {
                return spans;
            }
            let _ = tokio::time::timeout_at(deadline, changed).await;
        }
    }

    /// Waits until a metric named `name` has arrived or `timeout` passes;
    /// returns the most recently received one, `None` on timeout.
    pub async fn wait_for_metric(&self, name: &str, timeout: Duration) -> Option<ReceivedMetric> {
        let deadline = Instant::now() + timeout;
        loop {
            let changed = self.store.changed.notified();
            let found = self.metrics().into_iter().rev().find(|m| m.name == name);
            if found.is_some() || Instant::now() >= deadline {
                return found;
            }
            let _ = tokio::time::timeout_at(deadline, changed).await;
        }
    }

    /// Forgets every span and metric received so far (counters are kept).
    pub fn clear(&self) {
        if let Ok(mut spans) = self.store.spans.lock() {
            spans.clear();
        }
        if let Ok(mut metrics) = self.store.metrics.lock() {
            metrics.clear();
        }
        if let Ok(mut last) = self.store.last_metrics_export.lock() {
            *last = None;
        }
    }
}

impl Drop for OtlpReceiver {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

async fn http_accept_loop(listener: TcpListener, store: Arc<Store>) {
    let mut tasks = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    let _ = stream.set_nodelay(true);
                    let store = store.clone();
                    tasks.spawn(async move {
                        let svc = hyper::service::service_fn(move |req| http_export(req, store.clone()));
                        let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
                        let _ = builder.serve_connection(TokioIo::new(stream), svc).await;
                    });
                }
                Err(e) => {
                    tracing::warn!(error = %e, "OTLP/HTTP receiver accept failed");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            },
            Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
        }
    }
}

fn reply(
    status: http::StatusCode,
    content_type: &'static str,
    body: Vec<u8>,
) -> http::Response<Full<Bytes>> {
    let mut resp = http::Response::new(Full::new(Bytes::from(body)));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static(content_type),
    );
    resp
}

async fn http_export(
    req: http::Request<hyper::body::Incoming>,
    store: Arc<Store>,
) -> Result<http::Response<Full<Bytes>>, Infallible> {
    const TEXT: &str = "text/plain";
    if req.method() != http::Method::POST {
        return Ok(reply(
            http::StatusCode::METHOD_NOT_ALLOWED,
            TEXT,
            b"POST only\n".to_vec(),
        ));
    }
    let gzip = match req.headers().get(http::header::CONTENT_ENCODING) {
        None => false,
        Some(v) if v.as_bytes().eq_ignore_ascii_case(b"gzip") => true,
        Some(v) if v.as_bytes().eq_ignore_ascii_case(b"identity") => false,
        Some(_) => {
            return Ok(reply(
                http::StatusCode::UNSUPPORTED_MEDIA_TYPE,
                TEXT,
                b"only gzip bodies are supported\n".to_vec(),
            ));
        }
    };
    let json = req
        .headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    let path = req.uri().path().to_owned();
    let body = match req.into_body().collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => {
            return Ok(reply(
                http::StatusCode::BAD_REQUEST,
                TEXT,
                e.to_string().into_bytes(),
            ));
        }
    };
    let body = if gzip {
        let mut plain = Vec::new();
        if let Err(e) = flate2::read::GzDecoder::new(&body[..]).read_to_end(&mut plain) {
            return Ok(reply(
                http::StatusCode::BAD_REQUEST,
                TEXT,
                format!("bad gzip body: {e}").into_bytes(),
            ));
        }
        Bytes::from(plain)
    } else {
        body
    };
    let decoded = match path.as_str() {
        "/v1/traces" => {
            decode::<ExportTraceServiceRequest>(&body, json).map(|r| store.add_traces(r))
        }
        "/v1/metrics" => {
            decode::<ExportMetricsServiceRequest>(&body, json).map(|r| store.add_metrics(r))
        }
        _ => {
            return Ok(reply(
                http::StatusCode::NOT_FOUND,
                TEXT,
                b"unknown signal\n".to_vec(),
            ));
        }
    };
    match decoded {
        Ok(()) => {
            store.http_exports.fetch_add(1, Ordering::SeqCst);
            // An empty Export*ServiceResponse encodes to zero bytes / `{}`.
            Ok(if json {
                reply(http::StatusCode::OK, "application/json", b"{}".to_vec())
            } else {
                reply(http::StatusCode::OK, "application/x-protobuf", Vec::new())
            })
        }
        Err(message) => Ok(reply(
            http::StatusCode::BAD_REQUEST,
            TEXT,
            message.into_bytes(),
        )),
    }
}

fn decode<T>(body: &[u8], json: bool) -> Result<T, String>
where
    T: Message + Default + serde::de::DeserializeOwned,
{
    if json {
        serde_json::from_slice(body).map_err(|e| e.to_string())
    } else {
        T::decode(body).map_err(|e| e.to_string())
    }
}
