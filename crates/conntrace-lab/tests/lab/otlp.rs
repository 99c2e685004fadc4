//! OtlpReceiver and spans_from_otlp_json.

use std::time::Duration;

use bytes::Bytes;
use conntrace_lab::{MetricData, OtlpReceiver, spans_from_otlp_json};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use opentelemetry::metrics::MeterProvider as _;
use opentelemetry::trace::{
    Link, Span as _, SpanContext, SpanKind, Status, TraceContextExt, TraceFlags, TraceId,
    TraceState, Tracer as _, TracerProvider as _,
};
use opentelemetry::{Array, Context, KeyValue, StringValue, Value};
use opentelemetry_otlp::WithExportConfig as _;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{
    AnyValue, InstrumentationScope, KeyValue as PKv, any_value,
};
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};
use opentelemetry_sdk::Resource;
use prost::Message;

use crate::util::tcp;

/// A real opentelemetry-otlp gRPC exporter's spans and metrics are decoded
/// and flattened: names, ids, parent, kind, typed attributes, events,
/// links, status, resource, scope, timing; a counter and a histogram.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decodes_spans_and_metrics_from_the_otlp_grpc_exporter() {
    let receiver = OtlpReceiver::start().await.expect("receiver");
    assert!(receiver.endpoint().starts_with("http://127.0.0.1:"));
    let resource = Resource::builder().with_service_name("lab-test").build();
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .with_endpoint(receiver.endpoint())
        .build()
        .expect("span exporter");
    let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource.clone())
        .build();
    let tracer = provider.tracer("lab-scope");
    let linked = SpanContext::new(
        TraceId::from_hex("0af7651916cd43dd8448eb211c80319c").expect("trace id"),
        opentelemetry::trace::SpanId::from_hex("b7ad6b7169203331").expect("span id"),
        TraceFlags::SAMPLED,
        true,
        TraceState::default(),
    );
    let parent = tracer.start("parent");
    let cx = Context::current_with_span(parent);
    let mut child = tracer
        .span_builder("child")
        .with_kind(SpanKind::Client)
        .with_attributes(vec![
            KeyValue::new("s", "v"),
            KeyValue::new("i", 42i64),
            KeyValue::new("f", 1.5),
            KeyValue::new("b", true),
            KeyValue::new(
                "arr",
                Value::Array(Array::String(vec![
                    StringValue::from("a"),
                    StringValue::from("b"),
                ])),
            ),
        ])
        .with_links(vec![Link::new(
            linked,
            vec![KeyValue::new("link.k", "x")],
            0,
        )])
        .start_with_context(&tracer, &cx);
    child.add_event("evt", vec![KeyValue::new("k", 7i64)]);
    tokio::time::sleep(Duration::from_millis(20)).await;
    child.set_status(Status::error("boom"));
    child.end();
    cx.span().end();

    let meter_exporter = opentelemetry_otlp::MetricExporter::builder()
        .with_tonic()
        .with_endpoint(receiver.endpoint())
        .build()
        .expect("metric exporter");
    let meter_provider = opentelemetry_sdk::metrics::SdkMeterProvider::builder()
        .with_periodic_exporter(meter_exporter)
        .with_resource(resource)
        .build();
    let meter = meter_provider.meter("lab-meter");
    let counter = meter
        .u64_counter("lab.requests")
        .with_unit("{request}")
        .build();
    counter.add(3, &[KeyValue::new("pool.hit", true)]);
    counter.add(2, &[KeyValue::new("pool.hit", false)]);
    let histogram = meter.f64_histogram("lab.latency").with_unit("s").build();
    histogram.record(0.25, &[]);
    histogram.record(0.75, &[]);

    let (p, m) = (provider.clone(), meter_provider.clone());
    tokio::task::spawn_blocking(move || {
        p.force_flush().expect("flush spans");
        m.force_flush().expect("flush metrics");
    })
    .await
    .expect("flush task");

    let spans = receiver.wait_for_spans(2, Duration::from_secs(5)).await;
    assert_eq!(spans.len(), 2, "{spans:?}");
    let parent = spans
        .iter()
        .find(|s| s.name() == "parent")
        .expect("parent span");
    let child = spans
        .iter()
        .find(|s| s.name() == "child")
        .expect("child span");
    assert_eq!(parent.parent_span_id_hex(), None);
    assert_eq!(child.parent_span_id_hex(), Some(parent.span_id_hex()));
    assert_eq!(child.trace_id_hex(), parent.trace_id_hex());
    assert_eq!(child.trace_id_hex().len(), 32);
    assert_eq!(child.span_id_hex().len(), 16);
    assert_eq!(
        child.kind(),
        opentelemetry_proto::tonic::trace::v1::span::SpanKind::Client
    );
    assert_eq!(child.attr_str("s"), Some("v"));
    assert_eq!(child.attr_i64("i"), Some(42));
    assert_eq!(child.attr_f64("f"), Some(1.5));
    assert_eq!(child.attr_f64("i"), Some(42.0));
    assert_eq!(child.attr_bool("b"), Some(true));
    assert_eq!(
        child.attr_str_array("arr"),
        Some(vec!["a".to_owned(), "b".to_owned()])
    );
    assert!(child.has_attr("s") && !child.has_attr("nope"));
    assert_eq!(child.attr_str("i"), None, "typed accessors do not coerce");
    let events = child.events();
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].name, "evt");
    assert_eq!(events[0].attributes.i64("k"), Some(7));
    let links = child.links();
    assert_eq!(links.len(), 1);
    assert_eq!(links[0].trace_id_hex, "0af7651916cd43dd8448eb211c80319c");
    assert_eq!(links[0].span_id_hex, "b7ad6b7169203331");
    assert_eq!(links[0].attributes.str("link.k"), Some("x"));
    assert_eq!(
        child.status_code(),
        opentelemetry_proto::tonic::trace::v1::status::StatusCode::Error
    );
    assert_eq!(child.status_message(), "boom");
    assert!(
        child.duration() >= Duration::from_millis(20),
        "{:?}",
        child.duration()
    );
    assert!(child.end_unix_nanos() > child.start_unix_nanos());
    assert_eq!(child.resource().str("service.name"), Some("lab-test"));
    assert_eq!(child.scope_name(), "lab-scope");
    assert_eq!(receiver.spans_named("child").len(), 1);

    let requests = receiver
        .wait_for_metric("lab.requests", Duration::from_secs(5))
        .await
        .expect("counter exported");
    assert_eq!(requests.unit, "{request}");
    assert!(matches!(
        requests.data,
        MetricData::Sum {
            monotonic: true,
            ..
        }
    ));
    assert_eq!(requests.total(), 5.0);
    let hit = requests
        .number_points()
        .iter()
        .find(|p| p.attributes.bool("pool.hit") == Some(true))
        .expect("hit point");
    assert_eq!(hit.value, 3.0);
    assert!(hit.is_int);
    let latency = receiver
        .wait_for_metric("lab.latency", Duration::from_secs(5))
        .await
        .expect("histogram exported");
    assert_eq!(latency.unit, "s");
    assert_eq!(latency.histogram_count(), 2);
    assert_eq!(latency.histogram_points()[0].sum, Some(1.0));
    assert_eq!(latency.histogram_points()[0].min, Some(0.25));
    assert!(receiver.trace_exports() >= 1 && receiver.metric_exports() >= 1);

    receiver.clear();
    assert!(receiver.spans().is_empty() && receiver.metrics().is_empty());
    tokio::task::spawn_blocking(move || {
        let _ = provider.shutdown();
        let _ = meter_provider.shutdown();
    })
    .await
    .expect("shutdown task");
}

