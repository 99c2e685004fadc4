//! Test harness: a per-test tracer provider with an in-memory exporter, a
//! thread-local tracing subscriber, and span lookup helpers.

use std::time::Duration;

use opentelemetry::trace::{SpanId, SpanKind, Status};
use opentelemetry::{KeyValue, Value};
use opentelemetry_sdk::metrics::data::{AggregatedMetrics, MetricData};
use opentelemetry_sdk::metrics::{InMemoryMetricExporter, PeriodicReader, SdkMeterProvider};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use reqwest_conntrace::{ConnTrace, TlsSettings, otlp, semconv};

use crate::contract::Kind;
use tracing::subscriber::DefaultGuard;
use tracing_subscriber::layer::SubscriberExt;

/// Spans exported by one test.
pub(crate) struct Telemetry {
    pub(crate) provider: SdkTracerProvider,
    exporter: InMemorySpanExporter,
    meter_provider: SdkMeterProvider,
    metric_exporter: InMemoryMetricExporter,
    _guard: DefaultGuard,
}

/// One exported metric data point, flattened.
#[derive(Debug, Clone)]
pub(crate) struct Point {
    pub(crate) unit: String,
    /// The instrument kind as the SDK aggregated it.
    pub(crate) kind: crate::contract::Kind,
    pub(crate) attributes: Vec<(String, String)>,
    /// Sum or gauge value; a histogram's count.
    pub(crate) value: f64,
}

