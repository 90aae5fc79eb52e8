"""Nexus service operations end to end with ``durable-workflow==2.12.0`` against a real
``capstan serve`` (SQLite, or a two-node PostgreSQL cluster with CAPSTAN_TEST_BACKEND=postgres).

A caller workflow calls operations registered in the service catalog whose ``start_workflow``
bindings start handler workflows, in its own namespace and in another one:
- ``ctx.call_nexus_service`` (sync, waits for completion) resumes with the handler run's result,
  or raises ``NexusOperationFailed`` when the handler run fails;
- ``ctx.start_nexus_operation`` (async, waits for acceptance) resumes as soon as the handler run
  is started, with its ids, and its history never gets a second row at that step;
- an operation missing from the catalog is a failure the workflow catches (``rejected_not_found``);
- an idempotency key used twice starts one handler run;
- ``Client.execute_nexus_operation`` admits calls through the catalog's execute route;
- an operator's cancellation of a call, and a run's cooperative cancellation delivered at a
  call (a worker opting into ``nexus_cooperative_cancellation``), end the waiting step;
- a waiting call survives a server restart.
Each caller's history is replayed by the SDK on every task, so every row shape is replayed.
"""
from __future__ import annotations

import asyncio

import httpx
import pytest
from durable_workflow import workflow
from durable_workflow.errors import NexusOperationFailed, WorkflowCancelled

from capstan_harness import (
    CONTROL_HEADERS, events_of, fetch_history_raw, make_client, payload_of, run_async, unique, wait_for_history,
    wait_result,
)


@workflow.defn(name="nexus.invoice")
class Invoice:
    def run(self, ctx, amount):
        return {"invoice": amount * 2}


@workflow.defn(name="nexus.refuse")
class Refuse:
    def run(self, ctx, amount):
        raise ValueError(f"cannot charge {amount}")


@workflow.defn(name="nexus.forever")
class Forever:
    def run(self, ctx, amount):
        yield ctx.start_timer(3600)
        return amount


@workflow.defn(name="nexus.patient")
class Patient:
    """Waits on a call whose handler never ends; an operator cancels the call."""

    def run(self, ctx):
        try:
            yield ctx.call_nexus_service("billing", "invoicing", "hang", [1])
        except NexusOperationFailed as failure:
            return [failure.status, failure.caller_observed_error_type, str(failure)]
        return "completed"


@workflow.defn(name="nexus.cancellable")
class Cancellable:
    """Waits on a call whose handler never ends; the run's cooperative cancellation is
    delivered at the call."""

    def run(self, ctx):
        yield ctx.call_nexus_service("billing", "invoicing", "hang", [1])
        return "completed"


@workflow.defn(name="nexus.slow")
class Slow:
    def run(self, ctx, amount):
        yield ctx.start_timer(3)
        return {"slow": amount}


@workflow.defn(name="nexus.waiter")
class Waiter:
    def run(self, ctx):
        done = yield ctx.call_nexus_service("billing", "invoicing", "slow", [5])
        return done.result


@workflow.defn(name="nexus.caller")
class Caller:
    def run(self, ctx, amount, other_namespace, key):
        done = yield ctx.call_nexus_service("billing", "invoicing", "create", [amount])
        started = yield ctx.start_nexus_operation("billing", "invoicing", "create", [amount + 1])
        failures = {}
        try:
            yield ctx.call_nexus_service("billing", "invoicing", "charge", [amount])
        except NexusOperationFailed as failure:
            failures["charge"] = [failure.status, failure.caller_observed_error_type, str(failure)]
        try:
            yield ctx.call_nexus_service("billing", "invoicing", "missing", [amount])
        except NexusOperationFailed as failure:
            failures["missing"] = [failure.status, failure.outcome, failure.reason]
        remote = yield ctx.call_nexus_service("ledger", "books", "post", [amount], target_namespace=other_namespace)
        first = yield ctx.start_nexus_operation("billing", "invoicing", "create", [7], idempotency_key=key)
        again = yield ctx.start_nexus_operation("billing", "invoicing", "create", [7], idempotency_key=key)
        return {
            "done": done.result,
            "started": [started.status, started.accepted],
            "failures": failures,
            "remote": remote.result,
            "same_call": first.service_call_id == again.service_call_id,
        }


