//! The metrics contract: what the library exports, checked from both ends
//! (the SDK's output in `metrics.rs`, the Prometheus/Grafana files in
//! `deploy.rs`).

use reqwest_conntrace::semconv;

/// How an OTel instrument kind arrives in Prometheus.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// Monotonic sum: a Prometheus counter (`_total`).
    Counter,
    /// Non-monotonic sum: a Prometheus gauge.
    UpDownCounter,
    /// A Prometheus gauge.
    Gauge,
    /// Explicit-bucket histogram: `_bucket`, `_sum`, `_count` series.
    Histogram,
}

/// One metric the library exports over OTLP.
pub(crate) struct OtelMetric {
    pub(crate) name: &'static str,
    pub(crate) unit: &'static str,
    pub(crate) kind: Kind,
    pub(crate) attributes: &'static [&'static str],
}

/// The OTLP metrics the library exports: names (the library's `semconv`
/// constants), units, kinds and the attribute keys each may carry. The one
/// list that `metrics.rs` checks the exported metrics against and
/// `deploy.rs` checks the Prometheus rules and the Grafana dashboard against.
pub(crate) const OTEL_METRICS: &[OtelMetric] = &[
    OtelMetric {
        name: semconv::HTTP_CLIENT_REQUEST_DURATION,
        unit: "s",
        kind: Kind::Histogram,
        attributes: &[
            semconv::HTTP_REQUEST_METHOD,
            semconv::SERVER_ADDRESS,
            semconv::SERVER_PORT,
            semconv::URL_SCHEME,
            semconv::HTTP_RESPONSE_STATUS_CODE,
            semconv::ERROR_TYPE,
            semconv::NETWORK_PROTOCOL_VERSION,
            semconv::HTTP_CONNECTION_REUSED,
        ],
    },
    OtelMetric {
        name: semconv::HTTP_CLIENT_ACTIVE_REQUESTS,
        unit: "{request}",
        kind: Kind::UpDownCounter,
        attributes: &[
            semconv::HTTP_REQUEST_METHOD,
            semconv::SERVER_ADDRESS,
            semconv::SERVER_PORT,
            semconv::URL_SCHEME,
        ],
    },
    OtelMetric {
        name: semconv::DNS_LOOKUP_DURATION,
        unit: "s",
        kind: Kind::Histogram,
        attributes: &[semconv::DNS_QUESTION_NAME, semconv::ERROR_TYPE],
    },
    OtelMetric {
        name: semconv::HTTP_CLIENT_OPEN_CONNECTIONS,
        unit: "{connection}",
        kind: Kind::UpDownCounter,
        attributes: &[
            semconv::HTTP_CONNECTION_STATE,
            semconv::SERVER_ADDRESS,
            semconv::SERVER_PORT,
            semconv::URL_SCHEME,
            semconv::NETWORK_PROTOCOL_VERSION,
        ],
    },
    OtelMetric {
        name: semconv::HTTP_CLIENT_CONNECTION_DURATION,
        unit: "s",
        kind: Kind::Histogram,
        attributes: &[
            semconv::SERVER_ADDRESS,
            semconv::SERVER_PORT,
            semconv::URL_SCHEME,
            semconv::NETWORK_PROTOCOL_VERSION,
        ],
    },
    OtelMetric {
        name: semconv::HTTP_CLIENT_CONNECTION_SETUP_DURATION,
        unit: "s",
        kind: Kind::Histogram,
        attributes: &[
            semconv::SERVER_ADDRESS,
            semconv::SERVER_PORT,
            semconv::URL_SCHEME,
            semconv::NETWORK_TYPE,
            semconv::TLS_PROTOCOL_VERSION,
            semconv::TLS_RESUMED,
            semconv::ERROR_TYPE,
        ],
    },
    OtelMetric {
        name: semconv::HTTP_CLIENT_CONNECTIONS_OPENED,
        unit: "{connection}",
        kind: Kind::Counter,
        attributes: &[
            semconv::SERVER_ADDRESS,
            semconv::SERVER_PORT,
            semconv::URL_SCHEME,
            semconv::TLS_RESUMED,
        ],
    },
    OtelMetric {
        name: semconv::HTTP_CLIENT_POOL_MISSES,
        unit: "{request}",
        kind: Kind::Counter,
        attributes: &[
            semconv::SERVER_ADDRESS,
            semconv::SERVER_PORT,
            semconv::URL_SCHEME,
            semconv::HTTP_CONNECTION_MISS_REASON,
            semconv::HTTP_CONNECTION_POOL_LIMITS,
        ],
    },
    OtelMetric {
        name: semconv::HTTP_CLIENT_POOL_PEAK_IN_FLIGHT,
        unit: "{request}",
        kind: Kind::Gauge,
        attributes: &[semconv::SERVER_ADDRESS, semconv::SERVER_PORT],
    },
    OtelMetric {
        name: semconv::HTTP_CLIENT_POOL_IDLE_LIMIT,
        unit: "{connection}",
        kind: Kind::Gauge,
        attributes: &[semconv::SERVER_ADDRESS, semconv::SERVER_PORT],
    },
];
