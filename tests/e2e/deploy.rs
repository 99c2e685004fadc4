//! The docker-compose stack's configuration (docker-compose.yml, deploy/)
//! checked without Docker: every file parses, the files agree with each
//! other (ports, service names, mounted paths, start-up order, datasource
//! uids, trace links, alert routes, runbook links), and every metric and
//! label the Prometheus rules and the Grafana dashboard use is one the
//! library's OTLP metrics become in Prometheus. promtool (dashboard PromQL)
//! and amtool (Alertmanager routing) run for real.
//!
//! Which edit breaks which test (each test's comment says more):
//! - rename a metric in `semconv` (via [`OTEL_METRICS`]) only, or in rules.yml / the
//!   dashboard only -> `rules_and_dashboard_use_only_exported_names`;
//! - move the collector's OTLP receiver to another port without publishing
//!   it -> `collector_receives_otlp_on_the_published_ports`;
//! - move the prometheus exporter off 8889 (or rename the compose service)
//!   -> `prometheus_scrapes_the_collector_exporter`;
//! - change a datasource uid or URL on one side only ->
//!   `grafana_reads_prometheus_and_jaeger_and_loads_the_dashboard`;
//! - drop a panel's trace link, or link a label the panel does not carry ->
//!   `pool_panels_link_to_the_matching_traces`;
//! - drop memory_limiter, move batch before sampling, stop keeping misses ->
//!   `collector_limits_memory_and_keeps_every_miss_and_error`;
//! - route warnings to the pager, point a webhook elsewhere ->
//!   `alerts_route_by_severity_to_a_receiver_in_the_stack`;
//! - hard-code a runbook URL, or drop RUNBOOK_BASE_URL's default ->
//!   `runbook_links_come_from_one_variable_and_resolve_by_default`;
//! - a depends_on without condition, or on a service without health check
//!   -> `compose_starts_in_order_on_health_checks`;
//! - delete or move a mounted file -> `compose_mounts_existing_files_and_pins_images`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use reqwest_conntrace::semconv;
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

/// Prometheus' external label holding the runbook base URL (one variable,
/// RUNBOOK_BASE_URL, in docker-compose.yml).
const RUNBOOK_LABEL: &str = "runbook_base_url";

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
pub(crate) fn prometheus_name(name: &str, unit: &str, kind: Kind) -> String {
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
    let base = prometheus_name(m.name, m.unit, m.instrument);
    match m.instrument {
        Kind::Histogram => ["_bucket", "_sum", "_count"]
            .iter()
            .map(|s| format!("{base}{s}"))
            .collect(),
        _ => vec![base],
    }
}

/// The Prometheus label name of an attribute key.
pub(crate) fn prometheus_label(key: &str) -> String {
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
    depends_on: BTreeMap<String, DependsOn>,
    healthcheck: Option<Healthcheck>,
    #[allow(dead_code)]
    mem_limit: Option<String>,
    #[allow(dead_code)]
    restart: Option<String>,
}

/// `depends_on: {SERVICE: {condition: ...}}` (the long form: start-up waits
/// for the condition, not only for the container to exist).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DependsOn {
    condition: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Healthcheck {
    test: Vec<String>,
    #[allow(dead_code)]
    interval: Option<String>,
    #[allow(dead_code)]
    timeout: Option<String>,
    #[allow(dead_code)]
    retries: Option<u32>,
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
    #[serde(default)]
    extensions: BTreeMap<String, serde_norway::Value>,
    processors: BTreeMap<String, serde_norway::Value>,
    exporters: BTreeMap<String, serde_norway::Value>,
    service: CollectorService,
}

#[derive(Debug, Deserialize)]
struct CollectorService {
    #[serde(default)]
    extensions: Vec<String>,
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

fn datasources() -> Vec<Datasource> {
    yaml::<Datasources>(DATASOURCES).datasources
}

fn datasource_by_uid<'a>(sources: &'a [Datasource], uid: &str) -> Option<&'a Datasource> {
    sources.iter().find(|d| d.uid == uid)
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

