//! Spans another process exported, turned back into the SDK's [`SpanData`]
//! so this process's sinks take them as they take its own: `conntrace lab
//! env-proxy` runs `conntrace probe` children (a proxy from the environment
//! must be set before a process starts) whose spans reach the lab's
//! [`conntrace_lab::OtlpReceiver`], and from there the lab's traces file,
//! page and collector (see `Telemetry::add_received`).
//!
//! The conversion is the inverse of opentelemetry-proto's
//! `From<SpanData> for Span`: ids, parent, flags, kind, times, attributes,
//! events, links, status and the instrumentation scope's name and version
//! are kept as the child exported them, so a trace stays whole (its tree
//! and its links) in every sink. Attribute values the SDK has no type for
//! (key-value lists, bytes, arrays of mixed types) become their text.

use std::borrow::Cow;
use std::str::FromStr as _;
use std::time::{Duration, SystemTime};

use conntrace_lab::{Attributes, ReceivedSpan};
use opentelemetry::trace::{
    Event, Link, SpanContext, SpanId, SpanKind, Status, TraceFlags, TraceId, TraceState,
};
use opentelemetry::{Array, InstrumentationScope, KeyValue, StringValue, Value};
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue as ProtoKeyValue, any_value};
use opentelemetry_proto::tonic::trace::v1::{SpanFlags, span, status};
use opentelemetry_sdk::trace::{SpanData, SpanEvents, SpanLinks};

/// `span` as the SDK's [`SpanData`]; `None` when its trace or span id is
/// not the 16 or 8 bytes OTLP requires (nothing can carry such a span).
pub(crate) fn span_data(span: &ReceivedSpan) -> Option<SpanData> {
    let proto = span.proto();
    let span_context = context(
        &proto.trace_id,
        &proto.span_id,
        proto.flags,
        &proto.trace_state,
    )?;
    let parent_span_id = match proto.parent_span_id.as_slice() {
        [] => SpanId::INVALID,
        bytes => SpanId::from_bytes(bytes.try_into().ok()?),
    };
    let mut events = SpanEvents::default();
    events.events = proto
        .events
        .iter()
        .map(|e| {
            Event::new(
                e.name.clone(),
                time(e.time_unix_nano),
                key_values(&e.attributes),
                e.dropped_attributes_count,
            )
        })
        .collect();
    events.dropped_count = proto.dropped_events_count;
    let mut links = SpanLinks::default();
    links.links = proto
        .links
        .iter()
        .filter_map(|l| {
            Some(Link::new(
                context(&l.trace_id, &l.span_id, l.flags, &l.trace_state)?,
                key_values(&l.attributes),
                l.dropped_attributes_count,
            ))
        })
        .collect();
    links.dropped_count = proto.dropped_links_count;
    let mut scope = InstrumentationScope::builder(span.scope_name().to_owned());
    if !span.scope_version().is_empty() {
        scope = scope.with_version(span.scope_version().to_owned());
    }
    Some(SpanData {
        span_context,
        parent_span_id,
        parent_span_is_remote: proto.flags & SpanFlags::ContextIsRemoteMask as u32 != 0,
        span_kind: kind(proto.kind),
        name: Cow::Owned(proto.name.clone()),
        start_time: time(proto.start_time_unix_nano),
        end_time: time(proto.end_time_unix_nano),
        attributes: key_values(&proto.attributes),
        dropped_attributes_count: proto.dropped_attributes_count,
        events,
        links,
        status: match proto.status.as_ref() {
            Some(s) if s.code == status::StatusCode::Error as i32 => {
                Status::error(s.message.clone())
            }
            Some(s) if s.code == status::StatusCode::Ok as i32 => Status::Ok,
            _ => Status::Unset,
        },
        instrumentation_scope: scope.build(),
    })
}