fn sample_request(name: &str) -> ExportTraceServiceRequest {
    ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            scope_spans: vec![ScopeSpans {
                scope: Some(InstrumentationScope {
                    name: "manual".into(),
                    ..Default::default()
                }),
                spans: vec![Span {
                    trace_id: vec![1; 16],
                    span_id: vec![2; 8],
                    name: name.into(),
                    start_time_unix_nano: 1_000,
                    end_time_unix_nano: 3_000,
                    attributes: vec![PKv {
                        key: "k".into(),
                        value: Some(AnyValue {
                            value: Some(any_value::Value::StringValue("v".into())),
                        }),
                        ..Default::default()
                    }],
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        }],
    }
}

async fn post(
    addr: std::net::SocketAddr,
    path: &str,
    content_type: &str,
    body: Vec<u8>,
) -> (u16, Bytes) {
    post_encoded(addr, path, content_type, None, body).await
}

async fn post_encoded(
    addr: std::net::SocketAddr,
    path: &str,
    content_type: &str,
    content_encoding: Option<&str>,
    body: Vec<u8>,
) -> (u16, Bytes) {
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp(addr).await))
        .await
        .expect("handshake");
    tokio::spawn(conn);
    let mut req = http::Request::post(path)
        .header(http::header::HOST, "otlp")
        .header(http::header::CONTENT_TYPE, content_type);
    if let Some(encoding) = content_encoding {
        req = req.header(http::header::CONTENT_ENCODING, encoding);
    }
    let req = req.body(Full::new(Bytes::from(body))).expect("request");
    let resp = sender.send_request(req).await.expect("response");
    let status = resp.status().as_u16();
    (
        status,
        resp.into_body().collect().await.expect("body").to_bytes(),
    )
}

