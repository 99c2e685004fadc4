//! The docker-compose stack's configuration (docker-compose.yml, deploy/)
//! checked without Docker: every file parses, the files agree with each
//! other (ports, service names, mounted paths, datasource uid), and every
//! metric name the Prometheus rules and the Grafana dashboard use is one the
//! library's OTLP metrics become in Prometheus.
//!
//! Which edit breaks which test (each test's comment says more):
//! - rename a metric in `semconv` (via [`OTEL_METRICS`]) only, or in rules.yml / the
//!   dashboard only -> `rules_and_dashboard_use_only_exported_names`;
//! - move the collector's OTLP receiver to another port without publishing
//!   it -> `collector_receives_otlp_on_the_published_ports`;
//! - move the prometheus exporter off 8889 (or rename the compose service)
//!   -> `prometheus_scrapes_the_collector_exporter`;
//! - change the datasource uid or URL on one side only ->
//!   `grafana_reads_prometheus_and_loads_the_dashboard`;
//! - delete or move a mounted file -> `compose_mounts_existing_files_and_pins_images`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::contract::{Kind, OTEL_METRICS, OtelMetric};

/// Labels the collector's prometheus exporter adds to every series:
/// `job` (service.name), `instance` (service.instance.id) and the
/// instrumentation scope.
const EXPORTER_LABELS: &[&str] = &[
    "job",
    "instance",
    "otel_scope_name",
    "otel_scope_version",
    "otel_scope_schema_url",
];

/// The README section every alert's runbook_url points at.
const RUNBOOK_HEADING: &str = "## Alerting on pool misses";

// ---------------------------------------------------------------------------
// OTel -> Prometheus names, as the OpenTelemetry Collector (contrib)
// `prometheus` exporter builds them with its default translation
// (UnderscoreEscapingWithSuffixes / add_metric_suffixes: true), through
// prometheus/otlptranslator's MetricNamer and LabelNamer.
// ---------------------------------------------------------------------------

/// The Prometheus unit word for an OTel (UCUM) unit; `None` for units that
/// add no suffix (`{annotation}` units, `1`, empty).
fn unit_suffix(unit: &str) -> Option<String> {
    // Only the main unit: none of our units has a `/per` part.
    let unit = unit.trim();
    if unit.is_empty() || unit.contains(['{', '}']) {
        return None;
    }
    let word = match unit {
        "s" => "seconds",
        "ms" => "milliseconds",
        "us" => "microseconds",
        "ns" => "nanoseconds",
        "By" => "bytes",
        "1" => return None,
        "%" => "percent",
        other => other,
    };
    Some(word.to_owned())
}

/// The Prometheus metric name of an OTel metric: name split on every
/// character outside `[A-Za-z0-9:]` and joined with `_`, the unit word
/// appended unless already a token, `_total` for counters, `_ratio` for
/// unit-`1` gauges.
fn prometheus_name(name: &str, unit: &str, kind: Kind) -> String {
    let mut tokens: Vec<String> = name
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == ':'))
        .filter(|t| !t.is_empty())
        .map(str::to_owned)
        .collect();
    if let Some(word) = unit_suffix(unit)
        && !tokens.contains(&word)
    {
        tokens.push(word);
    }
    if kind == Kind::Counter {
        tokens.retain(|t| t != "total");
        tokens.push("total".to_owned());
    }
    if kind == Kind::Gauge && unit == "1" {
        tokens.retain(|t| t != "ratio");
        tokens.push("ratio".to_owned());
    }
    tokens.join("_")
}

/// The series names a metric shows up under in Prometheus.
fn prometheus_series(m: &OtelMetric) -> Vec<String> {
    let base = prometheus_name(m.name, m.unit, m.kind);
    match m.kind {
        Kind::Histogram => ["_bucket", "_sum", "_count"]
            .iter()
            .map(|s| format!("{base}{s}"))
            .collect(),
        _ => vec![base],
    }
}

/// The Prometheus label name of an attribute key.
fn prometheus_label(key: &str) -> String {
    key.chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect()
}

