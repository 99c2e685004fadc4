//! The pictures: `--html` pages opened in a real browser (headless Chromium,
//! Debian's `chromium`, installed by scripts/test.sh), checked for what a
//! person sees (trace blocks, phase bars, miss markers, links, the heat
//! strip, calls in flight) against the spans the page was made from; a
//! 10,000-span file through `conntrace view`; the probe's `--waterfall`.
//! Screenshots are kept under `target/tmp/conntrace-view/`.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::time::Duration;

use conntrace_lab::{ReceivedSpan, TestPki, TestServer};
use reqwest_conntrace::semconv;

use super::{conntrace, run, stderr};

/// Where screenshots and pages are kept after the test.
fn artefacts() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("conntrace-view");
    std::fs::create_dir_all(&dir).expect("artefact dir");
    dir
}

/// Runs headless Chromium on `page` with `args`; returns stdout and stderr.
async fn chromium(page: &Path, args: &[&str]) -> (String, String) {
    let mut cmd = tokio::process::Command::new("chromium");
    cmd.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--hide-scrollbars",
        "--enable-logging=stderr",
        "--v=0",
        "--window-size=1600,2200",
    ])
    .args(args)
    .arg(format!("file://{}", page.display()))
    .kill_on_drop(true);
    let out = tokio::time::timeout(Duration::from_secs(120), cmd.output())
        .await
        .expect("chromium finished in time")
        .expect("chromium runs (Debian package chromium, installed by scripts/test.sh)");
    assert!(out.status.success(), "chromium failed: {}", stderr(&out));
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr(&out),
    )
}

/// The page's DOM after its script ran, checked to have rendered with no
/// console message (the page logs nothing; an exception shows up as one).
async fn rendered_dom(page: &Path) -> String {
    let (dom, log) = chromium(page, &["--dump-dom"]).await;
    let console: Vec<&str> = log.lines().filter(|l| l.contains(":CONSOLE")).collect();
    assert!(console.is_empty(), "console messages: {console:#?}");
    assert!(
        dom.contains("data-rendered=\"ok\""),
        "the page's script ran to its end"
    );
    dom
}

/// The value of attribute `name` in the start tag `tag`.
fn attr<'a>(tag: &'a str, name: &str) -> Option<&'a str> {
    let key = format!(" {name}=\"");
    let start = tag.find(&key)? + key.len();
    let end = tag[start..].find('"')?;
    Some(&tag[start..start + end])
}

/// Every element starting with `prefix` (e.g. `<g class="row request"`):
/// its start tag and the markup up to the next `</g>`.
fn elements<'a>(dom: &'a str, prefix: &str) -> Vec<(&'a str, &'a str)> {
    let mut out = Vec::new();
    let mut rest = dom;
    while let Some(at) = rest.find(prefix) {
        let from = &rest[at..];
        let tag_end = from.find('>').map_or(from.len(), |e| e + 1);
        let body_end = from.find("</g>").unwrap_or(from.len());
        out.push((&from[..tag_end], &from[..body_end.max(tag_end)]));
        rest = &from[tag_end..];
    }
    out
}

/// The part of `dom` from `<div class="CLASS" data-group="GROUP"` to the
/// next such div (or the end).
fn section<'a>(dom: &'a str, class: &str, group: &str) -> &'a str {
    let open = format!("<div class=\"{class}\" data-group=\"{group}\"");
    let start = dom
        .find(&open)
        .unwrap_or_else(|| panic!("no {class} for {group}"));
    let rest = &dom[start + open.len()..];
    let end = rest
        .find(&format!("<div class=\"{class}\""))
        .or_else(|| rest.find("</section>"))
        .unwrap_or(rest.len());
    &rest[..end]
}

/// Whether `text` (`74.3 ms`, `1.25 s`) is the span's duration to the
/// printed precision (the page rounds to microseconds, then to the digit
/// shown).
fn shows_duration(text: &str, span: &ReceivedSpan) -> bool {
    let ms = span.duration().as_secs_f64() * 1000.0;
    let (value, unit_ms, step) = match text.split_once(' ') {
        Some((v, "ms")) => (v, 1.0, 0.1),
        Some((v, "s")) => (v, 1000.0, 0.01),
        _ => return false,
    };
    value
        .parse::<f64>()
        .is_ok_and(|v| (v * unit_ms - ms).abs() <= step * unit_ms / 2.0 + 0.001)
}

/// The text of the first `<tspan class="dur">` in `markup`.
fn dur_text(markup: &str) -> &str {
    let open = "<tspan class=\"dur\">";
    let start = markup.find(open).expect("a duration") + open.len();
    let end = markup[start..].find('<').expect("end of text");
    &markup[start..start + end]
}

