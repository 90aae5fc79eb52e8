"""Who did what: principals the server derives from credentials, recorded on history.

A server with named credentials (``--credentials-file``): alice (operator, two secrets), bob
(operator) and a worker principal. Through the Python SDK and raw HTTP, alice starts a
workflow, bob signals it, alice cancels another with her second secret; the SDK worker
completes one run and fails another. Every request also carries the spoofing fields and
gateway headers of DW's principal-attribution scenarios. History (the control plane's
``principal`` on each event) must name only server-derived principals; a timer firing names
none (``null``). Secrets rotate by editing the file, without a restart; no secret reaches the
log. Without authentication every request acts as the documented anonymous principal.
"""
from __future__ import annotations

import asyncio
import time

import httpx
from durable_workflow import workflow

from capstan_harness import (
    CONTROL_HEADERS,
    envelope,
    fetch_history_raw,
    make_client,
    run_async,
    running_worker,
    unique,
    wait_result,
)

ALICE_V1 = "alice-" + "1" * 32
ALICE_V2 = "alice-" + "2" * 32
ALICE_V3 = "alice-" + "3" * 32
BOB = "bob-" + "b" * 32
WORKER = "worker-" + "w" * 32
WORKER_PRINCIPAL = "worker:principal-attribution"

SPOOF_FIELDS = {"principal": "mallory", "principal_id": "mallory", "principal_type": "attacker",
                "actor": "mallory", "user": "mallory"}
SPOOF_HEADERS = {
    "X-Workflow-Principal-Id": "mallory", "X-Workflow-Principal-Type": "attacker",
    "X-Workflow-Principal-Label": "Mallory", "X-Workflow-Caller-Type": "spoofed-gateway",
    "X-Workflow-Caller-Label": "Mallory Gateway", "X-Workflow-Auth-Status": "trusted_elsewhere",
    "X-Workflow-Auth-Method": "gateway_token", "X-Forwarded-User": "mallory",
    "X-Forwarded-Email": "mallory@example.invalid", "X-Remote-User": "mallory",
    "Authorization-Override": "Bearer mallory",
}


def token_principal(name: str) -> dict:
    return {"type": "auth:token", "id": name}


@workflow.defn(name="principals.approval")
class Approval:
    def __init__(self) -> None:
        self.approved = False

    @workflow.signal("approve")
    def approve(self) -> None:
        self.approved = True

    @workflow.query("approved")
    def is_approved(self) -> bool:
        return self.approved

    def run(self, ctx, request):
        yield ctx.sleep(1)  # a timer: its firing is the server's doing
        yield ctx.wait_condition(lambda: self.approved)
        return f"{request} approved"


@workflow.defn(name="principals.failing")
class Failing:
    def run(self, ctx):
        raise RuntimeError("this workflow fails on purpose")
        yield  # noqa: unreachable - makes run a generator, as the SDK expects


def stored(secret: str) -> str:
    import hashlib
    return "sha256:" + hashlib.sha256(secret.encode()).hexdigest()


def credentials_file(alice_secrets: list[str]) -> str:
    alice = ", ".join(f'"{stored(s)}"' for s in alice_secrets)
    return (
        f'[[credential]]\nprincipal = "alice"\nroles = ["operator"]\nsecrets = [{alice}]\n'
        f'[[credential]]\nprincipal = "bob"\nroles = ["operator"]\nsecrets = ["{stored(BOB)}"]\n'
        f'[[credential]]\nprincipal = "{WORKER_PRINCIPAL}"\nroles = ["worker"]\nsecrets = ["{stored(WORKER)}"]\n'
    )


def control(url: str, token: str | None) -> httpx.AsyncClient:
    headers = {**CONTROL_HEADERS, **SPOOF_HEADERS}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    return httpx.AsyncClient(base_url=url, headers=headers, timeout=30.0)


async def principals_by_type(url: str, workflow_id: str, run_id: str, token: str | None) -> dict[str, list]:
    headers = {"Authorization": f"Bearer {token}"} if token else None
    events = await fetch_history_raw(url, workflow_id, run_id, headers=headers)
    seen: dict[str, list] = {}
    for event in events:
        seen.setdefault(event["event_type"], []).append(event.get("principal", "absent"))
    return seen