def register(http: httpx.Client, namespace: str, endpoint: str, service: str, operations: dict) -> None:
    headers = {**CONTROL_HEADERS, "X-Namespace": namespace}
    assert http.post("/service-endpoints", json={"endpoint_name": endpoint}, headers=headers).status_code == 201
    created = http.post(f"/service-endpoints/{endpoint}/services", json={"service_name": service}, headers=headers)
    assert created.status_code == 201, created.text
    for name, binding in operations.items():
        body = {
            "operation_name": name,
            "operation_mode": "sync",
            "handler_binding_kind": "start_workflow",
            "handler_binding": binding,
        }
        created = http.post(f"/service-endpoints/{endpoint}/services/{service}/operations", json=body, headers=headers)
        assert created.status_code == 201, created.text


def rows_at(history, sequence):
    return [
        event for event in history
        if event["event_type"].startswith("ServiceCall") and event["payload"].get("sequence") == sequence
    ]


def test_workflows_call_operations_bound_to_workflows(server_url, worker_url, run_worker):
    namespace = unique("nexus").lower()
    other = unique("nexus-other").lower()
    queue = unique("nexus-q")
    workflow_id = unique("nexus-caller")
    key = unique("nexus-key")

    async def main():
        async with make_client(server_url) as admin:
            await admin.create_namespace(namespace)
            await admin.create_namespace(other)
        with httpx.Client(base_url=f"{server_url}/api", timeout=10) as http:
            register(http, namespace, "billing", "invoicing", {
                "create": {"workflow_type": "nexus.invoice", "queue": queue},
                "charge": {"workflow_type": "nexus.refuse", "queue": queue},
            })
            register(http, other, "ledger", "books", {"post": {"workflow_type": "nexus.invoice", "queue": queue}})
        workflows = {"workflows": [Caller, Invoice, Refuse]}
        async with run_worker(worker_url, queue, namespace=namespace, **workflows):
            async with run_worker(worker_url, queue, namespace=other, **workflows):
                async with make_client(server_url, namespace=namespace) as client:
                    handle = await client.start_workflow(
                        workflow_type="nexus.caller", task_queue=queue, workflow_id=workflow_id,
                        input=[21, other, key],
                    )
                    result = await wait_result(handle, timeout=90)
                    run_id = (await handle.describe()).run_id
        return result, run_id

    result, run_id = run_async(main(), timeout=150)
    assert result["done"] == {"invoice": 42}
    assert result["started"] == ["started", True]
    assert result["failures"]["charge"][0] == "failed"
    assert result["failures"]["charge"][1] == "ValueError"
    assert "cannot charge 21" in result["failures"]["charge"][2]
    assert result["failures"]["missing"] == ["failed", "rejected_not_found", "operation_not_found"]
    assert result["remote"] == {"invoice": 42}
    assert result["same_call"] is True

    history = run_async(fetch_history_raw(server_url, workflow_id, run_id, namespace=namespace), timeout=30)
    types = lambda seq: [event["event_type"] for event in rows_at(history, seq)]  # noqa: E731
    assert types(1) == ["ServiceCallStarted", "ServiceCallCompleted"]
    assert types(2) == ["ServiceCallStarted"], "an async call never gets a second row"
    assert types(3) == ["ServiceCallStarted", "ServiceCallFailed"]
    assert types(4) == ["ServiceCallFailed"]
    assert types(5) == ["ServiceCallStarted", "ServiceCallCompleted"]
    assert types(6) == ["ServiceCallStarted"]
    # The key's call, admitted at step 6, is answered as it stands: still running, or ended.
    assert types(7) in (["ServiceCallStarted"], ["ServiceCallCompleted"])
    started, completed = rows_at(history, 1)
    assert started["payload"]["service_call_id"] == completed["payload"]["service_call_id"]
    linked = started["payload"]["linked_workflow_instance_id"]
    assert completed["payload"]["linked_workflow_instance_id"] == linked
    remote = rows_at(history, 5)[0]["payload"]
    assert remote["target_namespace"] == other and remote["service_call"]["caller_namespace"] == namespace
    first, again = rows_at(history, 6)[0]["payload"], rows_at(history, 7)[0]["payload"]
    assert first["linked_workflow_instance_id"] == again["linked_workflow_instance_id"]
    assert again["service_call"]["idempotent_replay"] is True

    with httpx.Client(base_url=f"{server_url}/api", headers={**CONTROL_HEADERS, "X-Namespace": namespace}) as http:
        listed = http.get(f"/workflows/{workflow_id}/nexus-operations").json()
        # One call per admitted key: step 7 joined step 6's call.
        assert listed["count"] == 6 and listed["caller_namespace"] == namespace, listed
        assert {call["caller_workflow_run_id"] for call in listed["nexus_operations"]} == {run_id}
        first_call = listed["nexus_operations"][0]
        assert first_call["status"] == "completed" and first_call["response_payload"]["codec"] == "avro"
        of_run = http.get(f"/workflows/{workflow_id}/runs/{run_id}/nexus-operations", params={"limit": 2}).json()
        assert of_run["count"] == 2 and of_run["workflow_run_id"] == run_id