/// The `data-ms` of the `<rect class="bar CLASS"` in `markup`, if drawn.
fn bar_ms(markup: &str, class: &str) -> Option<f64> {
    let at = markup.find(&format!("<rect class=\"bar {class}\""))?;
    let tag = &markup[at..at + markup[at..].find('>')?];
    attr(tag, "data-ms")?.parse().ok()
}

/// The page laid out every label and note inside its picture (the page's
/// own check in the browser: `data-overflow` counts texts cut by an
/// edge or running into the time axis); no label was shortened.
fn labels_fit(dom: &str) {
    let body = &dom[dom.find("<body").expect("body")..];
    let tag = &body[..body.find('>').expect("body tag")];
    assert_eq!(attr(tag, "data-overflow"), Some("0"), "texts cut: {tag}");
    let labels = dom.matches("class=\"row-label").count();
    assert!(labels > 0);
    for (at, _) in dom.match_indices("class=\"row-label") {
        let text = &dom[at..at + dom[at..].find("</text>").expect("label end")];
        assert!(!text.contains('…') && !text.contains("<title>"), "{text}");
    }
}

/// The spans of a demo run, by id, with their children.
struct Spans {
    all: Vec<ReceivedSpan>,
    by_id: HashMap<String, usize>,
}

impl Spans {
    fn new(all: Vec<ReceivedSpan>) -> Self {
        let by_id = all
            .iter()
            .enumerate()
            .map(|(i, s)| (s.span_id_hex(), i))
            .collect();
        Self { all, by_id }
    }

    fn get(&self, id: &str) -> &ReceivedSpan {
        &self.all[*self.by_id.get(id).unwrap_or_else(|| panic!("span {id}"))]
    }

    fn children(&self, parent: &ReceivedSpan) -> Vec<&ReceivedSpan> {
        let id = parent.span_id_hex();
        let mut v: Vec<&ReceivedSpan> = self
            .all
            .iter()
            .filter(|s| s.parent_span_id_hex().as_deref() == Some(id.as_str()))
            .collect();
        v.sort_by_key(|s| s.start_unix_nanos());
        v
    }

    fn in_trace(&self, trace: &str) -> Vec<&ReceivedSpan> {
        self.all
            .iter()
            .filter(|s| s.trace_id_hex() == trace)
            .collect()
    }

    /// The measured (not warm-up) fan-outs of demo phase `phase`, in start order.
    fn fanouts(&self, phase: &str) -> Vec<&ReceivedSpan> {
        let mut v: Vec<&ReceivedSpan> = self
            .all
            .iter()
            .filter(|s| s.name() == "user_request")
            .filter(|s| s.attr_str("demo.phase") == Some(phase))
            .filter(|s| s.attr_bool("demo.warmup") == Some(false))
            .collect();
        v.sort_by_key(|s| s.start_unix_nanos());
        v
    }

    /// The request spans under `root` (its trace), in start order.
    fn requests_under(&self, root: &ReceivedSpan) -> Vec<&ReceivedSpan> {
        let mut v: Vec<&ReceivedSpan> = self
            .in_trace(&root.trace_id_hex())
            .into_iter()
            .filter(|s| s.has_attr(semconv::HTTP_REQUEST_METHOD))
            .collect();
        v.sort_by_key(|s| s.start_unix_nanos());
        v
    }

    /// Requests in flight at most, over `requests`: ends before starts
    /// at the same instant.
    fn peak_in_flight(requests: &[&ReceivedSpan]) -> usize {
        let mut changes: Vec<(u64, i32)> = requests
            .iter()
            .flat_map(|r| [(r.start_unix_nanos(), 1), (r.end_unix_nanos(), -1)])
            .collect();
        changes.sort_unstable();
        let (mut now, mut peak) = (0, 0);
        for (_, d) in changes {
            now += d;
            peak = peak.max(now);
        }
        usize::try_from(peak).unwrap_or(0)
    }
}

