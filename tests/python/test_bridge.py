"""Bridge-adapter webhooks through the published Python SDK (``durable-workflow==2.12.0``): an
external event starts or signals a workflow exactly once per (adapter, idempotency key); repeats
answer ``duplicate`` with the first identities; rejections are 422 outcome documents the SDK
returns instead of raising.
"""
from __future__ import annotations

from durable_workflow import workflow

from capstan_harness import make_client, run_async, unique, wait_result


@workflow.defn(name="bridge.order")
class OrderWorkflow:
    def run(self, ctx, event):
        return {"event": event}


@workflow.defn(name="bridge.approval")
class ApprovalWorkflow:
    def __init__(self) -> None:
        self.approvers: list[str] = []

    @workflow.signal("approve")
    def approve(self, approver: str) -> None:
        self.approvers.append(approver)

    def run(self, ctx):
        yield ctx.wait_condition(lambda: len(self.approvers) >= 1)
        yield ctx.start_timer(1)  # room for a (wrongly) repeated signal to land
        return {"approvers": self.approvers}


def test_webhook_events_start_and_signal_exactly_once(server_url, worker_url, run_worker):
    queue = unique("bridge")
    event_key = unique("evt")

    async def main():
        async with run_worker(worker_url, queue, workflows=[OrderWorkflow, ApprovalWorkflow]) as worker, \
                make_client(server_url) as client:
            target = {"workflow_type": "bridge.order", "task_queue": queue, "business_key": "invoice-1"}
            first = await client.send_webhook_bridge_event(
                "stripe", action="start_workflow", idempotency_key=event_key, target=target,
                input={"invoice": 1}, correlation={"provider": "stripe"},
            )
            repeat = await client.send_webhook_bridge_event(
                "stripe", action="start_workflow", idempotency_key=event_key, target=target, input={"invoice": 2},
            )
            started = await wait_result(client.get_workflow_handle(first.workflow_id), timeout=30, workers=[worker])

            approval_id = unique("approval")
            handle = await client.start_workflow(workflow_type="bridge.approval", task_queue=queue, workflow_id=approval_id)
            signal_key = unique("page")
            signal_target = {"workflow_id": approval_id, "signal_name": "approve"}
            signalled = await client.send_webhook_bridge_event(
                "pagerduty", action="signal_workflow", idempotency_key=signal_key, target=signal_target, input={"who": "ada"},
            )
            resignalled = await client.send_webhook_bridge_event(
                "pagerduty", action="signal_workflow", idempotency_key=signal_key, target=signal_target, input={"who": "grace"},
            )
            approved = await wait_result(handle, timeout=30, workers=[worker])
            unknown = await client.send_webhook_bridge_event(
                "pagerduty", action="signal_workflow", idempotency_key=unique("lost"),
                target={"workflow_id": unique("nobody"), "signal_name": "approve"},
            )
            unsupported = await client.send_webhook_bridge_event(
                "github", action="delete_everything", idempotency_key=unique("x"), target={},
            )
        return first, repeat, started, signalled, resignalled, approved, unknown, unsupported

    first, repeat, started, signalled, resignalled, approved, unknown, unsupported = run_async(main(), timeout=90)
    assert first.schema == "durable-workflow.v2.bridge-adapter-outcome.contract" and first.version == 1
    assert (first.accepted, first.outcome, first.control_plane_outcome) == (True, "accepted", "started_new")
    assert first.workflow_id.startswith("bridge-stripe-") and first.correlation == {"provider": "stripe"}
    assert (repeat.accepted, repeat.outcome, repeat.reason) == (False, "duplicate", "duplicate_start")
    assert repeat.workflow_id == first.workflow_id and repeat.run_id == first.run_id
    assert started == {"event": {"invoice": 1}}, "a plain JSON input is the single argument; the repeat started nothing"
    assert (signalled.accepted, signalled.outcome) == (True, "accepted")
    assert (resignalled.outcome, resignalled.control_plane_outcome) == ("duplicate", "deduped_existing_command")
    assert approved == {"approvers": [{"who": "ada"}]}, "exactly one signal was delivered"
    assert (unknown.accepted, unknown.outcome, unknown.reason) == (False, "rejected", "unknown_target")
    assert (unsupported.outcome, unsupported.reason) == ("rejected", "unsupported_action")
