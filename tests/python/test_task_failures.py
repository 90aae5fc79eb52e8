"""A workflow task that keeps failing shows its cause: the published Python SDK reports an entry
that cannot bind the recorded arguments (message, type, reason and stack trace), and the cause is
on the describe and history answers, in the CLI and first on the UI's run page, until a worker
with compatible code completes the task and the run finishes.
"""
from __future__ import annotations

import asyncio
import subprocess

import httpx
from durable_workflow import workflow
from playwright.async_api import async_playwright, expect

from capstan_harness import CONTROL_HEADERS, capstan_binary, make_client, run_async, unique, wait_result
from test_ui import chromium_path, open_page, screenshot


@workflow.defn(name="tf.entry")
class TwoArgumentEntry:
    """Deployed code that no longer binds the recorded single argument."""

    def run(self, ctx, name, greeting):
        return f"{greeting}, {name}"
        yield  # a generator, as workflow entries are


@workflow.defn(name="tf.entry")
class OneArgumentEntry:
    """The compatible code restored."""

    def run(self, ctx, name):
        return f"hello, {name}"
        yield


async def wait_failure(http: httpx.AsyncClient, workflow_id: str, timeout: float = 20.0) -> dict:
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        described = (await http.get(f"/api/workflows/{workflow_id}")).json()
        if described.get("workflow_task_failure"):
            return described
        assert asyncio.get_running_loop().time() < deadline, f"no task failure shown: {described}"
        await asyncio.sleep(0.2)


def test_a_failing_workflow_task_shows_its_cause_until_it_completes(server_url, worker_url, run_worker):
    queue = unique("tf")
    workflow_id = unique("tf-wf")

    def cli_table(*args: str) -> str:
        done = subprocess.run([str(capstan_binary()), *args, "--server", server_url, "--output", "table"],
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, (args, done.stdout, done.stderr)
        return done.stdout

    async def main():
        async with httpx.AsyncClient(base_url=server_url, headers=CONTROL_HEADERS, timeout=30.0) as http, \
                make_client(server_url) as client:
            async with run_worker(worker_url, queue, workflows=[TwoArgumentEntry]):
                handle = await client.start_workflow(workflow_type="tf.entry", task_queue=queue,
                                                     workflow_id=workflow_id, input=["Ada"])
                described = await wait_failure(http, workflow_id)
            failure = described["workflow_task_failure"]
            assert failure["type"] == "WorkflowEntryArgumentsMismatchError", failure
            assert failure["reason"] == "workflow_entry_arguments_mismatch", failure
            assert "argument_binding_failed" in failure["message"], failure
            assert "Traceback" in failure["stack_trace"] and "WorkflowEntryArgumentsMismatchError" in failure["stack_trace"]
            assert failure["consecutive_failures"] >= 1 and failure["workflow_task_attempt"] >= 1
            assert failure["lease_owner"] and failure["failed_at"] and failure["first_failed_at"]
            assert failure["message"] in described["wait_reason"], described["wait_reason"]
            workflow_tasks = [t for t in described["open_tasks"] if t["kind"] == "workflow"]
            assert [t["last_error"] for t in workflow_tasks] == [failure["message"]], described["open_tasks"]

            history = (await http.get(f"/api/workflows/{workflow_id}/runs/{handle.run_id}/history")).json()
            assert history["workflow_task_failure"]["stack_trace"] == failure["stack_trace"]

            for command in (("workflow", "describe", workflow_id), ("workflow", "history", workflow_id)):
                printed = await asyncio.to_thread(cli_table, *command)
                assert "! workflow task failing" in printed and "argument_binding_failed" in printed, printed
                assert "reason: workflow_entry_arguments_mismatch" in printed and "Traceback" in printed, printed

            async with async_playwright() as playwright:
                browser = await playwright.chromium.launch(executable_path=chromium_path(), args=["--no-sandbox"])
                page = await browser.new_page(viewport={"width": 1366, "height": 900})
                await open_page(page, f"{server_url}/#/workflows/{workflow_id}")
                box = page.locator("#task-failure")
                await expect(box).to_contain_text("The workflow task is failing")
                await expect(box).to_contain_text("workflow_entry_arguments_mismatch")
                await expect(page.locator("#task-failure-stack")).to_contain_text("Traceback")
                # The history budget is on the page: this small run is not near it.
                await expect(page.locator("#history-budget")).to_contain_text("2 events")
                await expect(page.locator("#history-budget .badge")).to_have_count(0)
                await screenshot(page, "workflow-task-failing")
                # The list says which runs are failing their task.
                await open_page(page, f"{server_url}/#/workflows?query={workflow_id}")
                await expect(page.locator(".task-failing").first).to_contain_text("task failing")
                await browser.close()

            async with run_worker(worker_url, queue, workflows=[OneArgumentEntry]):
                assert await wait_result(handle, timeout=90) == "hello, Ada"
            cleared = (await http.get(f"/api/workflows/{workflow_id}")).json()
            assert cleared["workflow_task_failure"] is None and cleared["wait_reason"] is None, cleared

    run_async(main(), timeout=180)
