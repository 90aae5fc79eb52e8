"""The recovery ledger through the published Python SDK (``durable-workflow==2.12.0``).

An operator declares an activity type a consequential action. The SDK knows nothing of it: the
worker just runs activities. When a dispatch of the action ends without a conclusive result
(the worker's exception, or a timeout: the worker was lost), Capstan does not retry it. The
workflow waits, repair is refused, and an operator records evidence: ``effect_confirmed`` (the
workflow continues with the operator's result, and the provider is not called again) or
``effect_absent`` (exactly one new attempt, with the same ``activity_execution_id``).
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
    payload_of,
    run_async,
    unique,
    wait_result,
)

# Calls of the provider, per test key (the activity runs in this process).
CHARGES: dict[str, list[str]] = {}


@activity.defn(name="ledger.charge")
def charge(key: str, mode: str) -> dict:
    calls = CHARGES.setdefault(key, [])
    calls.append(mode)
    if mode == "fail-first" and len(calls) == 1:
        raise RuntimeError("connection reset while the bank was charging")
    if mode == "hang-first" and len(calls) == 1:
        time.sleep(4)  # the start-to-close timeout (2 s) ends the attempt first: the worker is "lost"
    return {"charged": key, "calls": len(calls)}


@workflow.defn(name="ledger.checkout")
class CheckoutWorkflow:
    def run(self, ctx, key, mode):
        receipt = yield ctx.schedule_activity(
            "ledger.charge", [key, mode], start_to_close_timeout=2,
            retry_policy=ActivityRetryPolicy(max_attempts=5, backoff_seconds=[1]),
        )
        return {"receipt": receipt}


async def define_charge(http: httpx.AsyncClient) -> dict:
    response = await http.put("/api/action-definitions/ledger.charge", json={
        "recovery_mode": "non_atomic",
        "verification": {"declared_effects": ["payment"]},
    })
    assert response.status_code == 200, response.text
    return response.json()


async def wait_for_unknown(http: httpx.AsyncClient, workflow_id: str, timeout: float = 20.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        entries = (await http.get("/api/ledger", params={"state": "outcome_unknown", "workflow_id": workflow_id})).json()["entries"]
        if entries:
            return entries[0]
        await asyncio.sleep(0.1)
    raise AssertionError(f"no outcome_unknown entry for {workflow_id}")


def run_scenario(server_url, worker_url, run_worker, mode, decision, result=None):
    queue = unique("ledger")
    workflow_id = unique(f"checkout-{mode}")
    key = unique("charge")

    async def main():
        async with httpx.AsyncClient(base_url=server_url, headers=CONTROL_HEADERS, timeout=30.0) as http:
            definition = await define_charge(http)
            async with run_worker(worker_url, queue, workflows=[CheckoutWorkflow], activities=[charge]) as worker, \
                    make_client(server_url) as client:
                handle = await client.start_workflow(workflow_type="ledger.checkout", task_queue=queue, workflow_id=workflow_id, input=[key, mode])
                unknown = await wait_for_unknown(http, workflow_id)
                await asyncio.sleep(1.5)  # longer than the retry backoff: nothing retries by itself
                described = (await http.get(f"/api/workflows/{workflow_id}")).json()
                repair = await http.post(f"/api/workflows/{workflow_id}/repair", json={})
                calls_while_blocked = len(CHARGES.get(key, []))
                body = {"decision": decision, "evidence": {"provider_reference": "bank-tx-7", "note": "checked the bank's console"}}
                if result is not None:
                    body["result"] = result
                resolved = await http.post(f"/api/ledger/{unknown['ledger_key']}/resolve", json=body)
                outcome = await wait_result(handle, timeout=30, workers=[worker])
                events = await fetch_history(client, workflow_id, handle.run_id)
                shown = (await http.get(f"/api/ledger/{unknown['ledger_key']}")).json()
                entries = (await http.get("/api/ledger", params={"workflow_id": workflow_id})).json()["entries"]
        return definition, unknown, described, repair, calls_while_blocked, resolved, outcome, events, shown, entries, CHARGES.get(key, [])

    return run_async(main(), timeout=90)


def test_effect_confirmed_advances_without_calling_the_provider_again(server_url, worker_url, run_worker):
    definition, unknown, described, repair, calls_while_blocked, resolved, outcome, events, shown, entries, calls = run_scenario(
        server_url, worker_url, run_worker, "fail-first", "effect_confirmed", result={"charged": "by-operator", "calls": 1},
    )
    assert definition["version"] >= 1 and len(definition["definition_hash"]) == 64
    assert unknown["state"] == "outcome_unknown" and unknown["unknown_reason"]["kind"] == "worker_failure", unknown
    assert unknown["definition_hash"] == definition["definition_hash"]
    assert "bank" not in str(unknown["input_hash"]), "hashes only"
    assert described["blocked_by"]["ledger_key"] == unknown["ledger_key"], described["blocked_by"]
    assert repair.status_code == 409 and repair.json()["reason"] == "outcome_unknown_requires_resolution", repair.text
    assert calls_while_blocked == 1, "no automatic retry while the outcome is unknown"
    assert resolved.status_code == 200 and resolved.json()["state"] == "effect_confirmed", resolved.text
    assert outcome == {"receipt": {"charged": "by-operator", "calls": 1}}, outcome
    assert len(calls) == 1, "the provider ran exactly once in total"
    assert_history_invariants(events, terminal="WorkflowCompleted")
    assert not events_of(events, "ActivityRetryScheduled", "ActivityFailed")
    assert [e["state"] for e in shown["checkpoints"]] == ["dispatched", "outcome_unknown", "effect_confirmed"]
    assert shown["chain_verified"] is True
    assert shown["resolution"]["evidence"]["provider_reference"] == "bank-tx-7"
    assert len(entries) == 1


def test_effect_absent_allows_one_new_attempt_with_the_same_execution_id(server_url, worker_url, run_worker):
    _, unknown, _, repair, calls_while_blocked, resolved, outcome, events, _, entries, calls = run_scenario(
        server_url, worker_url, run_worker, "hang-first", "effect_absent",
    )
    assert unknown["unknown_reason"]["kind"] == "timeout", unknown
    assert repair.status_code == 409
    assert calls_while_blocked == 1
    assert resolved.json()["state"] == "effect_absent", resolved.text
    assert outcome == {"receipt": {"charged": outcome["receipt"]["charged"], "calls": 2}}, outcome
    assert len(calls) == 2
    assert_history_invariants(events, terminal="WorkflowCompleted")
    (retry,) = events_of(events, "ActivityRetryScheduled")
    assert payload_of(retry)["retry_reason"] == "ledger_effect_absent"
    started = events_of(events, "ActivityStarted")
    assert len(started) == 2 and len({payload_of(e)["activity_execution_id"] for e in started}) == 1
    states = sorted(e["state"] for e in entries)
    assert states == ["effect_absent", "verified"], entries
    assert len({e["idempotency_key_hash"] for e in entries}) == 1, "one provider idempotency key"
    assert len({e["ledger_key"] for e in entries}) == 2


@activity.defn(name="ledger.wipe")
def wipe(request: dict) -> dict:
    CHARGES.setdefault(request["key"], []).append("wipe")
    return {"status": "wiped", "effects": request.get("effects", ["deletion"])}


@workflow.defn(name="ledger.maintenance")
class MaintenanceWorkflow:
    def run(self, ctx, request):
        try:
            result = yield ctx.schedule_activity("ledger.wipe", [request], start_to_close_timeout=5)
        except Exception as failure:  # noqa: BLE001 - reported as the workflow's result
            return {"refused": str(failure)}
        return {"result": result}


def test_irreversible_actions_need_an_approval_and_results_are_verified(server_url, worker_url, run_worker):
    """An `irreversible` action without `approval_ref` in its arguments fails before dispatch
    (`approval_required`, the activity never runs, nothing is ledgered); with one it runs and a
    result that passes verification closes its entry; a result announcing an undeclared effect
    leaves the outcome unknown."""
    queue = unique("ledger-wipe")
    keys = [unique("wipe") for _ in range(3)]

    async def main():
        async with httpx.AsyncClient(base_url=server_url, headers=CONTROL_HEADERS, timeout=30.0) as http:
            defined = await http.put("/api/action-definitions/ledger.wipe", json={
                "recovery_mode": "irreversible",
                "verification": {"result_schema": {"type": "object", "required": ["status"]}, "declared_effects": ["deletion"]},
            })
            assert defined.status_code == 200, defined.text
            async with run_worker(worker_url, queue, workflows=[MaintenanceWorkflow], activities=[wipe]) as worker, \
                    make_client(server_url) as client:
                requests = [
                    {"key": keys[0]},
                    {"key": keys[1], "approval_ref": "CAB-42"},
                    {"key": keys[2], "approval_ref": "CAB-43", "effects": ["deletion", "email"]},
                ]
                handles = [
                    await client.start_workflow(workflow_type="ledger.maintenance", task_queue=queue, workflow_id=unique("maint"), input=[r])
                    for r in requests
                ]
                results = [await wait_result(h, timeout=30, workers=[worker]) for h in handles[:2]]
                unknown = await wait_for_unknown(http, handles[2].workflow_id)
                entries = [
                    (await http.get("/api/ledger", params={"workflow_id": h.workflow_id})).json()["entries"] for h in handles
                ]
        return results, unknown, entries

    results, unknown, entries = run_async(main(), timeout=60)
    assert "approval_required" in results[0]["refused"], results[0]
    assert keys[0] not in CHARGES, "never dispatched"
    assert entries[0] == []
    assert results[1] == {"result": {"status": "wiped", "effects": ["deletion"]}}, results[1]
    assert [e["state"] for e in entries[1]] == ["verified"]
    assert unknown["unknown_reason"]["kind"] == "invalid_result", unknown
    assert "undeclared effect" in unknown["unknown_reason"]["problems"][0]


def test_capstan_verify_finds_a_tampered_history_or_ledger_row(server_factory, run_worker):
    """`capstan verify` recomputes every history chain and ledger chain from the stored rows:
    exit 0 on an intact database; after one history payload or one ledger checkpoint is changed
    in the database file, exit 1 naming the broken chain."""
    import json
    import sqlite3
    import subprocess

    from capstan_harness import capstan_binary

    server = server_factory.create()
    queue = unique("verify")
    workflow_id = unique("verify-wf")
    key = unique("verify-charge")

    async def main():
        async with httpx.AsyncClient(base_url=server.url, headers=CONTROL_HEADERS, timeout=30.0) as http:
            await define_charge(http)
            async with run_worker(server.url, queue, workflows=[CheckoutWorkflow], activities=[charge]) as worker, \
                    make_client(server.url) as client:
                handle = await client.start_workflow(workflow_type="ledger.checkout", task_queue=queue, workflow_id=workflow_id, input=[key, "ok"])
                return await wait_result(handle, timeout=30, workers=[worker])

    assert run_async(main(), timeout=60)["receipt"]["calls"] == 1
    database = server.data_dir / "capstan.db"

    def verify() -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(capstan_binary()), "verify", "--data-dir", str(server.data_dir), "--json"],
            capture_output=True, text=True, timeout=60,
        )

    intact = verify()
    assert intact.returncode == 0, intact.stdout + intact.stderr
    report = json.loads(intact.stdout)
    assert report["runs_checked"] >= 1 and report["ledger_instances_checked"] == 1 and report["checkpoints_checked"] == 2

    with sqlite3.connect(database) as db:
        db.execute(
            "UPDATE history_events SET payload = replace(payload, 'ledger.charge', 'ledger.refund') "
            "WHERE event_type = 'ActivityScheduled'"
        )
    broken = verify()
    assert broken.returncode == 1, broken.stdout
    assert any("history chain broken" in p for p in json.loads(broken.stdout)["problems"]), broken.stdout

    with sqlite3.connect(database) as db:
        db.execute(
            "UPDATE history_events SET payload = replace(payload, 'ledger.refund', 'ledger.charge') "
            "WHERE event_type = 'ActivityScheduled'"
        )
        db.execute("UPDATE ledger_checkpoints SET doc = replace(doc, '\"verified\"', '\"effect_absent\"')")
    assert verify().returncode == 1
    missing = subprocess.run([str(capstan_binary()), "verify", "--data-dir", str(server.data_dir / "nope")],
                             capture_output=True, text=True, timeout=60)
    assert missing.returncode == 2 and "no database" in missing.stderr


@activity.defn(name="ledger.transfer")
def transfer(key: str) -> dict:
    calls = CHARGES.setdefault(key, [])
    calls.append("transfer")
    return {"status": "processing" if len(calls) == 1 else "settled", "polls": len(calls)}


@workflow.defn(name="ledger.transfer-flow")
class TransferWorkflow:
    def run(self, ctx, key):
        return (yield ctx.schedule_activity("ledger.transfer", [key], start_to_close_timeout=5))


def test_a_pending_provider_result_is_polled_again_under_a_new_entry(server_url, worker_url, run_worker):
    """A definition's `pending` rule marks "not yet" results: the entry becomes a visible
    `pending` handoff, the next poll runs after `poll_interval_seconds` as a new dispatch with a
    new ledger entry and the same idempotency key, and the workflow gets the settled result."""
    queue = unique("ledger-transfer")
    key = unique("transfer")

    async def main():
        async with httpx.AsyncClient(base_url=server_url, headers=CONTROL_HEADERS, timeout=30.0) as http:
            defined = await http.put("/api/action-definitions/ledger.transfer", json={
                "recovery_mode": "non_atomic", "poll_interval_seconds": 1,
                "pending": {"pointer": "/status", "values": ["processing"]},
            })
            assert defined.status_code == 200, defined.text
            async with run_worker(worker_url, queue, workflows=[TransferWorkflow], activities=[transfer]) as worker, \
                    make_client(server_url) as client:
                handle = await client.start_workflow(workflow_type="ledger.transfer-flow", task_queue=queue, workflow_id=unique("transfer-wf"), input=[key])
                result = await wait_result(handle, timeout=30, workers=[worker])
                entries = (await http.get("/api/ledger", params={"workflow_id": handle.workflow_id})).json()["entries"]
        return result, entries

    result, entries = run_async(main(), timeout=60)
    assert result == {"status": "settled", "polls": 2}, result
    assert [e["state"] for e in entries] == ["pending", "verified"], entries
    assert len({e["idempotency_key_hash"] for e in entries}) == 1


def test_a_broken_ledger_chain_blocks_the_run_until_an_incident_is_closed(server_factory, run_worker):
    """A commit that extends a ledger chain first checks the checkpoint it links to. After a
    checkpoint row is changed in the database file, resolving the entry is refused
    (`integrity_incident_open`), an integrity incident opens and the run is blocked; the incident
    cannot be closed while the chain is still broken; once the row is restored and the incident
    closed, the resolution goes through and the workflow completes."""
    import sqlite3

    server = server_factory.create()
    queue = unique("integrity")
    workflow_id = unique("integrity-wf")
    key = unique("integrity-charge")
    database = server.data_dir / "capstan.db"

    async def main():
        async with httpx.AsyncClient(base_url=server.url, headers=CONTROL_HEADERS, timeout=30.0) as http:
            await define_charge(http)
            async with run_worker(server.url, queue, workflows=[CheckoutWorkflow], activities=[charge]) as worker, \
                    make_client(server.url) as client:
                handle = await client.start_workflow(workflow_type="ledger.checkout", task_queue=queue, workflow_id=workflow_id, input=[key, "fail-first"])
                unknown = await wait_for_unknown(http, workflow_id)
                with sqlite3.connect(database) as db:
                    original = db.execute("SELECT doc FROM ledger_checkpoints WHERE ledger_key = ? AND doc LIKE '%outcome_unknown%'",
                                          (unknown["ledger_key"],)).fetchone()[0]
                    db.execute("UPDATE ledger_checkpoints SET doc = ? WHERE doc = ?", (original.replace("worker_failure", "forged"), original))
                body = {"decision": "effect_confirmed", "evidence": {"note": "seen at the bank"}, "result": {"charged": "ok", "calls": 1}}
                refused = await http.post(f"/api/ledger/{unknown['ledger_key']}/resolve", json=body)
                incidents = (await http.get("/api/integrity-incidents", params={"state": "open"})).json()["incidents"]
                described = (await http.get(f"/api/workflows/{workflow_id}")).json()
                still_broken = await http.post(f"/api/integrity-incidents/{incidents[0]['incident_id']}/close", json={"note": "looked"})
                with sqlite3.connect(database) as db:
                    db.execute("UPDATE ledger_checkpoints SET doc = ? WHERE ledger_key = ? AND doc LIKE '%forged%'", (original, unknown["ledger_key"]))
                closed = await http.post(f"/api/integrity-incidents/{incidents[0]['incident_id']}/close",
                                         json={"note": "restored the row from backup"})
                resolved = await http.post(f"/api/ledger/{unknown['ledger_key']}/resolve", json=body)
                result = await wait_result(handle, timeout=30, workers=[worker])
        return refused, incidents, described, still_broken, closed, resolved, result

    refused, incidents, described, still_broken, closed, resolved, result = run_async(main(), timeout=60)
    assert refused.status_code == 409 and refused.json()["reason"] == "integrity_incident_open", refused.text
    assert len(incidents) == 1 and incidents[0]["workflow_id"] == workflow_id, incidents
    assert described["integrity_incident"] == incidents[0]["incident_id"], described
    assert still_broken.status_code == 409 and still_broken.json()["reason"] == "integrity_chain_broken", still_broken.text
    assert closed.status_code == 200 and closed.json()["state"] == "closed", closed.text
    assert resolved.status_code == 200, resolved.text
    assert result == {"receipt": {"charged": "ok", "calls": 1}}, result


def test_capstan_ledger_and_actions_cli(server_url, worker_url, run_worker):
    """The operator CLI against a running server: define and show an action, list the
    `outcome_unknown` queue as JSON, resolve an entry (the workflow then completes), and a
    refused call exits 1 with the server's reason."""
    import json
    import subprocess

    from capstan_harness import capstan_binary

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(capstan_binary()), *args, "--server", server_url], capture_output=True, text=True, timeout=60,
        )

    defined = cli("actions", "define", "ledger.charge", "--mode", "non_atomic",
                  "--verification", '{"declared_effects": ["payment"]}', "--output", "json")
    assert defined.returncode == 0, defined.stderr
    assert json.loads(defined.stdout)["recovery_mode"] == "non_atomic"
    shown = cli("actions", "show", "ledger.charge")
    assert shown.returncode == 0 and "ledger.charge" in shown.stdout and "RECOVERY_MODE" in shown.stdout, shown.stdout
    assert "ledger.charge" in cli("actions", "list").stdout

    queue = unique("ledger-cli")
    workflow_id = unique("cli-checkout")
    key = unique("cli-charge")

    async def main():
        async with httpx.AsyncClient(base_url=server_url, headers=CONTROL_HEADERS, timeout=30.0) as http:
            async with run_worker(worker_url, queue, workflows=[CheckoutWorkflow], activities=[charge]) as worker, \
                    make_client(server_url) as client:
                handle = await client.start_workflow(workflow_type="ledger.checkout", task_queue=queue, workflow_id=workflow_id, input=[key, "fail-first"])
                unknown = await wait_for_unknown(http, workflow_id)
                listed = await asyncio.to_thread(cli, "ledger", "list", "--state", "outcome_unknown", "--workflow-id", workflow_id, "--output", "json")
                table = await asyncio.to_thread(cli, "ledger", "show", unknown["ledger_key"])
                resolved = await asyncio.to_thread(
                    cli, "ledger", "resolve", unknown["ledger_key"], "--decision", "effect_absent",
                    "--evidence", '{"note": "no charge at the bank"}',
                )
                again = await asyncio.to_thread(
                    cli, "ledger", "resolve", unknown["ledger_key"], "--decision", "effect_absent", "--evidence", '{"note": "x"}',
                )
                result = await wait_result(handle, timeout=30, workers=[worker])
                entry = (await http.get(f"/api/ledger/{unknown['ledger_key']}")).json()
        return unknown, listed, table, resolved, again, result, entry

    unknown, listed, table, resolved, again, result, entry = run_async(main(), timeout=90)
    assert listed.returncode == 0, listed.stderr
    assert [e["ledger_key"] for e in json.loads(listed.stdout)["entries"]] == [unknown["ledger_key"]]
    assert "outcome_unknown" in table.stdout and "chain verified: true" in table.stdout, table.stdout
    assert resolved.returncode == 0 and "effect_absent" in resolved.stdout, resolved.stderr
    # The resolver is the credential's principal (auth off here: the anonymous principal).
    assert entry["resolution"]["principal"] == "anonymous", entry
    assert again.returncode == 1 and "ledger_entry_not_unknown" in again.stderr, again.stderr
    assert result == {"receipt": {"charged": key, "calls": 2}}, result
