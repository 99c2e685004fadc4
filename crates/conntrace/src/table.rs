//! Table and number formatting shared by the text outputs.

use comfy_table::presets::UTF8_FULL_CONDENSED;
use comfy_table::{CellAlignment, ContentArrangement, Table};

/// A table with `header`; columns from `right_from` on are right-aligned.
pub(crate) fn new_table(header: &[&str], right_from: usize) -> Table {
    let mut table = Table::new();
    table
        .load_preset(UTF8_FULL_CONDENSED)
        .set_content_arrangement(ContentArrangement::Disabled)
        .set_header(header.to_vec());
    for i in right_from..header.len() {
        if let Some(col) = table.column_mut(i) {
            col.set_cell_alignment(CellAlignment::Right);
        }
    }
    table
}

/// Milliseconds with one decimal, `-` when absent.
pub(crate) fn fmt_ms(v: Option<f64>) -> String {
    v.map_or_else(|| "-".to_owned(), |v| format!("{v:.1}"))
}

/// A ratio as a percentage with one decimal.
pub(crate) fn fmt_pct(r: f64) -> String {
    format!("{:.1} %", r * 100.0)
}

/// `yes` / `no` / `-`.
pub(crate) fn fmt_bool(v: Option<bool>) -> &'static str {
    match v {
        Some(true) => "yes",
        Some(false) => "no",
        None => "-",
    }
}