/// The demo's own page: one column per phase with the first six measured
/// fan-outs, every request and connection of them as a row, a bar per
/// connection phase span, a miss marker exactly on the requests whose span
/// has a miss reason, links to the serving connections, durations as the
/// spans say; the heat strip's counts equal both the spans' and the demo's
/// own report; no console errors. Keeps a screenshot.
#[tokio::test]
async fn demo_page_in_a_browser_shows_what_its_spans_say() {
    let dir = tempfile::tempdir().expect("tempdir");
    let traces = dir.path().join("traces.json");
    let page = artefacts().join("demo.html");
    let mut cmd = conntrace();
    cmd.args([
        "demo",
        "--duration",
        "1.5",
        "--warmup",
        "0.5",
        "--json",
        "--quiet",
        "--traces-out",
    ])
    .arg(&traces)
    .arg("--html")
    .arg(&page);
    let out = run(cmd).await;
    assert!(out.status.success(), "demo failed: {}", stderr(&out));
    assert!(stderr(&out).is_empty(), "--quiet: {}", stderr(&out));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let spans = Spans::new(
        conntrace_lab::spans_from_otlp_json(&std::fs::read_to_string(&traces).expect("traces"))
            .expect("OTLP JSON"),
    );
    let dom = rendered_dom(&page).await;

    let mut misses_seen = 0;
    for phase in report["phases"].as_array().expect("phases") {
        let name = phase["name"].as_str().expect("name");
        let group = format!("user_request {name}");
        let fanouts = spans.fanouts(name);
        assert_eq!(
            fanouts.len() as u64,
            phase["fanouts"].as_u64().expect("n"),
            "{name}"
        );

        // Timeline: the first six measured fan-outs, in order.
        let column = section(&dom, "column", &group);
        let blocks = elements(column, "<g class=\"trace\"");
        let shown: Vec<&str> = blocks
            .iter()
            .map(|(tag, _)| attr(tag, "data-trace-id").expect("trace id"))
            .collect();
        let expected: Vec<String> = fanouts.iter().take(6).map(|f| f.trace_id_hex()).collect();
        assert_eq!(shown, expected, "{name}: trace blocks");

        let rows = elements(column, "<g class=\"row ");
        let row_ids: Vec<&str> = rows
            .iter()
            .map(|(tag, _)| attr(tag, "data-span-id").expect("span id"))
            .collect();
        let mut want_requests = BTreeSet::new();
        let mut want_connections = BTreeSet::new();
        let mut want_phases: BTreeMap<&str, usize> = BTreeMap::new();
        let mut want_misses = BTreeMap::new();
        for f in fanouts.iter().take(6) {
            for r in spans.requests_under(f) {
                want_requests.insert(r.span_id_hex());
                if let Some(reason) = r.attr_str(semconv::HTTP_CONNECTION_MISS_REASON) {
                    want_misses.insert(r.span_id_hex(), reason.to_owned());
                }
            }
            for s in spans.in_trace(&f.trace_id_hex()) {
                if s.name() == semconv::CONNECTION_SETUP_SPAN {
                    want_connections.insert(s.span_id_hex());
                    for p in spans.children(s) {
                        *want_phases.entry(p.name()).or_default() += 1;
                    }
                }
            }
        }
        let got = |kind: &str| -> BTreeSet<String> {
            rows.iter()
                .filter(|(tag, _)| tag.starts_with(&format!("<g class=\"row {kind}\"")))
                .map(|(tag, _)| attr(tag, "data-span-id").expect("id").to_owned())
                .collect()
        };
        assert_eq!(got("request"), want_requests, "{name}: request rows");
        assert_eq!(
            got("connection"),
            want_connections,
            "{name}: connection rows"
        );
        assert_eq!(
            row_ids.len(),
            6 + want_requests.len() + want_connections.len(),
            "{name}: a root row per trace, nothing else"
        );

        // A bar per phase span, coloured by phase.
        for (span_name, class) in [
            (semconv::DNS_LOOKUP_SPAN, "phase-dns"),
            (semconv::TCP_CONNECT_SPAN, "phase-tcp"),
            (semconv::PROXY_CONNECT_SPAN, "phase-proxy"),
            (semconv::TLS_HANDSHAKE_SPAN, "phase-tls"),
        ] {
            assert_eq!(
                column.matches(&format!("class=\"phase {class}")).count(),
                want_phases.get(span_name).copied().unwrap_or(0),
                "{name}: {class} bars"
            );
        }

        // Miss markers on the requests that missed, and on no others.
        let mut markers = BTreeMap::new();
        for (tag, body) in &rows {
            if !tag.starts_with("<g class=\"row request\"") {
                continue;
            }
            let id = attr(tag, "data-span-id").expect("id");
            let span = spans.get(id);
            if let Some(marker) = body.find("class=\"miss-marker\"") {
                let reason = attr(&body[marker - 6..], "data-reason").expect("reason");
                markers.insert(id.to_owned(), reason.to_owned());
                assert!(body.contains(&format!(">{}<", format_args!(" {reason}"))));
            }
            // wait | server | body: wait is `http.connection.wait_time`, the
            // headers arrived at the `http.receive.start` event, the body
            // ends with the span (the page rounds times to µs).
            let start = span.start_unix_nanos() as f64 / 1e6;
            let end = span.end_unix_nanos() as f64 / 1e6;
            let headers = span
                .events()
                .iter()
                .find(|e| e.name == semconv::EVENT_RESPONSE_HEADERS)
                .map(|e| e.time_unix_nano as f64 / 1e6)
                .unwrap_or_else(|| panic!("{name}: request {id} has no headers event"));
            let had = start
                + span
                    .attr_f64(semconv::HTTP_CONNECTION_WAIT_TIME)
                    .expect("wait time")
                    * 1000.0;
            // `wait_time` can end after the headers (it ends when the
            // previous response on the connection was read to its end,
            // REFERENCE 10): then no server time, as in the waterfall.
            let want = [
                ("wait", had - start),
                ("server", headers - had),
                ("body", end - headers.max(had)),
            ];
            for (class, ms) in want {
                let got = bar_ms(body, class);
                if class == "wait" && got.is_none() {
                    assert!(ms < 0.001, "{name}: {id} waited {ms} ms, no wait bar");
                    continue;
                }
                let got = got.unwrap_or_else(|| panic!("{name}: {id} has no {class} bar"));
                assert!(
                    (got - ms.max(0.0)).abs() <= 0.003,
                    "{name}: request {id} {class} {got} ms, the spans say {ms} ms ({want:?}, {body})"
                );
            }
            assert!(
                headers > start && headers <= end,
                "{name}: {id} headers inside the span"
            );
            // The duration beside the bar is the span's.
            assert!(
                shows_duration(dur_text(body), span),
                "{name}: request {id} shows {} for {:?}",
                dur_text(body),
                span.duration()
            );
            // The link (or child) to the serving connection points at a
            // setup span of that connection.
            let link = format!("data-from=\"{id}\" data-to=\"");
            if let Some(at) = column.find(&link) {
                let to = &column[at + link.len()..at + link.len() + 16];
                let target = spans.get(to);
                assert_eq!(target.name(), semconv::CONNECTION_SETUP_SPAN);
                assert_eq!(
                    target.attr_i64(semconv::HTTP_CONNECTION_ID),
                    span.attr_i64(semconv::HTTP_CONNECTION_ID),
                    "{name}: link of {id}"
                );
            }
        }
        assert_eq!(markers, want_misses, "{name}: miss markers");
        misses_seen += markers.len();

        // Heat strip: per batch, what the spans of every measured fan-out
        // say and what the demo counted from its own request reports.
        let overview = section(&dom, "group", &group);
        let cells = elements(overview, "<g class=\"heat-batch\"");
        let mut span_cells: BTreeMap<usize, (usize, usize)> = BTreeMap::new();
        let mut all_requests = Vec::new();
        for f in &fanouts {
            for r in spans.requests_under(f) {
                let batch = spans
                    .get(&r.parent_span_id_hex().expect("a batch parent"))
                    .attr_i64(semconv::FAN_OUT_BATCH_INDEX)
                    .expect("batch index") as usize;
                let cell = span_cells.entry(batch).or_default();
                cell.0 += 1;
                cell.1 += usize::from(r.has_attr(semconv::HTTP_CONNECTION_MISS_REASON));
                all_requests.push(r);
            }
        }
        let page_cells: BTreeMap<usize, (usize, usize)> = cells
            .iter()
            .map(|(tag, _)| {
                let n = |k: &str| attr(tag, k).and_then(|v| v.parse().ok()).expect(k);
                (n("data-batch"), (n("data-calls"), n("data-misses")))
            })
            .collect();
        assert_eq!(page_cells, span_cells, "{name}: heat strip vs spans");
        let report_cells: BTreeMap<usize, (usize, usize)> = phase["batches"]
            .as_array()
            .expect("batches")
            .iter()
            .map(|b| {
                let n = |k: &str| b[k].as_u64().expect(k) as usize;
                (n("index"), (n("calls"), n("misses")))
            })
            .collect();
        assert_eq!(
            page_cells, report_cells,
            "{name}: heat strip vs the demo's report"
        );

        // Calls in flight: the peak the spans give, against the idle limit.
        let chart = elements(overview, "<svg class=\"inflight\"");
        let peak = attr(chart[0].0, "data-peak").expect("peak");
        assert_eq!(
            peak,
            Spans::peak_in_flight(&all_requests).to_string(),
            "{name}: peak in flight"
        );
        let limit = phase["pool_max_idle_per_host"].as_u64().expect("pool");
        assert!(
            overview.contains(&format!(">idle limit {limit}<")),
            "{name}: the idle limit line"
        );
    }
    assert!(
        misses_seen > 0,
        "the small pool's fan-outs miss, so the markers are tested"
    );

    labels_fit(&dom);

    let png = artefacts().join("demo.png");
    let _ = std::fs::remove_file(&png);
    chromium(&page, &[&format!("--screenshot={}", png.display())]).await;
    let size = std::fs::metadata(&png).expect("screenshot written").len();
    assert!(size > 20_000, "a real picture: {size} bytes");

    // Hover: the pointer over the first missing request's bar shows that
    // span's attributes (a copy of the page with a mouse move dispatched).
    let (first_miss, reason) = {
        let column = section(&dom, "column", "user_request small-pool");
        let (tag, _) = elements(column, "<g class=\"row request\"")
            .into_iter()
            .find(|(tag, _)| attr(tag, "data-miss").is_some())
            .expect("a missing request in the small pool");
        (
            attr(tag, "data-span-id").expect("id").to_owned(),
            attr(tag, "data-miss").expect("reason").to_owned(),
        )
    };
    let hover = artefacts().join("demo-hover.html");
    let html = std::fs::read_to_string(&page).expect("page");
    let script = format!(
        "<script>const bar = document.querySelector('g.row[data-span-id=\"{first_miss}\"] rect.bar.server'); const box = bar.getBoundingClientRect(); bar.dispatchEvent(new MouseEvent('mousemove', {{bubbles: true, clientX: box.x + 2, clientY: box.y + 2}}));</script></body>"
    );
    std::fs::write(&hover, html.replacen("</body>", &script, 1)).expect("hover page");
    let dom = rendered_dom(&hover).await;
    let tip_at = dom.find("<div id=\"tooltip\"").expect("tooltip");
    let tip = &dom[tip_at..tip_at + dom[tip_at..].find("</table>").expect("attribute table")];
    assert!(tip.contains("display: block"), "shown: {tip}");
    assert!(tip.contains(&format!("<td>{first_miss}</td>")), "{tip}");
    assert!(
        tip.contains(&format!(
            "<td>{}</td><td>{reason}</td>",
            semconv::HTTP_CONNECTION_MISS_REASON
        )),
        "{tip}"
    );
    let span = spans.get(&first_miss);
    for key in span.attributes().keys() {
        assert!(tip.contains(&format!("<td>{key}</td>")), "{key} in {tip}");
    }
    let png = artefacts().join("demo-hover.png");
    chromium(&hover, &[&format!("--screenshot={}", png.display())]).await;
}