const DATASOURCES: &str = "deploy/grafana/provisioning/datasources/datasources.yml";
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
        for dep in svc.depends_on.keys() {
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
    let health = endpoint_port(yaml_str(
        collector
            .extensions
            .get("health_check")
            .expect("health_check extension"),
        &["endpoint"],
    ));
    assert!(
        collector
            .service
            .extensions
            .contains(&"health_check".to_owned()),
        "the health_check extension is enabled in service.extensions"
    );
    let published = svc.published();
    for want in [grpc, http] {
        assert!(
            published.contains(&(want, want)),
            "OTLP receiver port {want} is not published as {want}:{want}: {published:?}"
        );
    }
    for (host, container) in &published {
        assert!(
            [grpc, http, exporter, health].contains(container),
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

/// Each provisioned datasource is a compose service on the port it listens
/// on (Prometheus on its published port, Jaeger's query service on 16686);
/// every datasource reference in the dashboard names one of their uids with
/// the right type; the dashboard provider reads the directory the dashboard
/// JSON is mounted in.
#[test]
fn grafana_reads_prometheus_and_jaeger_and_loads_the_dashboard() {
    let compose = compose();
    let (_, grafana) = service_by_image(&compose, "grafana/grafana");
    let sources = datasources();
    for (kind, image) in [
        ("prometheus", "prom/prometheus"),
        ("jaeger", "jaegertracing/jaeger"),
    ] {
        let (service, svc) = service_by_image(&compose, image);
        let ds = sources
            .iter()
            .find(|d| d.kind == kind)
            .unwrap_or_else(|| panic!("no {kind} datasource in {DATASOURCES}"));
        let port = svc
            .published()
            .first()
            .map(|(_, c)| *c)
            .unwrap_or_else(|| panic!("{service} publishes no port"));
        assert_eq!(
            ds.url,
            format!("http://{service}:{port}"),
            "{kind} datasource URL"
        );
    }

    let dash = dashboard();
    let mut refs = Vec::new();
    json_values(&dash, "datasource", &mut refs);
    assert!(refs.len() > 5, "panels and targets name their datasource");
    for r in refs
        .into_iter()
        .chain(trace_link_queries().iter().map(|q| &q["datasource"]))
    {
        let ds = datasource_by_uid(&sources, r["uid"].as_str().unwrap_or_default())
            .unwrap_or_else(|| panic!("datasource reference {r}: no such provisioned uid"));
        assert_eq!(r["type"], ds.kind.as_str(), "datasource reference {r}");
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

/// The labels a panel's series carry: the `by (...)` labels of its queries
/// (every pool panel aggregates), or for a bare recording rule the `by`
/// labels of the rule's expression.
fn panel_series_labels(panel: &serde_json::Value, rules: &[Rule]) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for target in panel["targets"].as_array().into_iter().flatten() {
        let expr = target["expr"].as_str().unwrap_or_default();
        out.extend(output_labels(expr, rules));
    }
    out.remove("le");
    out
}

/// The `by` labels of an expression, or when it has none, those of the
/// recording rules it reads (recursively).
fn output_labels(expr: &str, rules: &[Rule]) -> BTreeSet<String> {
    let labels = by_labels(expr);
    if !labels.is_empty() {
        return labels;
    }
    promql_names(expr)
        .metrics
        .iter()
        .filter_map(|m| {
            rules
                .iter()
                .find(|r| r.record.as_deref() == Some(m.as_str()))
        })
        .flat_map(|r| output_labels(&r.expr, rules))
        .collect()
}

/// Label names inside every `by (...)` of an expression.
fn by_labels(expr: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = expr;
    while let Some(i) = rest.find("by") {
        let after = &rest[i + 2..];
        let word_start =
            i == 0 || !rest[..i].ends_with(|c: char| c.is_ascii_alphanumeric() || c == '_');
        if word_start && let Some(list) = after.trim_start().strip_prefix('(') {
            let list = list.split(')').next().unwrap_or_default();
            out.extend(
                list.split(',')
                    .map(|l| l.trim().to_owned())
                    .filter(|l| !l.is_empty()),
            );
        }
        rest = after;
    }
    out
}

/// Every Jaeger search query the dashboard's data links open (the `panes`
/// parameter of each `/explore` link), with the panel it belongs to.
fn trace_links() -> Vec<(serde_json::Value, serde_json::Value)> {
    let dash = dashboard();
    let mut out = Vec::new();
    for panel in dash["panels"].as_array().expect("panels") {
        for link in panel["fieldConfig"]["defaults"]["links"]
            .as_array()
            .into_iter()
            .flatten()
        {
            let url = link["url"].as_str().expect("link url");
            let panes = url
                .strip_prefix("/explore?")
                .and_then(|q| q.split('&').find_map(|kv| kv.strip_prefix("panes=")))
                .unwrap_or_else(|| panic!("link {url} is not an Explore link with panes="));
            let panes: serde_json::Value =
                serde_json::from_str(panes).unwrap_or_else(|e| panic!("panes of {url}: {e}"));
            for pane in panes.as_object().expect("panes is an object").values() {
                for q in pane["queries"].as_array().expect("queries") {
                    out.push((panel.clone(), q.clone()));
                }
            }
        }
    }
    out
}

fn trace_link_queries() -> Vec<serde_json::Value> {
    trace_links().into_iter().map(|(_, q)| q).collect()
}

/// Every pool panel (each timeseries panel) links to the traces behind
/// the clicked series: a Jaeger search for that series' service (`job` =
/// service.name), host (server.address) and, where the panel splits by
/// them, miss reason, reuse or TLS resumption. Each search tag is an
/// attribute the library sets (a `semconv` constant) and takes its value
/// from the Prometheus label that same attribute became, a label the
/// panel's series carry; each operation is one of the library's span names.
/// Renaming a label in a panel's `by (...)` without its link, or linking
/// to an attribute that is not exported, fails here.
#[test]
fn pool_panels_link_to_the_matching_traces() {
    let rules = rules();
    let attributes = [
        semconv::SERVER_ADDRESS,
        semconv::SERVER_PORT,
        semconv::HTTP_CONNECTION_MISS_REASON,
        semconv::HTTP_CONNECTION_REUSED,
        semconv::TLS_RESUMED,
        semconv::DNS_QUESTION_NAME,
    ];
    let miss_reasons = [
        semconv::MISS_REASON_COLD,
        semconv::MISS_REASON_ALL_BUSY,
        semconv::MISS_REASON_IDLE_EXPIRED,
        semconv::MISS_REASON_CLOSED_BY_PEER,
        semconv::MISS_REASON_DISCARDED,
        semconv::MISS_REASON_NEW_CLIENT,
    ];
    let operations = [
        semconv::CONNECTION_SETUP_SPAN,
        semconv::DNS_LOOKUP_SPAN,
        semconv::TCP_CONNECT_SPAN,
        semconv::TLS_HANDSHAKE_SPAN,
    ];
    let dash = dashboard();
    let timeseries: Vec<&serde_json::Value> = dash["panels"]
        .as_array()
        .expect("panels")
        .iter()
        .filter(|p| p["type"] == "timeseries")
        .collect();
    assert!(timeseries.len() >= 6, "the pool panels");
    let links = trace_links();
    for panel in &timeseries {
        let title = panel["title"].as_str().unwrap_or_default();
        let queries: Vec<&serde_json::Value> = links
            .iter()
            .filter(|(p, _)| p["id"] == panel["id"])
            .map(|(_, q)| q)
            .collect();
        assert!(
            !queries.is_empty(),
            "panel {title:?} has no link to its traces"
        );
        let labels = panel_series_labels(panel, &rules);
        let label_ref = |value: &str| -> Option<String> {
            value
                .strip_prefix("${__field.labels.")
                .and_then(|v| v.strip_suffix('}'))
                .map(str::to_owned)
        };
        for q in queries {
            assert_eq!(q["queryType"], "search", "{title}: {q}");
            let service = q["service"].as_str().unwrap_or_default();
            assert_eq!(
                label_ref(service).as_deref(),
                Some("job"),
                "{title}: the service is the series' job (service.name)"
            );
            assert!(labels.contains("job"), "{title}: series carry no job");
            if let Some(op) = q["operation"].as_str() {
                assert!(
                    operations.contains(&op),
                    "{title}: operation {op} is not one of our spans"
                );
            }
            let tags = q["tags"].as_str().unwrap_or_default();
            let mut keys = BTreeSet::new();
            // Jaeger's tag search: logfmt `key=value` pairs.
            for pair in tags.split_whitespace() {
                let (key, value) = pair
                    .split_once('=')
                    .unwrap_or_else(|| panic!("{title}: tag {pair:?} is not key=value"));
                assert!(
                    attributes.contains(&key),
                    "{title}: tag {key} is not an attribute we set"
                );
                keys.insert(key);
                match label_ref(value) {
                    Some(label) => {
                        assert_eq!(
                            label,
                            prometheus_label(key),
                            "{title}: tag {key} takes its value from another attribute's label"
                        );
                        assert!(
                            labels.contains(&label),
                            "{title}: series carry no {label} (they have {labels:?})"
                        );
                    }
                    None if key == semconv::HTTP_CONNECTION_MISS_REASON => {
                        assert!(
                            miss_reasons.contains(&value),
                            "{title}: miss reason {value}"
                        )
                    }
                    None => assert!(
                        ["true", "false"].contains(&value),
                        "{title}: fixed value {value} for {key}"
                    ),
                }
            }
            if labels.contains("server_address") {
                assert!(
                    keys.contains(semconv::SERVER_ADDRESS),
                    "{title}: the link does not narrow to the host"
                );
            }
            for (label, key) in [
                (
                    "http_connection_miss_reason",
                    semconv::HTTP_CONNECTION_MISS_REASON,
                ),
                ("http_connection_reused", semconv::HTTP_CONNECTION_REUSED),
                ("tls_resumed", semconv::TLS_RESUMED),
            ] {
                if labels.contains(label) {
                    assert!(
                        keys.contains(key),
                        "{title}: series split by {label}, the link does not"
                    );
                }
            }
        }
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
/// fix, and a runbook_url built from the one base URL (the external label
/// `runbook_base_url`) and the anchor of the README section that exists.
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
            Some(format!("{{{{ $externalLabels.{RUNBOOK_LABEL} }}}}#{anchor}").as_str()),
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

/// Start-up is ordered on conditions, not on container creation: every
/// `depends_on` names a condition, a `service_healthy` dependency has a
/// health check, every service has one except the collector (its contrib
/// image is FROM scratch: no shell or HTTP client to run one; the compose
/// header says so), and the dependencies have no cycle.
#[test]
fn compose_starts_in_order_on_health_checks() {
    let compose = compose();
    let (collector, _) = service_by_image(&compose, "otel/opentelemetry-collector");
    for (name, svc) in &compose.services {
        if name != collector {
            let check = svc
                .healthcheck
                .as_ref()
                .unwrap_or_else(|| panic!("service {name} has no healthcheck"));
            assert_eq!(
                check.test.first().map(String::as_str),
                Some("CMD"),
                "{name}: {check:?}"
            );
            let port = svc.published().first().map(|(_, c)| *c);
            assert!(
                check.test.iter().any(|a| port
                    .is_some_and(|p| a.contains(&format!("localhost:{p}")))
                    || a.contains("localhost:13133")),
                "{name}: the health check probes none of its listeners: {check:?}"
            );
        }
        for (dep, on) in &svc.depends_on {
            assert!(
                [
                    "service_healthy",
                    "service_started",
                    "service_completed_successfully"
                ]
                .contains(&on.condition.as_str()),
                "{name} -> {dep}: condition {}",
                on.condition
            );
            if on.condition == "service_healthy" {
                assert!(
                    compose.services[dep].healthcheck.is_some(),
                    "{name} waits for {dep} to be healthy, which has no healthcheck"
                );
            }
        }
    }
    // Topological order exists (no cycle): peel services whose
    // dependencies have all started.
    let mut started: BTreeSet<&str> = BTreeSet::new();
    while started.len() < compose.services.len() {
        let next: Vec<&str> = compose
            .services
            .iter()
            .filter(|(n, s)| {
                !started.contains(n.as_str())
                    && s.depends_on.keys().all(|d| started.contains(d.as_str()))
            })
            .map(|(n, _)| n.as_str())
            .collect();
        assert!(
            !next.is_empty(),
            "depends_on cycle among {:?}",
            compose.services.keys()
        );
        started.extend(next);
    }
    // What waits for what: traces need Jaeger, alerts need Alertmanager,
    // Grafana needs both of its datasources.
    let (jaeger, _) = service_by_image(&compose, "jaegertracing/jaeger");
    let (prom, prom_svc) = service_by_image(&compose, "prom/prometheus");
    let (am, _) = service_by_image(&compose, "prom/alertmanager");
    let (_, grafana) = service_by_image(&compose, "grafana/grafana");
    let (_, collector_svc) = service_by_image(&compose, "otel/opentelemetry-collector");
    assert!(collector_svc.depends_on.contains_key(jaeger));
    assert!(prom_svc.depends_on.contains_key(am));
    assert!(grafana.depends_on.contains_key(prom) && grafana.depends_on.contains_key(jaeger));
}

/// The collector runs the contrib distribution (the only one with
/// tail_sampling); memory_limiter is the first processor of every pipeline
/// and batch the last; the traces pipeline tail-samples with a policy
/// keeping every trace carrying `http.connection.miss_reason` (any value),
/// one keeping every error, and a probabilistic one for the rest; metrics
/// are not sampled.
#[test]
fn collector_limits_memory_and_keeps_every_miss_and_error() {
    let compose = compose();
    let (_, svc) = service_by_image(&compose, "otel/opentelemetry-collector");
    assert!(
        svc.image
            .starts_with("otel/opentelemetry-collector-contrib:"),
        "tail_sampling is in the contrib image only: {}",
        svc.image
    );
    let collector = collector();
    for (name, p) in &collector.service.pipelines {
        assert_eq!(
            p.processors.first().map(String::as_str),
            Some("memory_limiter"),
            "{name}: memory_limiter first"
        );
        assert_eq!(
            p.processors.last().map(String::as_str),
            Some("batch"),
            "{name}: batch last"
        );
    }
    let metrics = &collector.service.pipelines["metrics"];
    assert!(
        !metrics
            .processors
            .iter()
            .any(|p| p.starts_with("tail_sampling"))
    );
    let traces = &collector.service.pipelines["traces"];
    let sampler = traces
        .processors
        .iter()
        .find(|p| p.starts_with("tail_sampling"))
        .expect("traces are tail-sampled");
    let policies = collector.processors[sampler]["policies"]
        .as_sequence()
        .expect("policies");
    let kind = |p: &serde_norway::Value| p["type"].as_str().unwrap_or_default().to_owned();
    let miss = policies
        .iter()
        .find(|p| kind(p) == "string_attribute")
        .expect("a string_attribute policy");
    assert_eq!(
        yaml_str(miss, &["string_attribute", "key"]),
        semconv::HTTP_CONNECTION_MISS_REASON
    );
    assert_eq!(
        miss["string_attribute"]["enabled_regex_matching"].as_bool(),
        Some(true)
    );
    let values: Vec<&str> = miss["string_attribute"]["values"]
        .as_sequence()
        .expect("values")
        .iter()
        .filter_map(|v| v.as_str())
        .collect();
    assert_eq!(values, vec![".+"], "any miss reason");
    let errors = policies
        .iter()
        .find(|p| kind(p) == "status_code")
        .expect("a status_code policy");
    assert_eq!(
        errors["status_code"]["status_codes"]
            .as_sequence()
            .and_then(|c| c.first())
            .and_then(|c| c.as_str()),
        Some("ERROR")
    );
    let hits = policies
        .iter()
        .find(|p| kind(p) == "probabilistic")
        .expect("plain hits sampled");
    let pct = hits["probabilistic"]["sampling_percentage"]
        .as_f64()
        .expect("percentage");
    assert!(pct > 0.0 && pct < 100.0, "{pct}");
    // Sampling would be pointless after an exporter that sends everything.
    assert!(
        traces
            .exporters
            .iter()
            .all(|e| !e.starts_with("prometheus"))
    );
}

// deploy/alertmanager/alertmanager.yml: only what the checks read.
#[derive(Debug, Deserialize)]
struct Alertmanager {
    receivers: Vec<AmReceiver>,
}

#[derive(Debug, Deserialize)]
struct AmReceiver {
    name: String,
    #[serde(default)]
    webhook_configs: Vec<AmWebhook>,
}

#[derive(Debug, Deserialize)]
struct AmWebhook {
    url: String,
}

const ALERTMANAGER: &str = "deploy/alertmanager/alertmanager.yml";

/// The receiver Alertmanager's routing tree picks for `labels`, as amtool
/// (Debian's prometheus-alertmanager, installed by scripts/test.sh)
/// computes it from the real config.
fn amtool_route(labels: &[(&str, &str)]) -> String {
    let out = std::process::Command::new("amtool")
        .args(["config", "routes", "test", "--config.file"])
        .arg(repo_root().join(ALERTMANAGER))
        .args(labels.iter().map(|(k, v)| format!("{k}={v}")))
        .output()
        .expect("amtool runs (scripts/test.sh installs Debian's prometheus-alertmanager)");
    assert!(
        out.status.success(),
        "amtool config routes test failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// Alerts page someone: Prometheus sends them to the compose service
/// running Alertmanager on its port; amtool routes every severity the rules
/// use to a receiver of its own (page and warning apart); each receiver's
/// webhook is a compose service on a port it publishes, and that service is
/// the pager log whose script listens on that port.
#[test]
fn alerts_route_by_severity_to_a_receiver_in_the_stack() {
    #[derive(Debug, Deserialize)]
    struct Alerting {
        alerting: AlertingBlock,
    }
    #[derive(Debug, Deserialize)]
    struct AlertingBlock {
        alertmanagers: Vec<AmTargets>,
    }
    #[derive(Debug, Deserialize)]
    struct AmTargets {
        static_configs: Vec<StaticConfig>,
    }
    let compose = compose();
    let (am_service, am) = service_by_image(&compose, "prom/alertmanager");
    let am_port = am
        .published()
        .first()
        .map(|(_, c)| *c)
        .expect("alertmanager port");
    let prom: Alerting = yaml("deploy/prometheus/prometheus.yml");
    let targets: Vec<&String> = prom
        .alerting
        .alertmanagers
        .iter()
        .flat_map(|a| &a.static_configs)
        .flat_map(|c| &c.targets)
        .collect();
    assert_eq!(targets, vec![&format!("{am_service}:{am_port}")]);
    assert!(
        am.container_path_of(ALERTMANAGER).is_some_and(|path| am
            .command
            .iter()
            .any(|c| c == &format!("--config.file={path}"))),
        "alertmanager runs with the mounted config: {:?}",
        am.command
    );

    let severities: BTreeSet<String> = rules()
        .iter()
        .filter(|r| r.alert.is_some())
        .filter_map(|r| r.labels.get("severity").cloned())
        .collect();
    assert!(severities.contains("page") && severities.contains("warning"));
    let config: Alertmanager = yaml(ALERTMANAGER);
    let mut chosen = BTreeMap::new();
    for severity in &severities {
        let receiver = amtool_route(&[
            ("alertname", "HttpClientPoolMissRatioHigh"),
            ("severity", severity),
        ]);
        let r = config
            .receivers
            .iter()
            .find(|r| r.name == receiver)
            .unwrap_or_else(|| panic!("amtool routed {severity} to unknown receiver {receiver}"));
        assert!(
            !r.webhook_configs.is_empty(),
            "receiver {receiver} notifies no one"
        );
        chosen.insert(severity.clone(), receiver);
    }
    assert_ne!(
        chosen["page"], chosen["warning"],
        "pages and warnings are routed apart"
    );

    let pager_script = read("deploy/alertmanager/pager_log.py");
    for r in &config.receivers {
        for hook in &r.webhook_configs {
            let rest = hook
                .url
                .strip_prefix("http://")
                .unwrap_or_else(|| panic!("webhook {} is not http://", hook.url));
            let authority = rest.split('/').next().unwrap_or_default();
            let (host, port) = authority.split_once(':').expect("host:port");
            let port = port.parse::<u16>().expect("port");
            let svc = compose
                .services
                .get(host)
                .unwrap_or_else(|| panic!("webhook {} is not a compose service", hook.url));
            assert!(
                svc.published().iter().any(|(_, c)| *c == port),
                "{host} does not publish {port}"
            );
            assert!(
                svc.container_path_of("deploy/alertmanager/pager_log.py")
                    .is_some_and(|p| svc.command.contains(&p)),
                "{host} runs the pager log"
            );
            assert!(
                pager_script.contains(&format!("\"PAGER_LOG_PORT\", \"{port}\"")),
                "pager_log.py listens on {port}"
            );
        }
    }
}

/// The runbook links resolve: Prometheus' external label runbook_base_url
/// comes from one variable (RUNBOOK_BASE_URL), which docker-compose.yml
/// passes to Prometheus with a default that is README.md as the pager-log
/// service serves it (mounted where it serves from, on its published
/// port); the README has the section every runbook_url's anchor names.
#[test]
fn runbook_links_come_from_one_variable_and_resolve_by_default() {
    #[derive(Debug, Deserialize)]
    struct Global {
        global: GlobalBlock,
    }
    #[derive(Debug, Deserialize)]
    struct GlobalBlock {
        external_labels: BTreeMap<String, String>,
    }
    let prom: Global = yaml("deploy/prometheus/prometheus.yml");
    assert_eq!(
        prom.global
            .external_labels
            .get(RUNBOOK_LABEL)
            .map(String::as_str),
        Some("${RUNBOOK_BASE_URL}")
    );
    let compose = compose();
    let (_, prom_svc) = service_by_image(&compose, "prom/prometheus");
    let value = prom_svc
        .environment
        .get("RUNBOOK_BASE_URL")
        .expect("prometheus gets RUNBOOK_BASE_URL");
    let default = value
        .strip_prefix("${RUNBOOK_BASE_URL:-")
        .and_then(|v| v.strip_suffix('}'))
        .unwrap_or_else(|| panic!("RUNBOOK_BASE_URL has no default: {value}"));
    let rest = default
        .strip_prefix("http://localhost:")
        .expect("a local default");
    let (port, path) = rest.split_once('/').expect("port/path");
    let port = port.parse::<u16>().expect("port");
    let (name, server) = compose
        .services
        .iter()
        .find(|(_, s)| s.published().iter().any(|(h, _)| *h == port))
        .unwrap_or_else(|| panic!("no service publishes {port}"));
    assert_eq!(path, "README.md");
    assert_eq!(
        server.container_path_of("README.md").as_deref(),
        Some("/srv/docs/README.md"),
        "{name} serves README.md from /srv/docs"
    );
    assert!(read("deploy/alertmanager/pager_log.py").contains("\"PAGER_LOG_DOCS\", \"/srv/docs\""));
}
