// The server page: throughput, latency and backlog over time, from `/metrics` scraped by this
// page every few seconds while it is open (the charts begin when the page does: Prometheus keeps
// the history). Rates are differences between two scrapes of this node's counters.

import { h, svg, duration } from "./dom.js";

export const SCRAPE_MS = 3000;
const KEEP = 200; // samples: ten minutes at one per three seconds

/// Prometheus text → `[{name, labels, value}]`.
export function parseMetrics(text) {
  const samples = [];
  for (const line of text.split("\n")) {
    if (!line || line.startsWith("#")) continue;
    const match = /^([a-zA-Z_:][\w:]*)(?:\{(.*)\})?\s+(\S+)/.exec(line);
    if (!match) continue;
    const labels = {};
    for (const [, key, value] of (match[2] || "").matchAll(/(\w+)="((?:[^"\\]|\\.)*)"/g)) labels[key] = value.replace(/\\(.)/g, "$1");
    samples.push({ name: match[1], labels, value: Number(match[3]) });
  }
  return samples;
}

const total = (samples, name, keep = () => true) =>
  samples.filter((s) => s.name === name && keep(s.labels)).reduce((sum, s) => sum + s.value, 0);
const largest = (samples, name) => samples.filter((s) => s.name === name).reduce((max, s) => Math.max(max, s.value), 0);

/// A quantile from the difference of two scrapes of a histogram's buckets.
function quantile(previous, current, name, q) {
  const buckets = (samples) => {
    const byLe = new Map();
    for (const s of samples) if (s.name === name + "_bucket") byLe.set(s.labels.le, (byLe.get(s.labels.le) || 0) + s.value);
    return byLe;
  };
  const before = buckets(previous), after = buckets(current);
  const rows = [...after.entries()].map(([le, count]) => [le === "+Inf" ? Infinity : Number(le), count - (before.get(le) || 0)]).sort((a, b) => a[0] - b[0]);
  const count = rows.length ? rows[rows.length - 1][1] : 0;
  if (!count) return null;
  const rank = q * count;
  let lower = 0, below = 0;
  for (const [le, cumulative] of rows) {
    if (cumulative >= rank) {
      if (le === Infinity) return lower;
      return lower + (le - lower) * ((rank - below) / Math.max(cumulative - below, 1));
    }
    lower = le; below = cumulative;
  }
  return lower;
}

const notPoll = (labels) => !/\/poll$/.test(labels.route || "");

/// One point of every chart from two consecutive scrapes `seconds` apart.
export function point(previous, current, seconds) {
  const rate = (name, keep) => Math.max(total(current, name, keep) - total(previous, name, keep), 0) / seconds;
  const mean = (name, keep) => {
    const count = total(current, name + "_count", keep) - total(previous, name + "_count", keep);
    return count > 0 ? (total(current, name + "_sum", keep) - total(previous, name + "_sum", keep)) / count : null;
  };
  return {
    started: rate("capstan_workflows_started_total"),
    closed: rate("capstan_workflows_closed_total", (l) => l.reason !== "continued"),
    failed: rate("capstan_workflows_closed_total", (l) => /failed|timed_out|terminated/.test(l.reason)),
    requests: rate("capstan_http_requests_total", notPoll),
    errors: rate("capstan_http_requests_total", (l) => l.code === "5xx"),
    requestMean: mean("capstan_http_request_duration_seconds", notPoll),
    requestP95: quantile(previous.filter((s) => notPoll(s.labels)), current.filter((s) => notPoll(s.labels)), "capstan_http_request_duration_seconds", 0.95),
    commitMean: mean("capstan_store_commit_seconds"),
    commitP99: quantile(previous, current, "capstan_store_commit_seconds", 0.99),
    commits: rate("capstan_store_commit_seconds_count"),
    readyWorkflow: total(current, "capstan_task_queue_ready", (l) => l.kind === "workflow"),
    readyActivity: total(current, "capstan_task_queue_ready", (l) => l.kind === "activity"),
    leased: total(current, "capstan_task_queue_leased"),
    oldest: largest(current, "capstan_task_queue_oldest_ready_age_seconds"),
  };
}

const CHARTS = [
  { id: "throughput", title: "Workflows per second", unit: "/s", series: [["started", "started"], ["closed", "closed"], ["failed", "failed"]] },
  { id: "requests", title: "Requests per second (polls excluded)", unit: "/s", series: [["requests", "requests"], ["errors", "5xx"]] },
  { id: "latency", title: "Latency (polls excluded)", unit: "s", series: [["requestMean", "request mean"], ["requestP95", "request p95"], ["commitMean", "commit mean"], ["commitP99", "commit p99"]] },
  { id: "backlog", title: "Backlog: tasks waiting for a worker", unit: "", series: [["readyWorkflow", "workflow tasks"], ["readyActivity", "activity tasks"], ["leased", "leased"]] },
  { id: "oldest", title: "Oldest ready task's wait", unit: "s", series: [["oldest", "oldest wait"]] },
];

