//! The OTLP JSON file exporters: keep finished spans (and the latest metric
//! collection) in memory and write them as one OTLP
//! `ExportTraceServiceRequest` (`ExportMetricsServiceRequest`) JSON document
//! (the encoding of opentelemetry-proto's `with-serde` feature, as the
//! OpenTelemetry Collector's file exporter and OTLP/HTTP JSON use it).
//! Files are written through [`OutputFile`]: created (so checked) before the
//! run, written to a temporary file beside the target and renamed over it,
//! so a reader or a second run never sees a half-written document.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use anyhow::Context as _;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::metrics::v1::ResourceMetrics as ResourceMetricsProto;
use opentelemetry_proto::transform::common::tonic::ResourceAttributesWithSchema;
use opentelemetry_proto::transform::trace::tonic::group_spans_by_resource_and_scope;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::metrics::Temporality;
use opentelemetry_sdk::metrics::data::ResourceMetrics;
use opentelemetry_sdk::metrics::exporter::PushMetricExporter;
use opentelemetry_sdk::trace::{SpanData, SpanExporter};

/// Distinguishes the temporary files of one process.
static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// A JSON output file written atomically: [`create`](Self::create) makes a
/// temporary file in the target's directory up front (so an unwritable
/// place fails before the run, naming the file), [`write`](Self::write)
/// fills it and renames it over the target. Two runs writing the same path
/// each rename a complete document; the last one wins. The temporary file
/// is removed when the `OutputFile` is dropped unwritten (error, Ctrl-C).
#[derive(Debug)]
pub(crate) struct OutputFile {
    /// The file to write.
    path: PathBuf,
    /// The temporary file beside it.
    temp: PathBuf,
    /// `traces` or `metrics`, for error messages.
    what: &'static str,
    /// Renamed into place already.
    done: bool,
}

impl OutputFile {
    /// Checks that `path` can be written: creates the temporary file beside
    /// it. `what` names the file in errors (`traces`, `metrics`).
    ///
    /// # Errors
    /// `cannot write <what> file <path>: <why>` when `path` is a directory or
    /// its directory does not exist or is not writable.
    pub(crate) fn create(path: &Path, what: &'static str) -> anyhow::Result<Self> {
        let context = || format!("cannot write {what} file {}", path.display());
        if path.is_dir() {
            return Err(anyhow::anyhow!("it is a directory").context(context()));
        }
        let name = path
            .file_name()
            .ok_or_else(|| anyhow::anyhow!("no file name").context(context()))?;
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let temp = dir.join(format!(
            ".{}.{}.{}.tmp",
            name.to_string_lossy(),
            std::process::id(),
            TEMP_COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        File::create(&temp).with_context(context)?;
        Ok(Self {
            path: path.to_path_buf(),
            temp,
            what,
            done: false,
        })
    }

    /// The file this writes.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Serializes `value` as one JSON document and a newline (so the file is
    /// also valid JSON Lines) into the temporary file, then renames it over
    /// the target.
    ///
    /// # Errors
    /// `cannot write <what> file <path>: <why>`.
    pub(crate) fn write(&mut self, value: &impl serde::Serialize) -> anyhow::Result<()> {
        let context = || format!("cannot write {} file {}", self.what, self.path.display());
        let file = File::create(&self.temp).with_context(context)?;
        let mut out = BufWriter::new(file);
        serde_json::to_writer(&mut out, value)
            .map_err(std::io::Error::from)
            .and_then(|()| writeln!(out))
            .and_then(|()| out.flush())
            .with_context(context)?;
        drop(out);
        std::fs::rename(&self.temp, &self.path).with_context(context)?;
        self.done = true;
        Ok(())
    }
}

impl OutputFile {
    /// Writes `bytes` (a whole document) into the temporary file, then
    /// renames it over the target.
    ///
    /// # Errors
    /// `cannot write <what> file <path>: <why>`.
    pub(crate) fn write_bytes(&mut self, bytes: &[u8]) -> anyhow::Result<()> {
        let context = || format!("cannot write {} file {}", self.what, self.path.display());
        std::fs::write(&self.temp, bytes).with_context(context)?;
        std::fs::rename(&self.temp, &self.path).with_context(context)?;
        self.done = true;
        Ok(())
    }
}

impl Drop for OutputFile {
    fn drop(&mut self) {
        if !self.done {
            let _ = std::fs::remove_file(&self.temp);
        }
    }
}

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
    /// Writes every collected span to `out` as one JSON document followed
    /// by a newline. Returns the number of spans written.
    ///
    /// # Errors
    /// When the file cannot be written.
    pub(crate) fn write_json(&self, out: &mut OutputFile) -> anyhow::Result<usize> {
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
        out.write(&request)?;
        Ok(count)
    }
}

impl SpanStore {
    /// Appends `spans` after the spans collected so far (spans this
    /// process did not end itself, e.g. a child process's).
    pub(crate) fn extend(&self, spans: impl IntoIterator<Item = SpanData>) {
        if let Ok(mut c) = self.inner.lock() {
            c.spans.extend(spans);
        }
    }