def test_every_fact_names_the_authenticated_principal_and_never_a_spoofed_one(server_factory, tmp_path):
    path = tmp_path / "credentials.toml"
    path.write_text(credentials_file([ALICE_V1, ALICE_V2]))
    server = server_factory.create("--auth", "token", "--credentials-file", str(path))
    queue = unique("principals")

    async def main():
        async with running_worker(server.url, queue, workflows=[Approval, Failing], token=WORKER), \
                control(server.url, ALICE_V1) as alice, control(server.url, BOB) as bob, \
                control(server.url, ALICE_V2) as alice_v2, make_client(server.url, token=BOB) as bob_sdk:
            approved_id, cancelled_id, failing_id = unique("approved"), unique("cancelled"), unique("failing")
            started = {}
            for workflow_id, workflow_type, args in ((approved_id, "principals.approval", ["order"]),
                                                     (cancelled_id, "principals.approval", ["other"]),
                                                     (failing_id, "principals.failing", [])):
                reply = await alice.post("/api/workflows", json={
                    "workflow_id": workflow_id, "workflow_type": workflow_type, "task_queue": queue,
                    "input": envelope(args), **SPOOF_FIELDS})
                assert reply.status_code == 201, reply.text
                started[workflow_id] = reply.json()["run_id"]
            await asyncio.sleep(1.5)  # the timers fire
            # Queries write no history: the instance's audit trail records who asked.
            assert await bob_sdk.get_workflow_handle(approved_id).query("approved") is not None
            raw_query = await bob.post(f"/api/workflows/{approved_id}/query/approved", json={**SPOOF_FIELDS})
            assert raw_query.status_code == 200, raw_query.text
            signal = await bob.post(f"/api/workflows/{approved_id}/signal/approve",
                                    json={"input": envelope([]), **SPOOF_FIELDS})
            assert signal.status_code == 202, signal.text
            cancel = await alice_v2.post(f"/api/workflows/{cancelled_id}/cancel", json={"reason": "no", **SPOOF_FIELDS})
            assert cancel.status_code == 200, cancel.text
            archive = await bob.post(f"/api/workflows/{cancelled_id}/archive", json={"reason": "done", **SPOOF_FIELDS})
            assert archive.status_code == 200, archive.text
            result = await wait_result(bob_sdk.get_workflow_handle(approved_id), timeout=30)
            assert result == "order approved", result
            deadline = time.monotonic() + 30
            while (await alice.get(f"/api/workflows/{failing_id}")).json()["status"] != "failed":
                assert time.monotonic() < deadline, "the failing workflow never failed"
                await asyncio.sleep(0.2)
            audit = await alice.get(f"/api/workflows/{approved_id}/audit-events")
            assert audit.status_code == 200, audit.text
            histories = {wid: await principals_by_type(server.url, wid, run, ALICE_V1) for wid, run in started.items()}
            return histories, audit.json()["events"]

    seen, queries = run_async(main(), timeout=90)
    approved = seen[next(w for w in seen if w.startswith("approved"))]
    cancelled = seen[next(w for w in seen if w.startswith("cancelled"))]
    failing = seen[next(w for w in seen if w.startswith("failing"))]
    alice, bob, worker = token_principal("alice"), token_principal("bob"), token_principal(WORKER_PRINCIPAL)
    assert approved["WorkflowStarted"] == [alice], approved
    assert approved["SignalReceived"] == [bob], approved
    assert approved["WorkflowCompleted"] == [worker], approved
    assert approved["TimerFired"] == [None], f"a timer firing is the server's doing: {approved}"
    assert cancelled["WorkflowStarted"] == [alice], cancelled
    assert alice in cancelled["CancelRequested"], f"alice's second secret acts as alice: {cancelled}"
    assert cancelled["ArchiveRequested"] == [bob] and cancelled["WorkflowArchived"] == [bob], cancelled
    assert failing["WorkflowFailed"] == [worker], failing
    assert [(q["action"], q["principal"], q["detail"]["query_name"]) for q in queries] == \
        [("workflow.query", bob, "approved")] * 2, queries
    everything = repr(seen) + repr(queries)
    assert "mallory" not in everything and "attacker" not in everything, everything
    log = server.log_text()
    for secret in (ALICE_V1, ALICE_V2, BOB, WORKER):
        assert secret not in log, "a secret reached the log"


