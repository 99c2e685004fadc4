//! The page model: exported spans turned into what the page draws (groups
//! of traces, rows, phase bars, miss markers, links, per-batch miss rates,
//! calls in flight). Everything comes from span names, attributes, events
//! and links (the `semconv` names), so the page shows exactly what a trace
//! viewer such as Jaeger would show for the same spans.
//!
//! Terms:
//! - a *request* is a span with `http.request.method`; it is a *miss* when it
//!   carries `http.connection.miss_reason` (REFERENCE.md section 14: every
//!   request that found no idle connection);
//! - a *connection* is an `http.connection_setup` span, its *phases* the
//!   `dns.lookup`, `tcp.connect`, `proxy.connect` and `tls.handshake`
//!   spans under it;
//! - a *group* is the set of traces whose root span has the same name (and,
//!   for the demo, the same `demo.phase`): one demo phase, one probe mode,
//!   one lab run;
//! - a *batch* is a request's position in its fan-out
//!   (`http.fan_out.batch.index` of its `batch` parent), else its position
//!   among the requests of its trace.
//!
//! Traces whose root says `demo.warmup = true` are left out, as in the
//! demo's own numbers.
//!
//! Every text taken from the spans (names, attribute values, events, links,
//! status messages) passes through the library's URL redaction
//! (`UrlRedaction::redact_text`), so a file written by another exporter
//! (a collector's file exporter behind an application without it) shows no
//! credentials or signed-URL values either.

use std::collections::{BTreeMap, HashMap};

use conntrace_lab::ReceivedSpan;
use reqwest_conntrace::{UrlRedaction, semconv};
use serde::Serialize;

use crate::stats::{ratio, round3};

/// Root attribute that splits traces of one root name into groups (the
/// demo's phase name).
const GROUP_ATTRIBUTE: &str = "demo.phase";

/// Root attribute marking a demo warm-up fan-out (left out).
const WARMUP_ATTRIBUTE: &str = "demo.warmup";

/// Root attribute holding the demo phase's idle-pool size.
const DEMO_IDLE_LIMIT_ATTRIBUTE: &str = "demo.pool_max_idle_per_host";

/// Root attribute holding the probe mode's idle-pool size (absent when the
/// client keeps reqwest's default, unlimited).
const PROBE_IDLE_LIMIT_ATTRIBUTE: &str = "conntrace.probe.pool_max_idle_per_host";

/// Root attribute holding the demo fan-out's number.
const DEMO_FANOUT_INDEX_ATTRIBUTE: &str = "demo.fanout.index";

/// The span names of a connection's phases, in connect order, with the
/// short name the page and the terminal use for each.
pub(crate) const PHASES: [(&str, &str); 4] = [
    (semconv::DNS_LOOKUP_SPAN, "dns"),
    (semconv::TCP_CONNECT_SPAN, "tcp"),
    (semconv::PROXY_CONNECT_SPAN, "proxy"),
    (semconv::TLS_HANDSHAKE_SPAN, "tls"),
];

/// Everything the page draws, serialized into it as JSON.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Page {
    /// What the spans come from (command line or file name).
    pub(crate) title: String,
    /// The `conntrace` version that made the page.
    pub(crate) version: &'static str,
    /// Spans read.
    pub(crate) spans_total: usize,
    /// Traces read (any span).
    pub(crate) traces_total: usize,
    /// Traces left out as demo warm-up.
    pub(crate) warmup_traces: usize,
    /// Traces with neither a request nor a connection span (not drawn).
    pub(crate) other_traces: usize,
    /// The groups, in start order.
    pub(crate) groups: Vec<Group>,
    /// Every span drawn, referenced by index from rows and bars; what a
    /// hover shows.
    pub(crate) spans: Vec<SpanInfo>,
    /// Attribute keys and values of [`SpanInfo::attrs`], interned.
    pub(crate) strings: Vec<String>,
}