/// Every Prometheus series name the library's metrics produce, with the
/// labels each can carry.
fn exported_series() -> BTreeMap<String, BTreeSet<String>> {
    let mut out = BTreeMap::new();
    for m in OTEL_METRICS {
        for series in prometheus_series(m) {
            let mut labels: BTreeSet<String> =
                m.attributes.iter().map(|a| prometheus_label(a)).collect();
            labels.extend(EXPORTER_LABELS.iter().map(|l| (*l).to_owned()));
            if series.ends_with("_bucket") {
                labels.insert("le".to_owned());
            }
            out.insert(series, labels);
        }
    }
    out
}

/// The derivation against the collector's documented and tested
/// translations (pkg/translator/prometheus README, otlptranslator's
/// metric_namer_test.go) and the names the issue lists. Fails if the
/// function drifts from upstream, which would make the name check below
/// compare against the wrong names.
#[test]
fn prometheus_names_follow_the_collector_translation() {
    // Upstream examples.
    assert_eq!(
        prometheus_name("system.filesystem.usage", "By", Kind::Gauge),
        "system_filesystem_usage_bytes"
    );
    assert_eq!(
        prometheus_name("system.network.dropped", "{packets}", Kind::Gauge),
        "system_network_dropped"
    );
    assert_eq!(
        prometheus_name("system.processes.created", "", Kind::Counter),
        "system_processes_created_total"
    );
    assert_eq!(
        prometheus_name("system.memory.utilization", "1", Kind::Gauge),
        "system_memory_utilization_ratio"
    );
    assert_eq!(
        prometheus_name("requests_total", "", Kind::Counter),
        "requests_total"
    );
    assert_eq!(
        prometheus_name("response_time_seconds", "s", Kind::Gauge),
        "response_time_seconds"
    );
    assert_eq!(
        prometheus_name("active_connections", "", Kind::UpDownCounter),
        "active_connections"
    );
    assert_eq!(
        prometheus_label("http.connection.reused"),
        "http_connection_reused"
    );
    // Ours, as the issue lists them.
    let names: BTreeSet<String> = exported_series().into_keys().collect();
    for expected in [
        "http_client_request_duration_seconds_bucket",
        "http_client_request_duration_seconds_count",
        "http_client_active_requests",
        "dns_lookup_duration_seconds_bucket",
        "http_client_open_connections",
        "http_client_connection_duration_seconds_sum",
        "http_client_connection_setup_duration_seconds_bucket",
        "http_client_connections_opened_total",
        "http_client_pool_misses_total",
        "http_client_pool_peak_in_flight",
        "http_client_pool_idle_limit",
    ] {
        assert!(names.contains(expected), "{expected} not in {names:?}");
    }
}

// ---------------------------------------------------------------------------
// A small PromQL scanner: which names an expression uses as metrics and
// which as labels. Not a parser (promtool checks syntax, see
// `dashboard_queries_are_valid_promql`); enough to find names.
// ---------------------------------------------------------------------------

/// Names that are PromQL keywords or aggregation operators, not metrics.
const PROMQL_WORDS: &[&str] = &[
    "and",
    "or",
    "unless",
    "bool",
    "offset",
    "inf",
    "nan",
    "sum",
    "min",
    "max",
    "avg",
    "count",
    "stddev",
    "stdvar",
    "topk",
    "bottomk",
    "quantile",
    "count_values",
    "group",
];

/// Keywords followed by a parenthesized list of label names.
const GROUPING: &[&str] = &[
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
];

#[derive(Debug, Default, PartialEq)]
struct PromqlNames {
    metrics: BTreeSet<String>,
    labels: BTreeSet<String>,
}

fn is_ident_start(c: char) -> bool {
    c.is_ascii_alphabetic() || c == '_' || c == ':'
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == ':'
}

/// Index just past the string literal starting at `i` (`"`, `'` or `` ` ``).
fn skip_string(s: &[char], i: usize) -> usize {
    let quote = s[i];
    let mut j = i + 1;
    while j < s.len() && s[j] != quote {
        if s[j] == '\\' && quote != '`' {
            j += 1;
        }
        j += 1;
    }
    j + 1
}

fn read_ident(s: &[char], i: usize) -> (String, usize) {
    let mut j = i;
    while j < s.len() && is_ident(s[j]) {
        j += 1;
    }
    (s[i..j].iter().collect(), j)
}

fn skip_space(s: &[char], mut i: usize) -> usize {
    while i < s.len() && s[i].is_whitespace() {
        i += 1;
    }
    i
}