    /// Whether `self` and `other` are handles to the same spans.
    pub(crate) fn same_as(&self, other: &SpanStore) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

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
        self.store.extend(batch);
        Ok(())
    }

    fn set_resource(&mut self, resource: &Resource) {
        if let Ok(mut c) = self.store.inner.lock() {
            c.resource = Some(resource.clone());
        }
    }
}

/// The latest metric collection (cumulative, so the latest holds every
/// value), as OTLP, and the collections other processes exported (taken in
/// with [`add_received`](Self::add_received)); written out with
/// [`MetricStore::write_json`].
#[derive(Debug, Clone, Default)]
pub(crate) struct MetricStore {
    /// The latest collection, already converted.
    latest: Arc<Mutex<Option<ExportMetricsServiceRequest>>>,
    /// Other processes' last collections, each under its own resource.
    received: Arc<Mutex<Vec<ResourceMetricsProto>>>,
}

impl MetricStore {
    /// Takes in the last collection another process exported (its
    /// resources, scopes and points as it sent them): written after this
    /// process's own, each under its own resource.
    pub(crate) fn add_received(&self, request: ExportMetricsServiceRequest) {
        if let Ok(mut received) = self.received.lock() {
            received.extend(request.resource_metrics);
        }
    }

    /// Writes the latest collection, then the collections taken in from
    /// other processes, to `out` as one JSON document and a newline (an
    /// empty request when nothing was collected).
    ///
    /// # Errors
    /// When the file cannot be written.
    pub(crate) fn write_json(&self, out: &mut OutputFile) -> anyhow::Result<()> {
        let poisoned = || anyhow::anyhow!("metric store poisoned");
        let mut request = self
            .latest
            .lock()
            .map_err(|_| poisoned())?
            .clone()
            .unwrap_or_default();
        request.resource_metrics.extend(
            self.received
                .lock()
                .map_err(|_| poisoned())?
                .iter()
                .cloned(),
        );
        out.write(&request)
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The names in `dir`, sorted.
    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .expect("read dir")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn writes_by_renaming_a_temporary_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("t.json");
        std::fs::write(&path, "old").expect("write");
        let mut out = OutputFile::create(&path, "traces").expect("create");
        // Until written, the old content stays whole beside the temp file.
        assert_eq!(std::fs::read_to_string(&path).expect("read"), "old");
        assert_eq!(names(dir.path()).len(), 2);
        out.write(&serde_json::json!({"a": 1})).expect("write");
        assert_eq!(std::fs::read_to_string(&path).expect("read"), "{\"a\":1}\n");
        assert_eq!(names(dir.path()), vec!["t.json"]);
        drop(out);
        assert_eq!(names(dir.path()), vec!["t.json"]);
    }

    #[test]
    fn an_unwritten_file_leaves_nothing_behind() {
        let dir = tempfile::tempdir().expect("tempdir");
        let out = OutputFile::create(&dir.path().join("t.json"), "traces").expect("create");
        drop(out);
        assert!(names(dir.path()).is_empty());
    }

    #[test]
    fn unwritable_places_fail_up_front_naming_the_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let missing = dir.path().join("no-such-dir").join("t.json");
        let err = OutputFile::create(&missing, "traces").map_err(|e| format!("{e:#}"));
        assert!(
            err.as_ref().is_err_and(
                |e| e.starts_with(&format!("cannot write traces file {}: ", missing.display()))
            ),
            "{err:?}"
        );
        let err = OutputFile::create(dir.path(), "metrics").map_err(|e| format!("{e:#}"));
        assert!(
            err.as_ref()
                .is_err_and(|e| e.ends_with("it is a directory")),
            "{err:?}"
        );
    }
}
