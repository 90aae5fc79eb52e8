// A run drawn as a timeline: one lane per activity (each attempt a bar), timer, child and wait,
// marks for signals and updates, the run itself on top. Built from the run's history alone, so
// what it shows is what was committed. Zoom and pan never refetch anything.

import { h, svg, duration } from "./dom.js";

const WIDTH = 1200;
const LABEL = 240;
const RIGHT = 12;
const ROW = 22;
const AXIS = 26;
/// Lanes drawn at most; a run with more says how many it left out.
export const LANES_MAX = 300;

const at = (iso) => Date.parse(iso);

/// The lanes of a run: `{start, end, lanes: [{key, label, kind, link, spans, marks, failed}]}`,
/// times in milliseconds. Spans still open run until `now` (an open run) or the run's close.
export function timelineModel(events, run, now) {
  const start = at(run.started_at) || (events.length ? at(events[0].timestamp) : now);
  const closedAt = run.closed_at ? at(run.closed_at) : null;
  const end = Math.max(closedAt ?? now, start);
  const lanes = new Map();
  const lane = (key, label, kind, link) => {
    if (!lanes.has(key)) lanes.set(key, { key, label, kind, link, spans: [], marks: [], failed: false, open: null });
    return lanes.get(key);
  };
  lane("run", `Run #${run.run_number ?? 1}`, "run");
  const close = (l, time, cls, title, seq) => {
    if (!l.open) return;
    l.spans.push({ from: l.open.from, to: time, cls, title: `${l.open.title} · ${title}`, seq: l.open.seq, endSeq: seq });
    if (cls === "fail") l.failed = true;
    l.open = null;
  };
  const marks = () => lane("marks", "Signals and updates", "marks");
  for (const event of events) {
    const time = at(event.timestamp);
    const p = event.payload || {};
    const seq = event.sequence;
    const type = event.event_type || "";
    const by = event.principal ? ` by ${event.principal.id}` : "";
    const activity = () => lane("a:" + p.activity_execution_id, p.activity_type || "activity", "activity");
    switch (type) {
      case "ActivityScheduled": activity().scheduled = { time, seq }; break;
      case "ActivityStarted": {
        const l = activity();
        if (l.scheduled && !l.spans.length && time > l.scheduled.time) {
          l.spans.push({ from: l.scheduled.time, to: time, cls: "queued", title: "scheduled, waiting for a worker", seq: l.scheduled.seq });
        }
        close(l, time, "fail", "ended without a report", seq);
        l.open = { from: time, seq, title: `attempt ${p.attempt_number ?? "?"}` };
        break;
      }
      case "ActivityRetryScheduled": close(activity(), time, "fail", `failed: ${p.message || p.exception_type || "error"}; retried`, seq); break;
      case "ActivityCompleted": close(activity(), time, "ok", "completed", seq); break;
      case "ActivityFailed": close(activity(), time, "fail", `failed: ${p.message || p.exception_type || "error"}`, seq); break;
      case "ActivityTimedOut": {
        const l = activity();
        if (!l.open && l.scheduled) l.open = { from: l.scheduled.time, seq: l.scheduled.seq, title: "never started" };
        close(l, time, "fail", `timed out (${p.timeout_kind || p.timeout_type || "timeout"})`, seq);
        break;
      }
      case "ActivityCancelled": close(activity(), time, "cancel", "cancelled", seq); break;
      case "TimerScheduled": {
        const l = lane("t:" + p.timer_id, `timer ${duration((p.delay_seconds ?? 0) * 1000)}`, "timer");
        l.open = { from: time, seq, title: `timer for ${duration((p.delay_seconds ?? 0) * 1000)}` };
        break;
      }
      case "TimerFired": close(lane("t:" + p.timer_id, "timer", "timer"), time, "ok", "fired", seq); break;
      case "TimerCancelled": close(lane("t:" + p.timer_id, "timer", "timer"), time, "cancel", "cancelled", seq); break;
      case "ChildWorkflowScheduled": {
        const link = p.child_workflow_instance_id && p.child_workflow_run_id
          ? `#/workflows/${encodeURIComponent(p.child_workflow_instance_id)}/runs/${encodeURIComponent(p.child_workflow_run_id)}` : null;
        const l = lane("c:" + p.child_call_id, `child ${p.child_workflow_type || ""}`, "child", link);
        l.open = { from: time, seq, title: `child ${p.child_workflow_instance_id || ""}` };
        break;
      }
      case "ChildRunCompleted": close(lane("c:" + p.child_call_id, "child", "child"), time, "ok", "completed", seq); break;
      case "ChildRunFailed": close(lane("c:" + p.child_call_id, "child", "child"), time, "fail", "failed", seq); break;
      case "ChildRunTerminated": close(lane("c:" + p.child_call_id, "child", "child"), time, "fail", "terminated", seq); break;
      case "ChildRunCancelled": close(lane("c:" + p.child_call_id, "child", "child"), time, "cancel", "cancelled", seq); break;
      case "SignalReceived": marks().marks.push({ at: time, cls: "signal", title: `signal ${p.signal_name || ""}${by}`, seq }); break;
      default: {
        const waitKey = Object.keys(p).find((k) => k.endsWith("_wait_id") && p[k]);
        if (waitKey && /WaitOpened$/.test(type)) {
          const name = type.replace(/WaitOpened$/, "").replace(/([a-z])([A-Z])/g, "$1 $2").toLowerCase();
          const l = lane("w:" + p[waitKey], `${name} wait${p.signal_name ? " " + p.signal_name : ""}`, "wait");
          l.open = { from: time, seq, title: `${name} wait` };
        } else if (waitKey && /Wait\w+$/.test(type)) {
          const l = lanes.get("w:" + p[waitKey]);
          if (l) close(l, time, /TimedOut/.test(type) ? "timeout" : /Cancel/.test(type) ? "cancel" : "ok", type.replace(/^\w*Wait/, "").toLowerCase(), seq);
        } else if (/^Update/.test(type)) {
          const failed = /Rejected|Failed/.test(type);
          marks().marks.push({ at: time, cls: failed ? "fail" : "update", title: `${type} ${p.update_name || p.name || ""}`.trim() + by, seq });
        } else if (/Failed$|TimedOut$/.test(type) && !/^Workflow/.test(type)) {
          marks().marks.push({ at: time, cls: "fail", title: type, seq });
        }
      }
    }
  }
  const runLane = lanes.get("run");
  const status = run.status || "running";
  const runCls = !closedAt ? "open" : status === "completed" ? "ok" : status === "cancelled" ? "cancel" : /failed|terminated|timed_out/.test(status) ? "fail" : "ok";
  runLane.spans.push({ from: start, to: end, cls: runCls, title: `run ${status}`, seq: 1, endSeq: events.length ? events[events.length - 1].sequence : 1 });
  runLane.failed = runCls === "fail";
  for (const l of lanes.values()) {
    if (l.open) {
      l.spans.push({ from: l.open.from, to: end, cls: closedAt ? "cancel" : "open", title: `${l.open.title} · ${closedAt ? "open when the run closed" : "still open"}`, seq: l.open.seq, open: !closedAt });
      l.open = null;
    }
  }
  return { start, end, lanes: [...lanes.values()].filter((l) => l.spans.length || l.marks.length) };
}