/// OTLP/HTTP: protobuf and JSON bodies posted to /v1/traces are decoded,
/// gzip-compressed too (collectors' default); unknown paths get 404,
/// garbage gets 400, other encodings 415.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decodes_otlp_http_protobuf_and_json() {
    let receiver = OtlpReceiver::start().await.expect("receiver");
    let addr = receiver.http_addr();
    assert_eq!(receiver.http_endpoint(), format!("http://{addr}"));
    let (status, _) = post(
        addr,
        "/v1/traces",
        "application/x-protobuf",
        sample_request("pb").encode_to_vec(),
    )
    .await;
    assert_eq!(status, 200);
    let json = serde_json::to_vec(&sample_request("js")).expect("json");
    let (status, body) = post(addr, "/v1/traces", "application/json", json).await;
    assert_eq!((status, &body[..]), (200, &b"{}"[..]));
    let (status, _) = post(addr, "/v1/logs", "application/x-protobuf", Vec::new()).await;
    assert_eq!(status, 404);
    let (status, _) = post(
        addr,
        "/v1/traces",
        "application/x-protobuf",
        vec![0xff, 0xff, 0xff],
    )
    .await;
    assert_eq!(status, 400);
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    std::io::Write::write_all(&mut gz, &sample_request("gz").encode_to_vec()).expect("gzip");
    let (status, _) = post_encoded(
        addr,
        "/v1/traces",
        "application/x-protobuf",
        Some("gzip"),
        gz.finish().expect("gzip"),
    )
    .await;
    assert_eq!(status, 200);
    let (status, _) = post_encoded(
        addr,
        "/v1/traces",
        "application/x-protobuf",
        Some("br"),
        vec![1, 2, 3],
    )
    .await;
    assert_eq!(status, 415);

    let spans = receiver.wait_for_spans(3, Duration::from_secs(2)).await;
    let names: Vec<&str> = spans.iter().map(|s| s.name()).collect();
    assert_eq!(names, ["pb", "js", "gz"]);
    assert_eq!(spans[0].trace_id_hex(), "01".repeat(16));
    assert_eq!(spans[1].attr_str("k"), Some("v"));
    assert_eq!(spans[1].duration(), Duration::from_nanos(2_000));
    assert_eq!(receiver.http_exports(), 3);
}

/// OTLP JSON files: the spec's example document (hex ids, string-encoded
/// nanoseconds), a serialised request, and JSON Lines all parse; junk is an error.
#[test]
fn parses_otlp_json_files() {
    let example = r#"{"resourceSpans":[{"resource":{"attributes":[{"key":"service.name","value":{"stringValue":"my.service"}}]},
      "scopeSpans":[{"scope":{"name":"my.library","version":"1.0.0"},
      "spans":[{"traceId":"5b8efff798038103d269b633813fc60c","spanId":"eee19b7ec3c1b174","parentSpanId":"eee19b7ec3c1b173",
      "name":"I'm a server span","startTimeUnixNano":"1544712660000000000","endTimeUnixNano":"1544712661000000000","kind":2,
      "attributes":[{"key":"my.span.attr","value":{"stringValue":"some value"}},{"key":"n","value":{"intValue":"7"}}],
      "status":{"code":2,"message":"bad"}}]}]}]}"#;
    let spans = spans_from_otlp_json(example).expect("spec example");
    assert_eq!(spans.len(), 1);
    let s = &spans[0];
    assert_eq!(s.name(), "I'm a server span");
    assert_eq!(s.trace_id_hex(), "5b8efff798038103d269b633813fc60c");
    assert_eq!(s.parent_span_id_hex().as_deref(), Some("eee19b7ec3c1b173"));
    assert_eq!(
        s.kind(),
        opentelemetry_proto::tonic::trace::v1::span::SpanKind::Server
    );
    assert_eq!(s.duration(), Duration::from_secs(1));
    assert_eq!(s.attr_str("my.span.attr"), Some("some value"));
    assert_eq!(s.attr_i64("n"), Some(7));
    assert_eq!(s.resource().str("service.name"), Some("my.service"));
    assert_eq!(s.scope_version(), "1.0.0");
    assert_eq!(s.status_message(), "bad");

    let a = serde_json::to_string(&sample_request("a")).expect("json");
    let b = serde_json::to_string(&sample_request("b")).expect("json");
    let names = |json: &str| -> Vec<String> {
        spans_from_otlp_json(json)
            .expect("parse")
            .iter()
            .map(|s| s.name().to_owned())
            .collect()
    };
    assert_eq!(names(&a), ["a"]);
    assert_eq!(names(&format!("{a}\n{b}\n")), ["a", "b"]);
    assert_eq!(names(&format!("[{a},{b}]")), ["a", "b"]);
    assert!(spans_from_otlp_json("not json").is_err());
}