/// One group of traces; times are ms after the start of its first trace.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Group {
    /// Root span name, plus `demo.phase` when present.
    pub(crate) name: String,
    /// `server.address:server.port` of its requests, sorted.
    pub(crate) hosts: Vec<String>,
    /// The idle-pool size: the demo phase's `demo.pool_max_idle_per_host`
    /// or the probe mode's `conntrace.probe.pool_max_idle_per_host`,
    /// else `http.client.pool.idle_limit` of an
    /// `http.connection.pool_advice` event; `None` when the spans do not say.
    pub(crate) idle_limit: Option<i64>,
    /// Traces in the group.
    pub(crate) traces: usize,
    /// Request spans.
    pub(crate) requests: usize,
    /// Of those, misses (with `http.connection.miss_reason`).
    pub(crate) misses: usize,
    /// Of those, failed (with `error.type` and no connection).
    pub(crate) failed: usize,
    /// Misses by reason.
    pub(crate) reasons: BTreeMap<String, usize>,
    /// Per batch position.
    pub(crate) batches: Vec<BatchCell>,
    /// Requests in flight over time: `[ms, count]` after each change
    /// (a step function), starting at `[0, 0]`.
    pub(crate) in_flight: Vec<[f64; 2]>,
    /// Most requests in flight at once.
    pub(crate) in_flight_peak: usize,
    /// First trace start to last span end.
    pub(crate) duration_ms: f64,
    /// Start of the first shown trace.
    pub(crate) shown_from_ms: f64,
    /// End of the last span of the shown traces.
    pub(crate) shown_to_ms: f64,
    /// The traces drawn on the timeline, in start order.
    pub(crate) shown: Vec<TraceView>,
}

/// Requests at one batch position.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct BatchCell {
    /// The position, from 0.
    pub(crate) index: usize,
    /// Requests at this position.
    pub(crate) calls: usize,
    /// Of those, misses.
    pub(crate) misses: usize,
    /// `misses / calls`.
    pub(crate) miss_ratio: f64,
    /// Misses by reason.
    pub(crate) reasons: BTreeMap<String, usize>,
}

/// One trace on the timeline.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct TraceView {
    /// Trace id, 32 hex digits.
    pub(crate) trace_id: String,
    /// Label: root name and, for a demo fan-out, its number.
    pub(crate) label: String,
    /// Misses among its requests.
    pub(crate) misses: usize,
    /// Its rows, top to bottom: the root (unless it is a request), then
    /// each request followed by the connections it started.
    pub(crate) rows: Vec<Row>,
}

/// One row: a span drawn as a bar.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Row {
    /// `root`, `request` or `connection`.
    pub(crate) kind: &'static str,
    /// Index into [`Page::spans`].
    pub(crate) span: usize,
    /// Text left of the bar.
    pub(crate) label: String,
    /// Span start.
    pub(crate) start_ms: f64,
    /// Span end.
    pub(crate) end_ms: f64,
    /// Request: `http.connection.wait_time`, ms.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) wait_ms: Option<f64>,
    /// Request: when its response headers arrived (the
    /// `http.receive.start` event), ms after the group's start: the end of
    /// "server", the start of "body".
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) headers_ms: Option<f64>,
    /// Request: `http.connection.miss_reason`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) miss_reason: Option<String>,
    /// Request: `error.type`; connection: its `error.type`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) error_type: Option<String>,
    /// `http.connection.id` (the serving one for a request).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) connection_id: Option<i64>,
    /// Request: index into [`Page::spans`] of the setup span of the
    /// connection that served it, when that span is drawn.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) served_by: Option<usize>,
    /// Request: `child` (its own connect served it) or `link` (a span link
    /// to another request's connect).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) served_how: Option<&'static str>,
    /// Connection: `http.connection.setup.outcome` (`null` when absent).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) outcome: Option<String>,
    /// Connection: its phases, in start order.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) phases: Vec<PhaseBar>,
    /// Request: the span id its link to the serving connection points at
    /// (resolved into `served_by` when that span is drawn).
    #[serde(skip)]
    link_target: Option<String>,
}

/// One connection phase.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct PhaseBar {
    /// `dns`, `tcp`, `proxy` or `tls`.
    pub(crate) phase: &'static str,
    /// Index into [`Page::spans`].
    pub(crate) span: usize,
    /// Phase span start.
    pub(crate) start_ms: f64,
    /// Phase span end.
    pub(crate) end_ms: f64,
    /// Its `error.type`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) error_type: Option<String>,
}

/// A drawn span, for the hover: ids, times and every attribute.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct SpanInfo {
    /// Span name.
    pub(crate) name: String,
    /// Span id, 16 hex digits.
    pub(crate) id: String,
    /// Start, ms after its group's start.
    pub(crate) start_ms: f64,
    /// Duration, ms.
    pub(crate) duration_ms: f64,
    /// Status: `error: message` or `null`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) status: Option<String>,
    /// Attributes as `[key, value, key, value, ...]` indices into
    /// [`Page::strings`] (values rendered as text).
    pub(crate) attrs: Vec<u32>,
    /// Events: name, ms after the group's start, attributes as text.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) events: Vec<EventInfo>,
    /// Links: the linked span id and the link's attributes as text, an
    /// index into [`Page::strings`].
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) links: Vec<u32>,
}