/// Round tick steps (ms) for an axis over `range` ms.
function tickStep(range) {
  const target = range / 6;
  const steps = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1e3, 2e3, 5e3, 1e4, 15e3, 3e4, 6e4, 12e4, 3e5, 6e5, 9e5, 18e5, 36e5, 72e5, 216e5, 432e5, 864e5];
  return steps.find((s) => s >= target) || Math.ceil(target / 864e5) * 864e5;
}

/// The timeline section: controls and the chart. `pick(sequence)` is called for a clicked bar.
/// `view` ({from, to, fitted}) is kept by the caller across redraws of a live run.
export function timelineSection(model, view, pick) {
  const full = { from: model.start, to: Math.max(model.end, model.start + 1) };
  if (!view.from || view.fitted) Object.assign(view, full, { fitted: true });
  const chart = h("div", { class: "timeline-chart" });
  const range = h("span", { class: "muted", id: "timeline-range" });
  const setView = (from, to) => {
    const width = Math.max(to - from, 10);
    const span = full.to - full.from;
    if (width >= span) { Object.assign(view, full, { fitted: true }); } else {
      const clampedFrom = Math.min(Math.max(from, full.from), full.to - width);
      Object.assign(view, { from: clampedFrom, to: clampedFrom + width, fitted: false });
    }
    draw();
  };
  const zoom = (factor, center) => {
    const c = center ?? (view.from + view.to) / 2;
    setView(c - (c - view.from) * factor, c + (view.to - c) * factor);
  };
  const pan = (fraction) => setView(view.from + (view.to - view.from) * fraction, view.to + (view.to - view.from) * fraction);
  const controls = h("div", { class: "timeline-controls" },
    h("button", { type: "button", id: "timeline-zoom-in", onclick: () => zoom(0.5) }, "Zoom in"),
    h("button", { type: "button", id: "timeline-zoom-out", onclick: () => zoom(2) }, "Zoom out"),
    h("button", { type: "button", id: "timeline-earlier", onclick: () => pan(-0.25) }, "Earlier"),
    h("button", { type: "button", id: "timeline-later", onclick: () => pan(0.25) }, "Later"),
    h("button", { type: "button", id: "timeline-fit", onclick: () => setView(full.from, full.to) }, "Fit"),
    range,
    h("span", { class: "muted hint" }, "Ctrl + wheel zooms, drag pans, a bar opens its event."));

  function draw() {
    const lanes = model.lanes.slice(0, LANES_MAX);
    const height = AXIS + lanes.length * ROW + 8;
    const plot = WIDTH - LABEL - RIGHT;
    const x = (t) => LABEL + ((t - view.from) / (view.to - view.from)) * plot;
    const clip = "timeline-clip";
    const root = svg("svg", { viewBox: `0 0 ${WIDTH} ${height}`, class: "timeline-svg", role: "img", id: "timeline",
      "aria-label": `Timeline of ${lanes.length} lanes`, "data-from": Math.round(view.from), "data-to": Math.round(view.to),
      "data-lanes": lanes.length });
    root.append(svg("defs", {}, svg("clipPath", { id: clip }, svg("rect", { x: LABEL, y: 0, width: plot, height }))));
    const step = tickStep(view.to - view.from);
    const first = Math.ceil((view.from - model.start) / step) * step + model.start;
    for (let t = first; t <= view.to; t += step) {
      root.append(svg("line", { x1: x(t), x2: x(t), y1: AXIS - 6, y2: height, class: "tl-grid" }),
        svg("text", { x: x(t), y: AXIS - 10, class: "tl-tick" }, "+" + duration(t - model.start)));
    }
    lanes.forEach((l, i) => {
      const y = AXIS + i * ROW;
      const row = svg("g", { class: `tl-lane ${l.kind}${l.failed ? " failed" : ""}`, "data-kind": l.kind });
      if (i % 2) row.append(svg("rect", { x: 0, y, width: WIDTH, height: ROW, class: "tl-stripe" }));
      const label = svg("text", { x: 6, y: y + ROW - 7, class: "tl-label" }, (l.failed ? "✕ " : "") + truncate(l.label, 34));
      row.append(l.link ? svg("a", { href: l.link }, label) : label);
      const bars = svg("g", { "clip-path": `url(#${clip})` });
      for (const s of l.spans) {
        const x1 = x(s.from), x2 = x(s.to);
        if (x2 < LABEL || x1 > WIDTH - RIGHT) continue;
        const bar = svg("rect", { x: Math.max(x1, LABEL - 2), y: y + (s.cls === "queued" ? 9 : 4), width: Math.max(x2 - Math.max(x1, LABEL - 2), 2),
          height: s.cls === "queued" ? 4 : ROW - 8, rx: 2, class: `tl-bar ${s.cls}`, "data-seq": s.seq, tabindex: 0,
          onclick: () => pick(s.endSeq ?? s.seq), onkeydown: (e) => e.key === "Enter" && pick(s.endSeq ?? s.seq) },
        svg("title", {}, `${l.label}: ${s.title} · ${duration(s.to - s.from)}`));
        bars.append(bar);
      }
      for (const m of l.marks) {
        const cx = x(m.at);
        if (cx < LABEL || cx > WIDTH - RIGHT) continue;
        bars.append(svg("path", { d: `M${cx} ${y + 4} l6 7 l-6 7 l-6 -7 z`, class: `tl-mark ${m.cls}`, "data-seq": m.seq, tabindex: 0,
          onclick: () => pick(m.seq) }, svg("title", {}, `${m.title} at +${duration(m.at - model.start)}`)));
      }
      row.append(bars);
      root.append(row);
    });
    enableDrag(root, plot, view, setView);
    root.addEventListener("wheel", (event) => {
      if (!event.ctrlKey && !event.metaKey) return;
      event.preventDefault();
      const box = root.getBoundingClientRect();
      const svgX = ((event.clientX - box.left) / box.width) * WIDTH;
      const center = view.from + ((svgX - LABEL) / plot) * (view.to - view.from);
      zoom(event.deltaY < 0 ? 0.8 : 1.25, center);
    }, { passive: false });
    range.textContent = `showing +${duration(view.from - model.start)} to +${duration(view.to - model.start)} of ${duration(full.to - full.from)}`
      + (model.lanes.length > LANES_MAX ? ` · ${model.lanes.length - LANES_MAX} more lanes not drawn` : "");
    chart.replaceChildren(root);
  }
  draw();
  return h("section", { class: "card", "aria-labelledby": "timeline-h" }, h("h2", { id: "timeline-h" }, "Timeline"), controls, chart, legend());
}

