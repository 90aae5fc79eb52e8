// Capstan's operator UI: a dependency-free single page over the same /api the CLI and SDKs use.
// Every value from the server is put into the page as text (never as HTML).

import { h, append, when, span } from "./dom.js";
import { timelineModel, timelineSection } from "./timeline.js";
import { serverPage } from "./server.js";
import { accessPage } from "./access.js";
import { batchesPage } from "./batches.js";

const CONTROL_PLANE_VERSION = "2";
/// How often the page of a running workflow looks for new history.
const LIVE_MS = 2000;
const PAGE_SIZE = 50;

const session = {
  get token() { return sessionStorage.getItem("capstan.token") || ""; },
  set token(value) { value ? sessionStorage.setItem("capstan.token", value) : sessionStorage.removeItem("capstan.token"); },
  get namespace() { return localStorage.getItem("capstan.namespace") || "default"; },
  set namespace(value) { localStorage.setItem("capstan.namespace", value); },
  get live() { return sessionStorage.getItem("capstan.live") !== "off"; },
  set live(value) { sessionStorage.setItem("capstan.live", value ? "on" : "off"); },
};

/// What the current page runs in the background (a live run, the server charts); stopped when
/// the page changes.
let stopPage = () => {};
/// Each run's timeline window, kept while its page redraws live.
const timelineViews = new Map();

/// `/metrics` as text, with this tab's token.
async function scrapeMetrics() {
  const headers = session.token ? { "Authorization": "Bearer " + session.token } : {};
  const response = await fetch("/metrics", { headers });
  if (!response.ok) throw new Error(`the server answered ${response.status}`);
  return response.text();
}

// ---------------------------------------------------------------------------------------------
// The API

class ApiError extends Error {
  constructor(status, body) {
    super(body && body.message ? body.message : `The server answered ${status}.`);
    this.status = status;
    this.reason = (body && body.reason) || "http_" + status;
    this.body = body || {};
  }
}