/// `conntrace view` on a file of 10,000+ spans (a longer demo's traces
/// file): the page renders (its script's own time and the browser's are
/// printed), draws the first six measured fan-outs per phase while its heat
/// strip counts every request of the file, and stays small (printed; under
/// 1 MiB: only the drawn spans' attributes are embedded).
#[tokio::test]
async fn view_renders_a_10000_span_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let traces = dir.path().join("traces.json");
    let mut cmd = conntrace();
    cmd.args([
        "demo",
        "--rate",
        "40",
        "--duration",
        "7",
        "--warmup",
        "0.5",
        "--quiet",
        "--json",
        "--traces-out",
    ])
    .arg(&traces);
    let out = run(cmd).await;
    assert!(out.status.success(), "demo failed: {}", stderr(&out));
    let spans =
        conntrace_lab::spans_from_otlp_json(&std::fs::read_to_string(&traces).expect("traces"))
            .expect("OTLP JSON");
    assert!(spans.len() >= 10_000, "{} spans", spans.len());
    let spans = Spans::new(spans);
    let measured_requests: usize = ["small-pool", "right-pool"]
        .iter()
        .flat_map(|p| spans.fanouts(p))
        .map(|f| spans.requests_under(f).len())
        .sum();

    let page = artefacts().join("view-10k.html");
    let mut cmd = conntrace();
    cmd.arg("view").arg(&traces).arg("--html").arg(&page);
    let out = run(cmd).await;
    assert!(out.status.success(), "view failed: {}", stderr(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).starts_with("page: "),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let bytes = std::fs::metadata(&page).expect("page").len();
    let json_bytes = std::fs::metadata(&traces).expect("traces").len();
    let opened = std::time::Instant::now();
    let dom = rendered_dom(&page).await;
    let browser_ms = opened.elapsed().as_millis();
    assert_eq!(dom.matches("<g class=\"trace\"").count(), 12, "6 per phase");
    let heat_calls: usize = elements(&dom, "<g class=\"heat-batch\"")
        .iter()
        .map(|(tag, _)| {
            attr(tag, "data-calls")
                .and_then(|v| v.parse::<usize>().ok())
                .expect("calls")
        })
        .sum();
    assert_eq!(
        heat_calls, measured_requests,
        "the heat strip counts every request"
    );
    let render_ms: u64 = dom
        .split("data-render-ms=\"")
        .nth(1)
        .and_then(|r| r.split('"').next())
        .and_then(|v| v.parse().ok())
        .expect("the page records its render time");
    eprintln!(
        "view: {} spans ({} KiB of OTLP JSON) -> page of {} KiB; script drew it in {render_ms} ms, chromium start to DOM dump {browser_ms} ms",
        spans.all.len(),
        json_bytes / 1024,
        bytes / 1024
    );
    assert!(bytes < 1024 * 1024, "the page stays small: {bytes} bytes");
    // Not a speed goal (that is the printed figure): catches a drawing
    // that grows quadratically with the number of spans.
    assert!(render_ms < 30_000, "drawing took {render_ms} ms");
}

