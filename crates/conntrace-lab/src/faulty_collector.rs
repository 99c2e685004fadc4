//! `FaultyCollector`: an OTLP/gRPC endpoint on loopback that fails the way
//! real collectors fail, for the export pipeline's fault tests. The other
//! two faults come from elsewhere: a refused port (nothing listening) and
//! a blackhole ([`FullBacklogListener`](crate::FullBacklogListener)).

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

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
use tokio::io::AsyncReadExt as _;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

use crate::{LabError, TestPki};

/// gRPC status codes, for [`CollectorFault::Answers`].
pub use tonic::Code;

/// How a [`FaultyCollector`] fails.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum CollectorFault {
    /// Accepts connections and never reads from them (a hung process whose
    /// socket buffers fill).
    AcceptsNeverReads,
    /// Reads everything and never answers (a collector stuck after reading
    /// the request).
    ReadsNeverAnswers,
    /// Answers every export with this gRPC status (e.g.
    /// `tonic::Code::Unavailable`, what an overloaded collector or a
    /// gateway with no healthy backend sends).
    Answers(tonic::Code),
    /// Answers every export with success, after this delay.
    AnswersAfter(Duration),
    /// Speaks TLS (a collector configured for TLS, reached over plaintext):
    /// answers the exporter's HTTP/2 preface with a TLS alert.
    Tls,
}

/// A running faulty collector on `127.0.0.1`. Dropping it closes the
/// listener and every connection.
#[derive(Debug)]
pub struct FaultyCollector {
    addr: SocketAddr,
    accepted: Arc<AtomicU64>,
    requests: Arc<AtomicU64>,
    task: JoinHandle<()>,
}

impl FaultyCollector {
    /// Listens on a free loopback port and fails as `fault` says.
    ///
    /// # Errors
    /// [`LabError::Io`] if the port cannot be bound; a TLS set-up error for
    /// [`CollectorFault::Tls`].
    pub async fn start(fault: CollectorFault) -> Result<FaultyCollector, LabError> {
        let listener = TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)))
            .await
            .map_err(|e| LabError::io("bind faulty collector", e))?;
        let addr = listener
            .local_addr()
            .map_err(|e| LabError::io("read faulty collector address", e))?;
        let accepted = Arc::new(AtomicU64::new(0));
        let requests = Arc::new(AtomicU64::new(0));
        let task = match fault {
            CollectorFault::AcceptsNeverReads | CollectorFault::ReadsNeverAnswers => {
                let read = matches!(fault, CollectorFault::ReadsNeverAnswers);
                tokio::spawn(hold_connections(listener, accepted.clone(), read))
            }
            CollectorFault::Tls => {
                let pki = TestPki::localhost()?;
                let config = rustls::ServerConfig::builder_with_provider(Arc::new(
                    rustls::crypto::ring::default_provider(),
                ))
                .with_safe_default_protocol_versions()?
                .with_no_client_auth()
                .with_single_cert(pki.leaf_chain_der(), pki.leaf_key_der())?;
                let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
                tokio::spawn(tls_accept_loop(listener, accepted.clone(), acceptor))
            }
            CollectorFault::Answers(_) | CollectorFault::AnswersAfter(_) => {
                let sink = FaultSink {
                    fault,
                    requests: requests.clone(),
                };
                let incoming = tonic::transport::server::TcpIncoming::from(listener);
                let router = tonic::transport::Server::builder()
                    .add_service(TraceServiceServer::new(sink.clone()))
                    .add_service(MetricsServiceServer::new(sink));
                tokio::spawn(async move {
                    let _ = router.serve_with_incoming(incoming).await;
                })
            }
        };
        Ok(FaultyCollector {
            addr,
            accepted,
            requests,
            task,
        })
    }

    /// The OTLP/gRPC endpoint, `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The listening address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Connections accepted (the faults that hold connections or speak
    /// TLS; 0 for the answering ones, which tonic accepts).
    pub fn accepted_connections(&self) -> u64 {
        self.accepted.load(Ordering::SeqCst)
    }

    /// Export requests answered (faults that answer).
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::SeqCst)
    }
}

impl Drop for FaultyCollector {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Accepts and keeps every connection open; with `read`, reads and
/// discards what arrives.
async fn hold_connections(listener: TcpListener, accepted: Arc<AtomicU64>, read: bool) {
    let mut held: Vec<JoinHandle<()>> = Vec::new();
    let mut parked: Vec<TcpStream> = Vec::new();
    while let Ok((mut stream, _)) = listener.accept().await {
        accepted.fetch_add(1, Ordering::SeqCst);
        if read {
            held.push(tokio::spawn(async move {
                let mut buf = [0u8; 16 * 1024];
                while matches!(stream.read(&mut buf).await, Ok(n) if n > 0) {}
                // Keep the half-closed socket open: never answer.
                std::future::pending::<()>().await;
            }));
        } else {
            parked.push(stream);
        }
    }
    drop(parked);
    for task in held {
        task.abort();
    }
}

/// Runs a TLS handshake on every connection (which a plaintext client's
/// bytes fail).
async fn tls_accept_loop(
    listener: TcpListener,
    accepted: Arc<AtomicU64>,
    acceptor: tokio_rustls::TlsAcceptor,
) {
    while let Ok((stream, _)) = listener.accept().await {
        accepted.fetch_add(1, Ordering::SeqCst);
        let acceptor = acceptor.clone();
        tokio::spawn(async move {
            let _ = acceptor.accept(stream).await;
        });
    }
}

/// The gRPC services of the answering faults.
#[derive(Debug, Clone)]
struct FaultSink {
    fault: CollectorFault,
    requests: Arc<AtomicU64>,
}

impl FaultSink {
    async fn answer(&self) -> Result<(), tonic::Status> {
        match &self.fault {
            CollectorFault::Answers(code) => {
                self.requests.fetch_add(1, Ordering::SeqCst);
                Err(tonic::Status::new(*code, "faulty collector"))
            }
            CollectorFault::AnswersAfter(delay) => {
                tokio::time::sleep(*delay).await;
                self.requests.fetch_add(1, Ordering::SeqCst);
                Ok(())
            }
            _ => Err(tonic::Status::internal("not an answering fault")),
        }
    }
}

#[tonic::async_trait]
impl TraceService for FaultSink {
    async fn export(
        &self,
        _request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        self.answer().await?;
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

#[tonic::async_trait]
impl MetricsService for FaultSink {
    async fn export(
        &self,
        _request: tonic::Request<ExportMetricsServiceRequest>,
    ) -> Result<tonic::Response<ExportMetricsServiceResponse>, tonic::Status> {
        self.answer().await?;
        Ok(tonic::Response::new(ExportMetricsServiceResponse {
            partial_success: None,
        }))
    }
}
