"""Reconciliation probes through the published Python SDK (``durable-workflow==2.12.0``).

A declared action names a probe: an activity type that asks the provider, by the entry's
idempotency key, whether the effect happened. When a dispatch's outcome becomes unknown Capstan
starts the probe (a standalone activity the same worker runs) and records its answer as the
resolution an operator would have made: ``found`` completes the step with the provider's
result, ``absent`` retries it once under the same key, ``inconclusive`` leaves it to the
operator. The action itself is never run by a probe.
"""
from __future__ import annotations

import asyncio
import time

import httpx
from durable_workflow import ActivityRetryPolicy, activity, workflow

from capstan_harness import (
    CONTROL_HEADERS,
    assert_history_invariants,
    events_of,
    fetch_history,
    make_client,
    run_async,
    unique,
    wait_result,
)

# The provider's books: charges by idempotency key, and every call the action made.
CHARGED: dict[str, int] = {}
CALLS: dict[str, list[str]] = {}
LOOKUPS: dict[str, int] = {}


@activity.defn(name="probes.charge")
def charge(order: dict) -> dict:
    key, mode = order["order_id"], order["mode"]
    calls = CALLS.setdefault(key, [])
    calls.append(mode)
    if mode == "charged-then-lost" or (mode == "lost-before-charging" and len(calls) > 1) or mode == "unclear":
        CHARGED[key] = CHARGED.get(key, 0) + 1
    if len(calls) == 1 and mode in ("charged-then-lost", "lost-before-charging", "unclear"):
        raise RuntimeError("connection reset: the bank's answer was lost")
    return {"charged": key, "calls": len(calls)}


@activity.defn(name="probes.lookup")
def lookup(question: dict) -> dict:
    key = question["idempotency_key"]
    LOOKUPS[key] = LOOKUPS.get(key, 0) + 1
    if CALLS.get(key, [""])[0] == "unclear":
        return {"outcome": "inconclusive", "evidence": {"note": "the bank's search API is degraded"}}
    if CHARGED.get(key):
        return {"outcome": "found", "evidence": {"provider_reference": f"ch-{key}"}, "result": {"charged": key, "calls": 0}}
    return {"outcome": "absent", "evidence": {"searched": f"charges with key {key}"}}


@workflow.defn(name="probes.checkout")
class Checkout:
    def run(self, ctx, order):
        receipt = yield ctx.schedule_activity(
            "probes.charge", [order], start_to_close_timeout=5,
            retry_policy=ActivityRetryPolicy(max_attempts=5, backoff_seconds=[1]),
        )
        return {"receipt": receipt}


DEFINITION = {
    "recovery_mode": "non_atomic",
    "idempotency_key": "/0/order_id",
    "preview": "/0/preview",
    "verification": {"result_schema": {"type": "object", "required": ["charged"]}},
    "probe": {"activity_type": "probes.lookup", "max_attempts": 2, "start_to_close_seconds": 5},
}


async def wait_for_entries(http: httpx.AsyncClient, workflow_id: str, done, timeout: float = 30.0) -> list[dict]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        entries = (await http.get("/api/ledger", params={"workflow_id": workflow_id})).json()["entries"]
        if done(entries):
            return entries
        await asyncio.sleep(0.1)
    raise AssertionError(f"the ledger of {workflow_id} never settled: {entries}")


def run_checkout(server_url, worker_url, run_worker, mode, operator=None):
    queue = unique("probes")
    workflow_id = unique(f"probe-{mode}")
    order = {"order_id": unique("ord"), "mode": mode, "preview": {"to": "acme", "amount": 100}}

    async def main():
        async with httpx.AsyncClient(base_url=server_url, headers=CONTROL_HEADERS, timeout=30.0) as http:
            defined = await http.put("/api/action-definitions/probes.charge", json=DEFINITION)
            assert defined.status_code == 200, defined.text
            async with run_worker(worker_url, queue, workflows=[Checkout], activities=[charge, lookup]) as worker, \
                    make_client(server_url) as client:
                handle = await client.start_workflow(workflow_type="probes.checkout", task_queue=queue, workflow_id=workflow_id, input=[order])
                if operator is not None:
                    entries = await wait_for_entries(
                        http, workflow_id, lambda es: any((e.get("probe") or {}).get("state") == "inconclusive" for e in es))
                    await operator(http, entries)
                outcome = await wait_result(handle, timeout=45, workers=[worker])
                events = await fetch_history(client, workflow_id, handle.run_id)
                entries = (await http.get("/api/ledger", params={"workflow_id": workflow_id})).json()["entries"]
                shown = [(await http.get(f"/api/ledger/{e['ledger_key']}")).json() for e in entries]
                probes = [(await http.get(f"/api/workflows/{e['probe']['workflow_id']}")).json() for e in entries if e.get("probe")]
        return order["order_id"], outcome, events, shown, probes

    return run_async(main(), timeout=120)


def test_a_found_answer_completes_the_step_without_running_the_action_again(server_url, worker_url, run_worker):
    key, outcome, events, shown, probes = run_checkout(server_url, worker_url, run_worker, "charged-then-lost")
    assert outcome == {"receipt": {"charged": key, "calls": 0}}, "the step completes with the probe's result"
    assert CALLS[key] == ["charged-then-lost"] and CHARGED[key] == 1, "the provider charged exactly once"
    assert LOOKUPS[key] == 1
    assert_history_invariants(events, terminal="WorkflowCompleted")
    assert len(events_of(events, "ActivityStarted")) == 1 and not events_of(events, "ActivityRetryScheduled")
    (entry,) = shown
    assert entry["state"] == "effect_confirmed", entry
    assert entry["resolution"]["principal"] == "probe:probes.lookup"
    assert entry["resolution"]["evidence"]["answer"]["provider_reference"] == f"ch-{key}"
    assert entry["probe"]["state"] == "found"
    assert [c["state"] for c in entry["checkpoints"]] == ["dispatched", "outcome_unknown", "effect_confirmed"]
    assert entry["chain_verified"] is True
    assert len(entry["preview_hash"]) == 64 and entry["checkpoints"][0]["details"]["preview_hash"] == entry["preview_hash"]
    assert (probes[0]["status"], probes[0]["workflow_type"]) == ("completed", "dw.standalone_activity"), probes[0]