/// The metric names and label names an expression refers to.
fn promql_names(expr: &str) -> PromqlNames {
    let s: Vec<char> = expr.chars().collect();
    let mut out = PromqlNames::default();
    let mut i = 0;
    while i < s.len() {
        let c = s[i];
        if c == '"' || c == '\'' || c == '`' {
            i = skip_string(&s, i);
        } else if c == '#' {
            while i < s.len() && s[i] != '\n' {
                i += 1;
            }
        } else if c == '[' {
            // Range or subquery durations, e.g. [5m], [$__rate_interval].
            while i < s.len() && s[i] != ']' {
                i += 1;
            }
            i += 1;
        } else if c == '{' {
            // Label matchers: `name op "value"`, comma separated.
            i += 1;
            while i < s.len() && s[i] != '}' {
                if s[i] == '"' || s[i] == '\'' || s[i] == '`' {
                    i = skip_string(&s, i);
                } else if is_ident_start(s[i]) {
                    let (label, j) = read_ident(&s, i);
                    out.labels.insert(label);
                    i = j;
                } else {
                    i += 1;
                }
            }
            i += 1;
        } else if c.is_ascii_digit() || c == '.' {
            // Numbers and durations (1h, 0.5, 1e3).
            while i < s.len() && (is_ident(s[i]) || s[i] == '.') {
                i += 1;
            }
        } else if is_ident_start(c) {
            let (word, j) = read_ident(&s, i);
            let next = skip_space(&s, j);
            let followed_by_paren = s.get(next) == Some(&'(');
            if GROUPING.contains(&word.as_str()) && followed_by_paren {
                let mut k = next + 1;
                while k < s.len() && s[k] != ')' {
                    if is_ident_start(s[k]) {
                        let (label, after) = read_ident(&s, k);
                        out.labels.insert(label);
                        k = after;
                    } else {
                        k += 1;
                    }
                }
                i = k + 1;
            } else {
                if !followed_by_paren && !PROMQL_WORDS.contains(&word.as_str()) {
                    out.metrics.insert(word);
                }
                i = j;
            }
        } else {
            i += 1;
        }
    }
    out
}

/// The scanner on the shapes the rules and the dashboard use.
#[test]
fn promql_scanner_finds_metrics_and_labels() {
    let names = promql_names(
        r#"(sum by (job, le) (rate(a_bucket{x="{y}", z=~"$job"}[$__rate_interval])) or b:c:d * 0)
           / on (job) group_left(w) max_over_time(e[6h] offset 1h) > bool 0.5 and sum(f) without (v)"#,
    );
    let set = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<BTreeSet<_>>();
    assert_eq!(names.metrics, set(&["a_bucket", "b:c:d", "e", "f"]));
    assert_eq!(names.labels, set(&["job", "le", "x", "z", "w", "v"]));
}

// ---------------------------------------------------------------------------
// The files.
// ---------------------------------------------------------------------------

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ sits in the workspace root")
        .to_path_buf()
}

