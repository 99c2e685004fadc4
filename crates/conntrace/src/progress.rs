//! Progress bars on stderr (indicatif), hidden when stderr is not a
//! terminal or with `--quiet`.

use std::io::IsTerminal as _;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// A progress bar of `len` steps labelled `prefix`; hidden when `quiet` or
/// when stderr is not a terminal.
pub(crate) fn bar(len: u64, prefix: &str, quiet: bool) -> ProgressBar {
    let target = if quiet || !std::io::stderr().is_terminal() {
        ProgressDrawTarget::hidden()
    } else {
        ProgressDrawTarget::stderr()
    };
    let bar = ProgressBar::with_draw_target(Some(len), target);
    if let Ok(style) = ProgressStyle::with_template(
        "{prefix:>12.bold} [{bar:30.cyan/blue}] {pos}/{len} fan-outs  {elapsed_precise}  {msg}",
    ) {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_prefix(prefix.to_owned());
    bar
}