function enableDrag(root, plot, view, setView) {
  let dragging = null;
  root.addEventListener("pointerdown", (event) => {
    if (event.target.closest && event.target.closest(".tl-bar, .tl-mark, a")) return;
    dragging = { x: event.clientX, from: view.from, to: view.to, width: root.getBoundingClientRect().width };
  });
  root.addEventListener("pointermove", (event) => {
    if (!dragging) return;
    const shift = ((dragging.x - event.clientX) / dragging.width) * WIDTH / plot * (dragging.to - dragging.from);
    setView(dragging.from + shift, dragging.to + shift);
  });
  for (const end of ["pointerup", "pointerleave"]) root.addEventListener(end, () => { dragging = null; });
}

function legend() {
  return h("div", { class: "timeline-legend muted" },
    [["ok", "completed"], ["fail", "failed or timed out"], ["open", "running"], ["cancel", "cancelled"], ["queued", "waiting for a worker"]]
      .map(([cls, text]) => h("span", {}, h("i", { class: `swatch ${cls}` }), text)),
    h("span", {}, h("i", { class: "swatch signal diamond" }), "signal"),
    h("span", {}, h("i", { class: "swatch update diamond" }), "update"));
}

function truncate(text, max) {
  const s = String(text ?? "");
  return s.length > max ? s.slice(0, max - 1) + "…" : s;
}