/// `conntrace probe --waterfall` with stdout not a terminal: plain text
/// (no escape codes), one bar per request on one scale, the phases as
/// letters: TCP and TLS on every fresh request (the server accepted a
/// connection each), none on the reused ones (idle hits), and the miss
/// reason beside each bar as the spans' attributes would say.
#[tokio::test]
async fn probe_waterfall_is_plain_text_off_a_terminal() {
    let pki = TestPki::localhost().expect("pki");
    let dir = tempfile::tempdir().expect("tempdir");
    let files = pki.write_to_dir(dir.path()).expect("pki files");
    let server = TestServer::builder()
        .tls(&pki)
        .delay(Duration::from_millis(5))
        .start()
        .await
        .expect("server");
    // 20 ms RTT, so a handshake stays wider than a cell even when a loaded
    // machine makes one request slow.
    let proxy = conntrace_lab::DelayProxy::start(server.addr(), Duration::from_millis(10))
        .await
        .expect("delay proxy");
    let url = format!("https://localhost:{}/", proxy.addr().port());
    let mut cmd = conntrace();
    cmd.args([
        "probe",
        &url,
        "--requests",
        "3",
        "--pool-max-idle-per-host",
        "2",
        "--waterfall",
        "--cacert",
    ])
    .arg(&files.ca)
    .arg("--html")
    .arg(artefacts().join("probe.html"));
    let out = run(cmd).await;
    assert!(out.status.success(), "probe failed: {}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(!text.contains('\u{1b}'), "no escape codes off a terminal");
    assert_eq!(server.accepted_connections(), 4, "3 fresh + 1 reused");
    let bars: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("fresh ") || l.starts_with("reuse "))
        .filter(|l| l.contains(" |"))
        .collect();
    assert_eq!(bars.len(), 6, "{text}");
    let widths: BTreeSet<usize> = bars
        .iter()
        .map(|l| l.split('|').nth(1).expect("bar").chars().count())
        .collect();
    assert_eq!(widths.len(), 1, "one scale, one width: {text}");
    for (i, line) in bars.iter().enumerate() {
        let bar = line.split('|').nth(1).expect("bar");
        let tail = line.rsplit('|').next().expect("tail");
        assert!(
            bar.chars().all(|c| "dtpswrb ".contains(c)),
            "only phase letters: {line}"
        );
        match i {
            0 => assert!(tail.contains("miss cold, new conn #"), "{line}"),
            1..=3 => assert!(
                tail.contains("miss ") && tail.contains(", new conn #"),
                "{line}"
            ),
            _ => assert!(tail.contains("idle hit conn #"), "{line}"),
        }
        if i < 4 {
            assert!(
                bar.contains('s'),
                "a TLS handshake in a new connection: {line}"
            );
        } else {
            assert!(
                !bar.contains('s') && !bar.contains('t'),
                "no connect on a hit: {line}"
            );
        }
    }
    assert!(
        text.contains("waterfall (one cell = "),
        "the scale and legend: {text}"
    );
    // --html: a column per mode, a row per request, and as many
    // connections with a TLS bar as the server accepted.
    let dom = rendered_dom(&artefacts().join("probe.html")).await;
    for (mode, requests, connections) in [("fresh", 3, 3), ("reuse", 3, 1)] {
        let column = section(&dom, "column", &format!("probe {mode}"));
        let rows = elements(column, "<g class=\"row ");
        let count = |kind: &str| {
            rows.iter()
                .filter(|(tag, _)| attr(tag, "class") == Some(kind))
                .count()
        };
        assert_eq!(count("row request"), requests, "{mode}");
        assert_eq!(count("row connection"), connections, "{mode}");
        assert_eq!(
            column.matches("class=\"phase phase-tls").count(),
            connections,
            "{mode}"
        );
    }
    // The idle limit each mode's client had: 0 (fresh) and the flag's 2.
    for (mode, limit) in [("fresh", 0), ("reuse", 2)] {
        let overview = section(&dom, "group", &format!("probe {mode}"));
        assert!(
            overview.contains(&format!(">idle limit {limit}<")),
            "{mode}: the idle limit line"
        );
    }
    labels_fit(&dom);
}

