//! The OTLP JSON file exporters: keep finished spans (and the latest metric
//! collection) in memory and write them as one OTLP
//! `ExportTraceServiceRequest` (`ExportMetricsServiceRequest`) JSON document
//! (the encoding of opentelemetry-proto's `with-serde` feature, as the
//! OpenTelemetry Collector's file exporter and OTLP/HTTP JSON use it).

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;
use std::sync::{Arc, Mutex};

use anyhow::Context as _;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::transform::common::tonic::ResourceAttributesWithSchema;
use opentelemetry_proto::transform::trace::tonic::group_spans_by_resource_and_scope;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::metrics::Temporality;
use opentelemetry_sdk::metrics::data::ResourceMetrics;
use opentelemetry_sdk::metrics::exporter::PushMetricExporter;
use opentelemetry_sdk::trace::{SpanData, SpanExporter};

/// Spans collected so far and the resource they belong to.
#[derive(Debug, Default)]
struct Collected {
    /// Finished spans, in export order.
    spans: Vec<SpanData>,
    /// The tracer provider's resource (set by the SDK).
    resource: Option<Resource>,
}

/// Shared handle to the collected spans; written out with [`SpanStore::write_json`].
#[derive(Debug, Clone, Default)]
pub(crate) struct SpanStore {
    /// The collected spans.
    inner: Arc<Mutex<Collected>>,
}

impl SpanStore {
    /// Writes every collected span to `path` as one JSON document followed
    /// by a newline (so the file is also valid JSON Lines). Returns the
    /// number of spans written.
    ///
    /// # Errors
    /// When the file cannot be written.
    pub(crate) fn write_json(&self, path: &Path) -> anyhow::Result<usize> {
        let (spans, resource) = {
            let mut c = self
                .inner
                .lock()
                .map_err(|_| anyhow::anyhow!("span store poisoned"))?;
            (
                std::mem::take(&mut c.spans),
                c.resource
                    .clone()
                    .unwrap_or_else(|| Resource::builder().build()),
            )
        };
        let count = spans.len();
        let request = ExportTraceServiceRequest {
            resource_spans: group_spans_by_resource_and_scope(
                spans,
                &ResourceAttributesWithSchema::from(&resource),
            ),
        };
        let file = File::create(path)
            .with_context(|| format!("cannot create traces file {}", path.display()))?;
        let mut out = BufWriter::new(file);
        serde_json::to_writer(&mut out, &request)
            .map_err(std::io::Error::from)
            .and_then(|()| writeln!(out))
            .and_then(|()| out.flush())
            .with_context(|| format!("cannot write traces file {}", path.display()))?;
        Ok(count)
    }
}

impl SpanStore {
    /// Every collected span (kept), decoded as an OTLP receiver would see it.
    pub(crate) fn received(&self) -> Vec<conntrace_lab::ReceivedSpan> {
        let Ok(c) = self.inner.lock() else {
            return Vec::new();
        };
        let resource = c
            .resource
            .clone()
            .unwrap_or_else(|| Resource::builder().build());
        let request = ExportTraceServiceRequest {
            resource_spans: group_spans_by_resource_and_scope(
                c.spans.clone(),
                &ResourceAttributesWithSchema::from(&resource),
            ),
        };
        conntrace_lab::spans_from_export_request(request)
    }
}

/// A span exporter that only collects into a [`SpanStore`].
#[derive(Debug)]
pub(crate) struct MemoryExporter {
    /// Where exported spans go.
    store: SpanStore,
}

impl MemoryExporter {
    /// An exporter filling `store`.
    pub(crate) fn new(store: SpanStore) -> Self {
        Self { store }
    }
}

impl SpanExporter for MemoryExporter {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        if let Ok(mut c) = self.store.inner.lock() {
            c.spans.extend(batch);
        }
        Ok(())
    }

    fn set_resource(&mut self, resource: &Resource) {
        if let Ok(mut c) = self.store.inner.lock() {
            c.resource = Some(resource.clone());
        }
    }
}

/// The latest metric collection (cumulative, so the latest holds every
/// value), as OTLP; written out with [`MetricStore::write_json`].
#[derive(Debug, Clone, Default)]
pub(crate) struct MetricStore {
    /// The latest collection, already converted.
    latest: Arc<Mutex<Option<ExportMetricsServiceRequest>>>,
}

impl MetricStore {
    /// Writes the latest collection to `path` as one JSON document and a
    /// newline (an empty request when nothing was collected).
    ///
    /// # Errors
    /// When the file cannot be written.
    pub(crate) fn write_json(&self, path: &Path) -> anyhow::Result<()> {
        let request = self
            .latest
            .lock()
            .map_err(|_| anyhow::anyhow!("metric store poisoned"))?
            .clone()
            .unwrap_or_default();
        let file = File::create(path)
            .with_context(|| format!("cannot create metrics file {}", path.display()))?;
        let mut out = BufWriter::new(file);
        serde_json::to_writer(&mut out, &request)
            .map_err(std::io::Error::from)
            .and_then(|()| writeln!(out))
            .and_then(|()| out.flush())
            .with_context(|| format!("cannot write metrics file {}", path.display()))
    }
}

impl PushMetricExporter for MetricStore {
    async fn export(&self, metrics: &ResourceMetrics) -> OTelSdkResult {
        if let Ok(mut latest) = self.latest.lock() {
            *latest = Some(ExportMetricsServiceRequest::from(metrics));
        }
        Ok(())
    }

    fn force_flush(&self) -> OTelSdkResult {
        Ok(())
    }

    fn shutdown_with_timeout(&self, _timeout: std::time::Duration) -> OTelSdkResult {
        Ok(())
    }

    fn temporality(&self) -> Temporality {
        Temporality::Cumulative
    }
}