fn read(rel: &str) -> String {
    let path = repo_root().join(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

fn yaml<T: serde::de::DeserializeOwned>(rel: &str) -> T {
    serde_norway::from_str(&read(rel)).unwrap_or_else(|e| panic!("{rel} does not parse: {e}"))
}

// docker-compose.yml, with unknown keys refused so that a misspelt key
// (`volume:`, `port:`) fails here instead of being ignored by Docker.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Compose {
    // Fields read only so that deny_unknown_fields accepts them.
    #[allow(dead_code)]
    name: String,
    services: BTreeMap<String, ComposeService>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ComposeService {
    image: String,
    #[serde(default)]
    command: Vec<String>,
    #[serde(default)]
    environment: BTreeMap<String, String>,
    #[serde(default)]
    volumes: Vec<String>,
    #[serde(default)]
    ports: Vec<String>,
    #[serde(default)]
    depends_on: Vec<String>,
    #[allow(dead_code)]
    restart: Option<String>,
}

impl ComposeService {
    /// `(host port, container port)` of each published port.
    fn published(&self) -> Vec<(u16, u16)> {
        self.ports
            .iter()
            .map(|p| {
                let (host, container) = p
                    .split_once(':')
                    .unwrap_or_else(|| panic!("port {p:?} is not HOST:CONTAINER"));
                (port(host), port(container))
            })
            .collect()
    }

    /// `(source relative to the repo root, container path)` of each bind mount.
    fn mounts(&self) -> Vec<(String, String)> {
        self.volumes
            .iter()
            .map(|v| {
                let mut parts = v.split(':');
                let source = parts.next().unwrap_or_default();
                let target = parts
                    .next()
                    .unwrap_or_else(|| panic!("volume {v:?} has no container path"));
                let source = source
                    .strip_prefix("./")
                    .unwrap_or_else(|| panic!("volume {v:?}: bind mounts start with ./"));
                (source.to_owned(), target.to_owned())
            })
            .collect()
    }

    /// The container path `source` (a repo-relative file) is visible at,
    /// directly or through a mounted directory.
    fn container_path_of(&self, source: &str) -> Option<String> {
        self.mounts().into_iter().find_map(|(src, target)| {
            if source == src {
                Some(target)
            } else {
                source
                    .strip_prefix(&format!("{src}/"))
                    .map(|rest| format!("{target}/{rest}"))
            }
        })
    }
}

fn port(text: &str) -> u16 {
    text.trim()
        .parse()
        .unwrap_or_else(|e| panic!("{text:?} is not a port: {e}"))
}

/// The port of a `HOST:PORT` endpoint or target.
fn endpoint_port(endpoint: &str) -> u16 {
    port(endpoint.rsplit(':').next().unwrap_or_default())
}

fn compose() -> Compose {
    yaml("docker-compose.yml")
}

/// The compose service whose image starts with `image`.
fn service_by_image<'a>(compose: &'a Compose, image: &str) -> (&'a str, &'a ComposeService) {
    compose
        .services
        .iter()
        .find(|(_, s)| s.image.starts_with(image))
        .map(|(n, s)| (n.as_str(), s))
        .unwrap_or_else(|| panic!("no compose service runs {image}"))
}

// deploy/otel-collector.yaml
#[derive(Debug, Deserialize)]
struct Collector {
    receivers: BTreeMap<String, serde_norway::Value>,
    processors: BTreeMap<String, serde_norway::Value>,
    exporters: BTreeMap<String, serde_norway::Value>,
    service: CollectorService,
}

#[derive(Debug, Deserialize)]
struct CollectorService {
    pipelines: BTreeMap<String, Pipeline>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Pipeline {
    receivers: Vec<String>,
    #[serde(default)]
    processors: Vec<String>,
    exporters: Vec<String>,
}

fn collector() -> Collector {
    yaml("deploy/otel-collector.yaml")
}

/// A string at `path` (keys) inside a YAML value.
fn yaml_str<'a>(value: &'a serde_norway::Value, path: &[&str]) -> &'a str {
    let mut v = value;
    for key in path {
        v = v
            .get(*key)
            .unwrap_or_else(|| panic!("no {key} in {path:?}"));
    }
    v.as_str()
        .unwrap_or_else(|| panic!("{path:?} is not a string"))
}

// deploy/prometheus/prometheus.yml
#[derive(Debug, Deserialize)]
struct PrometheusConfig {
    rule_files: Vec<String>,
    scrape_configs: Vec<ScrapeConfig>,
}

#[derive(Debug, Deserialize)]
struct ScrapeConfig {
    job_name: String,
    #[serde(default)]
    honor_labels: bool,
    static_configs: Vec<StaticConfig>,
}

#[derive(Debug, Deserialize)]
struct StaticConfig {
    targets: Vec<String>,
}

