// The batch operations page: every batch of the namespace with its progress (followed live
// while one runs), a Cancel button on a running one, and a form that starts one over a query —
// first counting what it would select.

import { h, when } from "./dom.js";

const ACTIONS = ["cancel", "terminate", "signal", "pause", "resume", "redrive", "archive", "delete"];
/// How often the page looks again while a batch runs.
const FOLLOW_MS = 1000;

/// Renders the page into `container`; returns a function that stops following.
export async function batchesPage(container, deps) {
  const { api, act, table, badge, principalText, argumentsEnvelope } = deps;
  let timer;
  const render = async () => {
    const listed = await api("GET", "/batch-operations?limit=50");
    const batches = listed.batch_operations || [];
    container.replaceChildren(
      h("h1", {}, "Batch operations"),
      h("p", { class: "muted" }, "One action on every current run a query selects, a step at a time, each run acted on once. ",
        "Follow them here or with `capstan batch describe ID --follow`."),
      startForm(api, act, argumentsEnvelope, render),
      table("Batch operations, newest first", [
        ["Batch", (b) => h("span", { class: "mono" }, b.batch_id), "wrap"],
        ["Action", (b) => b.action],
        ["Selection", (b) => selectionText(b.request), "wrap"],
        ["State", (b) => badge(b.state)],
        ["Progress", (b) => progress(b)],
        ["By", (b) => principalText(b.principal)],
        ["Started", (b) => when(b.created_at)],
        ["", (b) => (b.state === "running"
          ? h("button", { type: "button", class: "danger", id: `batch-cancel-${b.batch_id}`,
            onclick: async () => { await act("Batch cancelled", () => api("POST", `/batch-operations/${encodeURIComponent(b.batch_id)}/cancel`, {})); render(); } }, "Cancel")
          : "")],
      ], batches, "No batch operations yet."));
    clearTimeout(timer);
    if (batches.some((b) => b.state === "running")) timer = setTimeout(render, FOLLOW_MS);
  };
  await render();
  return () => clearTimeout(timer);
}

/// A batch's counts, with a bar of the runs visited against those it counted at its start.
function progress(batch) {
  const skipped = Object.entries(batch.skipped_by_reason || {}).map(([reason, n]) => `${n} ${reason}`).join(", ");
  return h("span", { class: "batch-progress" },
    `${batch.matched} visited: ${batch.done} done`,
    batch.skipped ? `, ${batch.skipped} skipped (${skipped})` : "",
    batch.failed ? `, ${batch.failed} failed` : "",
    batch.state === "running" ? [" ", h("progress", { "aria-label": "visited" })] : null);
}

function selectionText(request) {
  const r = request || {};
  const parts = [
    r.workflow_type ? `type ${r.workflow_type}` : null,
    r.task_queue ? `queue ${r.task_queue}` : null,
    r.status ? `status ${r.status}` : null,
    r.query ? `query ${r.query}` : null,
    r.signal_name ? `signal ${r.signal_name}` : null,
    r.rate_per_second ? `${r.rate_per_second}/s` : null,
  ].filter(Boolean);
  return parts.join(", ") || "every run";
}

/// The form: the selection and the action; Count asks how many runs it selects now, Start runs it.
function startForm(api, act, argumentsEnvelope, render) {
  const field = (id, label, placeholder) => {
    const input = h("input", { id, placeholder });
    return [input, h("label", { for: id }, label, input)];
  };
  const action = h("select", { id: "batch-action" }, ACTIONS.map((a) => h("option", { value: a }, a)));
  const [query, queryLabel] = field("batch-query", "Query (filter or free text)", "Tier = \"gold\"");
  const [type, typeLabel] = field("batch-type", "Workflow type", "e.g. orders.checkout");
  const [queue, queueLabel] = field("batch-queue", "Task queue", "e.g. default");
  const status = h("select", { id: "batch-status" }, ["", "running", "paused", "completed", "failed"].map((s) => h("option", { value: s }, s || "any")));
  const [reason, reasonLabel] = field("batch-reason", "Reason", "why");
  const [signal, signalLabel] = field("batch-signal", "Signal (signal batches)", "signal name");
  const [rate, rateLabel] = field("batch-rate", "Runs per second, at most", "no limit");
  const count = h("span", { id: "batch-count", class: "muted" });
  const body = (dryRun) => {
    const value = (input) => input.value.trim() || null;
    const asked = {
      action: action.value, query: value(query), workflow_type: value(type), task_queue: value(queue),
      status: status.value || null, reason: value(reason), rate_per_second: value(rate) == null ? null : Number(rate.value),
      dry_run: dryRun,
    };
    if (action.value === "signal") {
      asked.signal_name = value(signal);
      asked.input = argumentsEnvelope([]);
    }
    return asked;
  };
  const form = h("form", { class: "stack", onsubmit: async (event) => {
    event.preventDefault();
    const counted = await act("Counted", () => api("POST", "/batch-operations", body(true)));
    if (counted === undefined) return;
    if (!confirm(`${action.value} ${counted.matched} run(s)?`)) return;
    await act("Batch started", () => api("POST", "/batch-operations", body(false)));
    render();
  } },
    h("label", { for: "batch-action" }, "Action", action),
    queryLabel, typeLabel, queueLabel,
    h("label", { for: "batch-status" }, "Status", status),
    reasonLabel, signalLabel, rateLabel,
    h("div", { class: "actions" },
      h("button", { type: "button", id: "batch-count-button", onclick: async () => {
        const counted = await act("Counted", () => api("POST", "/batch-operations", body(true)));
        if (counted !== undefined) count.textContent = `${counted.matched} run(s) selected now`;
      } }, "Count"),
      h("button", { type: "submit", class: "primary" }, "Start batch"), count));
  return h("section", { class: "card", "aria-labelledby": "batch-new-h" }, h("h2", { id: "batch-new-h" }, "New batch"), form);
}
