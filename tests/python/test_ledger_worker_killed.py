"""The recovery ledger when the worker process really dies (``SIGKILL``) in the middle of a
declared ``non_atomic`` provider call, through the published Python SDK.

After the attempt's lease runs out the step is ``outcome_unknown``: nothing retries it, the run
shows why it is blocked, repair is refused. The operator's evidence then decides:
``effect_confirmed`` completes the workflow with the operator's result and the provider is never
called again; ``effect_absent`` allows exactly one new attempt with the same
``activity_execution_id``.
"""
from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from capstan_harness import (
    CONTROL_HEADERS,
    assert_history_invariants,
    events_of,
    fetch_history,
    make_client,
    payload_of,
    run_async,
    unique,
    wait_result,
)
from ledger_provider import HANGS_ENV, ProviderCheckout, call_count, provider_call

HERE = Path(__file__).resolve().parent


def spawn_dying_worker(url: str, queue: str, log_path: Path) -> subprocess.Popen:
    env = dict(os.environ, **{HANGS_ENV: "1"})
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            [sys.executable, str(HERE / "ledger_provider.py"), url, queue],
            cwd=HERE, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )


async def wait_until(what: str, probe, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = await probe()
        if value:
            return value
        await asyncio.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.parametrize("decision", ["effect_confirmed", "effect_absent"])
def test_a_killed_worker_leaves_an_unknown_outcome_that_evidence_resolves(server_url, worker_url, run_worker, tmp_path, decision):
    queue = unique("ledger-kill")
    workflow_id = unique(f"provider-{decision}")
    calls_path = str(tmp_path / "provider-calls.txt")

    async def main():
        async with httpx.AsyncClient(base_url=server_url, headers=CONTROL_HEADERS, timeout=30.0) as http:
            defined = await http.put("/api/action-definitions/ledger.provider_call", json={"recovery_mode": "non_atomic"})
            assert defined.status_code == 200, defined.text
            process = spawn_dying_worker(worker_url, queue, tmp_path / "worker.log")
            try:
                async with make_client(server_url) as client:
                    handle = await client.start_workflow(
                        workflow_type="ledger.provider_checkout", task_queue=queue, workflow_id=workflow_id,
                        input=[calls_path, 42],
                    )
                    await wait_until("the provider call to start", lambda: asyncio.sleep(0, call_count(calls_path)))
                    os.killpg(process.pid, signal.SIGKILL)
                    process.wait(timeout=10)

                    # A healthy worker with the provider polls from here on: had the server retried
                    # by itself, this worker would have run the call again.
                    async with run_worker(worker_url, queue, workflows=[ProviderCheckout], activities=[provider_call]) as worker:
                        async def unknown_entry():
                            listed = await http.get("/api/ledger", params={"state": "outcome_unknown", "workflow_id": workflow_id})
                            return listed.json()["entries"]

                        (unknown,) = await wait_until("the outcome to become unknown", unknown_entry)
                        await asyncio.sleep(1.5)  # past the retry backoff: nothing retries by itself
                        blocked = (await http.get(f"/api/workflows/{workflow_id}")).json()
                        repair = await http.post(f"/api/workflows/{workflow_id}/repair", json={})
                        calls_while_blocked = call_count(calls_path)
                        body = {"decision": decision, "evidence": {"provider_reference": "ch_42", "note": "looked it up"}}
                        if decision == "effect_confirmed":
                            body["result"] = {"charged": 42, "by": "operator"}
                        resolved = await http.post(f"/api/ledger/{unknown['ledger_key']}/resolve", json=body)
                        outcome = await wait_result(handle, timeout=60, workers=[worker])
                    events = await fetch_history(client, workflow_id, handle.run_id)
            finally:
                if process.poll() is None:
                    os.killpg(process.pid, signal.SIGKILL)
        return unknown, blocked, repair, calls_while_blocked, resolved, outcome, events

    unknown, blocked, repair, calls_while_blocked, resolved, outcome, events = run_async(main(), timeout=150)
    assert unknown["unknown_reason"]["kind"] == "timeout", unknown
    assert blocked["blocked_by"]["ledger_key"] == unknown["ledger_key"], blocked
    assert repair.status_code == 409 and repair.json()["reason"] == "outcome_unknown_requires_resolution", repair.text
    assert calls_while_blocked == 1, "no automatic retry while the outcome is unknown"
    assert resolved.status_code == 200 and resolved.json()["state"] == decision, resolved.text
    assert_history_invariants(events, terminal="WorkflowCompleted")
    started = events_of(events, "ActivityStarted")
    if decision == "effect_confirmed":
        assert outcome == {"receipt": {"charged": 42, "by": "operator"}}, outcome
        assert call_count(calls_path) == 1, "the provider ran exactly once in total"
        assert len(started) == 1
    else:
        assert outcome == {"receipt": {"charged": 42, "by": "provider"}}, outcome
        assert call_count(calls_path) == 2, "exactly one new attempt"
        assert len(started) == 2 and len({payload_of(e)["activity_execution_id"] for e in started}) == 1