/// `conntrace lab connect-proxy --html`: the tunnel's `proxy.connect`
/// phase is drawn once per tunnel the proxy counted.
#[tokio::test]
async fn lab_page_draws_the_proxy_phase() {
    let page = artefacts().join("lab-connect-proxy.html");
    let mut cmd = conntrace();
    cmd.args([
        "lab",
        "connect-proxy",
        "--requests",
        "3",
        "--json",
        "--html",
    ])
    .arg(&page);
    let out = run(cmd).await;
    assert!(out.status.success(), "lab failed: {}", stderr(&out));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let tunnels: u64 = report["runs"]
        .as_array()
        .expect("runs")
        .iter()
        .filter_map(|r| r["counters"]["proxy_tunnels"].as_u64())
        .sum();
    assert!(tunnels > 0, "{report}");
    let dom = rendered_dom(&page).await;
    assert_eq!(
        dom.matches("class=\"phase phase-proxy").count() as u64,
        tunnels
    );
    // The root labels (`lab connect-proxy: RUN`) are whole.
    assert!(dom.contains(">lab connect-proxy: "), "a root label");
    labels_fit(&dom);
    let png = artefacts().join("lab-connect-proxy.png");
    chromium(&page, &[&format!("--screenshot={}", png.display())]).await;
}