// deploy/prometheus/rules.yml
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RuleFile {
    groups: Vec<RuleGroup>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RuleGroup {
    #[allow(dead_code)]
    name: String,
    rules: Vec<Rule>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Rule {
    record: Option<String>,
    alert: Option<String>,
    expr: String,
    #[serde(rename = "for")]
    for_: Option<String>,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    #[serde(default)]
    annotations: BTreeMap<String, String>,
}

fn rules() -> Vec<Rule> {
    yaml::<RuleFile>("deploy/prometheus/rules.yml")
        .groups
        .into_iter()
        .flat_map(|g| g.rules)
        .collect()
}

// Grafana provisioning.
#[derive(Debug, Deserialize)]
struct Datasources {
    datasources: Vec<Datasource>,
}

#[derive(Debug, Deserialize)]
struct Datasource {
    uid: String,
    #[serde(rename = "type")]
    kind: String,
    url: String,
}

#[derive(Debug, Deserialize)]
struct DashboardProviders {
    providers: Vec<DashboardProvider>,
}

#[derive(Debug, Deserialize)]
struct DashboardProvider {
    options: ProviderOptions,
}

#[derive(Debug, Deserialize)]
struct ProviderOptions {
    path: String,
}

const DATASOURCES: &str = "deploy/grafana/provisioning/datasources/prometheus.yml";
const PROVIDERS: &str = "deploy/grafana/provisioning/dashboards/conntrace.yml";
const DASHBOARD: &str = "deploy/grafana/dashboards/conntrace.json";

fn dashboard() -> serde_json::Value {
    serde_json::from_str(&read(DASHBOARD)).unwrap_or_else(|e| panic!("{DASHBOARD}: {e}"))
}

/// Every value under key `key` anywhere in `value`.
fn json_values<'a>(value: &'a serde_json::Value, key: &str, out: &mut Vec<&'a serde_json::Value>) {
    match value {
        serde_json::Value::Object(map) => {
            for (k, v) in map {
                if k == key {
                    out.push(v);
                }
                json_values(v, key, out);
            }
        }
        serde_json::Value::Array(items) => {
            for v in items {
                json_values(v, key, out);
            }
        }
        _ => {}
    }
}

/// The dashboard's PromQL: panel target expressions, and the selectors of
/// `label_values(SELECTOR, LABEL)` variable queries (with their label).
fn dashboard_queries() -> Vec<(String, Option<String>)> {
    let dash = dashboard();
    let mut out = Vec::new();
    let mut exprs = Vec::new();
    json_values(&dash, "expr", &mut exprs);
    for e in exprs {
        out.push((e.as_str().expect("expr is a string").to_owned(), None));
    }
    for var in dash["templating"]["list"]
        .as_array()
        .expect("templating.list")
    {
        let query = var["query"]["query"].as_str().expect("variable query");
        let inner = query
            .strip_prefix("label_values(")
            .and_then(|q| q.strip_suffix(')'))
            .unwrap_or_else(|| panic!("variable query {query:?} is not label_values(...)"));
        let (selector, label) = inner
            .rsplit_once(',')
            .expect("label_values(SELECTOR, LABEL)");
        out.push((selector.trim().to_owned(), Some(label.trim().to_owned())));
    }
    assert!(out.len() > 5, "the dashboard has queries: {out:?}");
    out
}

// ---------------------------------------------------------------------------
// The checks.
// ---------------------------------------------------------------------------

/// Every bind-mount source exists (a moved or deleted config would make
/// Docker mount an empty directory instead), and every image has a pinned
/// tag (no `latest`, no bare name).
#[test]
fn compose_mounts_existing_files_and_pins_images() {
    let compose = compose();
    assert!(
        compose.services.len() >= 4,
        "collector, jaeger, prometheus, grafana"
    );
    for (name, svc) in &compose.services {
        for (source, target) in svc.mounts() {
            let path = repo_root().join(&source);
            assert!(
                path.exists(),
                "service {name}: mount source {source} (-> {target}) does not exist"
            );
        }
        let tag = svc
            .image
            .rsplit_once(':')
            .map(|(_, t)| t)
            .unwrap_or_else(|| panic!("service {name}: image {} has no tag", svc.image));
        assert!(
            tag != "latest" && tag.chars().any(|c| c.is_ascii_digit()),
            "service {name}: image {} is not pinned to a version",
            svc.image
        );
        for dep in &svc.depends_on {
            assert!(
                compose.services.contains_key(dep),
                "service {name} depends on unknown {dep}"
            );
        }
    }
}

/// The collector's OTLP receivers listen on container ports the compose
/// file publishes on the same host ports, and the endpoint the compose
/// header tells users to export to is the gRPC one. Breaks when a receiver
/// port changes in deploy/otel-collector.yaml but not in the compose file
/// (or the reverse).
#[test]
fn collector_receives_otlp_on_the_published_ports() {
    let compose = compose();
    let (_, svc) = service_by_image(&compose, "otel/opentelemetry-collector");
    let config_path = svc
        .container_path_of("deploy/otel-collector.yaml")
        .expect("the collector mounts deploy/otel-collector.yaml");
    assert!(
        svc.command
            .iter()
            .any(|c| c == &format!("--config={config_path}")),
        "the collector runs with the mounted config: {:?}",
        svc.command
    );
    let collector = collector();
    let otlp = collector.receivers.get("otlp").expect("otlp receiver");
    let grpc = endpoint_port(yaml_str(otlp, &["protocols", "grpc", "endpoint"]));
    let http = endpoint_port(yaml_str(otlp, &["protocols", "http", "endpoint"]));
    let exporter = endpoint_port(yaml_str(
        collector
            .exporters
            .get("prometheus")
            .expect("prometheus exporter"),
        &["endpoint"],
    ));
    let published = svc.published();
    for want in [grpc, http] {
        assert!(
            published.contains(&(want, want)),
            "OTLP receiver port {want} is not published as {want}:{want}: {published:?}"
        );
    }
    for (host, container) in &published {
        assert!(
            [grpc, http, exporter].contains(container),
            "published {host}:{container} goes to no collector listener"
        );
    }
    let header_endpoint = read("docker-compose.yml")
        .lines()
        .find_map(|l| {
            l.split_whitespace()
                .find_map(|w| w.strip_prefix("OTEL_EXPORTER_OTLP_ENDPOINT=http://localhost:"))
                .map(port)
        })
        .expect("the compose header shows OTEL_EXPORTER_OTLP_ENDPOINT");
    assert_eq!(
        header_endpoint, grpc,
        "the header's endpoint is the gRPC receiver"
    );
}

/// Every pipeline uses components the config defines; metrics go to the
/// prometheus exporter, traces to Jaeger's compose service.
#[test]
fn collector_pipelines_reference_defined_components() {
    let collector = collector();
    for (name, p) in &collector.service.pipelines {
        for r in &p.receivers {
            assert!(
                collector.receivers.contains_key(r),
                "{name}: receiver {r} undefined"
            );
        }
        for r in &p.processors {
            assert!(
                collector.processors.contains_key(r),
                "{name}: processor {r} undefined"
            );
        }
        for e in &p.exporters {
            assert!(
                collector.exporters.contains_key(e),
                "{name}: exporter {e} undefined"
            );
        }
    }
    let metrics = collector
        .service
        .pipelines
        .get("metrics")
        .expect("metrics pipeline");
    assert!(metrics.receivers.contains(&"otlp".to_owned()));
    assert!(metrics.exporters.contains(&"prometheus".to_owned()));
    let traces = collector
        .service
        .pipelines
        .get("traces")
        .expect("traces pipeline");
    let jaeger = traces
        .exporters
        .iter()
        .find(|e| e.starts_with("otlp"))
        .expect("traces go out over OTLP");
    let endpoint = yaml_str(&collector.exporters[jaeger], &["endpoint"]);
    let host = endpoint.split(':').next().unwrap_or_default();
    let compose = compose();
    assert!(
        compose.services.contains_key(host),
        "traces go to {host}, not a compose service"
    );
}

/// Prometheus scrapes the collector's exporter at `service:port`, keeps the
/// exporter's `job` labels (honor_labels), and loads rule files that exist
/// and that the compose file mounts next to the config (rule_files are
/// resolved relative to it).
#[test]
fn prometheus_scrapes_the_collector_exporter() {
    let compose = compose();
    let (collector_service, _) = service_by_image(&compose, "otel/opentelemetry-collector");
    let exporter_port = endpoint_port(yaml_str(
        collector()
            .exporters
            .get("prometheus")
            .expect("prometheus exporter"),
        &["endpoint"],
    ));
    let config: PrometheusConfig = yaml("deploy/prometheus/prometheus.yml");
    let scrape = config
        .scrape_configs
        .iter()
        .find(|s| {
            s.static_configs
                .iter()
                .flat_map(|c| &c.targets)
                .any(|t| t.starts_with(&format!("{collector_service}:")))
        })
        .expect("a scrape job targets the collector service");
    let targets: Vec<&String> = scrape
        .static_configs
        .iter()
        .flat_map(|c| &c.targets)
        .collect();
    assert_eq!(
        targets,
        vec![&format!("{collector_service}:{exporter_port}")],
        "job {} scrapes the exporter's port",
        scrape.job_name
    );
    assert!(
        scrape.honor_labels,
        "honor_labels keeps job = service.name; without it the rules group by the collector"
    );
    let (_, prom) = service_by_image(&compose, "prom/prometheus");
    let config_in_container = prom
        .container_path_of("deploy/prometheus/prometheus.yml")
        .expect("prometheus.yml is mounted");
    assert_eq!(
        config_in_container, "/etc/prometheus/prometheus.yml",
        "the image's default config path"
    );
    for rule_file in &config.rule_files {
        let source = format!("deploy/prometheus/{rule_file}");
        assert!(repo_root().join(&source).is_file(), "{source} missing");
        assert_eq!(
            prom.container_path_of(&source),
            Some(format!("/etc/prometheus/{rule_file}")),
            "{source} is mounted next to prometheus.yml"
        );
    }
}

/// Grafana's provisioned datasource is the compose service `prometheus` on
/// the port Prometheus listens on; every datasource reference in the
/// dashboard uses its uid; the dashboard provider reads the directory the
/// dashboard JSON is mounted in.
#[test]
fn grafana_reads_prometheus_and_loads_the_dashboard() {
    let compose = compose();
    let (prom_service, prom) = service_by_image(&compose, "prom/prometheus");
    let (_, grafana) = service_by_image(&compose, "grafana/grafana");
    let ds: Datasources = yaml(DATASOURCES);
    let [ds] = ds.datasources.as_slice() else {
        panic!("one datasource expected")
    };
    assert_eq!(ds.kind, "prometheus");
    let prom_port = prom
        .published()
        .first()
        .map(|(_, c)| *c)
        .expect("prometheus port");
    assert_eq!(ds.url, format!("http://{prom_service}:{prom_port}"));

    let dash = dashboard();
    let mut refs = Vec::new();
    json_values(&dash, "datasource", &mut refs);
    assert!(refs.len() > 5, "panels and targets name their datasource");
    for r in refs {
        assert_eq!(r["uid"], ds.uid.as_str(), "datasource reference {r}");
        assert_eq!(r["type"], "prometheus");
    }

    // deploy/grafana/provisioning/KIND/FILE must appear at
    // /etc/grafana/provisioning/KIND/FILE, where Grafana looks.
    for file in [DATASOURCES, PROVIDERS] {
        let rest = file
            .strip_prefix("deploy/grafana/provisioning/")
            .expect("under provisioning/");
        assert_eq!(
            grafana.container_path_of(file),
            Some(format!("/etc/grafana/provisioning/{rest}")),
            "{file} is not where Grafana reads provisioning"
        );
    }
    let providers: DashboardProviders = yaml(PROVIDERS);
    let dashboard_in_container = grafana
        .container_path_of(DASHBOARD)
        .expect("the dashboard JSON is mounted");
    for p in &providers.providers {
        assert_eq!(
            Path::new(&dashboard_in_container).parent(),
            Some(Path::new(&p.options.path)),
            "the provider reads the directory the dashboard is mounted in"
        );
    }
    if let Some(home) = grafana
        .environment
        .get("GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH")
    {
        assert_eq!(home, &dashboard_in_container);
    }
}

/// Every name the rules and the dashboard query is a series the library's
/// metrics become in Prometheus (or a recording rule defined in rules.yml),
/// and every label they match or group by is one those series carry.
/// Renaming a metric or an attribute in one place only (OTEL_METRICS,
/// rules.yml or the dashboard) fails here, e.g. `http_client_pool_misses`
/// without `_total`, or `http_connection_reuse` for `http_connection_reused`.
#[test]
fn rules_and_dashboard_use_only_exported_names() {
    let exported = exported_series();
    let rules = rules();
    // Labels a recording rule's output can carry: those of what it reads.
    let mut recorded: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for rule in &rules {
        let Some(record) = &rule.record else { continue };
        assert!(
            record.contains(':'),
            "recording rule {record} is level:metric:operation"
        );
        let mut labels = BTreeSet::new();
        for m in promql_names(&rule.expr).metrics {
            let known = exported.get(&m).or_else(|| recorded.get(&m));
            labels.extend(
                known
                    .unwrap_or_else(|| panic!("{record} reads unknown series {m}"))
                    .clone(),
            );
        }
        recorded.insert(record.clone(), labels);
    }
    let check = |origin: &str, expr: &str, extra_label: Option<&str>| {
        let names = promql_names(expr);
        assert!(!names.metrics.is_empty(), "{origin}: no metric in {expr:?}");
        let mut allowed = BTreeSet::new();
        for m in &names.metrics {
            let labels = exported
                .get(m)
                .or_else(|| recorded.get(m))
                .unwrap_or_else(|| {
                    panic!(
                        "{origin}: {m} is neither an exported series nor a recording rule \
                     (exported: {:?})",
                        exported.keys().collect::<Vec<_>>()
                    )
                });
            allowed.extend(labels.iter().cloned());
        }
        for label in names.labels.iter().map(String::as_str).chain(extra_label) {
            assert!(
                allowed.contains(label),
                "{origin}: label {label} is not on {:?} (it has {allowed:?})",
                names.metrics
            );
        }
    };
    for rule in &rules {
        let origin = rule
            .record
            .as_deref()
            .or(rule.alert.as_deref())
            .unwrap_or("rule");
        check(&format!("rules.yml {origin}"), &rule.expr, None);
    }
    for (expr, label) in dashboard_queries() {
        check(DASHBOARD, &expr, label.as_deref());
    }
}

/// Every alert has a severity, a `for:` (no alert on one bad scrape), a
/// summary naming the service and host and showing the value, a one-line
/// fix, and a runbook_url pointing at the README section that exists.
#[test]
fn alerts_carry_severity_summary_fix_and_runbook() {
    let readme = read("README.md");
    assert!(
        readme.lines().any(|l| l.trim_end() == RUNBOOK_HEADING),
        "README.md has the section {RUNBOOK_HEADING:?}"
    );
    let anchor: String = RUNBOOK_HEADING
        .trim_start_matches('#')
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect();
    let alerts: Vec<Rule> = rules().into_iter().filter(|r| r.alert.is_some()).collect();
    assert!(
        alerts.len() >= 4,
        "miss ratio, in-flight, setup p99, TLS resumption"
    );
    for rule in &alerts {
        let name = rule.alert.as_deref().unwrap_or_default();
        let severity = rule.labels.get("severity").map(String::as_str);
        assert!(
            matches!(severity, Some("page" | "warning")),
            "{name}: severity {severity:?}"
        );
        assert!(rule.for_.is_some(), "{name}: no for:");
        let summary = rule
            .annotations
            .get("summary")
            .map(String::as_str)
            .unwrap_or_default();
        for part in ["$labels.job", "$labels.server_address", "$value"] {
            assert!(
                summary.contains(part),
                "{name}: summary lacks {part}: {summary:?}"
            );
        }
        let fix = rule
            .annotations
            .get("fix")
            .map(String::as_str)
            .unwrap_or_default();
        assert!(
            !fix.is_empty() && !fix.contains('\n'),
            "{name}: one-line fix"
        );
        assert_eq!(
            rule.annotations.get("runbook_url").map(String::as_str),
            Some(format!("README.md#{anchor}").as_str()),
            "{name}: runbook_url"
        );
    }
}

/// The dashboard's queries are valid PromQL, checked by promtool (installed
/// by scripts/test.sh): they go into a throw-away rule file with Grafana's
/// variables replaced, and `promtool check rules` parses them.
#[test]
fn dashboard_queries_are_valid_promql() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut file = String::from("groups:\n  - name: dashboard\n    rules:\n");
    for (i, (expr, _)) in dashboard_queries().iter().enumerate() {
        let expr = expr
            .replace("$__rate_interval", "5m")
            .replace("$job", ".*")
            .replace("$host", ".*");
        let quoted = serde_json::to_string(&expr).expect("quote");
        file.push_str(&format!(
            "      - record: dashboard:query:{i}\n        expr: {quoted}\n"
        ));
    }
    let path = dir.path().join("dashboard_rules.yml");
    std::fs::write(&path, &file).expect("write");
    let out = std::process::Command::new("promtool")
        .arg("check")
        .arg("rules")
        .arg(&path)
        .output()
        .expect("promtool runs (scripts/test.sh installs Debian's prometheus package)");
    assert!(
        out.status.success(),
        "promtool rejects a dashboard query:\n{}{}\n{file}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