async function api(method, path, body) {
  const headers = {
    "Accept": "application/json",
    "X-Durable-Workflow-Control-Plane-Version": CONTROL_PLANE_VERSION,
    "X-Namespace": session.namespace,
  };
  if (session.token) headers["Authorization"] = "Bearer " + session.token;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  let response;
  try {
    response = await fetch("/api" + path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  } catch (error) {
    throw new ApiError(0, { reason: "unreachable", message: "The server cannot be reached." });
  }
  const text = await response.text();
  let parsed = null;
  try { parsed = text ? JSON.parse(text) : null; } catch (_) { parsed = null; }
  if (!response.ok) throw new ApiError(response.status, parsed);
  return parsed;
}

function query(params) {
  const pairs = Object.entries(params).filter(([, v]) => v !== undefined && v !== null && v !== "");
  return pairs.length ? "?" + pairs.map(([k, v]) => `${encodeURIComponent(k)}=${encodeURIComponent(v)}`).join("&") : "";
}

const enc = encodeURIComponent;

// ---------------------------------------------------------------------------------------------
// DW payloads: base64 of an Avro single-object frame (marker c3 01, 8-byte schema fingerprint)
// written with the recursive `durable_workflow.protocol.Value` union schema.

function decodeAvroValue(base64) {
  let bytes;
  try {
    bytes = Uint8Array.from(atob(base64.replace(/\s/g, "")), (c) => c.charCodeAt(0));
  } catch (_) { return undefined; }
  if (bytes.length < 11 || bytes[0] !== 0xc3 || bytes[1] !== 0x01) return undefined;
  let at = 10;
  const view = new DataView(bytes.buffer);
  const long = () => {
    let shift = 0n, result = 0n, byte;
    do {
      if (at >= bytes.length) throw new Error("truncated");
      byte = bytes[at++];
      result |= BigInt(byte & 0x7f) << shift;
      shift += 7n;
    } while (byte & 0x80);
    const value = (result >> 1n) ^ -(result & 1n);
    return Number.isSafeInteger(Number(value)) ? Number(value) : value.toString();
  };
  const take = (n) => {
    if (n < 0 || at + n > bytes.length) throw new Error("truncated");
    const slice = bytes.subarray(at, at + n);
    at += n;
    return slice;
  };
  const string = () => new TextDecoder("utf-8", { fatal: true }).decode(take(long()));
  const blocks = (item) => {
    for (;;) {
      let count = long();
      if (count === 0) return;
      if (count < 0) { count = -count; long(); }
      for (let i = 0; i < count; i++) item();
    }
  };
  const value = () => {
    switch (long()) {
      case 0: return null;
      case 1: return take(1)[0] !== 0;
      case 2: return long();
      case 3: { const d = view.getFloat64(bytes.byteOffset + at, true); take(8); return d; }
      case 4: { const raw = take(long()); return { $type: "bytes", base64: btoa(String.fromCharCode(...raw)) }; }
      case 5: return string();
      case 6: { const items = []; blocks(() => items.push(value())); return items; }
      case 7: {
        const entries = {};
        blocks(() => { const key = string(); entries[key] = value(); });
        return entries;
      }
      default: throw new Error("unknown branch");
    }
  };
  try {
    const decoded = value();
    return at === bytes.length ? decoded : undefined;
  } catch (_) {
    return undefined;
  }
}

// The frame header of every payload: the single-object marker and the Value schema's
// CRC-64-AVRO fingerprint (the same eight bytes the SDKs write).
const AVRO_HEADER = [0xc3, 0x01, 0xe2, 0xa3, 0x3d, 0xff, 0x55, 0x80, 0x22, 0x37];

/// JSON as a DW payload blob: integers as longs, other numbers as doubles, objects as maps.
function encodeAvroValue(json) {
  const out = [...AVRO_HEADER];
  const long = (n) => {
    let v = BigInt(n);
    v = v >= 0n ? v << 1n : (-v << 1n) - 1n;
    do {
      let byte = Number(v & 0x7fn);
      v >>= 7n;
      if (v > 0n) byte |= 0x80;
      out.push(byte);
    } while (v > 0n);
  };
  const string = (text) => {
    const bytes = new TextEncoder().encode(text);
    long(bytes.length);
    out.push(...bytes);
  };
  const value = (v) => {
    if (v === null || v === undefined) { long(0); return; }
    if (typeof v === "boolean") { long(1); out.push(v ? 1 : 0); return; }
    if (typeof v === "number" && Number.isSafeInteger(v)) { long(2); long(v); return; }
    if (typeof v === "number") {
      long(3);
      const buffer = new DataView(new ArrayBuffer(8));
      buffer.setFloat64(0, v, true);
      for (let i = 0; i < 8; i++) out.push(buffer.getUint8(i));
      return;
    }
    if (typeof v === "string") { long(5); string(v); return; }
    if (Array.isArray(v)) {
      long(6);
      if (v.length) { long(v.length); v.forEach(value); }
      long(0);
      return;
    }
    const entries = Object.entries(v);
    long(7);
    if (entries.length) { long(entries.length); for (const [k, inner] of entries) { string(k); value(inner); } }
    long(0);
  };
  value(json);
  let binary = "";
  for (const byte of out) binary += String.fromCharCode(byte);
  return btoa(binary);
}

/// An argument list as the payload envelope the API takes.
function argumentsEnvelope(args) {
  return { codec: "avro", blob: encodeAvroValue(args) };
}

const AVRO_PREFIX = "ww"; // base64 of the c3 marker byte (the decoder checks the whole frame)

/// A copy of `value` with every DW payload decoded: `{codec, blob}` envelopes and blob strings.
function decodePayloads(value) {
  if (Array.isArray(value)) return value.map(decodePayloads);
  if (value && typeof value === "object") {
    if (typeof value.blob === "string" && (value.codec === "avro" || value.codec === undefined)) {
      const decoded = decodeAvroValue(value.blob);
      if (decoded !== undefined) return decoded;
    }
    const out = {};
    for (const [key, inner] of Object.entries(value)) out[key] = decodePayloads(inner);
    return out;
  }
  if (typeof value === "string" && value.startsWith(AVRO_PREFIX) && value.length >= 16) {
    const decoded = decodeAvroValue(value);
    if (decoded !== undefined) return decoded;
  }
  return value;
}

// ---------------------------------------------------------------------------------------------
// DOM helpers

const main = () => document.getElementById("main");

function show(...children) {
  const target = main();
  target.replaceChildren();
  append(target, children);
}

function toast(message, kind) {
  const box = document.getElementById("toast");
  const item = h("div", { class: kind === "error" ? "error" : "" }, message);
  box.append(item);
  setTimeout(() => item.remove(), 6000);
}

/** An audit event in words: the query asked, or the pause or resume and why. */
function auditText(event) {
  const detail = event.detail || {};
  if (event.action === "workflow.query") return `query ${detail.query_name || ""}`;
  const action = String(event.action || "").replace(/^workflow\./, "");
  return detail.reason ? `${action}: ${detail.reason}` : action;
}

/** The hold an operator put on a run, with when and why on hover. */
function pausedBadge(pause) {
  const title = pause ? `paused ${pause.paused_at}${pause.reason ? ": " + pause.reason : ""}` : "paused";
  return h("span", { class: "badge warn paused", title }, "paused");
}

function badge(text) {
  return text ? h("span", { class: "badge " + String(text).replace(/[^a-z_]/gi, "") }, text) : "—";
}

/// A ledger `unknown_reason` (`{kind, message, …}`) in words.
function reasonText(reason) {
  if (!reason) return "—";
  if (typeof reason !== "object") return String(reason);
  const kind = String(reason.kind || "unknown").replace(/_/g, " ");
  return reason.message ? `${kind}: ${reason.message}` : kind;
}

function json(value) {
  return h("pre", { class: "json" }, JSON.stringify(value, null, 2));
}

function facts(pairs) {
  return h("dl", { class: "facts" }, pairs.filter(Boolean).map(([k, v]) => [h("dt", {}, k), h("dd", {}, v ?? "—")]));
}

function table(caption, columns, rows, emptyText) {
  if (!rows.length) return h("div", { class: "empty" }, emptyText || "Nothing here.");
  return h("div", { class: "table-card" },
    h("table", {},
      h("caption", { class: "caption" }, caption),
      h("thead", {}, h("tr", {}, columns.map((c) => h("th", { scope: "col" }, c[0])))),
      h("tbody", {}, rows.map((row) => h("tr", {}, columns.map((c) => h("td", { class: c[2] || "" }, c[1](row))))))));
}

function errorBox(error) {
  if (error.status === 401) return tokenForm("This server needs an operator token.");
  if (error.status === 403) return tokenForm("This token may not do that (" + error.reason + ").");
  return h("div", { class: "error-box", role: "alert" },
    h("strong", {}, error.reason || "error"), ": ", error.message);
}

function tokenForm(message) {
  const input = h("input", { id: "token-input", type: "password", autocomplete: "off", value: session.token });
  return h("div", { class: "card" },
    h("h1", {}, "Sign in"),
    h("p", {}, message),
    h("form", { class: "stack", onsubmit: (event) => { event.preventDefault(); session.token = input.value.trim(); refreshIdentity(); route(); } },
      h("label", { for: "token-input" }, "Operator token", input),
      h("div", {}, h("button", { class: "primary", type: "submit" }, "Use token"))));
}

async function guarded(work) {
  try {
    await work();
  } catch (error) {
    if (error instanceof ApiError) show(errorBox(error));
    else show(h("div", { class: "error-box", role: "alert" }, "The page failed: " + error.message));
  }
}

async function act(label, work) {
  try {
    const result = await work();
    toast(label);
    return result;
  } catch (error) {
    toast(`Refused (${error.reason || "error"}): ${error.message}`, "error");
    return undefined;
  }
}

// ---------------------------------------------------------------------------------------------
// Chrome: namespace picker, token button, integrity banner

/// Who an event names: "alice", or "the server" for what the server did on its own.
function principalText(principal) {
  if (!principal) return "the server";
  return principal.type === "server" ? `${principal.id} (no authentication)` : principal.id;
}

/// The header's "Signed in as …": who this tab's token acts as, and its roles.
async function refreshIdentity() {
  const place = document.getElementById("signed-in");
  try {
    const me = await api("GET", "/auth/whoami");
    const bound = me.namespaces ? ` in ${me.namespaces.join(", ")}` : "";
    place.textContent = me.authentication === "none"
      ? "No authentication"
      : `Signed in as ${me.principal.id} (${me.roles.join(", ")}${bound})`;
    place.title = `principal ${me.principal.type}:${me.principal.id}`;
    if (me.namespaces && me.namespaces.length && !me.namespaces.includes(session.namespace)) {
      session.namespace = me.namespaces[0];
      loadNamespaces();
      route();
    }
  } catch (_) {
    place.textContent = "Not signed in";
    place.title = "";
  }
}

async function loadNamespaces() {
  const select = document.getElementById("namespace");
  try {
    const listed = await api("GET", "/namespaces");
    const names = (listed.namespaces || []).map((n) => n.name);
    if (!names.includes(session.namespace)) names.unshift(session.namespace);
    select.replaceChildren(...names.map((name) => h("option", { value: name }, name)));
  } catch (_) {
    select.replaceChildren(h("option", { value: session.namespace }, session.namespace));
  }
  select.value = session.namespace;
}

async function refreshBanner() {
  const banner = document.getElementById("banner");
  try {
    const open = (await api("GET", "/integrity-incidents?state=open")).incidents || [];
    banner.replaceChildren(...open.map((incident) =>
      h("div", { class: "incident" },
        h("strong", {}, "Integrity incident"), " on ",
        h("a", { href: `#/workflows/${enc(incident.workflow_id)}/runs/${enc(incident.run_id)}` }, incident.workflow_id),
        ": the run is blocked until an operator closes the incident. ",
        h("span", { class: "detail" }, incident.detail || ""))));
  } catch (_) {
    banner.replaceChildren();
  }
}

// ---------------------------------------------------------------------------------------------
// Workflows list

async function workflowsPage(params) {
  const filters = {
    status: params.get("status") || "",
    workflow_type: params.get("workflow_type") || "",
    task_queue: params.get("task_queue") || "",
    query: params.get("query") || "",
  };
  const token = params.get("page") || "";
  const [listed, counts] = await Promise.all([
    api("GET", "/workflows" + query({ ...filters, page_size: PAGE_SIZE, next_page_token: token })),
    api("GET", "/workflow-counts" + query({ workflow_type: filters.workflow_type, task_queue: filters.task_queue, query: filters.query })),
  ]);
  const link = (changes) => "#/workflows" + query({ ...filters, ...changes });
  const input = (name, label, placeholder) =>
    h("label", { for: "filter-" + name }, label, h("input", { id: "filter-" + name, name, value: filters[name], placeholder }));
  const form = h("form", { class: "filters", role: "search", onsubmit: (event) => {
    event.preventDefault();
    const data = new FormData(event.target);
    location.hash = link(Object.fromEntries([...data.entries()].map(([k, v]) => [k, String(v).trim()])));
  } },
    h("label", { for: "filter-status" }, "Status",
      h("select", { id: "filter-status", name: "status" },
        ["", "running", "completed", "failed"].map((s) => h("option", { value: s, selected: s === filters.status }, s || "any")))),
    input("workflow_type", "Type", "e.g. orders.checkout"),
    input("task_queue", "Task queue", "e.g. default"),
    input("query", "Search (id, business key or filter)", "Tier = \"gold\" AND Count > 2"),
    h("button", { class: "primary", type: "submit" }, "Filter"),
    h("a", { href: "#/workflows" }, "Clear"));
  const tabs = h("div", { class: "tabs", role: "navigation", "aria-label": "Status buckets" },
    [["", "All", counts.total], ["running", "Running", counts.running], ["paused", "Paused", counts.paused], ["completed", "Completed", counts.completed], ["failed", "Failed", counts.failed]]
      // A count the filter made too long to finish is a lower bound: "10001+".
      .map(([status, label, count]) => h("a", { href: link({ status }), "aria-current": String(status === filters.status),
        title: counts.exact === false ? "at least: the filter matched more runs than a count goes through" : null },
        `${label} (${count}${counts.exact === false ? "+" : ""})`)));
  const rows = listed.workflows || [];
  const pager = h("div", { class: "pager" },
    token ? h("a", { href: link({}) }, "First page") : null,
    listed.next_page_token ? h("a", { href: link({ page: listed.next_page_token }), id: "next-page" }, "Next page") : null,
    h("span", { class: "muted" }, `${rows.length} shown`));
  show(
    h("h1", {}, "Workflows"),
    form, tabs,
    table("Current runs, newest first", [
      ["Workflow ID", (w) => h("a", { href: `#/workflows/${enc(w.workflow_id)}` }, w.workflow_id), "wrap"],
      ["Type", (w) => w.workflow_type],
      ["Status", (w) => [badge(w.status),
        w.paused ? [" ", pausedBadge(w.pause)] : null,
        w.workflow_task_failing ? [" ", h("span", { class: "badge bad task-failing", title: w.workflow_task_last_error || "" }, `task failing ×${w.workflow_task_consecutive_failures}`)] : null,
        w.history_budget_pressure && w.history_budget_pressure !== "ok"
          ? [" ", h("span", { class: `badge ${w.history_budget_pressure === "approaching" ? "warn" : "bad"}` }, w.history_budget_pressure === "approaching" ? "history budget" : "continue as new")]
          : null]],
      ["Task queue", (w) => h("a", { href: `#/task-queues/${enc(w.task_queue)}` }, w.task_queue)],
      ["Run", (w) => "#" + w.run_number],
      ["Started", (w) => when(w.started_at)],
      ["Closed", (w) => when(w.closed_at)],
      ["Duration", (w) => span(w.started_at, w.closed_at)],
    ], rows, filters.status || filters.workflow_type || filters.task_queue || filters.query
      ? "No workflow matches these filters."
      : "No workflows yet. Start one with `capstan workflow start` or an SDK client."),
    pager);
}

// ---------------------------------------------------------------------------------------------
// Run detail

const CLOSING = /^Workflow(Completed|Failed|Cancelled|Terminated|TimedOut|ContinuedAsNew)$/;


/** A failing workflow task, first on the run page: the worker's message, type, reason and stack. */
function taskFailureBox(failure, open) {
  const cut = failure.truncated_bytes ? Object.entries(failure.truncated_bytes).map(([field, bytes]) => `${field} was ${bytes} bytes`).join(", ") : null;
  return h("div", { class: "error-box", role: "alert", id: "task-failure" },
    h("strong", {}, open ? "The workflow task is failing" : "The workflow task was failing when the run closed"),
    ` (${failure.consecutive_failures} in a row since `, when(failure.first_failed_at), "): ",
    h("span", { id: "task-failure-message" }, failure.message || "no message"),
    h("div", { class: "muted" }, [
      failure.type ? `type ${failure.type}` : null,
      failure.reason ? `reason ${failure.reason}` : null,
      failure.sequence != null ? `at sequence ${failure.sequence}` : null,
      `attempt ${failure.workflow_task_attempt}`,
      `worker ${failure.lease_owner}`,
    ].filter(Boolean).join(" · ")),
    failure.stack_trace ? h("details", { open: true }, h("summary", {}, "Stack trace"), h("pre", { class: "mono", id: "task-failure-stack" }, failure.stack_trace)) : null,
    cut ? h("div", { class: "muted" }, `Cut to the stored limit: ${cut}.`) : null);
}

async function runPage(workflowId, runId) {
  const path = `/workflows/${enc(workflowId)}` + (runId ? `/runs/${enc(runId)}` : "");
  const run = await api("GET", path);
  const [runs, integrity, history, ledger, audit] = await Promise.all([
    api("GET", `/workflows/${enc(workflowId)}/runs`),
    api("GET", `/workflows/${enc(workflowId)}/runs/${enc(run.run_id)}/integrity`).catch((e) => ({ error: e })),
    loadHistory(workflowId, run.run_id),
    api("GET", "/ledger" + query({ workflow_id: workflowId })).catch(() => ({ entries: [] })),
    api("GET", `/workflows/${enc(workflowId)}/audit-events` + query({ limit: 20 })).catch(() => ({ events: [] })),
  ]);
  const can = run.actions || {};
  const refresh = () => route();
  const post = (label, suffix, body) => act(label, () => api("POST", `/workflows/${enc(workflowId)}/runs/${enc(run.run_id)}/${suffix}`, body)).then(refresh);
  const buttons = h("div", { class: "actions" },
    h("button", { type: "button", id: "action-cancel", disabled: !can.can_cancel,
      onclick: () => confirm(`Cancel ${workflowId}?`) && post("Cancel requested", "cancel", { reason: "cancelled from the Capstan UI" }) }, "Cancel"),
    h("button", { type: "button", id: "action-terminate", class: "danger", disabled: !can.can_terminate,
      onclick: () => confirm(`Terminate ${workflowId}? Workflow code gets no chance to clean up.`) && post("Terminated", "terminate", { reason: "terminated from the Capstan UI" }) }, "Terminate"),
    can.can_resume
      ? h("button", { type: "button", id: "action-resume", class: "primary",
        onclick: () => post("Resumed", "resume", { reason: "resumed from the Capstan UI" }) }, "Resume")
      : h("button", { type: "button", id: "action-pause", disabled: !can.can_pause,
        onclick: () => {
          const reason = prompt(`Pause ${workflowId}? Its workflow and activity tasks stay with the server until it is resumed; timers, signals and timeouts go on. Why?`, "");
          if (reason !== null) post("Paused", "pause", { reason: reason || "paused from the Capstan UI" });
        } }, "Pause"),
    h("button", { type: "button", id: "action-repair", disabled: !can.can_repair,
      onclick: () => act("Repair requested", () => api("POST", `/workflows/${enc(workflowId)}/repair`, {})).then(refresh) }, "Repair"));

  const signalName = h("input", { id: "signal-name", required: true, placeholder: "signal name" });
  const signalInput = h("textarea", { id: "signal-input", placeholder: "[\"argument\"] (JSON list of arguments)" });
  const signalForm = h("form", { class: "stack", onsubmit: async (event) => {
    event.preventDefault();
    let args = [];
    try {
      const text = signalInput.value.trim();
      args = text ? JSON.parse(text) : [];
      if (!Array.isArray(args)) args = [args];
    } catch (_) { toast("The signal input is not JSON.", "error"); return; }
    await act(`Signal ${signalName.value} sent`, () => api("POST", `/workflows/${enc(workflowId)}/runs/${enc(run.run_id)}/signal/${enc(signalName.value)}`, { input: argumentsEnvelope(args) }));
    refresh();
  } },
    h("label", { for: "signal-name" }, "Signal", signalName),
    h("label", { for: "signal-input" }, "Arguments (JSON)", signalInput),
    h("div", {}, h("button", { type: "submit", disabled: !can.can_signal }, "Send signal")));

  const input = decodePayloads(run.input_envelope);
  const output = run.output_envelope ? decodePayloads(run.output_envelope) : undefined;
  const chain = integrity.error
    ? h("span", { class: "muted" }, integrity.error.message)
    : integrity.chain_verified
      ? [badge("ok"), ` ${integrity.event_count} events chain to ${String(integrity.head_hash || "").slice(0, 16)}…`]
      : [badge("bad"), ` broken at event ${integrity.broken_at_sequence ?? "?"}`];
  const leases = (run.open_tasks || []).filter((t) => t.lease_owner);
  const open = !run.closed_at;
  const viewKey = run.run_id;
  if (!timelineViews.has(viewKey)) timelineViews.set(viewKey, {});
  const timeline = timelineSection(timelineModel(history, run, Date.now()), timelineViews.get(viewKey), openEvent);
  const liveToggle = open ? h("label", { class: "live" },
    h("input", { type: "checkbox", id: "live-toggle", checked: session.live, onchange: (event) => { session.live = event.target.checked; route(); } }),
    " Follow live", session.live ? h("span", { class: "badge running", id: "live-badge" }, "live") : null) : null;

  show(
    h("p", {}, h("a", { href: "#/workflows" }, "← Workflows")),
    h("div", { class: "title-row" }, h("h1", {}, h("span", { id: "run-title" }, workflowId), badge(run.status), run.paused ? [" ", pausedBadge(run.pause)] : null), liveToggle, buttons),
    run.paused ? h("div", { class: "diagnostic", id: "paused-note" }, "Paused ", when(run.pause.paused_at),
      run.pause.principal ? ` by ${principalText(run.pause.principal)}` : "", run.pause.reason ? `: ${run.pause.reason}` : "",
      ". No workflow or activity task of this run goes to a worker until it is resumed; timers, signals and timeouts go on.") : null,
    run.workflow_task_failure ? taskFailureBox(run.workflow_task_failure, open) : null,
    run.integrity_incident ? h("div", { class: "error-box", role: "alert" }, "This run is blocked by an integrity incident: its stored history does not verify.") : null,
    run.blocked_by ? h("div", { class: "diagnostic" }, "Blocked: ", run.blocked_by.reason || "", " ", run.blocked_by.ledger_key ? h("a", { href: `#/ledger/${enc(run.blocked_by.ledger_key)}` }, run.blocked_by.ledger_key) : "") : null,
    h("div", { class: "grid" },
      h("section", { class: "card", "aria-labelledby": "summary-h" },
        h("h2", { id: "summary-h" }, "Summary"),
        facts([
          ["Run ID", h("span", { class: "mono" }, run.run_id)],
          ["Run", `#${run.run_number} of ${run.run_count}${run.is_current_run ? " (current)" : ""}`],
          ["Type", run.workflow_type],
          ["Task queue", h("a", { href: `#/task-queues/${enc(run.task_queue)}` }, run.task_queue)],
          run.business_key ? ["Business key", run.business_key] : null,
          ["Dispatch", h("span", { id: "dispatch-class" }, `priority ${run.priority ?? 5}, ${run.fairness_key ? `class ${run.fairness_key} (weight ${run.fairness_weight ?? 1})` : "default class"}`)],
          ["Started", when(run.started_at)],
          ["Started by", h("span", { id: "started-by" }, principalText(run.started_by))],
          ["Closed", run.closed_at ? [when(run.closed_at), " (", run.closed_reason || "", ")"] : "—"],
          ["Duration", span(run.started_at, run.closed_at)],
          ["Waiting on", run.wait_kind || "—"],
          ["History", h("span", { id: "history-budget" }, `${run.history_event_count} events, ${((run.history_size_bytes || 0) / 1048576).toFixed(2)} MiB `,
            run.history_budget_pressure && run.history_budget_pressure !== "ok"
              ? h("span", { class: `badge ${run.history_budget_pressure === "approaching" ? "warn" : "bad"}`, title: `past the threshold of ${(run.history_budget_pressure_dimensions || []).join(", ")}` },
                  run.history_budget_pressure === "approaching" ? "approaching history budget" : "continue as new recommended")
              : null)],
          ["Fence high water", String(run.fence_high_water ?? "—")],
          ["Lease", leases.length ? leases.map((t) => `${t.kind} task held by ${t.lease_owner} until ${t.lease_expires_at} (fence ${t.fence})`).join("; ") : "none held"],
          run.compatibility ? ["Build", run.compatibility] : null,
          run.parent_workflow_id ? ["Parent", h("a", { href: `#/workflows/${enc(run.parent_workflow_id)}/runs/${enc(run.parent_run_id)}` }, run.parent_workflow_id)] : null,
          ["History chain", h("span", { id: "chain-status" }, chain)],
          run.import_source ? ["Imported", h("span", { id: "imported-from", title: `import ${run.import_id}; bundle checksum ${run.import_bundle_checksum}` },
            h("span", { class: "badge" }, "imported"), ` from ${run.import_source_runtime === "embedded" ? "DW (embedded)" : run.import_source_runtime}`,
            run.import_source_namespace ? ` namespace ${run.import_source_namespace}` : "", ", ", when(run.imported_at))] : null,
        ])),
      h("section", { class: "card", "aria-labelledby": "io-h" },
        h("h2", { id: "io-h" }, "Input and result"),
        h("h3", { class: "muted" }, "Input"), h("div", { id: "run-input" }, json(input)),
        h("h3", { class: "muted" }, run.failure ? "Failure" : "Result"),
        h("div", { id: "run-output" }, run.failure ? json(run.failure) : output === undefined ? h("p", { class: "muted" }, "No result yet.") : json(output)),
        Object.keys(run.memo || {}).length ? [h("h3", { class: "muted" }, "Memo"), json(run.memo)] : null,
        Object.keys(run.search_attributes || {}).length ? [h("h3", { class: "muted" }, "Search attributes"), json(run.search_attributes)] : null)),

    timeline,

    h("h2", {}, "Pending activities"),
    table("Open activity executions", [
      ["Activity", (a) => [a.activity_type, h("div", { class: "muted mono" }, a.activity_execution_id)], "wrap"],
      ["Status", (a) => badge(a.status)],
      ["Attempts", (a) => `${a.attempt_count}${a.max_attempts ? " / " + a.max_attempts : ""}`],
      ["Lease", (a) => a.lease_owner ? [a.lease_owner, h("div", { class: "muted" }, "until ", when(a.lease_expires_at))] : a.next_attempt_at ? ["next attempt ", when(a.next_attempt_at)] : "—"],
      ["Last heartbeat", (a) => a.last_heartbeat_at ? [when(a.last_heartbeat_at), a.last_heartbeat_details == null ? null : json(a.last_heartbeat_details)] : "—"],
      ["Ledger", (a) => a.blocked_by
        ? h("a", { href: `#/ledger/${enc(a.blocked_by)}` }, "outcome unknown: resolve")
        : a.ledger_key ? h("a", { href: `#/ledger/${enc(a.ledger_key)}` }, "dispatch entry") : "—"],
    ], run.pending_activities || [], "No activity is pending."),

    h("div", { class: "grid" },
      h("section", {},
        h("h2", {}, "Timers"),
        table("Pending timers", [
          ["Timer", (t) => h("span", { class: "mono" }, t.timer_id), "wrap"],
          ["Purpose", (t) => t.purpose],
          ["Fires", (t) => when(t.fire_at)],
        ], run.pending_timers || [], "No timer is pending.")),
      h("section", {},
        h("h2", {}, "Updates"),
        table("Updates of this run", [
          ["Update", (u) => [u.name, h("div", { class: "muted mono" }, u.update_id)], "wrap"],
          ["Status", (u) => badge(u.status)],
          ["Outcome", (u) => u.failure_message || u.outcome || "—"],
        ], run.updates || [], "No updates."))),

    h("div", { class: "grid" },
      h("section", {},
        h("h2", {}, "Children"),
        table("Open child workflows", [
          ["Child", (c) => h("a", { href: `#/workflows/${enc(c.workflow_id)}/runs/${enc(c.run_id)}` }, c.workflow_id), "wrap"],
          ["Type", (c) => c.workflow_type],
          ["Parent close", (c) => c.parent_close_policy],
        ], run.open_children || [], "No open children.")),
      h("section", {},
        h("h2", {}, "Runs (continue-as-new chain)"),
        table("Runs of this workflow", [
          ["Run", (r) => r.run_id === run.run_id ? h("strong", {}, "#" + r.run_number) : h("a", { href: `#/workflows/${enc(workflowId)}/runs/${enc(r.run_id)}` }, "#" + r.run_number)],
          ["Status", (r) => badge(r.status)],
          ["Started", (r) => when(r.started_at)],
        ], runs.runs || []))),

    (ledger.entries || []).length ? [h("h2", {}, "Recovery ledger"), ledgerTable(ledger.entries)] : null,

    can.can_signal ? h("section", { class: "card" }, h("h2", {}, "Send a signal"), signalForm) : null,

    h("h2", {}, "Audit trail"),
    h("p", { class: "muted" }, "Queries, pauses and resumes write no history; who did what is kept here, newest first."),
    table("Queries, pauses and resumes of this workflow", [
      ["When", (e) => when(e.recorded_at)],
      ["Who", (e) => h("span", { class: "principal" }, principalText(e.principal))],
      ["What", (e) => h("span", { class: "mono" }, auditText(e))],
      ["Run", (e) => h("span", { class: "mono" }, e.run_id || "—")],
    ], audit.events || [], "No one has queried, paused or resumed this workflow."),

    h("h2", {}, `History (${history.length} events)`),
    h("ol", { class: "timeline", id: "history" }, history.map((event) => {
      const type = event.event_type || "";
      const cls = CLOSING.test(type) ? "closing" : /Failed|TimedOut/.test(type) ? "failure" : "";
      return h("li", { class: cls, id: `event-${event.sequence}` },
        h("details", {},
          h("summary", {}, h("span", { class: "seq" }, event.sequence), h("strong", {}, type),
            h("span", { class: "principal", "data-principal": event.principal ? event.principal.id : "" }, "by ", principalText(event.principal)),
            h("span", { class: "muted" }, when(event.timestamp))),
          json(decodePayloads(event.payload)),
          h("div", { class: "muted mono" }, "hash ", event.hash, " ← ", event.prev_hash)));
    })));
  if (open && session.live) followLive(path, run);
}

/// Opens history event `sequence` and brings it into view.
function openEvent(sequence) {
  const item = document.getElementById(`event-${sequence}`);
  if (!item) return;
  const details = item.querySelector("details");
  if (details) details.open = true;
  item.scrollIntoView({ block: "center" });
  item.classList.add("picked");
  setTimeout(() => item.classList.remove("picked"), 1600);
}

/// Redraws a running workflow's page when its history grows or its status changes, keeping the
/// reader's scroll position and the timeline's window.
function followLive(path, run) {
  let timer = null;
  let stopped = false;
  const look = async () => {
    try {
      const now = await api("GET", path);
      if (stopped) return;
      if (now.history_event_count !== run.history_event_count || now.status !== run.status || now.run_id !== run.run_id) {
        const scroll = window.scrollY;
        await route();
        window.scrollTo(0, scroll);
        return;
      }
    } catch (_) { /* the next look tries again */ }
    if (!stopped) timer = setTimeout(look, LIVE_MS);
  };
  timer = setTimeout(look, LIVE_MS);
  stopPage = () => { stopped = true; clearTimeout(timer); };
}

async function loadHistory(workflowId, runId) {
  const events = [];
  let token = "";
  for (let pages = 0; pages < 50; pages++) {
    const page = await api("GET", `/workflows/${enc(workflowId)}/runs/${enc(runId)}/history` + query({ page_size: 1000, next_page_token: token }));
    events.push(...(page.events || []));
    if (!page.next_page_token) break;
    token = page.next_page_token;
  }
  return events;
}

// ---------------------------------------------------------------------------------------------
// Recovery ledger

function ledgerTable(entries) {
  return table("Ledger entries", [
    ["Entry", (e) => h("a", { href: `#/ledger/${enc(e.ledger_key)}` }, e.ledger_key), "wrap"],
    ["Action", (e) => e.activity_type],
    ["State", (e) => badge(e.state)],
    ["Workflow", (e) => h("a", { href: `#/workflows/${enc(e.workflow_id)}` }, e.workflow_id), "wrap"],
    ["Dispatched", (e) => when(e.dispatched_at)],
    ["Why unknown", (e) => reasonText(e.unknown_reason)],
  ], entries, "No entries.");
}

async function ledgerPage(params) {
  const state = params.get("state") || "outcome_unknown";
  const listed = await api("GET", "/ledger" + query({ state }));
  const entries = listed.entries || [];
  show(
    h("h1", {}, "Recovery ledger"),
    h("p", { class: "muted" }, "Consequential actions whose dispatch left their effect uncertain wait here for an operator: confirm the effect (with its result) or say it is absent (the action is retried)."),
    h("div", { class: "tabs", role: "navigation", "aria-label": "Ledger states" },
      ["outcome_unknown", "dispatched", "pending", "verified", "effect_confirmed", "effect_absent"].map((s) =>
        h("a", { href: "#/ledger" + query({ state: s }), "aria-current": String(s === state) }, s.replace("_", " ")))),
    state === "outcome_unknown" && !entries.length
      ? h("div", { class: "empty" }, "No action has an unknown outcome. Nothing needs resolving.")
      : ledgerTable(entries));
}

async function ledgerEntryPage(key) {
  const entry = await api("GET", `/ledger/${enc(key)}`);
  const decision = h("select", { id: "resolve-decision", name: "decision", required: true },
    h("option", { value: "" }, "choose…"),
    h("option", { value: "effect_confirmed" }, "effect confirmed: the action happened"),
    h("option", { value: "effect_absent" }, "effect absent: the action did not happen (retry it)"));
  const evidence = h("textarea", { id: "resolve-evidence", name: "evidence", required: true, placeholder: "{\"provider_reference\": \"ch_123\", \"note\": \"checked the provider dashboard\"}" });
  const result = h("textarea", { id: "resolve-result", name: "result", placeholder: "the action's result as JSON (only with effect confirmed)" });
  const form = h("form", { class: "stack", id: "resolve-form", onsubmit: async (event) => {
    event.preventDefault();
    let body;
    try {
      body = { decision: decision.value, evidence: JSON.parse(evidence.value || "null") };
      if (result.value.trim()) body.result = JSON.parse(result.value);
    } catch (_) { toast("Evidence and result must be JSON.", "error"); return; }
    if (!body.evidence || typeof body.evidence !== "object" || Array.isArray(body.evidence)) { toast("Evidence must be a JSON object.", "error"); return; }
    const done = await act("Entry resolved", () => api("POST", `/ledger/${enc(key)}/resolve`, body));
    if (done) route();
  } },
    h("label", { for: "resolve-decision" }, "Decision", decision),
    h("label", { for: "resolve-evidence" }, "Evidence (JSON object: what you checked)", evidence),
    h("label", { for: "resolve-result" }, "Result (JSON, optional)", result),
    h("div", {}, h("button", { class: "primary", type: "submit" }, "Resolve")));
  show(
    h("p", {}, h("a", { href: "#/ledger" }, "← Recovery ledger")),
    h("h1", {}, h("span", { class: "mono" }, entry.ledger_key), badge(entry.state)),
    h("div", { class: "grid" },
      h("section", { class: "card" }, h("h2", {}, "Dispatch"), facts([
        ["Action", entry.activity_type],
        ["Workflow", h("a", { href: `#/workflows/${enc(entry.workflow_id)}` }, entry.workflow_id)],
        ["Run", h("span", { class: "mono" }, entry.run_id)],
        ["Attempt", `${entry.attempt_number} (${entry.activity_attempt_id})`],
        ["Fence", String(entry.fence)],
        ["Mode", entry.recovery_mode],
        ["Dispatched", when(entry.dispatched_at)],
        ["Why unknown", reasonText(entry.unknown_reason)],
        ["Input hash", h("span", { class: "mono" }, entry.input_hash)],
        ["Idempotency key hash", h("span", { class: "mono" }, entry.idempotency_key_hash || "—")],
        ["Checkpoint", h("span", { class: "mono" }, entry.checkpoint_hash || "—")],
        ["Chain", entry.chain_verified === undefined ? "—" : entry.chain_verified ? badge("ok") : badge("bad")],
      ])),
      entry.state === "outcome_unknown"
        ? h("section", { class: "card" }, h("h2", {}, "Resolve"), form)
        : h("section", { class: "card" }, h("h2", {}, "Resolution"), entry.resolution ? json(decodePayloads(entry.resolution)) : h("p", { class: "muted" }, "Not resolved by an operator."))),
    (entry.late_reports || []).length ? [h("h2", {}, "Late reports"), json(entry.late_reports)] : null);
}

// ---------------------------------------------------------------------------------------------
// Workers and task queues

/** A worker's free slots as its last heartbeat reported them. */
function slotsText(slots) {
  if (!slots) return "—";
  const names = { workflow_available: "workflow", activity_available: "activity", session_available: "session" };
  return Object.entries(slots).map(([family, free]) => `${free} ${names[family] || family}`).join(" · ") || "—";
}

/** The process metrics a worker reported: pid, resident memory, CPU share, uptime. */
function metricsText(metrics) {
  if (!metrics) return "—";
  return [
    metrics.host ? `${metrics.host}` : null,
    metrics.process_id != null ? `pid ${metrics.process_id}` : null,
    metrics.memory_bytes != null ? `${(metrics.memory_bytes / 1048576).toFixed(1)} MiB` : null,
    metrics.cpu_percent != null ? `${Number(metrics.cpu_percent).toFixed(1)}% CPU` : null,
    metrics.process_uptime_seconds != null ? `up ${metrics.process_uptime_seconds} s` : null,
  ].filter(Boolean).join(" · ") || "—";
}

async function workersPage() {
  const [workers, queues] = await Promise.all([api("GET", "/workers"), api("GET", "/task-queues")]);
  show(
    h("h1", {}, "Workers and task queues"),
    h("h2", {}, "Task queues"),
    table("Task queues", [
      ["Queue", (q) => h("a", { href: `#/task-queues/${enc(q.name)}` }, q.name), "wrap"],
      ["Backlog", (q) => String(q.stats?.backlog ?? 0)],
      ["Live pollers", (q) => String(q.stats?.poller_count ?? 0)],
      ["Oldest ready", (q) => { const age = q.stats?.workflow_tasks?.oldest_ready_age_seconds ?? q.stats?.activity_tasks?.oldest_ready_age_seconds; return age == null ? "—" : age + " s"; }],
      ["Diagnostics", (q) => (q.diagnostics || []).length ? (q.diagnostics || []).map((d) => h("div", { class: "diagnostic" }, h("strong", {}, d.reason), ": ", d.message)) : "—"],
    ], queues.task_queues || [], "No task queue has been polled yet."),
    h("h2", {}, "Workers"),
    table("Registered workers", [
      ["Worker", (w) => w.worker_id, "wrap"],
      ["Status", (w) => badge(w.status)],
      ["Queue", (w) => h("a", { href: `#/task-queues/${enc(w.task_queue)}` }, w.task_queue)],
      ["Build", (w) => w.build_id || "unversioned"],
      ["Runtime", (w) => `${w.runtime || "?"} ${w.sdk_version || ""}`],
      ["Last seen", (w) => when(w.last_heartbeat_at)],
      ["Free slots", (w) => h("span", { class: "worker-slots" }, slotsText(w.task_slots))],
      ["Process", (w) => h("span", { class: "worker-process" }, metricsText(w.process_metrics)), "wrap"],
      ["Types", (w) => [...(w.supported_workflow_types || []), ...(w.supported_activity_types || [])].join(", ") || "—", "wrap"],
    ], workers.workers || [], "No worker is registered in this namespace."));
}

async function taskQueuePage(name) {
  const [queue, builds, shares] = await Promise.all([
    api("GET", `/task-queues/${enc(name)}`),
    api("GET", `/task-queues/${enc(name)}/build-ids`).catch(() => ({ build_ids: [] })),
    api("GET", `/task-queues/${enc(name)}/priority-fairness`).catch(() => null),
  ]);
  const limits = await api("GET", `/task-queues/${enc(name)}/limits`).catch(() => null);
  const stats = queue.stats || {};
  show(
    h("p", {}, h("a", { href: "#/workers" }, "← Workers and task queues")),
    h("h1", {}, "Task queue ", h("span", { class: "mono" }, queue.name)),
    (queue.diagnostics || []).map((d) => h("div", { class: "diagnostic", role: "note" }, h("strong", {}, d.reason), ": ", d.message)),
    queueHolds(name, queue.admission || {}),
    h("div", { class: "grid" },
      h("section", { class: "card" }, h("h2", {}, "Backlog"), facts([
        ["Backlog", String(stats.backlog ?? 0)],
        ["Workflow tasks", `${stats.workflow_tasks?.ready_count ?? 0} ready, ${stats.workflow_tasks?.leased_count ?? 0} leased`],
        ["Activity tasks", `${stats.activity_tasks?.ready_count ?? 0} ready, ${stats.activity_tasks?.leased_count ?? 0} leased`],
        ["Live pollers", String(stats.poller_count ?? 0)],
      ])),
      h("section", { class: "card" }, h("h2", {}, "Build ids"),
        table("Build-id cohorts", [
          ["Build", (b) => b.build_id || "unversioned"],
          ["Status", (b) => badge(b.rollout_status || b.status)],
          ["Workers", (b) => String(b.active_worker_count ?? b.total_worker_count ?? 0)],
        ], builds.build_ids || [], "No build ids."))),
    limits ? flowControl(name, limits) : null,
    shares ? dispatchShares(shares) : null,
    h("h2", {}, "Pollers"),
    table("Workers polling this queue", [
      ["Worker", (p) => p.worker_id, "wrap"],
      ["Status", (p) => badge(p.status)],
      ["Build", (p) => p.build_id || "unversioned"],
      ["Runtime", (p) => `${p.runtime || "?"} ${p.sdk_version || ""}`],
      ["Last seen", (p) => when(p.last_heartbeat_at)],
      ["Free slots", (p) => h("span", { class: "poller-slots" }, slotsText(p.task_slots))],
      ["Process", (p) => metricsText(p.process_metrics), "wrap"],
    ], queue.pollers || [], "No worker polls this queue."),
    h("h2", {}, "Current leases"),
    table("Leased tasks", [
      ["Task", (l) => [l.task_kind, " ", h("span", { class: "mono" }, l.task_id)], "wrap"],
      ["Workflow", (l) => h("a", { href: `#/workflows/${enc(l.workflow_id)}/runs/${enc(l.run_id)}` }, l.workflow_id), "wrap"],
      ["Owner", (l) => l.lease_owner],
      ["Expires", (l) => when(l.lease_expires_at)],
    ], queue.current_leases || [], "No task is leased."));
}

/** Whether each kind of the queue's tasks goes to workers, with a Pause or Resume button each. */
function queueHolds(name, admission) {
  const row = (kind) => {
    const state = admission[`${kind}_tasks`] || {};
    const pause = state.pause;
    const post = (op, body) => act(op === "pause" ? `The queue's ${kind} tasks paused` : `The queue's ${kind} tasks resumed`,
      () => api("POST", `/task-queues/${enc(name)}/${op}`, { kind, ...body })).then(() => route());
    return h("div", { class: "title-row", id: `queue-${kind}` },
      h("span", {}, `${kind[0].toUpperCase()}${kind.slice(1)} tasks `, pause ? pausedBadge(pause) : badge("open"),
        pause ? h("span", { class: "muted" }, " since ", when(pause.paused_at), pause.principal ? ` by ${principalText(pause.principal)}` : "",
          pause.reason ? `: ${pause.reason}` : "") : null),
      pause
        ? h("button", { type: "button", id: `queue-resume-${kind}`, class: "primary", onclick: () => post("resume", {}) }, "Resume")
        : h("button", { type: "button", id: `queue-pause-${kind}`, onclick: () => {
          const reason = prompt(`Pause the ${kind} tasks of ${name}? None goes to a worker until they are resumed. Why?`, "");
          if (reason !== null) post("pause", { reason: reason || "paused from the Capstan UI" });
        } }, "Pause"));
  };
  return h("section", { class: "card", "aria-labelledby": "holds-h" },
    h("h2", { id: "holds-h" }, "Dispatch"), row("workflow"), row("activity"));
}

/** Whether a kind's limits row holds any limit (it may hold only a pause). */
function hasLimits(l) {
  return l.dispatch_rate_per_second != null || l.max_leased_tasks != null || l.fairness_key_limits
    || Object.keys(l.fairness_key_overrides || {}).length > 0 || Object.keys(l.fairness_weights || {}).length > 0;
}

/** The queue's flow-control limits per task kind, and a form that sets them live. */
function flowControl(name, limits) {
  const rows = [["workflow", limits.workflow_task], ["activity", limits.activity_task]]
    .filter(([, l]) => l && hasLimits(l)).map(([kind, l]) => ({ kind, ...l }));
  const kind = h("select", { id: "limit-kind" }, h("option", { value: "workflow" }, "workflow"), h("option", { value: "activity" }, "activity"));
  const rate = h("input", { id: "limit-rate", type: "number", min: "0", step: "any", placeholder: "no limit" });
  const burst = h("input", { id: "limit-burst", type: "number", min: "1", step: "1", placeholder: "the rate" });
  const cap = h("input", { id: "limit-max-leased", type: "number", min: "1", step: "1", placeholder: "no limit" });
  const keyCap = h("input", { id: "limit-key-max-leased", type: "number", min: "1", step: "1", placeholder: "no limit" });
  const weights = h("input", { id: "limit-weights", placeholder: "e.g. tenant-a=3, tenant-b=1" });
  const number = (field) => (field.value.trim() === "" ? null : Number(field.value));
  const path = () => `/task-queues/${enc(name)}/limits/${enc(kind.value)}`;
  const form = h("form", { class: "stack", onsubmit: async (event) => {
    event.preventDefault();
    // A key's own limits (set over the API or the CLI) are kept as they are.
    const current = (kind.value === "workflow" ? limits.workflow_task : limits.activity_task) || {};
    const fairnessWeights = {};
    for (const pair of weights.value.split(",").map((p) => p.trim()).filter(Boolean)) {
      const [key, weight] = pair.split("=").map((p) => p.trim());
      fairnessWeights[key] = Number(weight);
    }
    const body = {
      dispatch_rate_per_second: number(rate), dispatch_burst: number(burst), max_leased_tasks: number(cap),
      fairness_key_limits: number(keyCap) == null ? null : { max_leased_tasks: number(keyCap) },
      fairness_key_overrides: current.fairness_key_overrides || {},
      fairness_weights: fairnessWeights,
    };
    await act(`Limits of ${kind.value} tasks saved`, () => api("PUT", path(), body));
    route();
  } },
    h("label", { for: "limit-kind" }, "Task kind", kind),
    h("label", { for: "limit-rate" }, "Dispatch rate (per second)", rate),
    h("label", { for: "limit-burst" }, "Burst", burst),
    h("label", { for: "limit-max-leased" }, "Leased at once, at most", cap),
    h("label", { for: "limit-key-max-leased" }, "Cap per fairness key", keyCap),
    h("label", { for: "limit-weights" }, "Fairness key weights", weights),
    h("div", { class: "actions" },
      h("button", { type: "submit" }, "Save limits"),
      h("button", { type: "button", onclick: async () => { await act(`Limits of ${kind.value} tasks cleared`, () => api("DELETE", path())); route(); } }, "Clear limits")));
  return h("section", { class: "card", "aria-labelledby": "flow-h" },
    h("h2", { id: "flow-h" }, "Flow control"),
    table("Flow-control limits (in force on every node within a second)", [
      ["Kind", (r) => r.kind],
      ["Rate / s", (r) => (r.dispatch_rate_per_second == null ? "—" : String(r.dispatch_rate_per_second))],
      ["Burst", (r) => (r.dispatch_burst == null ? "—" : String(r.dispatch_burst))],
      ["Leased at most", (r) => (r.max_leased_tasks == null ? "—" : String(r.max_leased_tasks))],
      ["Leased now", (r) => String(r.leased_tasks)],
      ["Tokens", (r) => (r.available_tokens == null ? "—" : r.available_tokens.toFixed(1))],
      ["Fairness keys", (r) => fairnessKeySummary(r)],
    ], rows, "No limits: tasks go out as fast as workers take them."),
    form);
}

/** A kind's per-fairness-key limits and weights, in a line. */
function fairnessKeySummary(limits) {
  const limitText = (l) => [
    l.dispatch_rate_per_second == null ? null : `${l.dispatch_rate_per_second}/s`,
    l.max_leased_tasks == null ? null : `≤${l.max_leased_tasks} leased`,
  ].filter(Boolean).join(", ") || "no limit";
  const parts = [];
  if (limits.fairness_key_limits) parts.push(`each key ${limitText(limits.fairness_key_limits)}`);
  for (const [key, own] of Object.entries(limits.fairness_key_overrides || {})) parts.push(`${key}: ${limitText(own)}`);
  for (const [key, weight] of Object.entries(limits.fairness_weights || {})) parts.push(`${key} weight ${weight}`);
  return parts.length ? parts.join("; ") : "—";
}

/** Ready tasks by kind, priority and fairness class, with each class's recent dispatch. */
function dispatchShares(shares) {
  const rows = [];
  for (const [kind, surface] of [["workflow", shares.workflow_task], ["activity", shares.activity_task]]) {
    const recent = new Map((surface?.recent_dispatch || []).map((r) => [r.fairness_key, r.score]));
    for (const tier of surface?.priority_tiers || []) {
      for (const c of tier.classes) rows.push({ kind, priority: tier.priority, ...c, score: recent.get(c.fairness_key) ?? 0 });
    }
  }
  return [
    h("h2", {}, "Ready by priority and fairness class"),
    table("Ready tasks by priority and fairness class (lower priority numbers are dispatched first)", [
      ["Kind", (r) => r.kind],
      ["Priority", (r) => String(r.priority)],
      ["Class", (r) => r.fairness_key || "default"],
      ["Weight", (r) => String(r.fairness_weight)],
      ["Ready", (r) => String(r.count)],
      ["Recent dispatch", (r) => r.score.toFixed(2)],
    ], rows, "No task is waiting."),
  ];
}

// ---------------------------------------------------------------------------------------------
// Schedules

async function schedulesPage() {
  const listed = await api("GET", "/schedules");
  show(
    h("h1", {}, "Schedules"),
    table("Schedules", [
      ["Schedule", (s) => s.schedule_id, "wrap"],
      ["Status", (s) => badge(s.status)],
      ["Spec", (s) => (s.spec?.cron_expressions || []).join(", ") || (s.spec?.intervals || []).map((i) => i.every).join(", ") || "—"],
      ["Workflow", (s) => s.action?.workflow_type || "—"],
      ["Next run", (s) => when(s.next_run_at || s.next_fire_at)],
      ["Fired", (s) => String(s.fires_count ?? s.info?.fires_count ?? "—")],
    ], listed.schedules || [], "No schedules. Create one with `capstan schedule create`."));
}

// ---------------------------------------------------------------------------------------------
// Routing

function markSection(section) {
  for (const link of document.querySelectorAll("nav a[data-section]")) {
    if (link.dataset.section === section) link.setAttribute("aria-current", "page");
    else link.removeAttribute("aria-current");
  }
}

async function route() {
  const hash = location.hash.replace(/^#/, "") || "/workflows";
  const [path, search] = hash.split("?");
  const params = new URLSearchParams(search || "");
  const parts = path.split("/").filter(Boolean).map(decodeURIComponent);
  stopPage();
  stopPage = () => {};
  refreshBanner();
  await guarded(async () => {
    switch (parts[0]) {
      case "workflows":
        markSection("workflows");
        document.title = parts[1] ? `${parts[1]} · Capstan` : "Workflows · Capstan";
        if (!parts[1]) return workflowsPage(params);
        return runPage(parts[1], parts[2] === "runs" ? parts[3] : undefined);
      case "ledger":
        markSection("ledger");
        document.title = "Recovery ledger · Capstan";
        return parts[1] ? ledgerEntryPage(parts[1]) : ledgerPage(params);
      case "workers":
        markSection("workers");
        document.title = "Workers · Capstan";
        return workersPage();
      case "task-queues":
        markSection("workers");
        document.title = `${parts[1]} · Capstan`;
        return taskQueuePage(parts[1]);
      case "server":
        markSection("server");
        document.title = "Server · Capstan";
        stopPage = serverPage(main(), scrapeMetrics);
        return;
      case "schedules":
        markSection("schedules");
        document.title = "Schedules · Capstan";
        return schedulesPage();
      case "batches": {
        markSection("batches");
        document.title = "Batch operations · Capstan";
        stopPage = await batchesPage(main(), { api, act, table, badge, principalText, argumentsEnvelope });
        return;
      }
      case "access":
        markSection("access");
        document.title = "Access · Capstan";
        return accessPage(main(), { api, act, table, principalText });
      default:
        show(h("div", { class: "empty" }, "No such page. ", h("a", { href: "#/workflows" }, "Go to workflows")));
    }
  });
  document.body.dataset.ready = "true";
}

document.getElementById("namespace").addEventListener("change", (event) => {
  session.namespace = event.target.value;
  route();
});
document.getElementById("token-button").addEventListener("click", () => show(tokenForm("Paste an operator (or admin) token. It is kept for this browser tab only.")));
window.addEventListener("hashchange", () => { document.body.dataset.ready = "false"; route(); });
loadNamespaces();
refreshIdentity();
route();