impl Point {
    pub(crate) fn get(&self, key: &str) -> Option<&str> {
        self.attributes
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// The `RequestReport`s a handle hands to its `OnRequestEnd` callback
/// ([`callback`](Self::callback)), in the order they came.
#[derive(Clone, Default)]
pub(crate) struct Reports(std::sync::Arc<std::sync::Mutex<Vec<reqwest_conntrace::RequestReport>>>);

impl Reports {
    /// The callback to register with `ConnTraceBuilder::on_request_end`.
    pub(crate) fn callback(
        &self,
    ) -> impl Fn(&reqwest_conntrace::RequestReport) + Send + Sync + 'static {
        let sink = self.0.clone();
        move |r| sink.lock().expect("reports").push(r.clone())
    }

    /// The reports so far.
    pub(crate) fn taken(&self) -> Vec<reqwest_conntrace::RequestReport> {
        self.0.lock().expect("reports").clone()
    }
}

/// Installs a thread-local subscriber exporting into memory. Tests run on a
/// current-thread runtime so every poll sees it.
pub(crate) fn telemetry() -> Telemetry {
    telemetry_logging_to(None)
}

/// Log lines (`tracing` events, fmt format, no colours) a test captured.
#[derive(Clone, Default)]
pub(crate) struct Logs(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl Logs {
    /// Every line captured so far.
    pub(crate) fn lines(&self) -> Vec<String> {
        let bytes = self.0.lock().expect("log lock").clone();
        String::from_utf8_lossy(&bytes)
            .lines()
            .map(str::to_owned)
            .collect()
    }
}

impl std::io::Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("log lock").extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// As [`telemetry`], also writing the thread's log lines into `logs`.
pub(crate) fn telemetry_logging_to(logs: Option<Logs>) -> Telemetry {
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(exporter.clone())
        .build();
    let log_layer = logs.map(|logs| {
        tracing_subscriber::fmt::layer()
            .with_ansi(false)
            .with_writer(move || logs.clone())
    });
    let subscriber = tracing_subscriber::registry()
        .with(otlp::tracing_layer(&provider))
        .with(log_layer);
    let guard = tracing::subscriber::set_default(subscriber);
    let metric_exporter = InMemoryMetricExporter::default();
    let meter_provider = SdkMeterProvider::builder()
        .with_reader(PeriodicReader::builder(metric_exporter.clone()).build())
        .build();
    Telemetry {
        provider,
        exporter,
        meter_provider,
        metric_exporter,
        _guard: guard,
    }
}

/// Metrics only: a tracer provider whose sampler records no span (so no
/// connection-setup span records and its phase spans are never built), and
/// a thread-local subscriber without the OpenTelemetry layer (request spans
/// carry no OpenTelemetry context).
pub(crate) fn metrics_only() -> Telemetry {
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_sampler(opentelemetry_sdk::trace::Sampler::AlwaysOff)
        .with_simple_exporter(exporter.clone())
        .build();
    let guard = tracing::subscriber::set_default(tracing_subscriber::registry());
    let metric_exporter = InMemoryMetricExporter::default();
    let meter_provider = SdkMeterProvider::builder()
        .with_reader(PeriodicReader::builder(metric_exporter.clone()).build())
        .build();
    Telemetry {
        provider,
        exporter,
        meter_provider,
        metric_exporter,
        _guard: guard,
    }
}

impl Telemetry {
    /// A handle recording connection spans into this provider.
    pub(crate) fn conntrace(&self) -> ConnTrace {
        self.conntrace_builder().build()
    }

    /// A handle builder recording into this test's providers.
    pub(crate) fn conntrace_builder(&self) -> reqwest_conntrace::ConnTraceBuilder {
        ConnTrace::builder()
            .tracer_provider(&self.provider)
            .meter_provider(&self.meter_provider)
    }

    /// Collects metrics now and returns the points of the metric `name`
    /// from the latest collection (cumulative temporality).
    pub(crate) fn metric(&self, name: &str) -> Vec<Point> {
        self.metric_exporter.reset();
        self.meter_provider.force_flush().expect("metrics flush");
        let exported = self
            .metric_exporter
            .get_finished_metrics()
            .expect("in-memory metric exporter");
        let mut points = Vec::new();
        for rm in exported.iter().rev().take(1) {
            for sm in rm.scope_metrics() {
                for m in sm.metrics().filter(|m| m.name() == name) {
                    let unit = m.unit().to_owned();
                    let mut push = |kind, attrs: Vec<&KeyValue>, value: f64| {
                        points.push(Point {
                            unit: unit.clone(),
                            kind,
                            attributes: attrs
                                .into_iter()
                                .map(|kv| (kv.key.to_string(), kv.value.to_string()))
                                .collect(),
                            value,
                        })
                    };
                    match m.data() {
                        AggregatedMetrics::F64(MetricData::Histogram(h)) => {
                            for p in h.data_points() {
                                push(Kind::Histogram, p.attributes().collect(), p.count() as f64);
                            }
                        }
                        AggregatedMetrics::U64(MetricData::Sum(s)) => {
                            let kind = if s.is_monotonic() {
                                Kind::Counter
                            } else {
                                Kind::UpDownCounter
                            };
                            for p in s.data_points() {
                                push(kind, p.attributes().collect(), p.value() as f64);
                            }
                        }
                        AggregatedMetrics::I64(MetricData::Sum(s)) => {
                            let kind = if s.is_monotonic() {
                                Kind::Counter
                            } else {
                                Kind::UpDownCounter
                            };
                            for p in s.data_points() {
                                push(kind, p.attributes().collect(), p.value() as f64);
                            }
                        }
                        AggregatedMetrics::U64(MetricData::Gauge(g)) => {
                            for p in g.data_points() {
                                push(Kind::Gauge, p.attributes().collect(), p.value() as f64);
                            }
                        }
                        other => panic!("unexpected aggregation for {name}: {other:?}"),
                    }
                }
            }
        }
        points
    }

    /// The names of every metric exported so far.
    pub(crate) fn metric_names(&self) -> Vec<String> {
        self.metric_exporter.reset();
        self.meter_provider.force_flush().expect("metrics flush");
        let exported = self
            .metric_exporter
            .get_finished_metrics()
            .expect("in-memory metric exporter");
        exported
            .iter()
            .rev()
            .take(1)
            .flat_map(|rm| rm.scope_metrics())
            .flat_map(|sm| sm.metrics())
            .map(|m| m.name().to_owned())
            .collect()
    }

    /// An instrumented client behind the middleware, trusting only `pki`'s
    /// CA when given, recording into this provider.
    pub(crate) fn client(
        &self,
        builder: reqwest::ClientBuilder,
        pki: Option<&conntrace_lab::TestPki>,
    ) -> reqwest_middleware::ClientWithMiddleware {
        self.client_with(builder, pki, |b| b)
    }

    /// As [`client`](Self::client), with `configure` applied to the
    /// instrumented builder (pool settings set through our builder).
    pub(crate) fn client_with(
        &self,
        builder: reqwest::ClientBuilder,
        pki: Option<&conntrace_lab::TestPki>,
        configure: impl FnOnce(
            reqwest_conntrace::InstrumentedClientBuilder,
        ) -> reqwest_conntrace::InstrumentedClientBuilder,
    ) -> reqwest_middleware::ClientWithMiddleware {
        let instrumented = configure(self.conntrace().instrument_client(builder));
        let instrumented = match pki {
            Some(pki) => instrumented.tls(trust(pki)),
            None => instrumented,
        };
        instrumented.build_with_middleware().expect("client builds")
    }

    /// Waits (at most 10 s, else panics) until `trace` has no connect in
    /// flight: connects that lost a pool race finish in the background
    /// after the requests are done.
    pub(crate) async fn connects_done(&self, trace: &ConnTrace) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while trace.connects_in_flight() > 0 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{} connect(s) still running after 10 s",
                trace.connects_in_flight()
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    /// Every span ended so far. A connected socket's `tcp.connect` span
    /// ends when the kernel's answer about it arrives (on the sock_diag
    /// thread, within milliseconds): wait up to 2 s for every exported
    /// successful setup span to have its `tcp.connect` child.
    pub(crate) fn spans(&self) -> Vec<SpanData> {
        // Request spans (and their parents) still waiting for the kernel's
        // answer (a deferred miss reason, failure evidence) end first.
        reqwest_conntrace::wait_for_pending_spans(Duration::from_secs(2));
        let deadline = std::time::Instant::now() + Duration::from_secs(2);
        loop {
            let spans = self
                .exporter
                .get_finished_spans()
                .expect("in-memory exporter");
            let complete = spans
                .iter()
                .filter(|s| s.name == semconv::CONNECTION_SETUP_SPAN && !is_error(s))
                .all(|setup| {
                    spans.iter().any(|c| {
                        c.name == semconv::TCP_CONNECT_SPAN
                            && c.parent_span_id == setup.span_context.span_id()
                    })
                });
            if complete || std::time::Instant::now() >= deadline {
                return spans;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Spans with this name.
    pub(crate) fn named(&self, name: &str) -> Vec<SpanData> {
        self.spans()
            .into_iter()
            .filter(|s| s.name == name)
            .collect()
    }

    /// Request spans (client kind, carrying `http.request.method`), in start order.
    pub(crate) fn requests(&self) -> Vec<SpanData> {
        let mut v: Vec<SpanData> = self
            .spans()
            .into_iter()
            .filter(|s| s.span_kind == SpanKind::Client && has(s, semconv::HTTP_REQUEST_METHOD))
            .collect();
        v.sort_by_key(|s| s.start_time);
        v
    }

    /// Setup spans in start order.
    pub(crate) fn setups(&self) -> Vec<SpanData> {
        let mut v = self.named(semconv::CONNECTION_SETUP_SPAN);
        v.sort_by_key(|s| s.start_time);
        v
    }

    /// Children of `parent`.
    pub(crate) fn children(&self, parent: &SpanData) -> Vec<SpanData> {
        self.spans()
            .into_iter()
            .filter(|s| s.parent_span_id == parent.span_context.span_id())
            .collect()
    }

    /// The one child named `name`, if any.
    pub(crate) fn child(&self, parent: &SpanData, name: &str) -> Option<SpanData> {
        self.children(parent).into_iter().find(|s| s.name == name)
    }
}

pub(crate) fn attr<'a>(span: &'a SpanData, key: &str) -> Option<&'a Value> {
    span.attributes
        .iter()
        .find(|kv: &&KeyValue| kv.key.as_str() == key)
        .map(|kv| &kv.value)
}

pub(crate) fn has(span: &SpanData, key: &str) -> bool {
    attr(span, key).is_some()
}

pub(crate) fn bool_attr(span: &SpanData, key: &str) -> Option<bool> {
    match attr(span, key)? {
        Value::Bool(b) => Some(*b),
        _ => None,
    }
}

pub(crate) fn i64_attr(span: &SpanData, key: &str) -> Option<i64> {
    match attr(span, key)? {
        Value::I64(i) => Some(*i),
        _ => None,
    }
}

pub(crate) fn f64_attr(span: &SpanData, key: &str) -> Option<f64> {
    match attr(span, key)? {
        Value::F64(f) => Some(*f),
        _ => None,
    }
}

pub(crate) fn str_attr(span: &SpanData, key: &str) -> Option<String> {
    match attr(span, key)? {
        Value::String(s) => Some(s.to_string()),
        _ => None,
    }
}

pub(crate) fn duration(span: &SpanData) -> Duration {
    span.end_time
        .duration_since(span.start_time)
        .unwrap_or_default()
}

pub(crate) fn is_error(span: &SpanData) -> bool {
    matches!(span.status, Status::Error { .. })
}

pub(crate) fn span_id(span: &SpanData) -> SpanId {
    span.span_context.span_id()
}

/// TLS settings trusting the test PKI's CA only.
/// A middleware chain over a client `trace` instrumented (default reqwest
/// builder), for tests that place other middlewares before or after
/// `trace.middleware()` themselves.
pub(crate) fn middleware_chain(trace: &ConnTrace) -> reqwest_middleware::ClientBuilder {
    reqwest_middleware::ClientBuilder::new(
        trace
            .instrument_client(reqwest::Client::builder())
            .build()
            .expect("client"),
    )
}

pub(crate) fn trust(pki: &conntrace_lab::TestPki) -> TlsSettings {
    TlsSettings::new()
        .built_in_roots(false)
        .add_root_certificate(pki.ca_cert_der())
}

/// A raw TCP server on loopback for behaviours the lab server cannot show:
/// each accepted connection is handed to `serve` on a thread of its own.
/// Returns the server's `http://127.0.0.1:PORT/` URL; the server lives as
/// long as the process.
pub(crate) fn raw_server(serve: fn(std::net::TcpStream)) -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("http://{}/", listener.local_addr().expect("addr"));
    std::thread::spawn(move || {
        for socket in listener.incoming() {
            let Ok(socket) = socket else { return };
            std::thread::spawn(move || serve(socket));
        }
    });
    url
}

/// A TLS server on `pki`'s certificate (HTTP/1.1 by ALPN, TLS 1.3, no
/// session tickets: nothing is sent after the handshake but what `serve`
/// writes) that runs `serve` on a thread per connection, handshaken
/// lazily by rustls as `serve` reads. Dropping the stream closes the
/// socket without close_notify. Returns the server's `https://localhost`
/// URL.
pub(crate) fn raw_tls_server(
    pki: &conntrace_lab::TestPki,
    serve: fn(rustls::StreamOwned<rustls::ServerConnection, std::net::TcpStream>),
) -> String {
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .expect("TLS 1.3")
        .with_no_client_auth()
        .with_single_cert(pki.leaf_chain_der(), pki.leaf_key_der())
        .expect("certificate");
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    config.send_tls13_tickets = 0;
    let config = std::sync::Arc::new(config);
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!(
        "https://localhost:{}/",
        listener.local_addr().expect("addr").port()
    );
    std::thread::spawn(move || {
        for socket in listener.incoming() {
            let Ok(socket) = socket else { return };
            let Ok(connection) = rustls::ServerConnection::new(config.clone()) else {
                return;
            };
            std::thread::spawn(move || serve(rustls::StreamOwned::new(connection, socket)));
        }
    });
    url
}

/// Reads one request head from `socket`, up to its empty line (a GET: no
/// body follows). `false` when the peer closed or the read failed first.
pub(crate) fn read_request_head(socket: &mut impl std::io::Read) -> bool {
    let mut buf = [0u8; 4096];
    let mut got = Vec::new();
    while !got.windows(4).any(|w| w == b"\r\n\r\n") {
        match socket.read(&mut buf) {
            Ok(0) | Err(_) => return false,
            Ok(k) => got.extend_from_slice(&buf[..k]),
        }
    }
    true
}

/// The value of attribute `key` on span event `event`, if set.
pub(crate) fn event_attr(event: &opentelemetry::trace::Event, key: &str) -> Option<Value> {
    event
        .attributes
        .iter()
        .find(|kv| kv.key.as_str() == key)
        .map(|kv| kv.value.clone())
}

/// Waits (sleeping 10 ms between looks, never blocking the runtime) until
/// `done()` holds; panics naming `what` after `within`.
pub(crate) async fn wait_until(what: &str, within: Duration, mut done: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + within;
    while !done() {
        assert!(std::time::Instant::now() < deadline, "{what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// GETs `url` `n` times one after the other, reading each body to its end;
/// returns the bodies. Panics on any failure (the tests expect success).
pub(crate) async fn get_sequentially(
    client: &reqwest_middleware::ClientWithMiddleware,
    url: &str,
    n: usize,
) -> Vec<bytes::Bytes> {
    let mut bodies = Vec::with_capacity(n);
    for _ in 0..n {
        let response = client.get(url).send().await.expect("request succeeds");
        bodies.push(response.bytes().await.expect("body"));
    }
    bodies
}

/// A loopback TCP listener that accepts every connection and never sends a
/// byte (a server whose TLS handshake or response hangs): its address, and
/// the task holding the accepted sockets open (abort it to close them).
pub(crate) async fn silent_listener() -> (std::net::SocketAddr, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let hold = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = listener.accept().await {
            held.push(s);
        }
    });
    (addr, hold)
}
