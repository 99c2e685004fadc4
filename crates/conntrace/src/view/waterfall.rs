//! `conntrace probe --waterfall`: per request, one bar of its phases in the
//! manner of curl's `-w` timing and httpstat: DNS | TCP | proxy | TLS |
//! wait for a connection | server | body, every bar on one scale (the
//! slowest request fills the width), the miss reason beside it. Coloured
//! blocks on a terminal; letters (`d t p s w r b`) and no escape codes when
//! stdout is not one (or `NO_COLOR`/`CLICOLOR=0`).
//!
//! The phases come from the library's `RequestReport` (the same values as
//! the spans): DNS, TCP, proxy and TLS only for a request whose own pool
//! miss opened its connection; *wait* is the rest of
//! `http.connection.wait_time` (time before the connect started, or waiting
//! for a connection another request opened or was using); *server* is
//! connection to response headers, *body* headers to the end of the body.
//! The headers moment is `RequestReport::time_to_first_byte`, taken where
//! the library stamps the request span's `http.receive.start` event, which
//! the HTML page splits its bars at: both pictures split alike.

use console::{Color, Style, Term};

use crate::row::RequestRow;
use crate::stats::round3;

/// One phase of the bar: letter, colour, name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Segment {
    /// DNS lookup.
    Dns,
    /// TCP connect.
    Tcp,
    /// Proxy CONNECT.
    Proxy,
    /// TLS handshake.
    Tls,
    /// Waiting for a connection (beyond this request's own connect).
    Wait,
    /// Connection to response headers.
    Server,
    /// Response headers to the end of the body.
    Body,
}

impl Segment {
    /// Every segment, in bar order.
    pub(crate) const ALL: [Segment; 7] = [
        Segment::Dns,
        Segment::Tcp,
        Segment::Proxy,
        Segment::Tls,
        Segment::Wait,
        Segment::Server,
        Segment::Body,
    ];

    /// The letter drawn without colour.
    pub(crate) fn letter(self) -> char {
        match self {
            Segment::Dns => 'd',
            Segment::Tcp => 't',
            Segment::Proxy => 'p',
            Segment::Tls => 's',
            Segment::Wait => 'w',
            Segment::Server => 'r',
            Segment::Body => 'b',
        }
    }

    /// The legend's name.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Segment::Dns => "dns",
            Segment::Tcp => "tcp",
            Segment::Proxy => "proxy",
            Segment::Tls => "tls",
            Segment::Wait => "wait for a connection",
            Segment::Server => "server",
            Segment::Body => "body",
        }
    }

    /// The terminal colour (the page's phase colours, near enough).
    fn colour(self) -> Color {
        match self {
            Segment::Dns => Color::Magenta,
            Segment::Tcp => Color::Yellow,
            Segment::Proxy => Color::Color256(130),
            Segment::Tls => Color::Blue,
            Segment::Wait => Color::Color256(245),
            Segment::Server => Color::Green,
            Segment::Body => Color::Cyan,
        }
    }
}

/// The phases of one request, ms, in bar order; they add up to its total.
pub(crate) fn segments(r: &RequestRow) -> Vec<(Segment, f64)> {
    let own_connect = r.reused == Some(false) && r.paid_for_connection == Some(true);
    let mut out = Vec::new();
    let mut connect = 0.0;
    if own_connect {
        let proxy = r
            .setup
            .and_then(|s| s.proxy)
            .map(|d| d.as_secs_f64() * 1000.0);
        for (seg, ms) in [
            (Segment::Dns, r.dns_ms),
            (Segment::Tcp, r.tcp_ms),
            (Segment::Proxy, proxy),
            (Segment::Tls, r.tls_ms),
        ] {
            if let Some(ms) = ms {
                out.push((seg, ms));
                connect += ms;
            }
        }
    }
    let wait_total = r.wait_ms.unwrap_or(0.0).min(r.total_ms);
    out.push((Segment::Wait, (wait_total - connect).max(0.0)));
    let headers = r.ttfb_ms.unwrap_or(r.total_ms).min(r.total_ms);
    out.push((Segment::Server, (headers - wait_total).max(0.0)));
    out.push((Segment::Body, (r.total_ms - headers).max(0.0)));
    out.into_iter().map(|(s, v)| (s, round3(v))).collect()
}