function format(value, unit) {
  if (value === null || value === undefined) return "—";
  if (unit === "s") return duration(value * 1000);
  return (value >= 100 ? value.toFixed(0) : value >= 10 ? value.toFixed(1) : value.toFixed(2)) + unit;
}

function chart(spec, points) {
  const [W, H, L, B] = [560, 170, 56, 22];
  const values = points.flatMap((p) => spec.series.map(([key]) => p[key])).filter((v) => v !== null && Number.isFinite(v));
  const max = Math.max(...values, spec.unit === "s" ? 0.001 : 1) * 1.1;
  // The newest point at the right edge; older ones to its left, one slot per scrape.
  const x = (i) => L + ((KEEP - points.length + i) / (KEEP - 1)) * (W - L - 8);
  const y = (v) => H - B - (v / max) * (H - B - 10);
  const root = svg("svg", { viewBox: `0 0 ${W} ${H}`, class: "chart-svg", role: "img", "aria-label": spec.title, "data-points": points.length },
    svg("line", { x1: L, x2: W - 8, y1: H - B, y2: H - B, class: "chart-axis" }),
    svg("text", { x: L - 6, y: 14, class: "chart-tick end" }, format(max, spec.unit)),
    svg("text", { x: L - 6, y: H - B, class: "chart-tick end" }, "0"),
    svg("text", { x: W - 8, y: H - 6, class: "chart-tick end" }, "now"),
    svg("text", { x: L, y: H - 6, class: "chart-tick" }, `−${duration(KEEP * SCRAPE_MS)}`));
  spec.series.forEach(([key], index) => {
    const coords = points.map((p, i) => (p[key] === null || !Number.isFinite(p[key]) ? null : `${x(i).toFixed(1)},${y(p[key]).toFixed(1)}`)).filter(Boolean);
    if (coords.length) root.append(svg("polyline", { points: coords.join(" "), class: `chart-line s${index}` }));
  });
  const latest = points[points.length - 1] || {};
  return h("section", { class: "card chart", id: `chart-${spec.id}` },
    h("h2", {}, spec.title),
    root,
    h("div", { class: "chart-legend" }, spec.series.map(([key, label], index) =>
      h("span", {}, h("i", { class: `swatch s${index}` }), `${label}: `, h("strong", { "data-series": key }, format(latest[key], spec.unit))))));
}

/// The page, redrawn after every scrape until `stop()`. `scrape()` answers the metrics text.
export function serverPage(target, scrape) {
  const state = { points: [], previous: null, at: 0, timer: null, stopped: false };
  const facts = h("dl", { class: "facts", id: "server-facts" });
  const charts = h("div", { class: "charts", id: "server-charts" });
  const note = h("p", { class: "muted", id: "server-note" }, "Collecting: the charts start with the second scrape.");
  target.replaceChildren(h("h1", {}, "Server"), note, facts, charts);
  const tick = async () => {
    if (state.stopped) return;
    try {
      const samples = parseMetrics(await scrape());
      const now = performance.now();
      if (state.previous) {
        state.points.push(point(state.previous, samples, Math.max((now - state.at) / 1000, 0.001)));
        if (state.points.length > KEEP) state.points.shift();
        note.textContent = `This node, scraped every ${SCRAPE_MS / 1000} s since the page opened (Prometheus keeps the history; docs/metrics.md).`;
      }
      state.previous = samples;
      state.at = now;
      drawFacts(facts, samples);
      charts.replaceChildren(...CHARTS.map((spec) => chart(spec, state.points)));
    } catch (error) {
      note.textContent = `Could not read /metrics: ${error.message}`;
    }
    if (!state.stopped) state.timer = setTimeout(tick, SCRAPE_MS);
  };
  tick();
  return () => { state.stopped = true; clearTimeout(state.timer); };
}

function drawFacts(target, samples) {
  const build = samples.find((s) => s.name === "capstan_build_info");
  const started = samples.find((s) => s.name === "process_start_time_seconds");
  const rss = samples.find((s) => s.name === "process_resident_memory_bytes");
  const pool = (state) => total(samples, "capstan_db_pool_connections", (l) => l.state === state);
  const pairs = [
    ["Version", build ? build.labels.version : "—"],
    ["Up for", started ? duration(Date.now() - started.value * 1000) : "—"],
    ["Memory (resident)", rss ? `${(rss.value / 1048576).toFixed(1)} MiB` : "—"],
    ["Database connections", `${pool("in_use")} in use, ${pool("idle")} idle of ${total(samples, "capstan_db_pool_max_connections")}`],
    ["Unknown outcomes", String(total(samples, "capstan_ledger_entries", (l) => l.state === "outcome_unknown"))],
    ["Open integrity incidents", String(total(samples, "capstan_integrity_incidents_open"))],
    ["Workflows started (this node)", String(total(samples, "capstan_workflows_started_total"))],
  ];
  target.replaceChildren(...pairs.flatMap(([k, v]) => [h("dt", {}, k), h("dd", {}, v)]));
}
