//! [`ConnectionPhases`]: how a connection setup's phases are recorded (a
//! [`PhaseRecord`] each), and the shared end of a setup span whose
//! `tcp.connect` event waits for the kernel.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::SystemTime;

use opentelemetry::global::BoxedTracer;
use opentelemetry::trace::{SpanBuilder, SpanKind, Status, TraceContextExt, Tracer};
use opentelemetry::{Context, KeyValue};

use crate::semconv;

/// How the phases of a new connection (`dns.lookup`, `tcp.connect`,
/// `proxy.connect`, `tls.handshake`) are recorded under its
/// `http.connection_setup` span. Set with
/// [`ConnTraceBuilder::connection_phases`](crate::ConnTraceBuilder::connection_phases).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConnectionPhases {
    /// One child span per phase (3 for a TLS connection to a host name:
    /// 4 spans per connection with the setup span). A trace view draws
    /// the phases as bars.
    #[default]
    Spans,
    /// One span event per phase on the setup span, named like the phase
    /// span and stamped with the phase's start: the phase span's attributes
    /// plus [`HTTP_CONNECTION_PHASE_DURATION`](crate::semconv::HTTP_CONNECTION_PHASE_DURATION)
    /// (seconds), and `error.type` / `exception.message` when the phase
    /// failed. The events the phase span would carry (`dns.lookup_began`,
    /// `tcp.address_skipped`, `tcp.syn_retransmit`, `tls.server_hello`, ...)
    /// are events of the setup span too. One span per connection instead
    /// of 4: less CPU and fewer bytes per new connection, at the price of
    /// no phase bars in a trace view and no phase span to query by name.
    /// The `tcp.connect` event carries the kernel's facts (RTT, ...): a
    /// setup span whose socket is looked up in the kernel ends when both the
    /// kernel has answered and its triggering request's outcome is known
    /// (its end time is the connect's end either way).
    Events,
}

/// The end of a setup span with two parties that must both be done with
/// it: the triggering request's outcome (which sets the outcome
/// attributes) and, with [`ConnectionPhases::Events`], the kernel's answer
/// (which adds the `tcp.connect` event). The second to arrive ends it at
/// the connect's end.
#[derive(Debug)]
pub(crate) struct SetupSpanEnd {
    first_arrived: AtomicBool,
    cx: Context,
    end: SystemTime,
}

impl SetupSpanEnd {
    /// The setup span in `cx`, to end at `end` once both parties arrived.
    pub(crate) fn new(cx: Context, end: SystemTime) -> Self {
        Self {
            first_arrived: AtomicBool::new(false),
            cx,
            end,
        }
    }

    /// One party is done with the setup span: the second ends it.
    pub(crate) fn arrive(&self) {
        if self.first_arrived.swap(true, Ordering::AcqRel) {
            self.cx.span().end_with_timestamp(self.end);
        }
    }
}

/// One phase being recorded: its own span (a child of the setup span), or
/// an event on the setup span written when the phase ends
/// ([`ConnectionPhases::Events`]).
pub(crate) enum PhaseRecord {
    /// The phase span's context (the empty context when nothing records).
    Span(Context),
    Event(PhaseEvent),
}

/// A phase event being gathered until the phase ends (its own events go
/// on the setup span at once: no list kept).
pub(crate) struct PhaseEvent {
    setup: Context,
    name: &'static str,
    start: SystemTime,
    attributes: Vec<KeyValue>,
}

impl PhaseRecord {
    /// Starts phase `name` at `start` under the setup span in `setup`.
    pub(crate) fn start(
        tracer: &BoxedTracer,
        mode: ConnectionPhases,
        setup: &Context,
        name: &'static str,
        start: SystemTime,
        attributes: Vec<KeyValue>,
    ) -> Self {
        match mode {
            ConnectionPhases::Spans => {
                let span = tracer.build_with_context(
                    SpanBuilder::from_name(name)
                        .with_kind(SpanKind::Internal)
                        .with_start_time(start)
                        .with_attributes(attributes),
                    setup,
                );
                PhaseRecord::Span(Context::new().with_span(span))
            }
            ConnectionPhases::Events => PhaseRecord::Event(PhaseEvent {
                setup: setup.clone(),
                name,
                start,
                attributes,
            }),
        }
    }

    /// Adds `kv` to the phase's attributes.
    pub(crate) fn set_attribute(&mut self, kv: KeyValue) {
        match self {
            PhaseRecord::Span(cx) => cx.span().set_attribute(kv),
            PhaseRecord::Event(e) => e.attributes.push(kv),
        }
    }

    /// Adds the phase's own event `name` at `at` (to the setup span in
    /// events mode, before the phase's event: order by timestamp).
    pub(crate) fn add_event(
        &mut self,
        name: &'static str,
        at: SystemTime,
        attributes: Vec<KeyValue>,
    ) {
        match self {
            PhaseRecord::Span(cx) => cx.span().add_event_with_timestamp(name, at, attributes),
            PhaseRecord::Event(e) => e
                .setup
                .span()
                .add_event_with_timestamp(name, at, attributes),
        }
    }