/// `conntrace view` reads what an OpenTelemetry Collector's file exporter
/// writes (JSON lines, one ExportTraceServiceRequest each, fields left out,
/// the request and its connection in different lines) into the same page,
/// and refuses a file that is not OTLP JSON, or one with no request or
/// connection span to draw, with one line and exit 1.
#[tokio::test]
async fn view_reads_collector_json_lines_and_rejects_other_files() {
    let dir = tempfile::tempdir().expect("tempdir");
    let lines =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/cli/collector-file-exporter.jsonl");
    let page = artefacts().join("collector.html");
    let mut cmd = conntrace();
    cmd.arg("view").arg(&lines).arg("--html").arg(&page);
    let out = run(cmd).await;
    assert!(out.status.success(), "view failed: {}", stderr(&out));
    let dom = rendered_dom(&page).await;
    let rows = elements(&dom, "<g class=\"row ");
    let kinds: Vec<&str> = rows
        .iter()
        .map(|(tag, _)| attr(tag, "class").expect("class"))
        .collect();
    assert_eq!(
        kinds,
        ["row request", "row connection"],
        "a request root is not drawn twice"
    );
    assert!(rows[0].1.contains("data-reason=\"cold\""), "{}", rows[0].1);
    assert_eq!(rows[1].1.matches("class=\"phase phase-tls").count(), 1);
    assert!(dom.contains("data-from=\"eee19b7ec3c1b174\" data-to=\"eee19b7ec3c1b175\""));

    let not_otlp = dir.path().join("notes.json");
    std::fs::write(&not_otlp, "{\"hello\": [1, 2]}\nnot json\n").expect("write");
    let mut cmd = conntrace();
    cmd.arg("view")
        .arg(&not_otlp)
        .arg("--html")
        .arg(dir.path().join("x.html"));
    let out = run(cmd).await;
    super::assert_one_line_error(&out, "not an otlp json traces file");
    assert_eq!(out.status.code(), Some(1));
    assert!(!dir.path().join("x.html").exists(), "no page for bad input");

    // OTLP JSON, but nothing of ours in it: a span with only a name, and
    // an application's span with no HTTP attribute.
    let nothing_to_draw = dir.path().join("other.json");
    std::fs::write(
        &nothing_to_draw,
        r#"{"resourceSpans":[{"scopeSpans":[{"spans":[{"name":"x"},{"traceId":"0af7651916cd43dd8448eb211c80319c","spanId":"b7ad6b7169203331","name":"checkout","startTimeUnixNano":"1","endTimeUnixNano":"2"}]}]}]}"#,
    )
    .expect("write");
    let mut cmd = conntrace();
    cmd.arg("view")
        .arg(&nothing_to_draw)
        .arg("--html")
        .arg(dir.path().join("y.html"));
    let out = run(cmd).await;
    super::assert_one_line_error(&out, "holds 2 span(s) but no http client request");
    assert_eq!(out.status.code(), Some(1));
    assert!(
        !dir.path().join("y.html").exists(),
        "no page for nothing to draw"
    );
}

