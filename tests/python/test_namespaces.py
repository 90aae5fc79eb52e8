"""Namespaces through the published Python SDK client: create, list, describe, update, delete,
and isolation: a workflow in one namespace is invisible from another, and a worker of another
namespace never receives its tasks."""
from __future__ import annotations

import asyncio

import pytest
from durable_workflow import Client, NamespaceNotFound, ServerError, Worker, activity, workflow

from capstan_harness import BackgroundWorker, run_async, unique


@activity.defn(name="ns.greet")
def greet(name: str) -> str:
    return f"hello from {name}"


@activity.defn(name="ns.greet")
def wrong_greet(name: str) -> str:
    return "answered by a worker of another namespace"


@workflow.defn(name="ns.greeting")
class GreetingWorkflow:
    def run(self, ctx, name):
        return (yield ctx.schedule_activity("ns.greet", [name]))


def test_namespaces_are_managed_and_isolated(server_url):
    name = unique("team").lower().replace("_", "-")
    queue = unique("ns-queue")
    workflow_id = unique("ns-wf")

    async def main():
        async with Client(server_url, namespace="default") as admin:
            created = await admin.create_namespace(name, description="team namespace", retention_days=14)
            with pytest.raises(ServerError) as duplicate:
                await admin.create_namespace(name)
            listed = [n.name for n in (await admin.list_namespaces()).namespaces]
            updated = await admin.update_namespace(name, retention_days=7)
            described = await admin.describe_namespace(name)
            with pytest.raises((NamespaceNotFound, ServerError)) as missing:
                await admin.describe_namespace(unique("nope"))
        async with Client(server_url, namespace=name) as team, Client(server_url, namespace="default") as other:
            # A default-namespace worker on the same queue name must never see the team's tasks.
            stranger = await BackgroundWorker(server_url, queue, workflows=[GreetingWorkflow], activities=[wrong_greet]).start()
            handle = await team.start_workflow(workflow_type="ns.greeting", task_queue=queue, workflow_id=workflow_id, input=["team"])
            team_worker_client = Client(server_url, namespace=name)
            team_worker = Worker(team_worker_client, task_queue=queue, workflows=[GreetingWorkflow], activities=[greet],
                                 worker_id=unique("team-worker"), poll_timeout=2.0)
            runner = asyncio.create_task(team_worker.run_until(workflow_id=workflow_id, timeout=30.0))
            result = await handle.result(timeout=30, poll_interval=0.2)
            await runner
            await team_worker_client.aclose()
            await stranger.stop()
            with pytest.raises(Exception) as invisible:
                await other.get_workflow_handle(workflow_id).describe()
            team_list = [w.workflow_id for w in (await team.list_workflows()).executions]
            with pytest.raises(ServerError) as not_empty:
                await team.delete_namespace(name)
        async with Client(server_url, namespace="default") as admin:
            spare = await admin.create_namespace(name + "-spare")
            deleted = await admin.delete_namespace(spare.name)
            after = [n.name for n in (await admin.list_namespaces()).namespaces]
        return created, duplicate.value, listed, updated, described, missing.value, result, invisible.value, team_list, not_empty.value, deleted, after

    created, duplicate, listed, updated, described, missing, result, invisible, team_list, not_empty, deleted, after = run_async(main(), timeout=90)
    assert (created.name, created.description, created.retention_days, created.status) == (name, "team namespace", 14, "active")
    assert duplicate.status == 409 and duplicate.body["reason"] == "namespace_already_exists", duplicate.body
    assert name in listed and "default" in listed
    assert updated.retention_days == 7 and described.retention_days == 7 and described.description == "team namespace"
    assert getattr(missing, "status", 404) == 404
    assert result == "hello from team"
    assert type(invisible).__name__ == "WorkflowNotFound", repr(invisible)
    assert workflow_id in team_list
    assert not_empty.status == 409 and not_empty.body["reason"] == "namespace_not_empty", not_empty.body
    assert deleted.name == name + "-spare" and deleted.deleted == {"namespaces": 1}
    assert name + "-spare" not in after