/// The span context of `trace_id` / `span_id` (exported, so not remote),
/// with the trace flags in the low byte of the OTLP `flags`.
fn context(trace_id: &[u8], span_id: &[u8], flags: u32, trace_state: &str) -> Option<SpanContext> {
    let trace_id = TraceId::from_bytes(trace_id.try_into().ok()?);
    let span_id = SpanId::from_bytes(span_id.try_into().ok()?);
    let trace_flags = u8::try_from(flags & SpanFlags::TraceFlagsMask as u32)
        .map(TraceFlags::new)
        .unwrap_or_default();
    Some(SpanContext::new(
        trace_id,
        span_id,
        trace_flags,
        false,
        TraceState::from_str(trace_state).unwrap_or_default(),
    ))
}

/// `nanos` since the Unix epoch as a time.
fn time(nanos: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_nanos(nanos)
}

/// The OTLP span kind `value` (unspecified or unknown: internal, the SDK's
/// default).
fn kind(value: i32) -> SpanKind {
    match span::SpanKind::try_from(value) {
        Ok(span::SpanKind::Client) => SpanKind::Client,
        Ok(span::SpanKind::Server) => SpanKind::Server,
        Ok(span::SpanKind::Producer) => SpanKind::Producer,
        Ok(span::SpanKind::Consumer) => SpanKind::Consumer,
        _ => SpanKind::Internal,
    }
}

/// OTLP attributes as the SDK's; an attribute without a value is left out.
fn key_values(attributes: &[ProtoKeyValue]) -> Vec<KeyValue> {
    attributes
        .iter()
        .filter_map(|kv| {
            let value = match kv.value.as_ref().and_then(value) {
                Some(v) => v,
                // No SDK type: its text, as conntrace-lab renders it.
                None => Value::from(
                    Attributes::new(vec![kv.clone()])
                        .display(&kv.key)
                        .filter(|text| !text.is_empty())?,
                ),
            };
            Some(KeyValue::new(kv.key.clone(), value))
        })
        .collect()
}

/// `any` as an SDK value; `None` for what the SDK has no type for (or no value).
fn value(any: &AnyValue) -> Option<Value> {
    Some(match any.value.as_ref()? {
        any_value::Value::StringValue(s) => Value::from(s.clone()),
        any_value::Value::BoolValue(b) => Value::Bool(*b),
        any_value::Value::IntValue(i) => Value::I64(*i),
        any_value::Value::DoubleValue(d) => Value::F64(*d),
        any_value::Value::ArrayValue(a) => Value::Array(array(&a.values)?),
        _ => return None,
    })
}

/// A homogeneous OTLP array of scalars as an SDK array (an empty one as
/// strings); `None` when its items differ in type or are not scalars.
fn array(items: &[AnyValue]) -> Option<Array> {
    use any_value::Value as V;
    let Some(first) = items.first() else {
        return Some(Array::String(Vec::new()));
    };
    Some(match first.value.as_ref()? {
        V::BoolValue(_) => Array::Bool(each(items, |v| match v {
            V::BoolValue(b) => Some(*b),
            _ => None,
        })?),
        V::IntValue(_) => Array::I64(each(items, |v| match v {
            V::IntValue(i) => Some(*i),
            _ => None,
        })?),
        V::DoubleValue(_) => Array::F64(each(items, |v| match v {
            V::DoubleValue(d) => Some(*d),
            _ => None,
        })?),
        V::StringValue(_) => Array::String(each(items, |v| match v {
            V::StringValue(s) => Some(StringValue::from(s.clone())),
            _ => None,
        })?),
        _ => return None,
    })
}