def test_clients_execute_operations_through_the_catalog_route(server_url, worker_url, run_worker):
    namespace = unique("nexus-client").lower()
    queue = unique("nexus-client-q")
    key = unique("client-key")

    async def main():
        async with make_client(server_url) as admin:
            await admin.create_namespace(namespace)
        with httpx.Client(base_url=f"{server_url}/api", timeout=10) as http:
            register(http, namespace, "billing", "invoicing", {
                "create": {"workflow_type": "nexus.invoice", "queue": queue},
            })
        async with run_worker(worker_url, queue, namespace=namespace, workflows=[Invoice]):
            async with make_client(server_url, namespace=namespace) as client:
                started = await client.execute_nexus_operation(
                    "billing", "invoicing", "create", [4], idempotency_key=key, mode="async", wait_for="accepted",
                )
                again = await client.execute_nexus_operation(
                    "billing", "invoicing", "create", [4], idempotency_key=key, mode="async", wait_for="accepted",
                )
                try:
                    await client.execute_nexus_operation("billing", "invoicing", "missing", [4])
                    missing = None
                except NexusOperationFailed as failure:
                    missing = [failure.status, failure.outcome, failure.reason]
                refused = await client.execute_nexus_operation(
                    "billing", "invoicing", "missing", [4], raise_on_failure=False,
                )
                linked = started.response_or_failure_surface["linked_workflow_instance_id"]
                handle = client.get_workflow_handle(linked)
                assert await wait_result(handle, timeout=60) == {"invoice": 8}
        return started, again, missing, refused

    started, again, missing, refused = run_async(main(), timeout=120)
    assert started.accepted and started.status == "started" and started.service_call_id
    assert again.service_call_id == started.service_call_id, "one call per idempotency key"
    assert again.response_or_failure_surface["idempotent_replay"] is True
    assert missing == ["failed", "rejected_not_found", "operation_not_found"]
    assert refused.accepted is False and refused.is_failure

    path = f"/service-endpoints/billing/services/invoicing/operations/create/service-calls/{started.service_call_id}"
    with httpx.Client(base_url=f"{server_url}/api", headers={**CONTROL_HEADERS, "X-Namespace": namespace}) as http:
        described = http.get(path)
        assert described.status_code == 200, described.text
        call = described.json()
        assert call["found"] is True and call["status"] == "completed" and call["outcome"] == "completed"
        unknown = http.get(path.replace(started.service_call_id, "01NOSUCHCALL0000000000000"))
        assert unknown.status_code == 404 and unknown.json()["reason"] == "service_call_not_found"


def test_a_cancelled_call_fails_the_waiting_workflow_step(server_url, worker_url, run_worker):
    namespace = unique("nexus-cancel").lower()
    queue = unique("nexus-cancel-q")
    workflow_id = unique("nexus-patient")
    headers = {**CONTROL_HEADERS, "X-Namespace": namespace}

    async def main():
        async with make_client(server_url) as admin:
            await admin.create_namespace(namespace)
        with httpx.Client(base_url=f"{server_url}/api", timeout=10) as http:
            register(http, namespace, "billing", "invoicing", {"hang": {"workflow_type": "nexus.forever", "queue": queue}})
        async with run_worker(worker_url, queue, namespace=namespace, workflows=[Patient, Forever]):
            async with make_client(server_url, namespace=namespace) as client:
                handle = await client.start_workflow(workflow_type="nexus.patient", task_queue=queue, workflow_id=workflow_id)
                async with httpx.AsyncClient(base_url=f"{server_url}/api", headers=headers) as http:
                    call_id = None
                    for _ in range(200):
                        listed = (await http.get(f"/workflows/{workflow_id}/nexus-operations")).json()
                        if listed["count"]:
                            call_id = listed["nexus_operations"][0]["id"]
                            break
                        await asyncio.sleep(0.05)
                    assert call_id, "the call was admitted"
                    path = f"/service-endpoints/billing/services/invoicing/operations/hang/service-calls/{call_id}/cancel"
                    cancelled = await http.post(path, json={"reason": "operator gave up"})
                    assert cancelled.status_code == 200, cancelled.text
                return await wait_result(handle, timeout=60)

    status, error_type, message = run_async(main(), timeout=120)
    assert (status, error_type) == ("cancelled", "service_call_cancelled")
    assert "operator gave up" in message