def test_the_python_sdk_client_acts_as_its_credential(server_factory, tmp_path):
    """DW's `python_sdk_visibility`: the published SDK's client with bob's credential starts and
    signals a workflow; the history the SDK itself reads back (a page and the export) names bob
    on `WorkflowStarted` and `SignalReceived`, in the same shape as a raw HTTP start by bob."""
    from importlib.metadata import version

    path = tmp_path / "credentials.toml"
    path.write_text(credentials_file([ALICE_V1]))
    server = server_factory.create("--auth", "token", "--credentials-file", str(path))
    queue = unique("sdk-visibility")

    async def main():
        async with running_worker(server.url, queue, workflows=[Approval], token=WORKER), \
                make_client(server.url, token=BOB) as bob_sdk, control(server.url, BOB) as bob_http:
            handle = await bob_sdk.start_workflow(workflow_type="principals.approval", task_queue=queue,
                                                  workflow_id=unique("sdk-started"), input=["sdk"])
            await asyncio.sleep(1.5)  # the timer fires; the workflow waits for the signal
            await handle.signal("approve", [])
            assert await wait_result(handle, timeout=30) == "sdk approved"
            page = await handle.get_history()
            exported = await handle.export_history()
            reference_id = unique("http-started")
            reply = await bob_http.post("/api/workflows", json={
                "workflow_id": reference_id, "workflow_type": "principals.approval", "task_queue": queue,
                "input": envelope(["http"])})
            assert reply.status_code == 201, reply.text
            reference = await principals_by_type(server.url, reference_id, reply.json()["run_id"], BOB)
            return page, exported, reference

    page, exported, reference = run_async(main(), timeout=90)
    bob = token_principal("bob")
    assert version("durable-workflow") == "2.12.0"
    by_type = {}
    for event in page["events"]:
        by_type.setdefault(event["event_type"], []).append(event.get("principal"))
    assert by_type["WorkflowStarted"] == [bob], by_type
    assert by_type["SignalReceived"] == [bob], by_type
    assert reference["WorkflowStarted"] == [bob], "the raw HTTP reference names bob the same way"
    exported_started = [e for e in exported["history_events"] if e["event_type"] == "WorkflowStarted"]
    # The export's events are the worker plane's: the principal is in each event's payload.
    assert [e["payload"].get("principal") for e in exported_started] == [bob], exported_started


def test_a_secret_rotates_without_a_restart(server_factory, tmp_path):
    path = tmp_path / "credentials.toml"
    path.write_text(credentials_file([ALICE_V1]))
    server = server_factory.create("--auth", "token", "--credentials-file", str(path))
    queue = unique("rotation")

    async def main():
        async with control(server.url, ALICE_V1) as v1, control(server.url, ALICE_V3) as v3:
            assert (await v3.get("/api/workflows")).status_code == 401
            path.write_text(credentials_file([ALICE_V3]))  # v3 in, v1 out
            deadline = time.monotonic() + 10
            while (await v3.get("/api/workflows")).status_code != 200:
                assert time.monotonic() < deadline, "the new secret was never accepted"
                await asyncio.sleep(0.2)
            assert (await v1.get("/api/workflows")).status_code == 401, "the retired secret still works"
            workflow_id = unique("rotated")
            reply = await v3.post("/api/workflows", json={"workflow_id": workflow_id, "workflow_type": "t",
                                                          "task_queue": queue, "input": envelope([])})
            assert reply.status_code == 201, reply.text
            return await principals_by_type(server.url, workflow_id, reply.json()["run_id"], ALICE_V3)

    seen = run_async(main(), timeout=60)
    assert seen["WorkflowStarted"] == [token_principal("alice")], seen
    assert "named credentials reloaded" in server.log_text()


def test_without_authentication_every_request_is_the_anonymous_principal(server_factory):
    server = server_factory.create()
    queue = unique("anonymous")

    async def main():
        async with control(server.url, None) as anyone:
            workflow_id = unique("anon")
            reply = await anyone.post("/api/workflows", json={"workflow_id": workflow_id, "workflow_type": "t",
                                                              "task_queue": queue, "input": envelope([]), **SPOOF_FIELDS})
            assert reply.status_code == 201, reply.text
            signal = await anyone.post(f"/api/workflows/{workflow_id}/signal/go", json={"input": envelope([]), **SPOOF_FIELDS})
            assert signal.status_code == 202, signal.text
            coop = await anyone.post(f"/api/workflows/{workflow_id}/request-cancellation", json={**SPOOF_FIELDS})
            assert coop.status_code == 202, coop.text
            cancel = await anyone.post(f"/api/workflows/{workflow_id}/cancel", json={**SPOOF_FIELDS})
            assert cancel.status_code == 200, cancel.text
            return await principals_by_type(server.url, workflow_id, reply.json()["run_id"], None)

    seen = run_async(main(), timeout=60)
    anonymous = {"type": "server", "id": "anonymous"}
    for event_type in ("WorkflowStarted", "SignalReceived", "CooperativeCancellationRequested", "CancelRequested"):
        assert seen.get(event_type) == [anonymous], (event_type, seen)
    assert "mallory" not in repr(seen)
