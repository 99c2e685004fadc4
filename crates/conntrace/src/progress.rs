//! Progress bars on stderr (indicatif), hidden when stderr is not a
//! terminal or with `--quiet`. Every bar is also remembered so that an
//! interrupted run can [`clear_all`] before it prints its error line.

use std::io::IsTerminal as _;
use std::sync::Mutex;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle, WeakProgressBar};

/// The bars made so far (weak: a finished run's bars are gone).
static BARS: Mutex<Vec<WeakProgressBar>> = Mutex::new(Vec::new());

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
    if let Ok(mut bars) = BARS.lock() {
        bars.retain(|b| b.upgrade().is_some());
        bars.push(bar.downgrade());
    }
    bar
}

/// Clears every live bar from the terminal and hides it for good, so
/// updates from tasks still running draw nothing more. (A terminal that
/// echoes a typed Ctrl-C as `^C` has already moved the cursor below the
/// bar, so there the bar's last line stays, frozen, above what follows.)
pub(crate) fn clear_all() {
    let Ok(bars) = BARS.lock() else {
        return;
    };
    for bar in bars.iter().filter_map(WeakProgressBar::upgrade) {
        bar.finish_and_clear();
        bar.set_draw_target(ProgressDrawTarget::hidden());
    }
}