/// A span event, for the hover.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct EventInfo {
    /// Event name.
    pub(crate) name: String,
    /// Time, ms after the group's start.
    pub(crate) at_ms: f64,
    /// Attributes, `key=value` joined by `, `, an index into
    /// [`Page::strings`].
    pub(crate) attrs: u32,
}

/// How many traces per group the timeline draws by default.
pub(crate) const DEFAULT_SHOWN_TRACES: usize = 6;

/// Builds the page model from `spans`, drawing up to `max_shown` traces
/// per group (all when 0).
pub(crate) fn build(title: &str, spans: &[ReceivedSpan], max_shown: usize) -> Page {
    let index = SpanIndex::new(spans);
    let mut page = Page {
        title: redacted(title),
        version: env!("CARGO_PKG_VERSION"),
        spans_total: spans.len(),
        traces_total: index.traces.len(),
        warmup_traces: 0,
        other_traces: 0,
        groups: Vec::new(),
        spans: Vec::new(),
        strings: Vec::new(),
    };
    // Groups of traces, keyed by name, in order of their first trace.
    let mut groups: Vec<(String, Vec<TraceParts<'_>>)> = Vec::new();
    let mut traces: Vec<TraceParts<'_>> = index
        .traces
        .values()
        .map(|members| TraceParts::new(&index, members))
        .collect();
    traces.sort_by_key(|t| (t.start, t.root.span_id_hex()));
    for trace in traces {
        if trace.root.attr_bool(WARMUP_ATTRIBUTE) == Some(true) {
            page.warmup_traces += 1;
            continue;
        }
        if trace.requests.is_empty() && trace.connections.is_empty() {
            page.other_traces += 1;
            continue;
        }
        let name = match trace.root.attributes().display(GROUP_ATTRIBUTE) {
            Some(phase) => redacted(&format!("{} {phase}", trace.root.name())),
            None => redacted(trace.root.name()),
        };
        match groups.iter_mut().find(|(n, _)| *n == name) {
            Some((_, v)) => v.push(trace),
            None => groups.push((name, vec![trace])),
        }
    }
    let mut strings = Strings::default();
    for (name, traces) in groups {
        let group = build_group(name, &traces, &index, max_shown, &mut page, &mut strings);
        page.groups.push(group);
    }
    page.strings = strings.list;
    page
}

/// The spans by id, by trace, and the children of each span.
struct SpanIndex<'a> {
    /// Span id to span.
    by_id: HashMap<String, &'a ReceivedSpan>,
    /// Parent span id to children.
    children: HashMap<String, Vec<&'a ReceivedSpan>>,
    /// Trace id to its spans.
    traces: HashMap<String, Vec<&'a ReceivedSpan>>,
}

impl<'a> SpanIndex<'a> {
    fn new(spans: &'a [ReceivedSpan]) -> Self {
        let mut by_id = HashMap::with_capacity(spans.len());
        let mut children: HashMap<String, Vec<&ReceivedSpan>> = HashMap::new();
        let mut traces: HashMap<String, Vec<&ReceivedSpan>> = HashMap::new();
        for s in spans {
            by_id.insert(s.span_id_hex(), s);
            if let Some(p) = s.parent_span_id_hex() {
                children.entry(p).or_default().push(s);
            }
            traces.entry(s.trace_id_hex()).or_default().push(s);
        }
        for v in children.values_mut() {
            v.sort_by_key(|s| s.start_unix_nanos());
        }
        Self {
            by_id,
            children,
            traces,
        }
    }

    /// The children of `span`, in start order.
    fn children(&self, span: &ReceivedSpan) -> &[&'a ReceivedSpan] {
        self.children
            .get(&span.span_id_hex())
            .map_or(&[], Vec::as_slice)
    }

    /// The parent of `span`, when it is in the data.
    fn parent(&self, span: &ReceivedSpan) -> Option<&'a ReceivedSpan> {
        self.by_id.get(&span.parent_span_id_hex()?).copied()
    }
}

/// Whether `span` is a request span.
pub(crate) fn is_request(span: &ReceivedSpan) -> bool {
    span.has_attr(semconv::HTTP_REQUEST_METHOD)
}