/// The bar of `parts` in `width` cells at `ms_per_cell`: each phase from
/// the rounded cell of its start to that of its end, so the bar's length
/// is the request's total and phases shorter than a cell may vanish.
fn bar(parts: &[(Segment, f64)], ms_per_cell: f64, width: usize, colour: bool) -> String {
    let mut out = String::new();
    let mut at = 0.0;
    let mut drawn = 0usize;
    for &(seg, ms) in parts {
        at += ms;
        let end = ((at / ms_per_cell).round() as usize).min(width);
        let n = end.saturating_sub(drawn);
        if n > 0 {
            if colour {
                let style = Style::new().fg(seg.colour()).force_styling(true);
                out.push_str(&style.apply_to("█".repeat(n)).to_string());
            } else {
                out.extend(std::iter::repeat_n(seg.letter(), n));
            }
        }
        drawn = end.max(drawn);
    }
    out.push_str(&" ".repeat(width.saturating_sub(drawn)));
    out
}

/// What the request's pool outcome was, for the right of the bar.
fn outcome(r: &RequestRow) -> String {
    let conn = r
        .connection_id
        .map_or(String::new(), |c| format!(" conn #{c}"));
    if r.failed() {
        return format!("failed: {}", r.error_type.as_deref().unwrap_or("error"));
    }
    match (r.pool_outcome(), r.miss_reason) {
        (Some("new_connection"), Some(why)) => format!("miss {why}, new{conn}"),
        (Some("waited_for_busy"), Some(why)) => format!("miss {why}, waited for{conn}"),
        (Some("waited_for_busy"), None) => format!("miss, waited for{conn}"),
        (Some("new_connection"), None) => format!("miss, new{conn}"),
        _ => format!("idle hit{conn}"),
    }
}

/// The waterfall of `modes` (name and rows) as lines, `width` columns wide.
pub(crate) fn render(modes: &[(&str, &[RequestRow])], width: usize, colour: bool) -> Vec<String> {
    let slowest = modes
        .iter()
        .flat_map(|(_, rows)| rows.iter())
        .map(|r| r.total_ms)
        .fold(0.0_f64, f64::max);
    let label_width = modes
        .iter()
        .flat_map(|(m, rows)| {
            rows.iter()
                .map(move |r| m.len() + 1 + r.index.to_string().len())
        })
        .max()
        .unwrap_or(4);
    // label, " |", bar, "| ", total (10), "  ", outcome (~32)
    let bar_width = width.saturating_sub(label_width + 4 + 10 + 2 + 32).max(20);
    let ms_per_cell = (slowest / bar_width as f64).max(1e-9);
    let mut lines = Vec::new();
    let legend: Vec<String> = Segment::ALL
        .iter()
        .map(|s| {
            let mark = if colour {
                Style::new()
                    .fg(s.colour())
                    .force_styling(true)
                    .apply_to("█")
                    .to_string()
            } else {
                s.letter().to_string()
            };
            format!("{mark} {}", s.name())
        })
        .collect();
    lines.push(format!(
        "waterfall (one cell = {:.2} ms): {}",
        ms_per_cell,
        legend.join("  ")
    ));
    for (mode, rows) in modes {
        for r in rows.iter() {
            let label = format!("{mode} {}", r.index);
            lines.push(format!(
                "{label:>label_width$} |{}| {:>7.1} ms  {}",
                bar(&segments(r), ms_per_cell, bar_width, colour),
                r.total_ms,
                outcome(r)
            ));
        }
    }
    lines
}

/// Prints the waterfall of `modes` to stdout, as wide as the terminal
/// (100 columns when stdout is not one), coloured when stdout is a
/// terminal with colours on.
pub(crate) fn print(modes: &[(&str, &[RequestRow])]) {
    let term = Term::stdout();
    let width = term
        .size_checked()
        .map_or(100, |(_, cols)| usize::from(cols));
    let colour = term.is_term() && console::colors_enabled();
    for line in render(modes, width, colour) {
        println!("{line}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each phase takes the cells from its rounded start to its rounded
    /// end, so the bar is as long as the total; the rest is blank.
    #[test]
    fn bars_are_drawn_to_scale() {
        let parts = [
            (Segment::Tcp, 10.0),
            (Segment::Tls, 20.0),
            (Segment::Wait, 0.0),
            (Segment::Server, 60.0),
            (Segment::Body, 10.0),
        ];
        let drawn = bar(&parts, 2.0, 60, false);
        let want = format!(
            "{}{}{}{}{}",
            "t".repeat(5),
            "s".repeat(10),
            "r".repeat(30),
            "b".repeat(5),
            " ".repeat(10)
        );
        assert_eq!(drawn, want);
        // A phase shorter than half a cell vanishes; the total stays.
        let drawn = bar(
            &[(Segment::Dns, 0.4), (Segment::Server, 9.6)],
            1.0,
            12,
            false,
        );
        assert_eq!(drawn, format!("{}  ", "r".repeat(10)));
        // Coloured: escape codes, the same cells.
        let coloured = bar(&parts, 2.0, 60, true);
        assert!(coloured.contains('\u{1b}'));
        assert_eq!(console::strip_ansi_codes(&coloured).chars().count(), 60);
    }
}
