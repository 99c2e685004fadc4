//! The OTLP JSON file exporter: keeps finished spans in memory and writes
//! them as one OTLP `ExportTraceServiceRequest` JSON document (the encoding
//! of opentelemetry-proto's `with-serde` feature, as the OpenTelemetry
//! Collector's file exporter and OTLP/HTTP JSON use it).

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;
use std::sync::{Arc, Mutex};

use anyhow::Context as _;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::transform::common::tonic::ResourceAttributesWithSchema;
use opentelemetry_proto::transform::trace::tonic::group_spans_by_resource_and_scope;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::OTelSdkResult;
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