/// Whether `span` is a connection setup span.
pub(crate) fn is_connection(span: &ReceivedSpan) -> bool {
    span.name() == semconv::CONNECTION_SETUP_SPAN
}

/// One trace's root, requests and connections.
struct TraceParts<'a> {
    /// The earliest span without a parent in the data.
    root: &'a ReceivedSpan,
    /// Earliest start.
    start: u64,
    /// Latest end.
    end: u64,
    /// Request spans, in start order.
    requests: Vec<&'a ReceivedSpan>,
    /// Connection setup spans, in start order.
    connections: Vec<&'a ReceivedSpan>,
}

impl<'a> TraceParts<'a> {
    fn new(index: &SpanIndex<'a>, members: &[&'a ReceivedSpan]) -> Self {
        let mut sorted: Vec<&ReceivedSpan> = members.to_vec();
        sorted.sort_by_key(|s| (s.start_unix_nanos(), s.span_id_hex()));
        let root = sorted
            .iter()
            .find(|s| index.parent(s).is_none())
            .or(sorted.first())
            .copied()
            .expect("a trace has a span");
        Self {
            root,
            start: sorted.first().map_or(0, |s| s.start_unix_nanos()),
            end: sorted.iter().map(|s| s.end_unix_nanos()).max().unwrap_or(0),
            requests: sorted.iter().copied().filter(|s| is_request(s)).collect(),
            connections: sorted
                .iter()
                .copied()
                .filter(|s| is_connection(s))
                .collect(),
        }
    }
}

/// Interned strings.
#[derive(Default)]
struct Strings {
    /// In first-seen order.
    list: Vec<String>,
    /// String to its index.
    index: HashMap<String, u32>,
}

impl Strings {
    fn intern(&mut self, s: &str) -> u32 {
        if let Some(&i) = self.index.get(s) {
            return i;
        }
        let i = u32::try_from(self.list.len()).unwrap_or(u32::MAX);
        self.list.push(redacted(s));
        self.index.insert(s.to_owned(), i);
        i
    }
}

/// `text` with every URL in it redacted (user info, secret query values).
fn redacted(text: &str) -> String {
    if text.contains("://") {
        UrlRedaction::new().redact_text(text)
    } else {
        text.to_owned()
    }
}

/// An integer attribute, also when recorded as a decimal string (as
/// `tracing-opentelemetry` records `usize` fields).
fn attr_int(span: &ReceivedSpan, key: &str) -> Option<i64> {
    span.attr_i64(key)
        .or_else(|| span.attr_str(key).and_then(|s| s.parse().ok()))
}

/// Milliseconds from `t0` to `t` (both ns since the epoch).
fn rel_ms(t: u64, t0: u64) -> f64 {
    round3((t as f64 - t0 as f64) / 1e6)
}

/// The span's duration in ms.
fn dur_ms(s: &ReceivedSpan) -> f64 {
    round3(s.duration().as_secs_f64() * 1000.0)
}

/// The batch position of request `r`, the `i`-th request of its trace.
fn batch_of(index: &SpanIndex<'_>, r: &ReceivedSpan, i: usize) -> usize {
    index
        .parent(r)
        .and_then(|p| p.attr_i64(semconv::FAN_OUT_BATCH_INDEX))
        .and_then(|b| usize::try_from(b).ok())
        .unwrap_or(i)
}