def test_a_cooperative_cancellation_delivered_at_a_call_cancels_the_call_and_its_linked_run(
    server_url, worker_url, run_worker,
):
    namespace = unique("nexus-coop").lower()
    queue = unique("nexus-coop-q")
    workflow_id = unique("nexus-cancellable")

    async def main():
        async with make_client(server_url) as admin:
            await admin.create_namespace(namespace)
        with httpx.Client(base_url=f"{server_url}/api", timeout=10) as http:
            headers = {**CONTROL_HEADERS, "X-Namespace": namespace}
            register(http, namespace, "billing", "invoicing", {"hang": {"workflow_type": "nexus.forever", "queue": queue}})
            # The operation's policy cancels the linked run with the call.
            policy = {"cancellation_policy": {"propagate_to_linked_workflow": True}}
            updated = http.put("/service-endpoints/billing/services/invoicing/operations/hang", json=policy, headers=headers)
            assert updated.status_code == 200, updated.text
        async with run_worker(worker_url, queue, namespace=namespace, workflows=[Cancellable, Forever],
                              capabilities=["cooperative_cancellation", "nexus_cooperative_cancellation"]):
            async with make_client(server_url, namespace=namespace) as client:
                handle = await client.start_workflow(workflow_type="nexus.cancellable", task_queue=queue,
                                                     workflow_id=workflow_id)
                await wait_for_history(client, workflow_id, handle.run_id,
                                       lambda evs: bool(events_of(evs, "ServiceCallStarted")), what="ServiceCallStarted")
                await handle.request_cancellation(reason="stop", cleanup_timeout_seconds=60)
                with pytest.raises(WorkflowCancelled):
                    await handle.result(timeout=30, poll_interval=0.2)
                return handle.run_id

    run_id = run_async(main(), timeout=120)
    history = run_async(fetch_history_raw(server_url, workflow_id, run_id, namespace=namespace), timeout=30)
    (delivered,) = events_of(history, "CooperativeCancellationDelivered")
    assert payload_of(delivered)["call_kind"] == "service_operation" and payload_of(delivered)["sequence"] == 1
    assert [e["event_type"] for e in history if e["event_type"].startswith("ServiceCall")] == ["ServiceCallStarted"]
    assert history[-1]["event_type"] == "WorkflowCancelled"
    linked = payload_of(events_of(history, "ServiceCallStarted")[0])["linked_workflow_instance_id"]
    with httpx.Client(base_url=f"{server_url}/api", headers={**CONTROL_HEADERS, "X-Namespace": namespace}) as http:
        (call,) = http.get(f"/workflows/{workflow_id}/nexus-operations").json()["nexus_operations"]
        assert call["status"] == "cancelled"
        assert http.get(f"/workflows/{linked}").json()["status"] == "cancelled"


def test_a_waiting_call_survives_a_server_restart(server_factory, run_worker):
    """The caller's wait (its run document and waiter row) and the call are durable: a server
    killed while the handler run is still running delivers the terminal row after it restarts."""
    server = server_factory.create()
    queue = unique("nexus-restart-q")
    workflow_id = unique("nexus-waiter")
    with httpx.Client(base_url=f"{server.url}/api", timeout=10) as http:
        register(http, "default", "billing", "invoicing", {"slow": {"workflow_type": "nexus.slow", "queue": queue}})
    workflows = {"workflows": [Waiter, Slow]}

    async def until_waiting():
        async with run_worker(server.url, queue, **workflows):
            async with make_client(server.url) as client:
                handle = await client.start_workflow(workflow_type="nexus.waiter", task_queue=queue,
                                                     workflow_id=workflow_id)
                await wait_for_history(client, workflow_id, handle.run_id,
                                       lambda evs: bool(events_of(evs, "ServiceCallStarted")), what="ServiceCallStarted")
                return handle.run_id

    run_id = run_async(until_waiting(), timeout=60)
    server.kill()
    server.start()

    async def after_restart():
        async with run_worker(server.url, queue, **workflows):
            async with make_client(server.url, patient=True) as client:
                return await wait_result(client.get_workflow_handle(workflow_id), timeout=60)

    assert run_async(after_restart(), timeout=90) == {"slow": 5}
    history = run_async(fetch_history_raw(server.url, workflow_id, run_id), timeout=30)
    types = [e["event_type"] for e in history if e["event_type"].startswith("ServiceCall")]
    assert types == ["ServiceCallStarted", "ServiceCallCompleted"]
