//! `--html FILE` of `demo`, `probe` and `lab`: the page made from the spans
//! the run exported, written when the run is over.

use std::path::{Path, PathBuf};

use clap::Args;
use conntrace_lab::ReceivedSpan;

use super::model::{self, DEFAULT_SHOWN_TRACES};
use super::page;
use crate::export::OutputFile;

/// The `--html` option.
#[derive(Debug, Clone, Args)]
pub(crate) struct HtmlArg {
    /// Also write the run's spans as one self-contained HTML page (a
    /// timeline of traces with connection phases, misses and links, miss
    /// rates per batch, calls in flight; opens offline). Made from the same
    /// spans that are exported. [default: no page]
    #[arg(long, value_name = "FILE")]
    pub(crate) html: Option<PathBuf>,
}

impl HtmlArg {
    /// The page's output file, created now so an unwritable place fails
    /// before the run; `None` without `--html`.
    ///
    /// # Errors
    /// `cannot write html file <path>: <why>`.
    pub(crate) fn open(&self) -> anyhow::Result<Option<HtmlOutput>> {
        self.html.as_deref().map(HtmlOutput::create).transpose()
    }

    /// [`open`](Self::open), refusing a page path that is the run's
    /// `--traces-out` file or the metrics file written beside it (the page
    /// would overwrite the spans it is made from).
    ///
    /// # Errors
    /// As [`open`](Self::open); the same file: a bad command line (exit 2).
    pub(crate) fn open_apart_from(
        &self,
        traces: Option<&Path>,
    ) -> anyhow::Result<Option<HtmlOutput>> {
        if let (Some(page), Some(traces)) = (self.html.as_deref(), traces) {
            refuse_same_file(page, traces, "--traces-out")?;
            refuse_same_file(
                page,
                &crate::telemetry::metrics_path_beside(traces),
                "the metrics file beside --traces-out",
            )?;
        }
        self.open()
    }
}

/// A bad command line (exit 2) when `page` names the same file as `other`
/// (`what` says which), so a page never overwrites its own input.
pub(crate) fn refuse_same_file(page: &Path, other: &Path, what: &str) -> anyhow::Result<()> {
    let same = match (page.canonicalize(), other.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => match (std::path::absolute(page), std::path::absolute(other)) {
            (Ok(a), Ok(b)) => a == b,
            _ => false,
        },
    };
    if same {
        return Err(crate::error::usage(anyhow::anyhow!(
            "--html {} is the same file as {what}; give the page a name of its own",
            page.display()
        )));
    }
    Ok(())
}

/// Where a page goes: created (checked) before the run, written at its end.
#[derive(Debug)]
pub(crate) struct HtmlOutput {
    /// The file, written atomically.
    file: OutputFile,
}

/// What [`HtmlOutput::write`] wrote.
#[derive(Debug, Clone)]
pub(crate) struct Written {
    /// Absolute path of the page.
    pub(crate) path: String,
    /// Its size in bytes.
    pub(crate) bytes: usize,
    /// Traces drawn on its timeline.
    pub(crate) traces_drawn: usize,
}

impl HtmlOutput {
    /// Checks that `path` can be written (see [`OutputFile::create`]).
    ///
    /// # Errors
    /// `cannot write html file <path>: <why>`.
    pub(crate) fn create(path: &Path) -> anyhow::Result<Self> {
        Ok(Self {
            file: OutputFile::create(path, "html")?,
        })
    }

    /// Renders `spans` under `title`, drawing up to `max_shown` traces per
    /// group (0: all), and writes the page.
    ///
    /// # Errors
    /// `cannot write html file <path>: <why>`.
    pub(crate) fn write_with(
        mut self,
        title: &str,
        spans: &[ReceivedSpan],
        max_shown: usize,
    ) -> anyhow::Result<Written> {
        let model = model::build(title, spans, max_shown);
        let html = page::render(&model)?;
        self.file.write_bytes(html.as_bytes())?;
        let path = self.file.path();
        Ok(Written {
            path: std::path::absolute(path)
                .unwrap_or_else(|_| path.to_path_buf())
                .display()
                .to_string(),
            bytes: html.len(),
            traces_drawn: model.groups.iter().map(|g| g.shown.len()).sum(),
        })
    }

    /// [`write_with`](Self::write_with) the default number of traces per
    /// group, then, unless `quiet`, says on stderr where the page went.
    ///
    /// # Errors
    /// `cannot write html file <path>: <why>`.
    pub(crate) fn write(
        self,
        title: &str,
        spans: &[ReceivedSpan],
        quiet: bool,
    ) -> anyhow::Result<()> {
        let written = self.write_with(title, spans, DEFAULT_SHOWN_TRACES)?;
        if !quiet {
            eprintln!("{}", written.line(spans.len()));
        }
        Ok(())
    }
}

impl Written {
    /// `page: PATH (N KiB, M of S spans' traces drawn)`, for stderr.
    pub(crate) fn line(&self, spans: usize) -> String {
        format!(
            "page: {} ({} KiB; {} trace(s) drawn from {spans} span(s)); open it in a browser",
            self.path,
            self.bytes.div_ceil(1024),
            self.traces_drawn
        )
    }
}