/// Builds one group, adding its drawn spans to `page.spans`.
fn build_group(
    name: String,
    traces: &[TraceParts<'_>],
    index: &SpanIndex<'_>,
    max_shown: usize,
    page: &mut Page,
    strings: &mut Strings,
) -> Group {
    let t0 = traces.iter().map(|t| t.start).min().unwrap_or(0);
    let t_end = traces.iter().map(|t| t.end).max().unwrap_or(t0);
    let mut hosts = std::collections::BTreeSet::new();
    let mut reasons = BTreeMap::new();
    let mut batches: BTreeMap<usize, BatchCell> = BTreeMap::new();
    let mut changes: Vec<(u64, i32)> = Vec::new();
    let (mut requests, mut misses, mut failed) = (0, 0, 0);
    let mut idle_limit = None;
    for t in traces {
        if idle_limit.is_none() {
            idle_limit = attr_int(t.root, DEMO_IDLE_LIMIT_ATTRIBUTE)
                .or_else(|| attr_int(t.root, PROBE_IDLE_LIMIT_ATTRIBUTE));
        }
        for (i, r) in t.requests.iter().enumerate() {
            requests += 1;
            if let (Some(h), Some(p)) = (
                r.attr_str(semconv::SERVER_ADDRESS),
                r.attr_i64(semconv::SERVER_PORT),
            ) {
                hosts.insert(format!("{h}:{p}"));
            }
            let reason = r.attr_str(semconv::HTTP_CONNECTION_MISS_REASON);
            let cell = batches
                .entry(batch_of(index, r, i))
                .or_insert_with(|| BatchCell {
                    index: batch_of(index, r, i),
                    calls: 0,
                    misses: 0,
                    miss_ratio: 0.0,
                    reasons: BTreeMap::new(),
                });
            cell.calls += 1;
            if let Some(reason) = reason {
                misses += 1;
                cell.misses += 1;
                *cell.reasons.entry(reason.to_owned()).or_insert(0) += 1;
                *reasons.entry(reason.to_owned()).or_insert(0) += 1;
            }
            if r.has_attr(semconv::ERROR_TYPE) && !r.has_attr(semconv::HTTP_CONNECTION_ID) {
                failed += 1;
            }
            if idle_limit.is_none() {
                idle_limit = r
                    .events()
                    .iter()
                    .filter(|e| e.name == semconv::EVENT_POOL_ADVICE)
                    .find_map(|e| e.attributes.i64(semconv::HTTP_CLIENT_POOL_IDLE_LIMIT));
            }
            changes.push((r.start_unix_nanos(), 1));
            changes.push((r.end_unix_nanos(), -1));
        }
    }
    for cell in batches.values_mut() {
        cell.miss_ratio = ratio(cell.misses as f64, cell.calls as f64);
    }
    // Ends before starts at the same instant: back-to-back calls are not
    // counted as overlapping.
    changes.sort_unstable();
    let mut in_flight = vec![[0.0, 0.0]];
    let (mut now, mut peak) = (0i32, 0i32);
    for (t, d) in changes {
        now += d;
        peak = peak.max(now);
        let at = rel_ms(t, t0);
        match in_flight.last_mut() {
            Some(last) if last[0] == at => last[1] = f64::from(now),
            _ => in_flight.push([at, f64::from(now)]),
        }
    }
    let take = if max_shown == 0 {
        traces.len()
    } else {
        max_shown.min(traces.len())
    };
    let shown_traces = &traces[..take];
    let shown_from = shown_traces.iter().map(|t| t.start).min().unwrap_or(t0);
    let shown_to = shown_traces.iter().map(|t| t.end).max().unwrap_or(t0);
    let mut builder = RowBuilder {
        index,
        t0,
        page,
        strings,
        drawn: HashMap::new(),
    };
    let mut shown: Vec<TraceView> = shown_traces.iter().map(|t| builder.trace(t)).collect();
    // Span links resolve once every shown trace of the group is drawn:
    // the linked connection may sit in another trace.
    for row in shown.iter_mut().flat_map(|t| t.rows.iter_mut()) {
        if let Some(target) = row.link_target.take() {
            row.served_by = builder.drawn.get(&target).copied();
        }
    }
    Group {
        name,
        hosts: hosts.into_iter().collect(),
        idle_limit,
        traces: traces.len(),
        requests,
        misses,
        failed,
        reasons,
        batches: batches.into_values().collect(),
        in_flight,
        in_flight_peak: usize::try_from(peak).unwrap_or(0),
        duration_ms: rel_ms(t_end, t0),
        shown_from_ms: rel_ms(shown_from, t0),
        shown_to_ms: rel_ms(shown_to, t0),
        shown,
    }
}

/// Builds rows, adding drawn spans to the page.
struct RowBuilder<'a, 'p> {
    index: &'a SpanIndex<'a>,
    /// The group's start, ns.
    t0: u64,
    page: &'p mut Page,
    strings: &'p mut Strings,
    /// Span id to its index in `page.spans`, for spans drawn in this group.
    drawn: HashMap<String, usize>,
}

impl RowBuilder<'_, '_> {
    /// Adds `s` to the page's spans; returns its index.
    fn add(&mut self, s: &ReceivedSpan) -> usize {
        let id = s.span_id_hex();
        if let Some(&i) = self.drawn.get(&id) {
            return i;
        }
        let mut attrs = Vec::with_capacity(s.attributes().len() * 2);
        for key in s.attributes().keys() {
            let value = s.attributes().display(key).unwrap_or_default();
            attrs.push(self.strings.intern(key));
            attrs.push(self.strings.intern(&value));
        }
        let text = |a: &conntrace_lab::Attributes| {
            a.keys()
                .iter()
                .map(|k| format!("{k}={}", a.display(k).unwrap_or_default()))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let events = s
            .events()
            .iter()
            .map(|e| EventInfo {
                name: redacted(&e.name),
                at_ms: rel_ms(e.time_unix_nano, self.t0),
                attrs: self.strings.intern(&text(&e.attributes)),
            })
            .collect();
        let links = s
            .links()
            .iter()
            .map(|l| {
                let attrs = text(&l.attributes);
                let link = if attrs.is_empty() {
                    l.span_id_hex.clone()
                } else {
                    format!("{} ({attrs})", l.span_id_hex)
                };
                self.strings.intern(&link)
            })
            .collect();
        let status = match s.status_code() {
            opentelemetry_proto::tonic::trace::v1::status::StatusCode::Error => {
                Some(redacted(&format!("error: {}", s.status_message())))
            }
            _ => None,
        };
        self.page.spans.push(SpanInfo {
            name: redacted(s.name()),
            id: id.clone(),
            start_ms: rel_ms(s.start_unix_nanos(), self.t0),
            duration_ms: dur_ms(s),
            status,
            attrs,
            events,
            links,
        });
        let i = self.page.spans.len() - 1;
        self.drawn.insert(id, i);
        i
    }

    /// A bare row for span `s`.
    fn row(&mut self, kind: &'static str, s: &ReceivedSpan, label: String) -> Row {
        Row {
            kind,
            span: self.add(s),
            label,
            start_ms: rel_ms(s.start_unix_nanos(), self.t0),
            end_ms: rel_ms(s.end_unix_nanos(), self.t0),
            wait_ms: None,
            headers_ms: None,
            miss_reason: None,
            error_type: s.attr_str(semconv::ERROR_TYPE).map(str::to_owned),
            connection_id: s.attr_i64(semconv::HTTP_CONNECTION_ID),
            served_by: None,
            served_how: None,
            outcome: None,
            phases: Vec::new(),
            link_target: None,
        }
    }

    /// The rows of one trace.
    fn trace(&mut self, t: &TraceParts<'_>) -> TraceView {
        let label = match attr_int(t.root, DEMO_FANOUT_INDEX_ATTRIBUTE) {
            Some(n) => redacted(&format!("{} {n}", t.root.name())),
            None => redacted(t.root.name()),
        };
        // A trace whose root is itself a request (an application without
        // a span around its calls) starts with that request's row.
        let mut rows = Vec::new();
        if !is_request(t.root) {
            rows.push(self.row("root", t.root, label.clone()));
        }
        let mut placed = std::collections::HashSet::new();
        let mut misses = 0;
        for (i, r) in t.requests.iter().enumerate() {
            let in_batch = self
                .index
                .parent(r)
                .is_some_and(|p| p.has_attr(semconv::FAN_OUT_BATCH_INDEX));
            let label = if in_batch {
                format!("batch {}", batch_of(self.index, r, i))
            } else {
                redacted(&format!("{} #{}", r.name(), i + 1))
            };
            let mut row = self.row("request", r, label);
            row.wait_ms = r
                .attr_f64(semconv::HTTP_CONNECTION_WAIT_TIME)
                .map(|s| round3(s * 1000.0));
            row.headers_ms = r
                .events()
                .iter()
                .find(|e| e.name == semconv::EVENT_RESPONSE_HEADERS)
                .map(|e| rel_ms(e.time_unix_nano, self.t0));
            row.miss_reason = r
                .attr_str(semconv::HTTP_CONNECTION_MISS_REASON)
                .map(str::to_owned);
            if row.miss_reason.is_some() {
                misses += 1;
            }
            let own: Vec<&ReceivedSpan> = self
                .index
                .children(r)
                .iter()
                .copied()
                .filter(|c| is_connection(c))
                .collect();
            let serving = row.connection_id;
            let request_at = rows.len();
            rows.push(row);
            for c in own {
                placed.insert(c.span_id_hex());
                let conn = self.connection(c);
                if serving.is_some() && conn.connection_id == serving {
                    rows[request_at].served_by = Some(conn.span);
                    rows[request_at].served_how = Some("child");
                }
                rows.push(conn);
            }
            if rows[request_at].served_by.is_none()
                && let Some(link) = r.links().into_iter().find(|l| {
                    serving.is_some() && l.attributes.i64(semconv::HTTP_CONNECTION_ID) == serving
                })
            {
                rows[request_at].served_how = Some("link");
                rows[request_at].link_target = Some(link.span_id_hex);
            }
        }
        for c in &t.connections {
            if !placed.contains(&c.span_id_hex()) {
                let conn = self.connection(c);
                rows.push(conn);
            }
        }
        TraceView {
            trace_id: t.root.trace_id_hex(),
            label,
            misses,
            rows,
        }
    }

    /// The row of connection setup span `c`, with its phases.
    fn connection(&mut self, c: &ReceivedSpan) -> Row {
        let id = c.attr_i64(semconv::HTTP_CONNECTION_ID);
        let label = id.map_or_else(|| "connection".to_owned(), |id| format!("conn #{id}"));
        let mut row = self.row("connection", c, label);
        row.outcome = c
            .attr_str(semconv::HTTP_CONNECTION_SETUP_OUTCOME)
            .map(str::to_owned);
        let kids: Vec<&ReceivedSpan> = self.index.children(c).to_vec();
        for k in kids {
            let Some(&(_, phase)) = PHASES.iter().find(|(n, _)| *n == k.name()) else {
                continue;
            };
            let span = self.add(k);
            row.phases.push(PhaseBar {
                phase,
                span,
                start_ms: rel_ms(k.start_unix_nanos(), self.t0),
                end_ms: rel_ms(k.end_unix_nanos(), self.t0),
                error_type: k.attr_str(semconv::ERROR_TYPE).map(str::to_owned),
            });
        }
        row
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    /// An OTLP JSON span: ids as hex, times in ms after a fixed epoch.
    fn span(
        trace: &str,
        id: &str,
        parent: &str,
        name: &str,
        from_ms: u64,
        to_ms: u64,
        attrs: Value,
    ) -> Value {
        let ns = |ms: u64| (1_700_000_000_000_000_000u64 + ms * 1_000_000).to_string();
        let attributes: Vec<Value> = attrs
            .as_object()
            .map(|o| {
                o.iter()
                    .map(|(k, v)| {
                        let value = match v {
                            Value::Bool(b) => json!({"boolValue": b}),
                            Value::Number(n) if n.is_f64() => json!({"doubleValue": n}),
                            Value::Number(n) => json!({"intValue": n.to_string()}),
                            other => json!({"stringValue": other.as_str().unwrap_or_default()}),
                        };
                        json!({"key": k, "value": value})
                    })
                    .collect()
            })
            .unwrap_or_default();
        json!({
            "traceId": trace.repeat(32 / trace.len()),
            "spanId": id.repeat(16 / id.len()),
            "parentSpanId": if parent.is_empty() { String::new() } else { parent.repeat(16 / parent.len()) },
            "name": name, "kind": 1,
            "startTimeUnixNano": ns(from_ms), "endTimeUnixNano": ns(to_ms),
            "attributes": attributes, "events": [], "links": [],
        })
    }

    fn spans(list: Vec<Value>) -> Vec<ReceivedSpan> {
        let doc = json!({"resourceSpans": [{"resource": {"attributes": []},
            "scopeSpans": [{"scope": {"name": "t"}, "spans": list}]}]});
        conntrace_lab::spans_from_otlp_json(&doc.to_string()).expect("OTLP JSON")
    }

    /// Warm-up traces are left out, demo phases group, misses count per
    /// batch, requests in flight step, a request's own connect and a span
    /// link both resolve to the drawn setup span, a failed request counts,
    /// the headers event splits a request, the probe's idle-pool size is
    /// its idle limit.
    #[test]
    fn spans_become_groups_rows_and_counts() {
        let mut list = vec![
            // A warm-up fan-out: left out.
            span(
                "a",
                "a1",
                "",
                "user_request",
                0,
                50,
                json!({"demo.phase": "p", "demo.warmup": true}),
            ),
            span(
                "a",
                "a2",
                "a1",
                "GET",
                1,
                40,
                json!({"http.request.method": "GET", "http.connection.miss_reason": "cold"}),
            ),
            // A measured fan-out of two batches.
            span(
                "b",
                "b1",
                "",
                "user_request",
                0,
                120,
                json!({"demo.phase": "p", "demo.warmup": false, "demo.fanout.index": "1", "demo.pool_max_idle_per_host": "2"}),
            ),
            span("b", "b2", "b1", "fan_out", 1, 119, json!({})),
            span(
                "b",
                "b3",
                "b2",
                "batch",
                2,
                115,
                json!({"http.fan_out.batch.index": 0}),
            ),
            span(
                "b",
                "b4",
                "b3",
                "GET",
                10,
                110,
                json!({"http.request.method": "GET", "http.connection.miss_reason": "cold", "http.connection.reused": false, "http.connection.id": 1, "http.connection.wait_time": 0.03}),
            ),
            span(
                "b",
                "b5",
                "b4",
                "http.connection_setup",
                11,
                40,
                json!({"http.connection.id": 1, "http.connection.setup.outcome": "used"}),
            ),
            span("b", "b6", "b5", "tcp.connect", 11, 20, json!({})),
            span("b", "b7", "b5", "tls.handshake", 20, 40, json!({})),
            span(
                "b",
                "b8",
                "b2",
                "batch",
                2,
                100,
                json!({"http.fan_out.batch.index": 1}),
            ),
            span(
                "b",
                "b9",
                "b8",
                "GET",
                20,
                60,
                json!({"http.request.method": "GET", "http.connection.reused": true, "http.connection.id": 1, "http.connection.wait_time": 0.0}),
            ),
            // A probe mode with one failed request.
            span(
                "c",
                "c1",
                "",
                "probe fresh",
                500,
                600,
                json!({"conntrace.probe.pool_max_idle_per_host": 0}),
            ),
            span(
                "c",
                "c2",
                "c1",
                "GET",
                510,
                590,
                json!({"http.request.method": "GET", "error.type": "timeout"}),
            ),
        ];
        // The hit links to connection 1's setup span.
        list[10]["links"] = json!([{"traceId": "b".repeat(32), "spanId": "b5".repeat(8),
            "attributes": [{"key": "http.connection.id", "value": {"intValue": "1"}}]}]);
        // The first request's response headers arrived at 55 ms.
        list[5]["events"] = json!([{"name": "http.receive.start",
            "timeUnixNano": (1_700_000_000_000_000_000u64 + 55_000_000).to_string()}]);
        let page = build("t", &spans(list), 0);
        assert_eq!(page.spans_total, 13);
        assert_eq!(page.warmup_traces, 1);
        let names: Vec<&str> = page.groups.iter().map(|g| g.name.as_str()).collect();
        assert_eq!(names, ["user_request p", "probe fresh"]);

        let g = &page.groups[0];
        assert_eq!((g.traces, g.requests, g.misses, g.failed), (1, 2, 1, 0));
        assert_eq!(g.idle_limit, Some(2));
        let cells: Vec<(usize, usize, usize)> = g
            .batches
            .iter()
            .map(|b| (b.index, b.calls, b.misses))
            .collect();
        assert_eq!(cells, [(0, 1, 1), (1, 1, 0)]);
        assert_eq!(
            g.in_flight,
            [
                [0.0, 0.0],
                [10.0, 1.0],
                [20.0, 2.0],
                [60.0, 1.0],
                [110.0, 0.0]
            ]
        );
        assert_eq!(g.in_flight_peak, 2);

        let rows = &g.shown[0].rows;
        let kinds: Vec<&str> = rows.iter().map(|r| r.kind).collect();
        assert_eq!(kinds, ["root", "request", "connection", "request"]);
        assert_eq!(rows[0].label, "user_request 1");
        assert_eq!(rows[1].label, "batch 0");
        assert_eq!(rows[1].wait_ms, Some(30.0));
        assert_eq!(rows[1].headers_ms, Some(55.0));
        assert_eq!(rows[3].headers_ms, None);
        assert_eq!(rows[1].miss_reason.as_deref(), Some("cold"));
        let setup = rows[2].span;
        assert_eq!(page.spans[setup].name, "http.connection_setup");
        assert_eq!(
            (rows[1].served_by, rows[1].served_how),
            (Some(setup), Some("child"))
        );
        assert_eq!(
            (rows[3].served_by, rows[3].served_how),
            (Some(setup), Some("link"))
        );
        let phases: Vec<(&str, f64, f64)> = rows[2]
            .phases
            .iter()
            .map(|p| (p.phase, p.start_ms, p.end_ms))
            .collect();
        assert_eq!(phases, [("tcp", 11.0, 20.0), ("tls", 20.0, 40.0)]);

        let probe = &page.groups[1];
        assert_eq!((probe.requests, probe.misses, probe.failed), (1, 0, 1));
        assert_eq!(probe.idle_limit, Some(0));
        assert_eq!(probe.shown[0].rows[1].label, "GET #1");
    }
}