/// `conntrace view` of a file another exporter wrote with a URL's secrets
/// in clear (in `url.full`, another attribute, an event, a link, the status
/// message and the span name): the page holds none of them, and the URLs
/// are still there, redacted.
#[tokio::test]
async fn view_redacts_urls_in_files_written_by_others() {
    const MARK: &str = "S3CRETv";
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!(
        "https://{MARK}u:{MARK}p@api.example/x?X-Amz-Signature={MARK}1&Token={MARK}2&page=3"
    );
    let s = |v: &str| serde_json::json!({ "stringValue": v });
    let request = serde_json::json!({
        "traceId": "5b8efff798038103d269b633813fc60c",
        "spanId": "eee19b7ec3c1b174",
        "name": format!("GET {url}"),
        "kind": 3,
        "startTimeUnixNano": "1544712660000000000",
        "endTimeUnixNano": "1544712661000000000",
        "attributes": [
            {"key": "http.request.method", "value": s("GET")},
            {"key": "url.full", "value": s(&url)},
            {"key": "http.url", "value": s(&url)},
            {"key": "http.connection.miss_reason", "value": s("cold")},
        ],
        "events": [{
            "timeUnixNano": "1544712660500000000",
            "name": "exception",
            "attributes": [{"key": "exception.message", "value": s(&format!("error for url ({url})"))}],
        }],
        "links": [{
            "traceId": "5b8efff798038103d269b633813fc60c",
            "spanId": "eee19b7ec3c1b175",
            "attributes": [{"key": "from", "value": s(&url)}],
        }],
        "status": {"code": 2, "message": format!("error sending request for url ({url})")},
    });
    let doc = serde_json::json!({"resourceSpans": [{"resource": {"attributes": []},
        "scopeSpans": [{"scope": {"name": "reqwest-tracing"}, "spans": [request]}]}]});
    let file = dir.path().join("other.json");
    std::fs::write(&file, doc.to_string()).expect("write");
    let page = dir.path().join("other.html");
    let mut cmd = conntrace();
    cmd.arg("view").arg(&file).arg("--html").arg(&page);
    let out = run(cmd).await;
    assert!(out.status.success(), "view failed: {}", stderr(&out));
    let html = std::fs::read_to_string(&page).expect("page");
    assert!(!html.contains(MARK), "the page leaks a secret");
    assert!(
        html.contains("X-Amz-Signature=REDACTED&Token=REDACTED&page=3"),
        "the URLs are on the page, redacted"
    );
    assert!(!stderr(&out).contains(MARK), "{}", stderr(&out));
}

/// A page never overwrites its own input: `view F --html F`, and `probe
/// --html F --traces-out F` (or the metrics file beside it), are bad
/// command lines (exit 2), refused before anything is written or sent.
#[tokio::test]
async fn html_page_refuses_to_overwrite_its_traces() {
    let dir = tempfile::tempdir().expect("tempdir");
    let lines =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/cli/collector-file-exporter.jsonl");
    let traces = dir.path().join("traces.json");
    std::fs::copy(&lines, &traces).expect("copy");
    let before = std::fs::read(&traces).expect("read");
    let mut cmd = conntrace();
    cmd.arg("view").arg(&traces).arg("--html").arg(&traces);
    let out = run(cmd).await;
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("same file"), "{}", stderr(&out));
    assert_eq!(std::fs::read(&traces).expect("read"), before, "input kept");

    let server = TestServer::builder().start().await.expect("server");
    let new = dir.path().join("run.json");
    let metrics = dir.path().join("run.metrics.json");
    for page in [&new, &metrics] {
        let mut cmd = conntrace();
        cmd.args(["probe", &server.url("/"), "--requests", "1"])
            .arg("--traces-out")
            .arg(&new)
            .arg("--html")
            .arg(page);
        let out = run(cmd).await;
        assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
        assert!(stderr(&out).contains("same file"), "{}", stderr(&out));
        assert!(!new.exists(), "nothing written");
    }
    assert_eq!(server.accepted_connections(), 0, "no request sent");
}
