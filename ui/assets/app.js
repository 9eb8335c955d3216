// The live view's page: renders each snapshot the server sends over /events.
// Every string from the services (stream, computation and injector names, held-by reasons)
// goes into the page as text (textContent), never as markup; the graph is SVG the server
// drew with every name escaped, parsed as XML (no script of it ever runs: the page's
// Content-Security-Policy allows this file's scripts only).
"use strict";

(function () {
  const state = { paused: false, latest: null, shown: null, table: false, selected: null };

  function el(tag, attributes, ...children) {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(attributes || {})) {
      if (value !== undefined && value !== null) node.setAttribute(name, String(value));
    }
    for (const child of children) {
      if (child === undefined || child === null) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  function number(value, digits) {
    if (value === null || value === undefined) return "–";
    return Number(value).toLocaleString(undefined, { maximumFractionDigits: digits || 0 });
  }

  function duration(seconds) {
    if (seconds === null || seconds === undefined) return "–";
    if (seconds < 120) return seconds.toFixed(1) + " s";
    if (seconds < 7200) return (seconds / 60).toFixed(0) + " min";
    if (seconds < 172800) return (seconds / 3600).toFixed(0) + " h";
    return number(seconds / 86400) + " d";
  }

  function eventTime(micros) {
    if (micros === null || micros === undefined) return "–";
    const date = new Date(micros / 1000);
    return isNaN(date.getTime()) ? String(micros) : date.toISOString().replace(".000Z", "Z");
  }

  function sparkline(values) {
    const ns = "http://www.w3.org/2000/svg";
    const svg = document.createElementNS(ns, "svg");
    svg.setAttribute("class", "sparkline");
    svg.setAttribute("width", "90");
    svg.setAttribute("height", "20");
    if (!values || values.length < 2) return svg;
    const low = Math.min(...values), high = Math.max(...values);
    const span = high - low || 1;
    const points = values.map((v, i) =>
      (i * 88 / (values.length - 1) + 1).toFixed(1) + "," + (19 - (v - low) * 18 / span).toFixed(1));
    const line = document.createElementNS(ns, "polyline");
    line.setAttribute("points", points.join(" "));
    svg.append(line);
    const title = document.createElementNS(ns, "title");
    title.textContent = "lag from " + duration(values[0]) + " to " + duration(values[values.length - 1]);
    svg.append(title);
    return svg;
  }

  function fill(tbody, rows) {
    tbody.replaceChildren(...rows);
  }

  function renderHeadline(snapshot) {
    const h = snapshot.headline;
    const cards = [
      ["Data freshness", duration(h.freshness_s), "now minus the output's low watermark"],
      ["System latency", duration(h.system_latency_s),
        "how long the oldest record a computation has not read yet has waited (since this view first saw it)"],
      ["Input", h.input_rate === null ? "–" : number(h.input_rate) + "/s", "records/s the injectors write"],
      ["Processed", h.processed_rate === null ? "–" : number(h.processed_rate) + "/s", "records/s the computations consume"],
      ["Kafka lag", number(h.kafka_lag) + " records", "written, not yet consumed"],
      ["Keys committed", h.committed_keys_per_second === null || h.committed_keys_per_second === undefined
        ? "\u2013" : number(h.committed_keys_per_second) + "/s", "per second, all computations"],
      ["Dead letters", h.dead_letters_per_min === null ? "–" : number(h.dead_letters_per_min, 1) + "/min", "records set aside"],
      ["Late records", h.late_per_min === null || h.late_per_min === undefined ? "\u2013"
        : number(h.late_per_min, 1) + "/min", "records behind their computation's input watermark"],
      ["Stalled", number(h.stalled), "sources whose watermark does not move while input waits"],
    ];
    document.getElementById("headline").replaceChildren(...cards.map(([label, value, help]) =>
      el("div", { class: "card" + (label === "Stalled" && h.stalled ? " bad" : ""), title: help },
        el("div", { class: "label" }, label), el("div", { class: "value" }, value))));
  }

  function renderGraph(snapshot) {
    const box = document.getElementById("graph");
    const parsed = new DOMParser().parseFromString(snapshot.svg, "image/svg+xml");
    const svg = parsed.documentElement;
    if (svg.nodeName !== "svg") {
      box.replaceChildren(el("p", {}, "The graph could not be drawn."));
      return;
    }
    box.replaceChildren(document.importNode(svg, true));
    for (const node of box.querySelectorAll("g.node")) {
      node.addEventListener("click", () => select(node.getAttribute("data-node")));
    }
    highlight(snapshot);
  }

  function highlight(snapshot) {
    const box = document.getElementById("graph");
    const marked = new Set();
    for (const [computation, path] of Object.entries(snapshot.held || {})) {
      const node = snapshot.nodes.find((n) => n.id === computation);
      const show = state.selected ? state.selected === computation : node && node.health !== "ok";
      if (show && path.length > 1) path.forEach((id) => marked.add(id));
    }
    for (const node of box.querySelectorAll("g.node")) {
      const id = node.getAttribute("data-node");
      node.classList.toggle("held-path", marked.has(id));
      node.classList.toggle("selected", id === state.selected);
    }
    for (const edge of box.querySelectorAll("path.edge")) {
      edge.classList.toggle("held-path",
        marked.has(edge.getAttribute("data-from")) && marked.has(edge.getAttribute("data-to")));
    }
  }

  function select(id) {
    state.selected = state.selected === id ? null : id;
    if (state.shown) highlight(state.shown);
    if (state.selected && state.selected.startsWith("computation/")) showDetail(state.selected);
  }

  // -- a computation's key intervals, from the store ----------------------------------------
  const detail = { id: null, timer: null, maxRows: Infinity }; // maxRows: where counts stop

  function showDetail(id) {
    detail.id = id;
    document.getElementById("detail").hidden = false;
    const name = id.split("/").slice(2).join("/");
    document.getElementById("detail-title").textContent = "Computation " + name;
    clearTimeout(detail.timer);
    loadDetail();
  }

  function capped(interval, count) {
    // A count that reached the read's bound is a lower bound: "1,000+".
    return number(count) + (interval.more && count >= detail.maxRows ? "+" : "");
  }

  function hash(value) {
    return "0x" + Number(value).toString(16).padStart(8, "0");
  }

  async function loadDetail() {
    const id = detail.id;
    if (!id) return;
    const name = id.split("/").slice(2).join("/");
    const status = document.getElementById("detail-status");
    try {
      const response = await fetch("/api/intervals?" + new URLSearchParams({ computation: name }));
      const result = await response.json();
      if (!response.ok) throw new Error(result.error || response.statusText);
      if (detail.id !== id) return;
      detail.maxRows = result.max_rows;
      const node = state.shown ? state.shown.nodes.find((n) => n.id === id) : null;
      const load = Object.fromEntries(((node && node.hot) || []).map(([i, r]) => [i, r]));
      // An interval's watermark lag: its own where its pending work holds it below the
      // input's watermark, the input's otherwise.
      const behind = Object.fromEntries(((node && node.intervals_behind) || []).map(([i, s]) => [i, s]));
      const lagOf = (i) => i.retired ? "" : duration(behind[i.interval] ?? (node ? node.input_lag_s : null));
      const ranges = Object.fromEntries(((result.layout && result.layout.intervals) || [])
        .map((r) => [r.interval, hash(r.low) + "\u2013" + hash(r.high)]));
      // The interval whose pending work holds the computation's watermark, if one does.
      const holding = node && /^interval \d+$/.test(node.held_by || "") ? Number(node.held_by.slice(9)) : null;
      fill(document.querySelector("#intervals tbody"), result.intervals.map((i) =>
        el("tr", { class: i.retired ? "retired" : i.interval === holding ? "holds" : "",
          title: i.interval === holding ? "its pending work holds the computation's watermark" : null },
          el("td", {}, i.interval), el("td", {}, ranges[i.interval] || (i.retired ? "retired" : "\u2013")),
          el("td", {}, i.retired ? "retired" : (i.sequencer ?? "never acquired")),
          el("td", { class: "name" }, (node && node.owners && node.owners[i.interval]) || ""),
          el("td", {}, load[i.interval] !== undefined ? number(load[i.interval]) : ""),
          el("td", {}, lagOf(i)),
          el("td", {}, capped(i, i.state_keys)), el("td", {}, capped(i, i.timers)),
          el("td", {}, eventTime(i.next_event_timer)), el("td", {}, eventTime(i.next_wall_timer)),
          el("td", {}, capped(i, i.pending_productions)), el("td", {}, capped(i, i.dedup_rows)),
          el("td", {}, number(i.fenced)))));
      const layout = result.layout;
      status.textContent = "Keyspace " + result.keyspace + ", table " + result.table + "; " +
        (layout ? "layout version " + layout.version + " of " + layout.intervals.length +
          " intervals" + (layout.pending_change ? "; pending: " + layout.pending_change : "") :
          "no layout written yet") +
        (result.history.length ? "; latest changes: " + result.history.join("; ") : "") +
        ". Counts stop at " + number(result.max_rows) + " (shown with +). " +
        "Read " + eventTime(result.read_at ?? Date.now() * 1000).replace(/\.\d+Z$/, "Z") + ".";
    } catch (error) {
      status.textContent = "Could not read the store: " + error.message;
    }
    if (detail.id === id) detail.timer = setTimeout(loadDetail, 5000);
  }

  function renderNodes(snapshot) {
    fill(document.querySelector("#nodes tbody"), snapshot.nodes.map((n) =>
      el("tr", { class: "health-" + (n.health || "ok") },
        el("td", {}, n.kind), el("td", { class: "name" }, n.name), el("td", {}, n.state || ""),
        el("td", {}, n.kind === "stream" ? "" : duration(n.lag_s)),
        el("td", {}, number(n.kind === "stream" ? n.rate : n.in_rate)),
        el("td", {}, n.kind === "computation" ? number(n.backlog) : ""),
        el("td", {}, n.held_by || ""))));
  }

  function renderHeld(snapshot) {
    const byId = Object.fromEntries(snapshot.nodes.map((n) => [n.id, n]));
    const items = Object.entries(snapshot.held || {}).map(([computation, path]) => {
      const words = path.map((id, i) => {
        const node = byId[id] || { kind: "", name: id };
        const held = i === path.length - 1 && node.held_by ? " (" + node.held_by + ")" : "";
        // A stream step names the partition its reader is furthest behind on, if any.
        const reader = i > 0 ? byId[path[i - 1]] : null;
        const behind = node.kind === "stream" && reader && reader.behind &&
          reader.behind.stream === node.name ? " (partition " + reader.behind.partition + ": " +
          number(reader.behind.records) + " records unread)" : "";
        return node.kind + " " + node.name + held + behind;
      });
      const node = byId[computation];
      const item = el("li", { class: "health-" + (node ? node.health : "ok"), tabindex: "0" },
        words.join(" \u2190 "));
      item.addEventListener("click", () => select(computation));
      return item;
    });
    document.getElementById("held").replaceChildren(
      ...(items.length ? items : [el("li", {}, "No computation is running.")]));
  }

  function renderComputations(snapshot) {
    const rows = snapshot.nodes.filter((n) => n.kind === "computation").map((n) =>
      el("tr", { class: "health-" + n.health },
        el("td", {}, n.topology), el("td", { class: "name" }, computationLink(n)),
        el("td", { class: "health" }, n.health),
        el("td", {}, n.state === "complete" ? "complete" : eventTime(n.watermark)),
        el("td", {}, duration(n.lag_s)), el("td", {}, sparkline(n.lag_trend)),
        el("td", {}, number(n.in_rate) + " / " + number(n.out_rate)),
        el("td", {}, number(n.backlog)),
        el("td", {}, n.waiting_s === null || n.waiting_s === undefined ? "\u2013"
          : (n.waiting_at_least ? "\u2265 " : "") + duration(n.waiting_s)),
        el("td", {}, n.held_by),
        el("td", {}, (n.hot || []).map(([i, r]) => "interval " + i + " (" + number(r) + ")").join(", "))));
    fill(document.querySelector("#computations tbody"), rows);
  }

  function computationLink(node) {
    const link = el("button", { type: "button", class: "link", title: "its key intervals" },
      node.name);
    link.addEventListener("click", () => {
      state.selected = null;
      select(node.id);
      document.getElementById("detail").scrollIntoView();
    });
    return link;
  }

  function renderCommits(snapshot) {
    const rows = snapshot.nodes.filter((n) => n.kind === "computation").map((n) => {
      const stats = n.stats || {}, rates = n.rates || {};
      const count = (name) => el("td", { class: stats[name] ? "counted " + name : "" },
        stats[name] === undefined ? "\u2013" : number(stats[name]));
      return el("tr", {},
        el("td", { class: "name" }, n.name), count("batches"),
        el("td", {}, number(rates.processed)), el("td", {}, number(rates.committed_keys)),
        count("duplicates"), count("dead_letters"), count("pending"), count("resent"),
        count("transactions"), count("transaction_failures"), count("aborted_commits"),
        count("fenced_producers"), count("unknown_outcomes"), count("sequencer_conflicts"),
        count("failed_attempts"),
        el("td", {}, n.cache_hit_rate === null || n.cache_hit_rate === undefined ? "\u2013"
          : Math.round(n.cache_hit_rate * 100) + "%"));
    });
    fill(document.querySelector("#commits tbody"), rows);
  }

  function renderStreams(snapshot) {
    const names = Object.fromEntries(snapshot.nodes.map((n) => [n.id, n.name]));
    const rows = snapshot.streams.map((s) =>
      el("tr", { class: s.dead_letters ? "dead-letters" : "" },
        el("td", { class: "name" }, streamLink(s.name)),
        el("td", {}, Object.entries(s.partitions).map(([p, end]) => p + ": " + number(end)).join(", ")),
        el("td", {}, number(s.records)), el("td", {}, number(s.rate)),
        el("td", {}, s.writers.map((w) => names[w] || w).join(", ")),
        el("td", {}, ...s.consumers.map((c) => el("div", {
          title: "records not yet consumed, per partition: " + Object.entries(c.partitions || {})
            .map(([p, n]) => p + ": " + number(n)).join(", ") },
          (names[c.computation] || c.computation) + ": " + number(c.lag) + " records, " +
          duration(c.lag_s) + " ", sparkline(c.trend))))));
    fill(document.querySelector("#streams tbody"), rows);
  }

  function renderEvents(snapshot) {
    const items = snapshot.events.slice().reverse().map((e) =>
      el("li", { class: "event " + e.kind },
        el("time", {}, eventTime(e.at)), " ", e.source ? el("span", { class: "name" }, e.source) : null,
        e.source ? ": " : "", e.text));
    document.getElementById("events").replaceChildren(
      ...(items.length ? items : [el("li", {}, "Nothing happened yet.")]));
  }

  // -- the record browser --------------------------------------------------------------
  const scan = { controller: null, tailing: false, timer: null, positions: null, rows: [] };
  const MAX_ROWS = 500; // rows the table keeps while tailing: memory stays bounded

  function streamLink(name) {
    const link = el("button", { type: "button", class: "link", title: "browse its records" }, name);
    link.addEventListener("click", () => {
      const select = document.getElementById("scan-stream");
      select.value = name;
      document.getElementById("browser").scrollIntoView();
      readRecords(false);
    });
    return link;
  }

  function offer(select, values) {
    // The choices of a select, replaced only when they changed; the chosen one stays.
    if (select.options.length === values.length &&
        values.every((v, i) => select.options[i].value === v)) return;
    const chosen = select.value;
    select.replaceChildren(...values.map((v) => el("option", { value: v }, v)));
    if (values.includes(chosen)) select.value = chosen;
  }

  function fillStreamChoice(snapshot) {
    offer(document.getElementById("scan-stream"), snapshot.streams.map((s) => s.name));
  }

  function scanQuery(after) {
    const query = new URLSearchParams({ stream: document.getElementById("scan-stream").value });
    for (const [field, name] of [["scan-key", "key"], ["scan-since", "since"], ["scan-until", "until"]]) {
      const value = document.getElementById(field).value.trim();
      if (value) query.set(name, value);
    }
    query.set("limit", document.getElementById("scan-limit").value || "50");
    if (after) {
      query.set("after", Object.entries(after).map(([p, o]) => p + ":" + o).join(","));
    }
    return query;
  }

  function showValue(record) {
    const shown = record.dead_letter !== undefined ? { dead_letter: record.dead_letter } :
      record.value !== undefined ? record.value : { error: record.error, raw_hex: record.raw_hex };
    const text = typeof shown === "string" ? shown : JSON.stringify(shown);
    const cut = text.length > 300 ? text.slice(0, 299) + "\u2026" : text;
    return el("td", { class: "value", title: text }, cut);
  }

  function renderRecords() {
    fill(document.querySelector("#records tbody"), scan.rows.map((r) =>
      el("tr", { class: r.error ? "bad" : "" },
        el("td", {}, r.partition), el("td", {}, r.offset), el("td", { class: "name" }, r.key ?? ""),
        el("td", {}, r.time || (r.timestamp ?? "")), el("td", { class: "name" }, r.record_id || ""),
        showValue(r))));
  }

  function scanStatus(result, tail) {
    const ranges = Object.entries(result.ranges).map(([p, [a, b]]) =>
      "partition " + p + ": " + (a === b ? "nothing new" : number(a) + "\u2013" + number(b - 1)));
    return (tail ? "Tailing: " : "") + "read " + number(result.scanned) + " messages (" +
      (ranges.join(", ") || "no partition") + "), " + number(result.matched) + " matched, " +
      "showing " + number(scan.rows.length) +
      (result.truncated ? "; older messages were not read (the scan's budget)" : "") +
      (result.cancelled ? "; stopped" : "") + ".";
  }

  async function readRecords(tail) {
    if (scan.controller) scan.controller.abort();
    const controller = new AbortController();
    scan.controller = controller;
    const status = document.getElementById("scan-status");
    document.getElementById("scan-stop").disabled = false;
    if (!tail) status.textContent = "Reading\u2026";
    try {
      const response = await fetch("/api/records?" + scanQuery(tail ? scan.positions : null),
        { signal: controller.signal });
      const result = await response.json();
      if (!response.ok) throw new Error(result.error || response.statusText);
      scan.rows = tail ? result.records.concat(scan.rows).slice(0, MAX_ROWS) : result.records;
      scan.positions = result.positions;
      renderRecords();
      status.textContent = scanStatus(result, scan.tailing);
    } catch (error) {
      if (error.name !== "AbortError") status.textContent = "Could not read: " + error.message;
      else status.textContent = "Stopped.";
      stopTail();
    } finally {
      if (scan.controller === controller) scan.controller = null;
      document.getElementById("scan-stop").disabled = !scan.tailing;
    }
    if (scan.tailing) scan.timer = setTimeout(() => readRecords(true), 2000);
  }

  function stopTail() {
    scan.tailing = false;
    clearTimeout(scan.timer);
    const button = document.getElementById("scan-tail");
    button.textContent = "Tail live";
    button.setAttribute("aria-pressed", "false");
  }

  // -- series charts ---------------------------------------------------------------------
  const charts = { stream: null, key: null, timer: null, busy: false, snapshot: null };
  const SVG = "http://www.w3.org/2000/svg";

  function svg(tag, attributes, text) {
    const node = document.createElementNS(SVG, tag);
    for (const [name, value] of Object.entries(attributes)) node.setAttribute(name, String(value));
    if (text !== undefined) node.textContent = text;
    return node;
  }

  function fillChartChoice(snapshot) {
    const select = document.getElementById("chart-stream");
    const names = snapshot.streams.map((s) => s.name).filter((n) => n.endsWith(".predictions"));
    charts.snapshot = snapshot;
    offer(select, names);
    // The first chart of a stream loads by itself; live ones reload on their own timer.
    if (select.value && select.value !== charts.stream && !charts.busy) loadChart();
  }

  // The anomalies of a predictions stream: a stream named "anomalies" or "<...>.anomalies"
  // that a computation reading it (add_anomaly_detection's detectors) or writing it writes,
  // else the stream "anomalies" if there is one.
  function anomaliesFor(snapshot, predictions) {
    if (!snapshot) return null;
    const id = "stream/" + predictions;
    const near = new Set(snapshot.edges.filter((e) => e.from === id || e.to === id)
      .map((e) => (e.from === id ? e.to : e.from)));
    const written = snapshot.edges.filter((e) => near.has(e.from) && e.to.startsWith("stream/"))
      .map((e) => e.to.slice("stream/".length));
    const isAnomalies = (name) => name === "anomalies" || name.endsWith(".anomalies");
    return written.find(isAnomalies) ||
      (snapshot.streams.some((s) => s.name === "anomalies") ? "anomalies" : null);
  }

  async function loadChart() {
    const stream = document.getElementById("chart-stream").value;
    const keySelect = document.getElementById("chart-key");
    if (!stream) return;
    if (stream !== charts.stream) {
      charts.stream = stream;
      keySelect.replaceChildren();
    }
    const query = new URLSearchParams({ stream: stream,
      points: document.getElementById("chart-points").value || "500" });
    if (keySelect.value) query.set("key", keySelect.value);
    const anomalies = anomaliesFor(charts.snapshot, stream);
    if (anomalies) query.set("anomalies", anomalies);
    charts.busy = true;
    const status = document.getElementById("chart-status");
    try {
      const response = await fetch("/api/series?" + query);
      const result = await response.json();
      if (!response.ok) throw new Error(result.error || response.statusText);
      offer(keySelect, result.keys);
      if (!result.key && keySelect.value) {
        charts.busy = false;
        return loadChart(); // the keys are known now: chart the first
      }
      drawChart(result);
      status.textContent = result.key ? "Key " + result.key + ": " + number(result.points.length) +
        " buckets, " + number(result.anomalies.length) +
        (result.anomalies.length === 1 ? " anomaly" : " anomalies") + " (from the newest " +
        number(result.scanned) + " predictions); the band is expected \u00b1 " +
        result.band_spreads + " spreads." : "No prediction read yet.";
    } catch (error) {
      status.textContent = "Could not chart: " + error.message;
    } finally {
      charts.busy = false;
    }
    clearTimeout(charts.timer);
    charts.timer = document.getElementById("chart-live").checked && !state.paused
      ? setTimeout(() => { charts.timer = null; loadChart(); }, 5000) : null;
  }

  function drawChart(result) {
    const width = 960, height = 260, left = 50, right = 10, top = 10, bottom = 30;
    const points = result.points;
    const box = document.getElementById("chart");
    const chart = svg("svg", { class: "chart", viewBox: "0 0 " + width + " " + height,
      width: width, height: height, role: "img", "aria-label": "series of " + result.key });
    if (points.length < 2) {
      chart.append(svg("text", { x: 10, y: 30 }, "Not enough buckets to draw yet."));
      box.replaceChildren(chart);
      return;
    }
    const t0 = points[0][0], t1 = points[points.length - 1][0];
    const high = Math.max(1, ...points.map((p) => Math.max(p[1], p[4])));
    const x = (t) => left + (t - t0) * (width - left - right) / (t1 - t0 || 1);
    const y = (v) => top + (1 - v / high) * (height - top - bottom);
    const line = (index) => points.map((p) => x(p[0]).toFixed(1) + "," + y(p[index]).toFixed(1)).join(" ");
    const band = points.map((p) => x(p[0]).toFixed(1) + "," + y(p[4]).toFixed(1))
      .concat(points.slice().reverse().map((p) => x(p[0]).toFixed(1) + "," + y(p[3]).toFixed(1)));
    chart.append(svg("polygon", { class: "band", points: band.join(" ") }));
    chart.append(svg("polyline", { class: "expected", points: line(2) }));
    chart.append(svg("polyline", { class: "observed", points: line(1) }));
    for (const mark of result.anomalies) {
      if (mark.bucket < t0 || mark.bucket > t1) continue;
      const near = points.reduce((a, b) => Math.abs(b[0] - mark.bucket) < Math.abs(a[0] - mark.bucket) ? b : a);
      const dot = svg("circle", { class: "anomaly " + mark.kind, cx: x(mark.bucket).toFixed(1),
        cy: y(mark.observed ?? near[1]).toFixed(1), r: 5 });
      dot.append(svg("title", {}, mark.kind + " at " + eventTime(mark.bucket) + ": " +
        (mark.explanation || "observed " + mark.observed + ", expected " + mark.expected)));
      chart.append(dot);
    }
    chart.append(svg("text", { x: left, y: height - 8, class: "axis" }, eventTime(t0)));
    chart.append(svg("text", { x: width - right, y: height - 8, class: "axis end" }, eventTime(t1)));
    chart.append(svg("text", { x: 4, y: top + 10, class: "axis" }, number(high)));
    chart.append(svg("text", { x: 4, y: height - bottom, class: "axis" }, "0"));
    box.replaceChildren(chart);
  }

  function render(snapshot) {
    state.shown = snapshot;
    const error = document.getElementById("error");
    error.hidden = !snapshot.error;
    error.textContent = snapshot.error ? "Partial view: " + snapshot.error : "";
    renderHeadline(snapshot);
    renderGraph(snapshot);
    renderNodes(snapshot);
    renderHeld(snapshot);
    renderComputations(snapshot);
    renderCommits(snapshot);
    renderStreams(snapshot);
    fillStreamChoice(snapshot);
    fillChartChoice(snapshot);
    renderEvents(snapshot);
    document.body.dataset.seq = String(snapshot.seq);
    tick();
  }

  function tick() {
    const updated = document.getElementById("updated");
    if (!state.shown) return;
    const age = Math.max(0, Date.now() / 1000 - state.shown.now / 1e6);
    updated.textContent = "as of " + eventTime(state.shown.now) + " (" + duration(age) + " ago)" +
      (state.paused ? ", paused" : "");
    updated.classList.toggle("stale", age > 10);
  }

  function connect() {
    const connection = document.getElementById("connection");
    const source = new EventSource("/events");
    source.addEventListener("open", () => {
      connection.textContent = "live";
      connection.className = "connection live";
    });
    source.addEventListener("error", () => {
      // EventSource reconnects by itself (the server asks for 2 s between tries).
      connection.textContent = "reconnecting";
      connection.className = "connection down";
    });
    source.addEventListener("snapshot", (event) => {
      state.latest = JSON.parse(event.data);
      if (!state.paused) render(state.latest);
    });
  }

  function setTheme(theme) {
    document.documentElement.dataset.theme = theme;
    document.getElementById("theme").textContent = "Theme: " + theme;
    try { localStorage.setItem("millstream-theme", theme); } catch (e) { /* private mode */ }
  }

  document.addEventListener("DOMContentLoaded", () => {
    document.getElementById("pause").addEventListener("click", (event) => {
      state.paused = !state.paused;
      event.target.textContent = state.paused ? "Resume" : "Pause";
      event.target.setAttribute("aria-pressed", String(state.paused));
      if (!state.paused && state.latest) render(state.latest);
      if (!state.paused && !charts.timer && !charts.busy && charts.stream) loadChart();
      tick();
    });
    document.getElementById("view-toggle").addEventListener("click", (event) => {
      state.table = !state.table;
      document.getElementById("graph").hidden = state.table;
      document.getElementById("nodes").hidden = !state.table;
      event.target.textContent = state.table ? "Show as graph" : "Show as table";
    });
    document.getElementById("scan-stream").addEventListener("change", () => {
      stopTail();
      scan.positions = null; // a tail goes on from this stream's own positions
    });
    document.getElementById("scan-read").addEventListener("click", () => {
      stopTail();
      readRecords(false);
    });
    document.getElementById("scan-tail").addEventListener("click", (event) => {
      if (scan.tailing) {
        stopTail();
        return;
      }
      scan.tailing = true;
      event.target.textContent = "Stop tailing";
      event.target.setAttribute("aria-pressed", "true");
      readRecords(scan.positions !== null);
    });
    document.getElementById("scan-stop").addEventListener("click", () => {
      stopTail();
      if (scan.controller) scan.controller.abort();
      document.getElementById("scan-stop").disabled = true;
    });
    for (const id of ["chart-stream", "chart-key", "chart-points", "chart-live"]) {
      document.getElementById(id).addEventListener("change", () => {
        if (id === "chart-stream") document.getElementById("chart-key").replaceChildren();
        clearTimeout(charts.timer);
        charts.timer = null;
        loadChart();
      });
    }
    document.getElementById("detail-close").addEventListener("click", () => {
      // Closing the panel ends the selection too: the stalled paths show again.
      if (state.selected === detail.id) {
        state.selected = null;
        if (state.shown) highlight(state.shown);
      }
      detail.id = null;
      clearTimeout(detail.timer);
      document.getElementById("detail").hidden = true;
    });
    const themes = ["auto", "light", "dark"];
    document.getElementById("theme").addEventListener("click", () => {
      const now = document.documentElement.dataset.theme || "auto";
      setTheme(themes[(themes.indexOf(now) + 1) % themes.length]);
    });
    let saved = "auto";
    try { saved = localStorage.getItem("millstream-theme") || "auto"; } catch (e) { /* private mode */ }
    setTheme(themes.includes(saved) ? saved : "auto");
    setInterval(tick, 1000);
    connect();
  });
})();