/// `f` of every item's value; `None` as soon as one has none.
fn each<T>(items: &[AnyValue], f: impl Fn(&any_value::Value) -> Option<T>) -> Option<Vec<T>> {
    items
        .iter()
        .map(|i| i.value.as_ref().and_then(&f))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use opentelemetry_proto::transform::common::tonic::ResourceAttributesWithSchema;
    use opentelemetry_proto::transform::trace::tonic::group_spans_by_resource_and_scope;
    use opentelemetry_sdk::Resource;

    /// A span with every field set, as the SDK would end it.
    fn sample() -> SpanData {
        let parent = SpanContext::new(
            TraceId::from(0x0102_0304_0506_0708_090a_0b0c_0d0e_0f10),
            SpanId::from(0x1111_2222_3333_4444),
            TraceFlags::SAMPLED,
            false,
            TraceState::default(),
        );
        let mut events = SpanEvents::default();
        events.events = vec![Event::new(
            "tcp.syn_retransmit",
            time(1_700_000_000_500_000_000),
            vec![KeyValue::new("n", 1_i64)],
            0,
        )];
        events.dropped_count = 2;
        let mut links = SpanLinks::default();
        links.links = vec![Link::new(
            parent.clone(),
            vec![KeyValue::new("why", "served by")],
            1,
        )];
        SpanData {
            span_context: SpanContext::new(
                parent.trace_id(),
                SpanId::from(0x5555_6666_7777_8888),
                TraceFlags::SAMPLED,
                false,
                TraceState::default(),
            ),
            parent_span_id: parent.span_id(),
            parent_span_is_remote: false,
            span_kind: SpanKind::Client,
            name: "proxy.connect".into(),
            start_time: time(1_700_000_000_000_000_000),
            end_time: time(1_700_000_001_000_000_000),
            attributes: vec![
                KeyValue::new("http.response.status_code", 407_i64),
                KeyValue::new("error.type", "proxy_auth_required"),
                KeyValue::new("ok", false),
                KeyValue::new("ms", 1.5),
                KeyValue::new(
                    "addresses",
                    Value::Array(Array::String(vec!["::1".into(), "127.0.0.1".into()])),
                ),
            ],
            dropped_attributes_count: 3,
            events,
            links,
            status: Status::error("407 Proxy Authentication Required"),
            instrumentation_scope: InstrumentationScope::builder("reqwest-conntrace")
                .with_version("0.1.0")
                .build(),
        }
    }

    /// `spans` as a receiver gets them.
    fn received(spans: Vec<SpanData>) -> Vec<ReceivedSpan> {
        let resource = Resource::builder().with_service_name("child").build();
        conntrace_lab::spans_from_export_request(ExportTraceServiceRequest {
            resource_spans: group_spans_by_resource_and_scope(
                spans,
                &ResourceAttributesWithSchema::from(&resource),
            ),
        })
    }

    #[test]
    fn a_received_span_converts_back_to_what_was_exported() {
        let first = received(vec![sample()]);
        let back: Vec<SpanData> = first.iter().filter_map(span_data).collect();
        assert_eq!(back.len(), 1);
        // Exported again, the span is the same protobuf span, field by field.
        let again = received(back);
        assert_eq!(again.len(), 1);
        assert_eq!(again[0].proto(), first[0].proto());
        assert_eq!(again[0].scope_name(), "reqwest-conntrace");
        assert_eq!(again[0].scope_version(), "0.1.0");
    }

    #[test]
    fn ids_of_the_wrong_length_drop_the_span() {
        let mut spans = received(vec![sample()]);
        let mut proto = spans.remove(0).proto().clone();
        proto.span_id = vec![1, 2, 3];
        let broken = conntrace_lab::spans_from_export_request(ExportTraceServiceRequest {
            resource_spans: vec![opentelemetry_proto::tonic::trace::v1::ResourceSpans {
                scope_spans: vec![opentelemetry_proto::tonic::trace::v1::ScopeSpans {
                    spans: vec![proto],
                    ..Default::default()
                }],
                ..Default::default()
            }],
        });
        assert!(span_data(&broken[0]).is_none());
    }

    #[test]
    fn values_without_an_sdk_type_become_text() {
        let mixed = AnyValue {
            value: Some(any_value::Value::ArrayValue(
                opentelemetry_proto::tonic::common::v1::ArrayValue {
                    values: vec![
                        AnyValue {
                            value: Some(any_value::Value::IntValue(1)),
                        },
                        AnyValue {
                            value: Some(any_value::Value::StringValue("a".into())),
                        },
                    ],
                },
            )),
        };
        let kvs = key_values(&[ProtoKeyValue {
            key: "mixed".into(),
            value: Some(mixed),
            key_strindex: 0,
        }]);
        assert_eq!(kvs, vec![KeyValue::new("mixed", "[1, a]")]);
    }
}