def test_an_absent_answer_retries_once_under_the_same_key(server_url, worker_url, run_worker):
    key, outcome, events, shown, _ = run_checkout(server_url, worker_url, run_worker, "lost-before-charging")
    assert outcome == {"receipt": {"charged": key, "calls": 2}}
    assert CHARGED[key] == 1, "charged once, by the deliberate retry"
    assert_history_invariants(events, terminal="WorkflowCompleted")
    (retry,) = events_of(events, "ActivityRetryScheduled")
    states = sorted(e["state"] for e in shown)
    assert states == ["effect_absent", "verified"], states
    absent = next(e for e in shown if e["state"] == "effect_absent")
    verified = next(e for e in shown if e["state"] == "verified")
    assert absent["resolution"]["principal"] == "probe:probes.lookup" and absent["probe"]["state"] == "absent"
    assert absent["idempotency_key_hash"] == verified["idempotency_key_hash"], "the same provider key"
    assert "probe" not in verified or verified["probe"] is None, "a verified dispatch needs no probe"


def test_an_inconclusive_answer_leaves_the_decision_to_the_operator(server_url, worker_url, run_worker):
    async def operator(http, entries):
        (unknown,) = [e for e in entries if e["state"] == "outcome_unknown"]
        await asyncio.sleep(1.5)  # nothing moves by itself
        still = (await http.get(f"/api/ledger/{unknown['ledger_key']}")).json()
        assert still["state"] == "outcome_unknown" and still["checkpoints"][-1]["details"]["probe"] == "inconclusive", still
        body = {"decision": "effect_confirmed", "evidence": {"note": "found it in the bank console"},
                "result": {"charged": "by-operator", "calls": 1}}
        resolved = await http.post(f"/api/ledger/{unknown['ledger_key']}/resolve", json=body)
        assert resolved.status_code == 200, resolved.text

    key, outcome, events, shown, _ = run_checkout(server_url, worker_url, run_worker, "unclear", operator=operator)
    assert outcome == {"receipt": {"charged": "by-operator", "calls": 1}}
    assert LOOKUPS[key] == 1 and CALLS[key] == ["unclear"]
    (entry,) = shown
    assert entry["resolution"]["principal"] != "probe:probes.lookup" and entry["probe"]["state"] == "inconclusive"
    assert [c["state"] for c in entry["checkpoints"]] == ["dispatched", "outcome_unknown", "outcome_unknown", "effect_confirmed"]


def test_a_probe_may_never_be_an_action(server_url):
    async def main():
        async with httpx.AsyncClient(base_url=server_url, headers=CONTROL_HEADERS, timeout=30.0) as http:
            action = unique("act")
            probe = unique("look")
            answers = {}
            answers["self"] = await http.put(f"/api/action-definitions/{action}",
                                             json={"recovery_mode": "non_atomic", "probe": {"activity_type": action}})
            answers["field"] = await http.put(f"/api/action-definitions/{action}",
                                              json={"recovery_mode": "non_atomic", "probe": {"activity_type": probe, "retries": 3}})
            answers["bound"] = await http.put(f"/api/action-definitions/{action}",
                                              json={"recovery_mode": "non_atomic", "probe": {"activity_type": probe, "max_attempts": 50}})
            answers["pointer"] = await http.put(f"/api/action-definitions/{action}",
                                                json={"recovery_mode": "non_atomic", "preview": "preview"})
            answers["ok"] = await http.put(f"/api/action-definitions/{action}",
                                           json={"recovery_mode": "non_atomic", "probe": {"activity_type": probe}})
            answers["probe declared"] = await http.put(f"/api/action-definitions/{probe}", json={"recovery_mode": "non_atomic"})
            return answers

    answers = run_async(main(), timeout=30)
    assert answers["ok"].status_code == 200, answers["ok"].text
    for name in ("self", "field", "bound", "pointer", "probe declared"):
        answer = answers[name]
        assert answer.status_code == 422 and answer.json()["reason"] == "validation_failed", (name, answer.text)
    assert "probe.retries" in answers["field"].text and "probe.max_attempts" in answers["bound"].text


def test_the_cli_declares_a_probe_the_key_and_the_preview(server_url):
    import json
    import subprocess

    from capstan_harness import capstan_binary

    action = unique("cli-act")
    defined = subprocess.run(
        [str(capstan_binary()), "actions", "define", action, "--mode", "non_atomic", "--idempotency-key", "/0/order_id",
         "--preview", "/0/preview", "--probe", '{"activity_type": "cli.lookup", "max_attempts": 4}',
         "--output", "json", "--server", server_url],
        capture_output=True, text=True, timeout=60,
    )
    assert defined.returncode == 0, defined.stderr
    body = json.loads(defined.stdout)
    assert body["probe"] == {"activity_type": "cli.lookup", "max_attempts": 4}, body
    assert (body["idempotency_key"], body["preview"]) == ("/0/order_id", "/0/preview"), body
