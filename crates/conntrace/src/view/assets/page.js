// Draws the page from the model in #page-data (built by conntrace from the
// exported spans) with D3: scales, axes, shapes and data joins.
"use strict";
(function () {
  const started = performance.now();
  const page = JSON.parse(document.getElementById("page-data").textContent);
  const PHASES = ["dns", "tcp", "proxy", "tls"];
  // Tableau 10 (d3.schemeTableau10): purple, orange, brown, blue.
  const phaseColour = d3.scaleOrdinal(PHASES, [
    d3.schemeTableau10[6], d3.schemeTableau10[1], d3.schemeTableau10[8], d3.schemeTableau10[0],
  ]);
  const heat = d3.scaleSequential(d3.interpolateReds).domain([0, 1]);
  const ROW = 14, STEP = 18, TRACE_GAP = 10, TRACE_HEAD = 14, TOP = 24;

  const f2 = d3.format(".2f"), f1 = d3.format(".1f");
  const fmtMs = (v) => (v >= 1000 ? f2(v / 1000) + " s" : f1(v) + " ms");
  const DIAMOND = d3.symbol(d3.symbolDiamond, 60)();
  const pct = d3.format(".0%");
  const plural = (n, one, many) => n + " " + (n === 1 ? one : many);

  // Summary and legend.
  const groups = page.groups;
  const summary = [
    plural(page.spans_total, "span", "spans") + " in " + plural(page.traces_total, "trace", "traces"),
    plural(groups.length, "group", "groups"),
  ];
  if (page.warmup_traces) summary.push(plural(page.warmup_traces, "warm-up trace", "warm-up traces") + " left out (demo.warmup = true)");
  if (page.other_traces) summary.push(plural(page.other_traces, "trace", "traces") + " without HTTP spans not drawn");
  summary.push("made by conntrace " + page.version);
  d3.select("#summary").text(summary.join("; "));

  const legend = d3.select("#legend");
  const swatch = (cls, fill, text) => {
    const item = legend.append("span").attr("class", "item legend-" + cls);
    const svg = item.append("svg").attr("width", 22).attr("height", 12);
    if (cls === "miss") {
      svg.append("path").attr("class", "miss-marker").attr("transform", "translate(11,6)")
        .attr("d", d3.symbol(d3.symbolDiamond, 50)());
    } else if (cls === "link") {
      svg.append("path").attr("class", "link").attr("d", "M1,10 C11,10 11,2 21,2");
    } else {
      const r = svg.append("rect").attr("x", 1).attr("y", 1).attr("width", 20).attr("height", 10)
        .attr("class", "bar " + cls);
      if (fill) r.attr("fill", fill);
    }
    item.append("span").text(text);
  };
  const defs = d3.select("body").append("svg").attr("width", 0).attr("height", 0)
    .style("position", "absolute").append("defs");
  defs.append("pattern").attr("id", "hatch").attr("patternUnits", "userSpaceOnUse")
    .attr("width", 5).attr("height", 5).attr("patternTransform", "rotate(45)")
    .call((p) => {
      p.append("rect").attr("width", 5).attr("height", 5).attr("fill", "#e4e7ee");
      p.append("line").attr("x1", 0).attr("y1", 0).attr("x2", 0).attr("y2", 5)
        .attr("stroke", "#a5adbb").attr("stroke-width", 2);
    });
  swatch("phase-dns", phaseColour("dns"), "DNS (dns.lookup)");
  swatch("phase-tcp", phaseColour("tcp"), "TCP connect");
  swatch("phase-proxy", phaseColour("proxy"), "proxy CONNECT");
  swatch("phase-tls", phaseColour("tls"), "TLS handshake");
  swatch("wait", null, "wait for a connection");
  swatch("server", null, "server (to the response headers)");
  swatch("body", null, "body");
  // Spans without the http.receive.start event (files from other tools or
  // older versions) get one bar from the connection to the end.
  const unsplit = groups.some((g) => g.shown.some((t) => t.rows.some(
    (r) => r.kind === "request" && r.headers_ms == null && !r.error_type)));
  if (unsplit) swatch("response", null, "server + body (no http.receive.start event)");
  swatch("root", null, "trace root");
  swatch("miss", null, "pool miss (reason beside the bar)");
  swatch("link", null, "served by this connection");

  // Overview: per group, the per-batch miss rates and calls in flight.
  // Every container first, so each measures its share of the row.
  const overview = d3.select("#overview");
  const overviewDivs = groups.map((g) => overview.append("div").attr("class", "group").attr("data-group", g.name));
  const timeline = d3.select("#timeline");
  const columns = groups.map((g) => timeline.append("div").attr("class", "column").attr("data-group", g.name));
  groups.forEach((g, i) => {
    const div = overviewDivs[i];
    div.append("h2").text(g.name).append("span").attr("class", "sub")
      .text("  " + g.hosts.join(", ") + " · " + plural(g.traces, "trace", "traces") + ", "
        + plural(g.requests, "request", "requests") + ", " + plural(g.misses, "miss", "misses")
        + (g.requests ? " (" + pct(g.misses / g.requests) + ")" : "")
        + (g.failed ? ", " + g.failed + " failed" : ""));
    const width = Math.max(400, div.node().clientWidth || 520);
    drawHeat(div, g, width);
    drawInFlight(div, g, width);
  });

  function drawHeat(div, g, width) {
    div.append("div").attr("class", "sub").text("miss rate per batch position (fan-out batch index, else request position in its trace)");
    const n = g.batches.length;
    const cell = Math.max(6, Math.min(56, (width - 60) / Math.max(1, n)));
    const svg = div.append("svg").attr("class", "heat").attr("width", width).attr("height", 46);
    const cells = svg.selectAll("g.heat-batch").data(g.batches).join("g")
      .attr("class", "heat-batch")
      .attr("data-batch", (b) => b.index)
      .attr("data-calls", (b) => b.calls)
      .attr("data-misses", (b) => b.misses)
      .attr("transform", (b, i) => "translate(" + (i * cell) + ",0)");
    cells.append("rect").attr("class", "heat-cell").attr("width", cell).attr("height", 26)
      .attr("fill", (b) => heat(b.miss_ratio));
    cells.filter(() => cell >= 30).append("text").attr("x", cell / 2).attr("y", 17)
      .attr("text-anchor", "middle").attr("class", "heat-text")
      .style("fill", (b) => (b.miss_ratio > 0.55 ? "#fff" : "#1d2330"))
      .text((b) => pct(b.miss_ratio));
    cells.filter((b, i) => cell >= 30 || i % Math.ceil(30 / cell) === 0).append("text")
      .attr("x", cell / 2).attr("y", 40).attr("text-anchor", "middle").attr("class", "note")
      .text((b) => (cell >= 30 ? "b" : "") + b.index);
    cells.append("title").text((b) => "batch " + b.index + ": " + b.misses + " of " + b.calls
      + " missed" + (b.misses ? " (" + Object.entries(b.reasons).map(([k, v]) => k + " " + v).join(", ") + ")" : ""));
  }

  function drawInFlight(div, g, width) {
    div.append("div").attr("class", "sub").text("requests in flight over time"
      + (g.idle_limit != null ? " against the idle limit (pool_max_idle_per_host)" : " (the spans do not record the idle limit)"));
    const height = 120, m = { top: 8, right: 92, bottom: 20, left: 30 };
    const svg = div.append("svg").attr("class", "inflight").attr("width", width).attr("height", height)
      .attr("data-peak", g.in_flight_peak);
    const x = d3.scaleLinear([0, Math.max(1, g.duration_ms)], [m.left, width - m.right]);
    const top = Math.max(g.in_flight_peak, g.idle_limit != null ? g.idle_limit : 0, 1);
    const y = d3.scaleLinear([0, top * 1.15], [height - m.bottom, m.top]).nice();
    svg.append("rect").attr("class", "shown-window")
      .attr("x", x(g.shown_from_ms)).attr("y", m.top)
      .attr("width", Math.max(1, x(g.shown_to_ms) - x(g.shown_from_ms)))
      .attr("height", height - m.top - m.bottom)
      .append("title").text("the traces drawn below");
    const pts = g.in_flight.concat([[g.duration_ms, 0]]);
    svg.append("path").attr("class", "inflight-area")
      .attr("d", d3.area().curve(d3.curveStepAfter).x((p) => x(p[0])).y0(y(0)).y1((p) => y(p[1]))(pts));
    svg.append("path").attr("class", "inflight-line")
      .attr("d", d3.line().curve(d3.curveStepAfter).x((p) => x(p[0])).y((p) => y(p[1]))(pts));
    if (g.idle_limit != null) {
      svg.append("line").attr("class", "idle-limit")
        .attr("x1", m.left).attr("x2", width - m.right)
        .attr("y1", y(g.idle_limit)).attr("y2", y(g.idle_limit));
      svg.append("text").attr("class", "idle-limit-text").attr("x", width - m.right + 4)
        .attr("y", y(g.idle_limit) + 4).text("idle limit " + g.idle_limit);
    }
    // The peak's label above its level, moved up clear of the idle limit's.
    let peakY = y(g.in_flight_peak) - 4;
    if (g.idle_limit != null && Math.abs(peakY - (y(g.idle_limit) + 4)) < 12) peakY = y(g.idle_limit) - 9;
    svg.append("text").attr("class", "note peak-text").attr("x", width - m.right + 4)
      .attr("y", Math.max(10, peakY)).text("peak " + g.in_flight_peak);
    svg.append("g").attr("class", "axis").attr("transform", "translate(0," + (height - m.bottom) + ")")
      .call(d3.axisBottom(x).ticks(Math.max(2, Math.floor(width / 90))).tickFormat((v) => fmtMs(v)));
    svg.append("g").attr("class", "axis").attr("transform", "translate(" + m.left + ",0)")
      .call(d3.axisLeft(y).tickValues(y.ticks(4).filter(Number.isInteger)).tickFormat(d3.format("d")));
  }

  // Timeline: per group a column; the shown traces on one time axis, the
  // same milliseconds per pixel in every column.
  const windowMs = Math.max(1, d3.max(groups, (g) => g.shown_to_ms - g.shown_from_ms) || 1);
  const colWidth = columns.map((col) => Math.max(480, col.node().clientWidth || 640));
  const layout = lay();
  groups.forEach((g, i) => drawColumn(g, columns[i], i));

  // The text right of a row's bar, as [class, text] tspans.
  function noteParts(row, t) {
    let note = fmtMs(page.spans[row.span].duration_ms);
    if (row.kind === "root" && t.misses) note += " · " + plural(t.misses, "miss", "misses");
    if (row.kind === "connection") note += " · " + (row.outcome || (row.error_type ? "failed" : "no outcome"));
    const parts = [["dur", note]];
    if (row.miss_reason) parts.push(["miss-text", " " + row.miss_reason]);
    if (row.error_type) parts.push(["miss-text", " " + row.error_type]);
    if (row.kind === "request" && row.served_how === "link" && row.served_by == null) {
      parts.push(["note", " via conn #" + row.connection_id + " (not drawn)"]);
    }
    return parts;
  }

  // Measures the labels and notes as drawn (one layout pass): the label
  // column fits the longest row label, up to 40 % of the narrowest column
  // (longer ones end in "…", the whole text on hover; a trace's root label
  // heads its block across the whole column), and the time scale leaves
  // room right of every bar for its note.
  function lay() {
    const labelMax = Math.min(340, 0.4 * (d3.min(colWidth) || 480));
    const measure = d3.select("body").append("svg").attr("class", "timeline")
      .attr("width", 0).attr("height", 0).style("position", "absolute").style("visibility", "hidden");
    const rows = [];
    groups.forEach((g, i) => g.shown.forEach((t) => t.rows.forEach((row) => {
      const label = measure.append("text").attr("class", labelClass(row)).text(row.label).node();
      const note = measure.append("text").attr("class", "bar-note");
      for (const [cls, text] of noteParts(row, t)) note.append("tspan").attr("class", cls).text(text);
      rows.push({ g, i, row, label, note: note.node() });
    })));
    const labels = new Map();
    let left = 60;
    for (const r of rows) {
      let text = r.row.label;
      const max = r.row.kind === "root" ? colWidth[r.i] - 8 : labelMax;
      while (text.length > 1 && r.label.getComputedTextLength() > max) {
        text = text.slice(0, -1);
        r.label.textContent = text + "…";
      }
      labels.set(r.row, r.label.textContent);
      if (r.row.kind !== "root") left = Math.max(left, labelX(r.row) + r.label.getComputedTextLength() + 16);
    }
    left = Math.ceil(left);
    // Pixels per ms: the bars fit every column; each note fits its column,
    // unless that would shrink the bars to under a quarter (the column
    // then scrolls).
    const barsK = d3.min(colWidth, (w) => (w - left - 28) / windowMs); // room for the last tick's text
    let k = barsK;
    for (const r of rows) {
      const ms = Math.max(0.001, r.row.end_ms - r.g.shown_from_ms);
      k = Math.min(k, (colWidth[r.i] - left - 10 - r.note.getComputedTextLength()) / ms);
    }
    k = Math.max(k, barsK / 4);
    const widths = colWidth.slice();
    for (const r of rows) {
      const end = left + Math.max(0, r.row.end_ms - r.g.shown_from_ms) * k + 10 + r.note.getComputedTextLength();
      widths[r.i] = Math.max(widths[r.i], Math.ceil(end));
    }
    measure.remove();
    return { left, k, widths, labels };
  }

  function labelClass(row) {
    return "row-label" + (row.kind === "root" ? " trace-label" : "");
  }

  function labelX(row) {
    return row.kind === "connection" ? 14 : 2;
  }

  function drawColumn(g, col, i) {
    col.append("h2").text(g.name).append("span").attr("class", "sub")
      .text("  " + g.shown.length + " of " + plural(g.traces, "trace", "traces") + " shown, from "
        + fmtMs(g.shown_from_ms) + " into the group");
    const width = layout.widths[i], LEFT = layout.left, plot = windowMs * layout.k;
    let height = TOP;
    for (const t of g.shown) height += TRACE_HEAD + t.rows.length * STEP + TRACE_GAP;
    // Built detached and attached once: no style work while it grows.
    const svg = d3.create("svg").attr("class", "timeline").attr("width", width).attr("height", height + 4);
    const x = d3.scaleLinear([g.shown_from_ms, g.shown_from_ms + windowMs], [LEFT, LEFT + plot]);
    svg.append("g").attr("class", "axis").attr("transform", "translate(0," + (TOP - 4) + ")")
      .call(d3.axisTop(x).ticks(Math.max(2, Math.floor(plot / 80)))
        .tickFormat((v) => fmtMs(v - g.shown_from_ms)));
    const links = svg.append("g").attr("class", "links");
    const rowY = new Map(); // span index -> row centre y
    const rowsAt = []; // [row, y]
    let yTop = TOP;
    for (const t of g.shown) {
      const tg = svg.append("g").attr("class", "trace").attr("data-trace-id", t.trace_id)
        .attr("data-misses", t.misses);
      tg.append("line").attr("class", "trace-sep").attr("x1", 0).attr("x2", width)
        .attr("y1", yTop - 3).attr("y2", yTop - 3);
      yTop += TRACE_HEAD;
      t.rows.forEach((row, i) => {
        const y = yTop + i * STEP + ROW / 2;
        rowY.set(row.span, y);
        rowsAt.push([row, y]);
        drawRow(tg, row, y, x, t);
      });
      yTop += t.rows.length * STEP + TRACE_GAP;
    }
    // Links: from the serving connection's ready moment to the moment the
    // request had its connection.
    const link = d3.linkHorizontal();
    for (const [row, y] of rowsAt) {
      if (row.kind !== "request" || row.served_by == null || !rowY.has(row.served_by)) continue;
      const conn = page.spans[row.served_by];
      const readyAt = conn.start_ms + conn.duration_ms;
      const had = row.start_ms + (row.wait_ms || 0);
      links.append("path").attr("class", "link " + row.served_how)
        .attr("data-from", page.spans[row.span].id).attr("data-to", conn.id)
        .attr("d", link({ source: [x(readyAt), rowY.get(row.served_by)], target: [x(had), y] }));
    }
    svg.node().appendChild(links.node()); // on top of the bars
    col.node().appendChild(svg.node());
  }

  function drawRow(tg, row, y, x, t) {
    const span = page.spans[row.span];
    const g = tg.append("g").attr("class", "row " + row.kind).attr("data-span", row.span)
      .attr("data-span-id", span.id);
    if (row.miss_reason) g.attr("data-miss", row.miss_reason);
    if (row.connection_id != null) g.attr("data-connection-id", row.connection_id);
    // Labels fit left of the time axis (see lay); a shortened one has
    // the whole text in its title, and the hover shows the span.
    const label = layout.labels.get(row);
    const labelText = g.append("text").attr("class", labelClass(row))
      .attr("x", labelX(row)).attr("y", row.kind === "root" ? y - ROW / 2 - 3 : y + 4)
      .attr("data-span", row.span).text(label);
    if (label !== row.label) labelText.append("title").text(row.label);
    const x0 = x(row.start_ms), x1 = Math.max(x(row.end_ms), x0 + 1);
    const bar = (cls, a, b, h) => g.append("rect").attr("class", "bar " + cls)
      .attr("x", a).attr("y", y - h / 2).attr("width", Math.max(1, b - a)).attr("height", h)
      .attr("data-span", row.span);
    if (row.kind === "root") {
      bar("root", x0, x1, 6);
    } else if (row.kind === "request") {
      // wait | server | body, as the terminal waterfall splits them: the
      // connection was had at start + wait_time, the headers arrived at
      // the http.receive.start event. data-ms holds each part's length.
      const part = (cls, a, b) => bar(cls, x(a), Math.max(x(b), x(a) + 1), ROW)
        .attr("data-ms", d3.format(".3f")(Math.max(0, b - a)));
      const had = Math.min(row.end_ms, row.start_ms + (row.wait_ms || 0));
      if (row.wait_ms > 0) part("wait", row.start_ms, had);
      if (row.headers_ms != null) {
        const headers = Math.min(row.end_ms, Math.max(had, row.headers_ms));
        part("server", had, headers);
        part("body", headers, row.end_ms);
      } else {
        part(row.error_type ? "failed" : "response", had, row.end_ms);
      }
      if (row.miss_reason) {
        g.append("path").attr("class", "miss-marker").attr("data-reason", row.miss_reason)
          .attr("data-span", row.span)
          .attr("transform", "translate(" + (x0 - 7) + "," + y + ")")
          .attr("d", DIAMOND);
      }
    } else {
      bar("connection", x0, x1, ROW);
      g.selectAll("rect.phase").data(row.phases || []).join("rect")
        .attr("class", (p) => "phase phase-" + p.phase + (p.error_type ? " failed-phase" : ""))
        .attr("data-span", (p) => p.span)
        .attr("fill", (p) => phaseColour(p.phase))
        .attr("x", (p) => x(p.start_ms)).attr("y", y - ROW / 2 + 1)
        .attr("width", (p) => Math.max(1, x(p.end_ms) - x(p.start_ms))).attr("height", ROW - 2);
    }
    const text = g.append("text").attr("class", "bar-note").attr("x", x1 + 4).attr("y", y + 4);
    for (const [cls, s] of noteParts(row, t)) text.append("tspan").attr("class", cls).text(s);
  }

  // Hover: every element with data-span shows that span.
  const tip = d3.select("#tooltip");
  document.addEventListener("mousemove", (ev) => {
    const el = ev.target.closest && ev.target.closest("[data-span]");
    if (!el) { tip.style("display", "none"); return; }
    const span = page.spans[+el.getAttribute("data-span")];
    tip.html("");
    tip.append("div").attr("class", "tt-title").text(span.name + " · " + fmtMs(span.duration_ms)
      + " · starts at " + fmtMs(span.start_ms));
    if (span.status) tip.append("div").attr("class", "miss-text").text(span.status);
    const table = tip.append("table");
    const attrs = [["span id", span.id]];
    for (let i = 0; i + 1 < span.attrs.length; i += 2) attrs.push([page.strings[span.attrs[i]], page.strings[span.attrs[i + 1]]]);
    table.selectAll("tr").data(attrs).join("tr").selectAll("td").data((d) => d).join("td").text((d) => d);
    const events = span.events || [], links = span.links || [];
    if (events.length) {
      tip.append("div").attr("class", "tt-section").text("events");
      for (const e of events) {
        const attrs = page.strings[e.attrs];
        tip.append("div").text(fmtMs(e.at_ms) + " " + e.name + (attrs ? " (" + attrs + ")" : ""));
      }
    }
    if (links.length) {
      tip.append("div").attr("class", "tt-section").text("links");
      for (const l of links) tip.append("div").text(page.strings[l]);
    }
    tip.style("display", "block");
    const w = tip.node().offsetWidth, h = tip.node().offsetHeight;
    const left = Math.min(ev.clientX + 14, window.innerWidth - w - 8);
    const top = ev.clientY + 14 + h > window.innerHeight ? ev.clientY - h - 10 : ev.clientY + 14;
    tip.style("left", Math.max(4, left) + "px").style("top", Math.max(4, top) + "px");
  });

  // Layout check (the tests read it): texts cut by their picture's edge,
  // and row labels running into the time axis.
  let overflow = 0;
  d3.selectAll("svg.timeline, svg.inflight, svg.heat").each(function () {
    const box = this.getBoundingClientRect();
    d3.select(this).selectAll("text").each(function () {
      const b = this.getBoundingClientRect();
      if (b.left < box.left - 0.5 || b.right > box.right + 0.5) overflow++;
      else if (this.classList.contains("row-label") && !this.classList.contains("trace-label")
        && b.right > box.left + layout.left - 8) overflow++;
    });
  });
  document.body.dataset.overflow = String(overflow);
  document.body.dataset.rendered = "ok";
  document.body.dataset.renderMs = String(Math.round(performance.now() - started));
})();
