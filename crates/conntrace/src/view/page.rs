//! The page: one self-contained HTML file (no network access needed to
//! open it) holding the [`Page`] model as JSON, the vendored D3 library
//! (ISC licence, kept in the file) and the script that draws the model with it.

use anyhow::Context as _;

use super::model::Page;

/// The page skeleton; `{{name}}` marks where a part goes.
const TEMPLATE: &str = include_str!("assets/page.html");
/// The page's style sheet.
const STYLE: &str = include_str!("assets/page.css");
/// The script that draws the model.
const SCRIPT: &str = include_str!("assets/page.js");
/// D3 7.9.2 (`d3.min.js` from the npm package `d3`), unmodified.
const D3: &str = include_str!("assets/d3.min.js");
/// D3's licence (ISC), carried into every page.
const D3_LICENSE: &str = include_str!("assets/d3.LICENSE");
/// The vendored D3 version.
const D3_VERSION: &str = "7.9.2";

/// Renders `page` as one HTML document.
///
/// # Errors
/// When the model cannot be serialized (not expected: it holds only
/// strings and numbers).
pub(crate) fn render(page: &Page) -> anyhow::Result<String> {
    let data = script_safe_json(page)?;
    let title = escape_html(&page.title);
    let mut out = String::with_capacity(TEMPLATE.len() + D3.len() + data.len() + 64 * 1024);
    let mut rest = TEMPLATE;
    // One pass over the template: inserted parts are never scanned again,
    // so span data containing `{{...}}` stays as it is.
    while let Some(open) = rest.find("{{") {
        let Some(close) = rest[open..].find("}}") else {
            break;
        };
        out.push_str(&rest[..open]);
        let name = &rest[open + 2..open + close];
        out.push_str(match name {
            "title" => &title,
            "style" => STYLE,
            "data" => &data,
            "d3" => D3,
            "d3_license" => D3_LICENSE,
            "d3_version" => D3_VERSION,
            "script" => SCRIPT,
            other => anyhow::bail!("the page template names an unknown part {other:?}"),
        });
        rest = &rest[open + close + 2..];
    }
    out.push_str(rest);
    Ok(out)
}

/// `value` as JSON that can sit inside a `<script>` element: every `<`
/// (only ever inside JSON strings) written as `\u003c`, so no span value
/// can close the element.
fn script_safe_json(value: &impl serde::Serialize) -> anyhow::Result<String> {
    let json = serde_json::to_string(value).context("cannot serialize the page data")?;
    Ok(json.replace('<', "\\u003c"))
}

/// `text` with the HTML special characters escaped.
fn escape_html(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn span_values_cannot_break_out_of_the_page() {
        let json =
            script_safe_json(&serde_json::json!({"v": "</script><script>alert(1)"})).expect("json");
        assert!(!json.contains('<'), "{json}");
        let back: serde_json::Value = serde_json::from_str(&json).expect("still JSON");
        assert_eq!(back["v"], "</script><script>alert(1)");
        assert_eq!(escape_html("a<b>&\"'"), "a&lt;b&gt;&amp;&quot;&#39;");
    }

    #[test]
    fn the_page_is_self_contained() {
        let page = super::super::model::build("{{d3}} <x>", &[], 8);
        let html = render(&page).expect("render");
        assert!(
            html.contains("<title>conntrace: {{d3}} &lt;x&gt;</title>"),
            "the title is escaped and not expanded"
        );
        assert_eq!(html.matches("d3js.org v7.9.2").count(), 1, "D3 once");
        for part in ["{{style}}", "{{data}}", "{{script}}", "{{d3_license}}"] {
            assert!(!html.contains(part), "{part} filled in");
        }
        for remote in ["src=\"http", "href=\"http", "@import", "url(http"] {
            assert!(!html.contains(remote), "no network access: {remote}");
        }
        assert!(
            html.contains("Copyright 2010-2026 Mike Bostock"),
            "D3's licence kept"
        );
    }
}