    /// Marks the phase failed: `error.type` and, on a span, an error status
    /// with `message`; on an event, `exception.message`.
    pub(crate) fn fail(&mut self, error_type: &'static str, message: &str) {
        match self {
            PhaseRecord::Span(cx) => {
                let span = cx.span();
                span.set_attribute(KeyValue::new(semconv::ERROR_TYPE, error_type));
                span.set_status(Status::error(message.to_owned()));
            }
            PhaseRecord::Event(e) => {
                e.attributes
                    .push(KeyValue::new(semconv::ERROR_TYPE, error_type));
                e.attributes.push(KeyValue::new(
                    semconv::EXCEPTION_MESSAGE,
                    message.to_owned(),
                ));
            }
        }
    }

    /// Ends the phase at `end`: ends its span, or writes its event (with
    /// its duration) on the setup span.
    pub(crate) fn end(self, end: SystemTime) {
        match self {
            PhaseRecord::Span(cx) => cx.span().end_with_timestamp(end),
            PhaseRecord::Event(e) => {
                let PhaseEvent {
                    setup,
                    name,
                    start,
                    mut attributes,
                } = e;
                let duration = end.duration_since(start).unwrap_or_default();
                attributes.push(KeyValue::new(
                    semconv::HTTP_CONNECTION_PHASE_DURATION,
                    duration.as_secs_f64(),
                ));
                setup
                    .span()
                    .add_event_with_timestamp(name, start, attributes);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use opentelemetry::trace::{Tracer as _, TracerProvider as _};
    use opentelemetry_sdk::error::OTelSdkResult;
    use opentelemetry_sdk::trace::{SdkTracerProvider, SpanData, SpanProcessor};

    use super::*;

    /// Keeps ended spans.
    #[derive(Debug, Clone, Default)]
    struct Ended(Arc<Mutex<Vec<SpanData>>>);

    impl SpanProcessor for Ended {
        fn on_start(&self, _: &mut opentelemetry_sdk::trace::Span, _: &Context) {}
        fn on_end(&self, span: SpanData) {
            self.0.lock().expect("ended").push(span);
        }
        fn force_flush(&self) -> OTelSdkResult {
            Ok(())
        }
        fn shutdown_with_timeout(&self, _: Duration) -> OTelSdkResult {
            Ok(())
        }
    }

    fn provider() -> (SdkTracerProvider, Ended) {
        let ended = Ended::default();
        let provider = SdkTracerProvider::builder()
            .with_span_processor(ended.clone())
            .build();
        (provider, ended)
    }

    /// Whichever of the two parties arrives second ends the span, at the
    /// end time given up front.
    #[test]
    fn the_setup_span_ends_when_the_second_party_arrives() {
        let (provider, ended) = provider();
        let tracer = provider.tracer("test");
        let end = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
        for _ in 0..2 {
            let cx = Context::new().with_span(tracer.start("http.connection_setup"));
            let shared = SetupSpanEnd::new(cx, end);
            shared.arrive();
            assert!(ended.0.lock().expect("ended").is_empty(), "one party in");
            shared.arrive();
            let spans = std::mem::take(&mut *ended.0.lock().expect("ended"));
            assert_eq!(spans.len(), 1, "ended by the second");
            assert_eq!(spans[0].end_time, end);
        }
    }

    /// In events mode a phase is no span: an event on the setup span at
    /// the phase's start with its attributes, a failure and its duration;
    /// its own events are the setup span's too.
    #[test]
    fn an_event_phase_and_its_own_events_go_on_the_setup_span() {
        let (provider, ended) = provider();
        let tracer = BoxedTracer::new(Box::new(provider.tracer("test")));
        let setup = Context::new().with_span(tracer.start("http.connection_setup"));
        let start = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
        let mut phase = PhaseRecord::start(
            &tracer,
            ConnectionPhases::Events,
            &setup,
            semconv::TLS_HANDSHAKE_SPAN,
            start,
            vec![KeyValue::new(semconv::TLS_PROTOCOL_NAME, "tls")],
        );
        phase.add_event(
            semconv::EVENT_TLS_SERVER_HELLO,
            start + Duration::from_millis(1),
            vec![],
        );
        phase.fail("timeout", "handshake timed out");
        phase.end(start + Duration::from_millis(250));
        setup.span().end();
        let spans = std::mem::take(&mut *ended.0.lock().expect("ended"));
        assert_eq!(spans.len(), 1, "no phase span");
        let events: Vec<_> = spans[0].events.iter().collect();
        assert_eq!(events.len(), 2);
        assert_eq!(events[0].name, semconv::EVENT_TLS_SERVER_HELLO);
        assert_eq!(events[0].timestamp, start + Duration::from_millis(1));
        assert_eq!(events[1].name, semconv::TLS_HANDSHAKE_SPAN);
        assert_eq!(events[1].timestamp, start);
        let value = |key: &str| {
            events[1]
                .attributes
                .iter()
                .find(|kv| kv.key.as_str() == key)
                .map(|kv| kv.value.clone())
        };
        assert_eq!(
            value(semconv::TLS_PROTOCOL_NAME),
            Some(opentelemetry::Value::from("tls"))
        );
        assert_eq!(
            value(semconv::ERROR_TYPE),
            Some(opentelemetry::Value::from("timeout"))
        );
        assert_eq!(
            value(semconv::EXCEPTION_MESSAGE),
            Some(opentelemetry::Value::from("handshake timed out"))
        );
        assert_eq!(
            value(semconv::HTTP_CONNECTION_PHASE_DURATION),
            Some(opentelemetry::Value::F64(0.25))
        );
    }
}
