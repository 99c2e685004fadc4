//! `ReceivedMetric`: one exported metric, flattened with its resource and scope.

use opentelemetry_proto::tonic::metrics::v1::metric::Data;
use opentelemetry_proto::tonic::metrics::v1::number_data_point::Value as NumberValue;
use opentelemetry_proto::tonic::metrics::v1::{
    AggregationTemporality, HistogramDataPoint, NumberDataPoint, ResourceMetrics,
};

use crate::Attributes;

/// One metric from one export, with its resource attributes and scope.
#[derive(Debug, Clone, PartialEq)]
pub struct ReceivedMetric {
    /// Resource attributes of the exporting process.
    pub resource: Attributes,
    /// Instrumentation scope (meter) name.
    pub scope_name: String,
    /// Instrumentation scope attributes (empty when the meter has none):
    /// they tell apart meters of one name, e.g. `conntrace probe`'s
    /// `conntrace.probe.mode`.
    pub scope_attributes: Attributes,
    /// Metric name.
    pub name: String,
    /// Metric description.
    pub description: String,
    /// Metric unit (e.g. `s`, `ms`, `{connection}`).
    pub unit: String,
    /// The data points.
    pub data: MetricData,
}

/// The data of a metric, by aggregation type.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum MetricData {
    /// A sum (counter or up-down counter).
    Sum {
        /// Whether the sum only goes up.
        monotonic: bool,
        /// Cumulative or delta.
        temporality: AggregationTemporality,
        /// One point per attribute set.
        points: Vec<NumberPoint>,
    },
    /// A gauge.
    Gauge {
        /// One point per attribute set.
        points: Vec<NumberPoint>,
    },
    /// An explicit-bucket histogram.
    Histogram {
        /// Cumulative or delta.
        temporality: AggregationTemporality,
        /// One point per attribute set.
        points: Vec<HistogramPoint>,
    },
    /// An exponential histogram, summary or missing data (not decoded further).
    Other,
}

/// One sum or gauge data point.
#[derive(Debug, Clone, PartialEq)]
pub struct NumberPoint {
    /// The point's attributes.
    pub attributes: Attributes,
    /// The value (integer points converted to `f64`).
    pub value: f64,
    /// Whether the value was exported as an integer.
    pub is_int: bool,
    /// End of the point's interval, nanoseconds since the Unix epoch.
    pub time_unix_nano: u64,
}

/// One histogram data point.
#[derive(Debug, Clone, PartialEq)]
pub struct HistogramPoint {
    /// The point's attributes.
    pub attributes: Attributes,
    /// Number of recorded values.
    pub count: u64,
    /// Sum of recorded values, when exported.
    pub sum: Option<f64>,
    /// Smallest recorded value, when exported.
    pub min: Option<f64>,
    /// Largest recorded value, when exported.
    pub max: Option<f64>,
    /// Upper bounds of the buckets (one fewer than `bucket_counts`).
    pub explicit_bounds: Vec<f64>,
    /// Count per bucket.
    pub bucket_counts: Vec<u64>,
    /// End of the point's interval, nanoseconds since the Unix epoch.
    pub time_unix_nano: u64,
}

impl ReceivedMetric {
    /// The number points of a sum or gauge (empty for histograms).
    pub fn number_points(&self) -> &[NumberPoint] {
        match &self.data {
            MetricData::Sum { points, .. } | MetricData::Gauge { points } => points,
            _ => &[],
        }
    }

    /// The points of a histogram (empty for other types).
    pub fn histogram_points(&self) -> &[HistogramPoint] {
        match &self.data {
            MetricData::Histogram { points, .. } => points,
            _ => &[],
        }
    }

    /// Sum of all number points' values (sums and gauges), e.g. a counter's
    /// total over all attribute sets.
    pub fn total(&self) -> f64 {
        self.number_points().iter().map(|p| p.value).sum()
    }

    /// Sum of all histogram points' counts.
    pub fn histogram_count(&self) -> u64 {
        self.histogram_points().iter().map(|p| p.count).sum()
    }
}

fn temporality(raw: i32) -> AggregationTemporality {
    AggregationTemporality::try_from(raw).unwrap_or(AggregationTemporality::Unspecified)
}

fn number_points(points: Vec<NumberDataPoint>) -> Vec<NumberPoint> {
    points
        .into_iter()
        .map(|p| {
            let (value, is_int) = match p.value {
                Some(NumberValue::AsDouble(d)) => (d, false),
                Some(NumberValue::AsInt(i)) => (i as f64, true),
                None => (0.0, false),
            };
            NumberPoint {
                attributes: Attributes::new(p.attributes),
                value,
                is_int,
                time_unix_nano: p.time_unix_nano,
            }
        })
        .collect()
}

fn histogram_points(points: Vec<HistogramDataPoint>) -> Vec<HistogramPoint> {
    points
        .into_iter()
        .map(|p| HistogramPoint {
            attributes: Attributes::new(p.attributes),
            count: p.count,
            sum: p.sum,
            min: p.min,
            max: p.max,
            explicit_bounds: p.explicit_bounds,
            bucket_counts: p.bucket_counts,
            time_unix_nano: p.time_unix_nano,
        })
        .collect()
}

/// Flattens decoded resource metrics into one [`ReceivedMetric`] per metric.
pub(crate) fn flatten_resource_metrics(
    resource_metrics: Vec<ResourceMetrics>,
) -> Vec<ReceivedMetric> {
    let mut out = Vec::new();
    for rm in resource_metrics {
        let resource = Attributes::new(rm.resource.map(|r| r.attributes).unwrap_or_default());
        for sm in rm.scope_metrics {
            let (scope_name, scope_attributes) = sm
                .scope
                .map(|s| (s.name, Attributes::new(s.attributes)))
                .unwrap_or_default();
            for metric in sm.metrics {
                let data = match metric.data {
                    Some(Data::Sum(sum)) => MetricData::Sum {
                        monotonic: sum.is_monotonic,
                        temporality: temporality(sum.aggregation_temporality),
                        points: number_points(sum.data_points),
                    },
                    Some(Data::Gauge(gauge)) => MetricData::Gauge {
                        points: number_points(gauge.data_points),
                    },
                    Some(Data::Histogram(h)) => MetricData::Histogram {
                        temporality: temporality(h.aggregation_temporality),
                        points: histogram_points(h.data_points),
                    },
                    _ => MetricData::Other,
                };
                out.push(ReceivedMetric {
                    resource: resource.clone(),
                    scope_name: scope_name.clone(),
                    scope_attributes: scope_attributes.clone(),
                    name: metric.name,
                    description: metric.description,
                    unit: metric.unit,
                    data,
                });
            }
        }
    }
    out
}

/// Decodes an OTLP JSON metrics document (one `ExportMetricsServiceRequest`,
/// the encoding `conntrace`'s `<stem>.metrics.json` file and the
/// collector's file exporter use) into one [`ReceivedMetric`] per metric.
///
/// # Errors
/// [`LabError::Json`](crate::LabError::Json) when the text is not such a document.
pub fn metrics_from_otlp_json(json: &str) -> Result<Vec<ReceivedMetric>, crate::LabError> {
    let request: opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest =
        serde_json::from_str(json.trim())?;
    Ok(flatten_resource_metrics(request.resource_metrics))
}
