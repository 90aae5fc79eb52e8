"""The operator web UI in a real headless Chromium (Debian's ``chromium``, driven by Playwright),
against a real server with the published Python SDK as the worker.

An operator lists and filters workflows, reads a run (decoded input and result, the history
timeline, the verified hash chain), signals and cancels runs by clicking, watches workers and
task queues, and resolves an ``outcome_unknown`` ledger entry through the form; with auth on,
the page asks for a token. Screenshots of every page are kept in ``target/ui-screenshots``.
"""
from __future__ import annotations

import asyncio
import re
import os
import shutil
import time
from pathlib import Path

import httpx
from durable_workflow import ActivityRetryPolicy, activity, workflow
from playwright.async_api import Page, async_playwright, expect

from capstan_harness import CONTROL_HEADERS, decode_envelope, envelope, make_client, run_async, unique, wait_result

ARTIFACTS = Path(os.environ.get("CAPSTAN_UI_ARTIFACTS", Path(__file__).resolve().parents[2] / "target" / "ui-screenshots"))


def chromium_path() -> str:
    path = os.environ.get("CAPSTAN_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    assert path, "Debian's chromium is needed for the UI tests (apt-get install chromium; scripts/test-all.sh installs it)"
    return path


async def screenshot(page: Page, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    await page.evaluate("document.getElementById('toast').replaceChildren()")  # checked already
    await page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


async def open_page(page: Page, url: str) -> None:
    await page.goto(url)
    await page.wait_for_selector("body[data-ready='true']")


CHARGES: dict[str, int] = {}


@activity.defn(name="ui.charge")
def charge(key: str) -> dict:
    CHARGES[key] = CHARGES.get(key, 0) + 1
    if CHARGES[key] == 1:
        raise RuntimeError("connection reset while the provider was charging")
    return {"charged": key, "calls": CHARGES[key]}


@workflow.defn(name="ui.greeter")
class Greeter:
    def __init__(self) -> None:
        self.greeting = None

    @workflow.signal("finish")
    def finish(self, greeting: str) -> None:
        self.greeting = greeting

    def run(self, ctx, name, wait):
        if wait:
            yield ctx.wait_condition(lambda: self.greeting is not None)
        return f"{self.greeting or 'hello'}, {name}"


@workflow.defn(name="ui.checkout")
class Checkout:
    def run(self, ctx, key):
        receipt = yield ctx.schedule_activity(
            "ui.charge", [key], start_to_close_timeout=5,
            retry_policy=ActivityRetryPolicy(max_attempts=3, backoff_seconds=[1]),
        )
        return receipt


async def wait_status(http: httpx.AsyncClient, workflow_id: str, statuses: tuple[str, ...], timeout: float = 20.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        described = (await http.get(f"/api/workflows/{workflow_id}")).json()
        if described.get("status") in statuses or time.monotonic() > deadline:
            return described
        await asyncio.sleep(0.1)


async def wait_unknown(http: httpx.AsyncClient, workflow_id: str, timeout: float = 20.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        entries = (await http.get("/api/ledger", params={"state": "outcome_unknown", "workflow_id": workflow_id})).json()["entries"]
        if entries:
            return entries[0]
        await asyncio.sleep(0.1)
    raise AssertionError(f"no outcome_unknown entry for {workflow_id}")


def test_an_operator_works_through_every_page_in_chromium(server_url, worker_url, run_worker):
    queue = unique("ui")
    done_id, signal_id, cancel_id, checkout_id = unique("ui-done"), unique("ui-signal"), unique("ui-cancel"), unique("ui-checkout")
    key = unique("charge")

    async def main():
        async with httpx.AsyncClient(base_url=server_url, headers=CONTROL_HEADERS, timeout=30.0) as http, \
                run_worker(worker_url, queue, workflows=[Greeter, Checkout], activities=[charge]) as worker, \
                make_client(server_url) as client, async_playwright() as playwright:
            defined = await http.put("/api/action-definitions/ui.charge", json={"recovery_mode": "non_atomic"})
            assert defined.status_code == 200, defined.text
            done = await client.start_workflow(workflow_type="ui.greeter", task_queue=queue, workflow_id=done_id, input=["Ada", False])
            await wait_result(done, timeout=30, workers=[worker])
            await client.start_workflow(workflow_type="ui.greeter", task_queue=queue, workflow_id=signal_id, input=["Grace", True],
                                        priority=2, fairness_key="Tenant-UI", fairness_weight=4)
            await client.start_workflow(workflow_type="ui.greeter", task_queue=queue, workflow_id=cancel_id, input=["Grace", True])
            checkout = await client.start_workflow(workflow_type="ui.checkout", task_queue=queue, workflow_id=checkout_id, input=[key])
            await wait_status(http, signal_id, ("waiting",))
            await wait_status(http, cancel_id, ("waiting",))
            unknown = await wait_unknown(http, checkout_id)

            browser = await playwright.chromium.launch(executable_path=chromium_path(), args=["--no-sandbox"])
            page = await browser.new_page(viewport={"width": 1366, "height": 900})
            problems: list[str] = []
            page.on("pageerror", lambda error: problems.append(str(error)))
            page.on("dialog", lambda dialog: asyncio.ensure_future(dialog.accept()))

            # The list: every run, counts per bucket, filters that narrow it.
            await open_page(page, server_url + "/")
            await expect(page.get_by_role("heading", name="Workflows")).to_be_visible()
            for workflow_id in (done_id, signal_id, cancel_id, checkout_id):
                await expect(page.get_by_role("link", name=workflow_id)).to_be_visible()
            await expect(page.get_by_role("link", name="Completed (1)")).to_be_visible()
            await screenshot(page, "workflows")
            await page.get_by_label("Type").fill("ui.checkout")
            await page.get_by_role("button", name="Filter").click()
            await page.wait_for_selector("body[data-ready='true']")
            await expect(page.get_by_role("link", name=checkout_id)).to_be_visible()
            await expect(page.get_by_role("link", name=done_id)).to_have_count(0)
            await page.get_by_role("link", name="Completed (0)").click()
            await expect(page.get_by_text("No workflow matches these filters.")).to_be_visible()

            # A completed run: decoded input and result, the timeline, the verified chain.
            await open_page(page, f"{server_url}/#/workflows/{done_id}")
            await expect(page.locator("#run-title")).to_have_text(done_id)
            await expect(page.locator("#run-input")).to_contain_text('"Ada"')
            await expect(page.locator("#run-output")).to_contain_text('"hello, Ada"')
            await expect(page.locator("#chain-status")).to_contain_text("ok")
            await expect(page.locator("#history")).to_contain_text("WorkflowStarted")
            await expect(page.locator("#history")).to_contain_text("WorkflowCompleted")
            completed_event = page.locator("#history li").filter(has_text="WorkflowCompleted")
            await completed_event.locator("summary").click()
            await expect(completed_event.locator("pre")).to_contain_text('"hello, Ada"')  # the decoded Avro result
            await expect(page.locator("#action-cancel")).to_be_disabled()
            await screenshot(page, "run")

            # Pause a waiting run from its page: a badge and a note say so, the list has a Paused
            # tab; resume it from the same page.
            await open_page(page, f"{server_url}/#/workflows/{signal_id}")
            await page.locator("#action-pause").click()
            await expect(page.locator("#toast")).to_contain_text("Paused")
            await expect(page.locator("#paused-note")).to_contain_text("paused from the Capstan UI")
            await expect(page.locator("h1 .badge.paused")).to_have_text("paused")
            await screenshot(page, "run-paused")
            await open_page(page, server_url + "/")
            await page.get_by_role("link", name="Paused (1)").click()
            await page.wait_for_selector("body[data-ready='true']")
            await expect(page.get_by_role("link", name=signal_id)).to_be_visible()
            await expect(page.get_by_role("link", name=cancel_id)).to_have_count(0)
            await open_page(page, f"{server_url}/#/workflows/{signal_id}")
            await page.locator("#action-resume").click()
            await expect(page.locator("#toast")).to_contain_text("Resumed")
            audit_trail = page.locator("table").filter(has_text="Queries, pauses and resumes of this workflow")
            await expect(audit_trail).to_contain_text("pause: paused from the Capstan UI")
            await expect(audit_trail).to_contain_text("resume: resumed from the Capstan UI")
            await expect(page.locator("#paused-note")).to_have_count(0)
            await expect(page.locator("#action-pause")).to_be_enabled()

            # Signal one waiting run by form, cancel the other by clicking.
            await open_page(page, f"{server_url}/#/workflows/{signal_id}")
            await expect(page.locator("#dispatch-class")).to_have_text("priority 2, class tenant-ui (weight 4)")
            await page.get_by_label("Signal", exact=True).fill("finish")
            await page.get_by_label("Arguments (JSON)").fill('["bonjour"]')
            await page.get_by_role("button", name="Send signal").click()
            await expect(page.locator("#toast")).to_contain_text("Signal finish sent")
            # The page encoded the arguments as an Avro payload the SDK decodes.
            signalled = await wait_status(http, signal_id, ("completed",))
            signalled["result"] = decode_envelope(signalled["output_envelope"])
            await open_page(page, f"{server_url}/#/workflows/{cancel_id}")
            await page.locator("#action-cancel").click()
            await expect(page.locator("#toast")).to_contain_text("Cancel requested")
            cancelled = await wait_status(http, cancel_id, ("cancelled",))
            await open_page(page, f"{server_url}/#/workflows/{cancel_id}")
            await expect(page.locator("h1 .badge")).to_have_text("cancelled")
            await screenshot(page, "run-cancelled")

            # The blocked checkout shows its pending activity and ledger entry.
            await open_page(page, f"{server_url}/#/workflows/{checkout_id}")
            await expect(page.get_by_role("link", name="outcome unknown: resolve")).to_be_visible()
            await expect(page.locator("table").filter(has_text="Open activity executions")).to_contain_text("blocked")

            # Workers and queues.
            await open_page(page, f"{server_url}/#/workers")
            await expect(page.get_by_role("link", name=queue).first).to_be_visible()
            # The slots and process the SDK's heartbeat reported are shown, not blank.
            await expect(page.locator(".worker-slots").first).to_contain_text("workflow")
            await expect(page.locator(".worker-process").first).to_contain_text(f"pid {os.getpid()}")
            await screenshot(page, "workers")
            listed_queues = (await http.get("/api/task-queues")).json()["task_queues"]
            assert queue in [q["name"] for q in listed_queues] and all(q["name"] for q in listed_queues), listed_queues
            await open_page(page, f"{server_url}/#/task-queues/{queue}")
            await expect(page.get_by_text("Workers polling this queue")).to_be_visible()
            await expect(page.locator("table").filter(has_text="Workers polling this queue")).to_contain_text("active")
            await expect(page.locator(".poller-slots").first).to_contain_text("activity")
            await expect(page.get_by_role("heading", name="Ready by priority and fairness class")).to_be_visible()
            # Flow control, set live from the page.
            await expect(page.get_by_text("No limits: tasks go out as fast as workers take them.")).to_be_visible()
            await page.get_by_label("Task kind").select_option("activity")
            await page.get_by_label("Leased at once, at most").fill("7")
            await page.get_by_label("Cap per fairness key").fill("2")
            await page.get_by_label("Fairness key weights").fill("Tenant-A=3")
            await page.get_by_role("button", name="Save limits").click()
            await expect(page.locator("#toast")).to_contain_text("Limits of activity tasks saved")
            await expect(page.locator("table").filter(has_text="Flow-control limits")).to_contain_text("activity")
            await expect(page.locator("table").filter(has_text="Flow-control limits")).to_contain_text("each key ≤2 leased; tenant-a weight 3")
            limits = (await http.get(f"/api/task-queues/{queue}/limits")).json()
            assert limits["activity_task"]["max_leased_tasks"] == 7, limits
            assert limits["activity_task"]["fairness_key_limits"]["max_leased_tasks"] == 2, limits
            await page.get_by_label("Task kind").select_option("activity")
            await page.get_by_role("button", name="Clear limits").click()
            await expect(page.get_by_text("No limits: tasks go out as fast as workers take them.")).to_be_visible()
            # Pause the queue's activity tasks from its page, then resume them.
            await page.locator("#queue-pause-activity").click()
            await expect(page.locator("#toast")).to_contain_text("The queue's activity tasks paused")
            await expect(page.locator("#queue-activity .badge.paused")).to_have_text("paused")
            await expect(page.locator("#queue-workflow")).to_contain_text("open")
            await expect(page.get_by_text("task_queue_paused")).to_be_visible()
            described = (await http.get(f"/api/task-queues/{queue}")).json()
            assert described["admission"]["activity_tasks"]["status"] == "paused", described["admission"]
            assert described["admission"]["workflow_tasks"]["status"] == "open", described["admission"]
            await screenshot(page, "task-queue-paused")
            await page.locator("#queue-resume-activity").click()
            await expect(page.locator("#toast")).to_contain_text("The queue's activity tasks resumed")
            await expect(page.locator("#queue-pause-activity")).to_be_visible()
            await expect(page.get_by_text("No limits: tasks go out as fast as workers take them.")).to_be_visible()

            # The ledger: the unknown entry waits; resolve it by form (the effect was absent).
            await open_page(page, f"{server_url}/#/ledger")
            await page.get_by_role("link", name=unknown["ledger_key"]).click()
            await page.wait_for_selector("#resolve-form")
            await screenshot(page, "ledger-entry")
            await page.get_by_label("Decision").select_option("effect_absent")
            await page.get_by_label("Evidence (JSON object: what you checked)").fill('{"provider_reference": "none", "note": "no charge in the provider console"}')
            await page.get_by_role("button", name="Resolve").click()
            await expect(page.locator("#toast")).to_contain_text("Entry resolved")
            result = await wait_result(checkout, timeout=30, workers=[worker])
            entry = (await http.get(f"/api/ledger/{unknown['ledger_key']}")).json()
            await open_page(page, f"{server_url}/#/workflows/{checkout_id}")
            await expect(page.locator("#run-output")).to_contain_text('"calls": 2')
            await expect(page.get_by_role("heading", name="Recovery ledger")).to_be_visible()
            await screenshot(page, "run-checkout")
            await open_page(page, f"{server_url}/#/ledger")
            await expect(page.get_by_text("No action has an unknown outcome.")).to_be_visible()

            # A missing run is a clear error, not a blank page.
            await open_page(page, f"{server_url}/#/workflows/{unique('missing')}")
            await expect(page.get_by_role("alert").filter(has_text="instance_not_found")).to_be_visible()
            toasts = await page.locator("#toast").inner_text()
            await browser.close()
            return signalled, cancelled, result, entry, problems, toasts

    signalled, cancelled, result, entry, problems, toasts = run_async(main(), timeout=180)
    assert "Refused" not in toasts, toasts
    assert signalled["status"] == "completed" and signalled["result"] == "bonjour, Grace", signalled
    assert cancelled["status"] == "cancelled", cancelled
    assert result == {"charged": key, "calls": 2}, result
    assert entry["state"] != "outcome_unknown" and entry["resolution"]["decision"] == "effect_absent", entry
    assert problems == [], problems


def test_the_page_asks_for_an_operator_token_when_auth_is_on(server_factory):
    server = server_factory.create("--auth", "token", "--operator-token", "op-secret", "--worker-token", "worker-secret")

    async def main():
        async with async_playwright() as playwright:
            browser = await playwright.chromium.launch(executable_path=chromium_path(), args=["--no-sandbox"])
            page = await browser.new_page()
            await open_page(page, server.url + "/")
            await expect(page.get_by_role("heading", name="Sign in")).to_be_visible()
            await page.get_by_label("Operator token").fill("worker-secret")
            await page.get_by_role("button", name="Use token").click()
            await expect(page.get_by_text("This token may not do that")).to_be_visible()
            await page.get_by_label("Operator token").fill("op-secret")
            await page.get_by_role("button", name="Use token").click()
            await expect(page.get_by_role("heading", name="Workflows")).to_be_visible()
            await expect(page.get_by_text("No workflows yet.")).to_be_visible()
            await expect(page.locator("#signed-in")).to_have_text("Signed in as role:operator (operator)")
            await screenshot(page, "empty-with-token")
            await browser.close()

    run_async(main(), timeout=60)


def test_the_page_says_who_is_signed_in_and_who_did_what(server_factory, tmp_path):
    import hashlib

    def stored(secret: str) -> str:
        return "sha256:" + hashlib.sha256(secret.encode()).hexdigest()

    alice, bob, carol = "alice-" + "a" * 32, "bob-" + "b" * 32, "carol-" + "c" * 32
    path = tmp_path / "credentials.toml"
    path.write_text(
        f'[[credential]]\nprincipal = "alice"\nroles = ["admin"]\nsecrets = ["{stored(alice)}"]\n'
        f'[[credential]]\nprincipal = "bob"\nroles = ["operator"]\nsecrets = ["{stored(bob)}"]\n'
        f'[[credential]]\nprincipal = "carol"\nroles = ["operator"]\nnamespaces = ["billing"]\nsecrets = ["{stored(carol)}"]\n')
    server = server_factory.create("--auth", "token", "--credentials-file", str(path))
    workflow_id = unique("ui-who")

    async def main():
        def as_(token: str) -> httpx.AsyncClient:
            return httpx.AsyncClient(base_url=server.url, timeout=30.0,
                                     headers={**CONTROL_HEADERS, "Authorization": f"Bearer {token}"})
        async with as_(alice) as by_alice, as_(bob) as by_bob, async_playwright() as playwright:
            assert (await by_alice.post("/api/namespaces", json={"name": "billing"})).status_code == 201
            started = await by_alice.post("/api/workflows", json={"workflow_id": workflow_id, "workflow_type": "ui.who",
                                                                  "task_queue": unique("ui-who-q"), "input": envelope([])})
            assert started.status_code == 201, started.text
            signal = await by_bob.post(f"/api/workflows/{workflow_id}/signal/nudge", json={"input": envelope([])})
            assert signal.status_code == 202, signal.text

            browser = await playwright.chromium.launch(executable_path=chromium_path(), args=["--no-sandbox"])
            page = await browser.new_page(viewport={"width": 1366, "height": 900})
            await open_page(page, server.url + "/")
            await page.get_by_label("Operator token").fill(bob)
            await page.get_by_role("button", name="Use token").click()
            await expect(page.locator("#signed-in")).to_have_text("Signed in as bob (operator)")
            await open_page(page, f"{server.url}/#/workflows/{workflow_id}")
            await expect(page.locator("#started-by")).to_have_text("alice")
            started_event = page.locator("#history li").filter(has_text="WorkflowStarted")
            await expect(started_event.locator(".principal")).to_have_text("by alice")
            signalled = page.locator("#history li").filter(has_text="SignalReceived")
            await expect(signalled.locator(".principal")).to_have_text("by bob")
            await expect(page.get_by_text("No one has queried, paused or resumed this workflow.")).to_be_visible()
            await screenshot(page, "run-principals")

            # A credential bound to a namespace is put in it, and sees only it.
            await page.locator("#token-button").click()
            await page.get_by_label("Operator token").fill(carol)
            await page.get_by_role("button", name="Use token").click()
            await expect(page.locator("#signed-in")).to_have_text("Signed in as carol (operator in billing)")
            await expect(page.locator("#namespace")).to_have_value("billing")
            await expect(page.locator("#namespace option")).to_have_count(1)
            await page.get_by_role("navigation", name="Sections").get_by_role("link", name="Workflows").click()
            await expect(page.get_by_text("No workflows yet.")).to_be_visible()
            await browser.close()

    run_async(main(), timeout=90)


def test_an_admin_makes_rotates_and_deletes_a_credential_on_the_access_page(server_factory):
    root = "root-admin-" + "r" * 32
    server = server_factory.create("--auth", "token", "--admin-token", root)

    def whoami(token: str) -> httpx.Response:
        return httpx.get(f"{server.url}/api/auth/whoami", headers={"Authorization": f"Bearer {token}"}, timeout=10)

    async def main():
        async with async_playwright() as playwright:
            browser = await playwright.chromium.launch(executable_path=chromium_path(), args=["--no-sandbox"])
            page = await browser.new_page(viewport={"width": 1366, "height": 900})
            page.on("dialog", lambda dialog: asyncio.ensure_future(dialog.accept()))
            await open_page(page, server.url + "/#/access")
            await page.get_by_label("Operator token").fill(root)
            await page.get_by_role("button", name="Use token").click()
            await expect(page.get_by_role("heading", name="Access")).to_be_visible()
            await page.get_by_label("Principal").fill("ui-operator")
            await page.locator("#credential-role-operator").check()
            await page.get_by_role("button", name="Create credential").click()
            await expect(page.locator("#new-secret h2")).to_have_text("New secret for ui-operator")
            first = await page.locator("#new-secret-token").text_content()
            first_id = await page.locator("#new-secret p.muted .mono").text_content()
            assert (await asyncio.to_thread(whoami, first)).json()["principal"]["id"] == "ui-operator"
            credentials = page.locator("table").filter(has=page.locator("caption", has_text="Credentials"))
            changes = page.locator("table").filter(has=page.locator("caption", has_text="Recent changes"))
            row = credentials.locator("tbody tr").filter(has_text="ui-operator")
            await expect(row).to_contain_text("every namespace")
            await expect(row).to_contain_text("role:admin")  # who made it
            await screenshot(page, "access-new-secret")

            # Rotation by clicking: a second secret, then the first retired.
            await row.get_by_role("button", name="New secret").click()
            await expect(page.locator("#new-secret-token")).not_to_have_text(first)
            second = await page.locator("#new-secret-token").text_content()
            retire = page.locator(f"li[data-secret-id='{first_id}']").get_by_role("button", name="Retire")
            await retire.click()
            await expect(page.locator(f"li[data-secret-id='{first_id}']")).to_have_count(0)
            await expect(page.locator("#new-secret")).to_have_count(0)  # shown once, gone on the next change
            assert (await asyncio.to_thread(whoami, first)).status_code == 401
            assert (await asyncio.to_thread(whoami, second)).status_code == 200
            assert first not in await page.content() and second not in await page.content()

            await row.get_by_role("button", name="Delete").click()
            await expect(credentials.locator("tbody tr").filter(has_text="ui-operator")).to_have_count(0)
            assert (await asyncio.to_thread(whoami, second)).status_code == 401
            # The trail of what was done, newest first, by whom; never a secret.
            await expect(changes.locator("tbody tr")).to_have_count(4)
            await expect(changes.locator("tbody tr").first).to_contain_text("deleted")
            await expect(changes.locator("tbody tr").nth(1)).to_contain_text(first_id)
            await expect(changes).to_contain_text("role:admin")
            assert first not in await page.content() and second not in await page.content()
            await browser.close()

    run_async(main(), timeout=90)


def test_broken_chains_show_as_a_banner_and_on_the_run_page(server_factory, run_worker):
    """A forged ledger checkpoint opens an integrity incident: every page shows the banner and
    links to the run, whose page says it is blocked. A forged history event shows on the run
    page as the sequence where the chain breaks."""
    import sqlite3

    server = server_factory.create()
    queue = unique("ui-integrity")
    workflow_id = unique("ui-integrity-wf")
    key = unique("charge")
    database = server.data_dir / "capstan.db"

    async def main():
        async with httpx.AsyncClient(base_url=server.url, headers=CONTROL_HEADERS, timeout=30.0) as http, \
                run_worker(server.url, queue, workflows=[Checkout], activities=[charge]), \
                make_client(server.url) as client, async_playwright() as playwright:
            assert (await http.put("/api/action-definitions/ui.charge", json={"recovery_mode": "non_atomic"})).status_code == 200
            handle = await client.start_workflow(workflow_type="ui.checkout", task_queue=queue, workflow_id=workflow_id, input=[key])
            unknown = await wait_unknown(http, workflow_id)
            with sqlite3.connect(database) as db:
                db.execute("UPDATE ledger_checkpoints SET doc = replace(doc, 'worker_failure', 'forged') WHERE ledger_key = ?",
                           (unknown["ledger_key"],))
                db.execute("UPDATE history_events SET payload = replace(payload, 'ui.charge', 'ui.forged') "
                           "WHERE run_id = ? AND event_type = 'ActivityScheduled'", (handle.run_id,))
                forged_sequence = db.execute("SELECT sequence FROM history_events WHERE run_id = ? AND event_type = 'ActivityScheduled'",
                                             (handle.run_id,)).fetchone()[0]
            refused = await http.post(f"/api/ledger/{unknown['ledger_key']}/resolve",
                                      json={"decision": "effect_absent", "evidence": {"note": "x"}})
            assert refused.status_code == 409 and refused.json()["reason"] == "integrity_incident_open", refused.text

            browser = await playwright.chromium.launch(executable_path=chromium_path(), args=["--no-sandbox"])
            page = await browser.new_page(viewport={"width": 1366, "height": 900})
            await open_page(page, server.url + "/#/workers")
            banner = page.locator("#banner")
            await expect(banner).to_contain_text("Integrity incident")
            await banner.get_by_role("link", name=workflow_id).click()
            await page.wait_for_selector("#run-title")
            await expect(page.locator("#run-title")).to_have_text(workflow_id)
            await expect(page.get_by_text("This run is blocked by an integrity incident")).to_be_visible()
            await expect(page.locator("#chain-status")).to_contain_text(f"broken at event {forged_sequence}")
            await screenshot(page, "integrity-incident")
            await browser.close()

    run_async(main(), timeout=90)


TRIES: dict[str, int] = {}


@activity.defn(name="ui.flaky")
def flaky(key: str) -> str:
    TRIES[key] = TRIES.get(key, 0) + 1
    if TRIES[key] == 1:
        raise RuntimeError("the first attempt fails")
    return f"done on attempt {TRIES[key]}"


@workflow.defn(name="ui.timeline")
class Timeline:
    def __init__(self) -> None:
        self.go = False

    @workflow.signal("go")
    def proceed(self) -> None:
        self.go = True

    def run(self, ctx, key):
        done = yield ctx.schedule_activity(
            "ui.flaky", [key], start_to_close_timeout=5,
            retry_policy=ActivityRetryPolicy(max_attempts=3, backoff_seconds=[1]),
        )
        yield ctx.start_timer(1)
        yield ctx.wait_condition(lambda: self.go)
        return done


async def lanes(page: Page) -> list[dict]:
    return await page.evaluate("""() => [...document.querySelectorAll('#timeline .tl-lane')].map((lane) => ({
        kind: lane.dataset.kind,
        label: lane.querySelector('.tl-label').textContent,
        bars: [...lane.querySelectorAll('.tl-bar')].map((bar) => bar.getAttribute('class').replace('tl-bar ', '')),
        marks: [...lane.querySelectorAll('.tl-mark')].map((mark) => mark.getAttribute('class').replace('tl-mark ', '')),
    }))""")


def test_a_run_is_a_timeline_the_page_follows_live_and_the_server_has_charts(server_url, worker_url, run_worker):
    """A run with a failed then retried activity, a timer and a wait is drawn as lanes (the
    failed attempt red at a glance); zoom changes the window; a bar opens its event; the page of
    the running workflow follows it to its close without a reload; lists show relative times and
    durations; the server page charts throughput, latency and backlog from /metrics. No CSP
    violation on the way."""
    queue = unique("ui-timeline")
    workflow_id = unique("ui-timeline-wf")
    key = unique("flaky")

    async def main():
        async with httpx.AsyncClient(base_url=server_url, headers=CONTROL_HEADERS, timeout=30.0) as http, \
                run_worker(worker_url, queue, workflows=[Timeline], activities=[flaky]) as worker, \
                make_client(server_url) as client, async_playwright() as playwright:
            handle = await client.start_workflow(workflow_type="ui.timeline", task_queue=queue, workflow_id=workflow_id, input=[key])
            deadline = time.monotonic() + 20
            while True:  # until the wait is open (activity retried, timer fired)
                history = (await http.get(f"/api/workflows/{workflow_id}/runs/{handle.run_id}/history")).json()["events"]
                if any(e["event_type"] == "ConditionWaitOpened" for e in history) or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.2)

            browser = await playwright.chromium.launch(executable_path=chromium_path(), args=["--no-sandbox"])
            page = await browser.new_page(viewport={"width": 1366, "height": 1000})
            problems: list[str] = []
            page.on("pageerror", lambda error: problems.append(str(error)))
            page.on("console", lambda message: problems.append(message.text) if "Content Security Policy" in message.text else None)

            await open_page(page, f"{server_url}/#/workflows/{workflow_id}")
            await expect(page.locator("#timeline")).to_be_visible()
            drawn = await lanes(page)
            by_kind = {lane["kind"]: lane for lane in drawn}
            assert by_kind["run"]["bars"] == ["open"], drawn
            assert by_kind["activity"]["label"].startswith("✕ ui.flaky"), drawn
            assert [b for b in by_kind["activity"]["bars"] if b != "queued"] == ["fail", "ok"], drawn
            assert by_kind["timer"]["bars"] == ["ok"], drawn
            assert by_kind["wait"]["bars"] == ["open"], drawn
            await expect(page.locator("#live-badge")).to_be_visible()
            await screenshot(page, "run-timeline")

            # Zoom in halves the window, Fit restores it.
            svg = page.locator("#timeline")
            full = (int(await svg.get_attribute("data-from")), int(await svg.get_attribute("data-to")))
            await page.locator("#timeline-zoom-in").click()
            zoomed = (int(await svg.get_attribute("data-from")), int(await svg.get_attribute("data-to")))
            assert abs((zoomed[1] - zoomed[0]) * 2 - (full[1] - full[0])) <= 2, (full, zoomed)
            await page.locator("#timeline-earlier").click()
            panned = (int(await svg.get_attribute("data-from")), int(await svg.get_attribute("data-to")))
            assert panned[0] < zoomed[0] or panned[0] == full[0], (zoomed, panned)
            await page.locator("#timeline-fit").click()
            assert abs(int(await svg.get_attribute("data-to")) - int(await svg.get_attribute("data-from")) - (full[1] - full[0])) <= 2000

            # The failed attempt's bar opens the event that ended it.
            await page.locator("#timeline .tl-bar.fail").first.click()
            retried = page.locator("#history li").filter(has_text="ActivityRetryScheduled")
            await expect(retried.locator("details")).to_have_attribute("open", "")
            await expect(retried.locator("pre")).to_contain_text("the first attempt fails")

            # Live: the signal arrives elsewhere; the page follows the run to its close.
            assert (await http.post(f"/api/workflows/{workflow_id}/signal/go", json={})).status_code == 202
            await expect(page.locator("h1 .badge")).to_have_text("completed", timeout=20_000)
            await expect(page.locator("#history")).to_contain_text("WorkflowCompleted")
            await expect(page.locator("#live-badge")).to_have_count(0)
            drawn = await lanes(page)
            assert {lane["kind"]: lane for lane in drawn}["run"]["bars"] == ["ok"], drawn
            assert {lane["kind"]: lane for lane in drawn}["marks"]["marks"] == ["signal"], drawn
            result = await wait_result(handle, timeout=20, workers=[worker])

            # Lists: absolute and relative times, and durations.
            await open_page(page, f"{server_url}/#/workflows?workflow_type=ui.timeline")
            row = page.locator("tr").filter(has_text=workflow_id)
            # Relative: "just now" under 5 s, "N s ago" after (how long the steps above took).
            await expect(row.locator(".ago").first).to_contain_text(re.compile(r"ago|just now"))
            await expect(row.locator("time").first).to_have_attribute("datetime", re.compile(r"^\d{4}-\d\d-\d\dT"))
            assert re.search(r"\d+(\.\d)? s|\d+ min", await row.inner_text()), await row.inner_text()

            # The server page: charts fill as the page scrapes /metrics.
            await open_page(page, f"{server_url}/#/server")
            await expect(page.locator("#server-facts")).to_contain_text("Version")
            for chart in ("throughput", "requests", "latency", "backlog", "oldest"):
                await expect(page.locator(f"#chart-{chart} svg")).to_have_attribute("data-points", re.compile(r"^[2-9]|^\d\d"), timeout=20_000)
            await client.start_workflow(workflow_type="ui.timeline", task_queue=unique("nobody-polls"), workflow_id=unique("ui-backlog"), input=["x"])
            await expect(page.locator("#chart-backlog [data-series='readyWorkflow']")).to_have_text("1.00", timeout=20_000)
            await screenshot(page, "server")
            await browser.close()
            return result, problems

    result, problems = run_async(main(), timeout=150)
    assert result == "done on attempt 2", result
    assert problems == [], problems


def test_an_imported_run_shows_where_it_came_from(server_factory, run_worker):
    """A run moved in from another server by the import contract says so on its page (from
    which runtime and namespace, when), and its chain verifies from the bundle it came from."""
    source = server_factory.create()
    target = server_factory.create()
    queue = unique("ui-import")
    workflow_id = unique("ui-imported")

    async def main():
        async with httpx.AsyncClient(base_url=source.url, headers=CONTROL_HEADERS, timeout=30.0) as old, \
                httpx.AsyncClient(base_url=target.url, headers=CONTROL_HEADERS, timeout=30.0) as new, \
                make_client(source.url) as client, async_playwright() as playwright:
            async with run_worker(source.url, queue, workflows=[Greeter]) as worker:
                handle = await client.start_workflow(workflow_type="ui.greeter", task_queue=queue,
                                                     workflow_id=workflow_id, input=["Ada", False])
                await wait_result(handle, timeout=30, workers=[worker])
            bundle = (await old.get(f"/api/workflows/{workflow_id}/runs/{handle.run_id}/history/export")).json()
            imported = await new.post("/api/workflows/import/embedded-v2", json={"bundle": bundle})
            assert imported.status_code == 201, imported.text

            browser = await playwright.chromium.launch(executable_path=chromium_path(), args=["--no-sandbox"])
            page = await browser.new_page(viewport={"width": 1366, "height": 900})
            await open_page(page, f"{target.url}/#/workflows/{workflow_id}")
            await expect(page.locator("#imported-from")).to_contain_text("imported from capstan namespace default")
            await expect(page.locator("#chain-status")).to_contain_text("ok")
            await screenshot(page, "imported-run")
            await browser.close()

    run_async(main(), timeout=90)


def test_an_operator_counts_starts_follows_and_cancels_a_batch(server_url):
    """The Batches page: a batch over a queue's runs counted, started, followed to its end; a
    slow one cancelled from its row."""
    queue, slow_queue = unique("ui-batch"), unique("ui-batch-slow")

    async def main():
        async with httpx.AsyncClient(base_url=server_url, headers=CONTROL_HEADERS, timeout=30.0) as http, \
                async_playwright() as playwright:
            for q, n in ((queue, 12), (slow_queue, 40)):
                for i in range(n):
                    started = await http.post("/api/workflows", json={"workflow_type": "ui.batched", "task_queue": q, "workflow_id": f"{q}-{i}"})
                    assert started.status_code in (200, 201), started.text
            browser = await playwright.chromium.launch(executable_path=chromium_path(), args=["--no-sandbox"])
            page = await browser.new_page(viewport={"width": 1366, "height": 900})
            problems: list[str] = []
            page.on("pageerror", lambda error: problems.append(str(error)))
            page.on("dialog", lambda dialog: asyncio.ensure_future(dialog.accept()))

            await open_page(page, server_url + "/#/batches")
            await expect(page.get_by_role("heading", name="Batch operations")).to_be_visible()
            await page.get_by_label("Action").select_option("pause")
            await page.get_by_label("Task queue").fill(queue)
            await page.locator("#batch-count-button").click()
            await expect(page.locator("#batch-count")).to_have_text("12 run(s) selected now")
            await page.get_by_role("button", name="Start batch").click()
            await expect(page.locator("#toast")).to_contain_text("Batch started")
            row = page.locator("tr").filter(has_text=f"queue {queue}")
            await expect(row.locator(".badge")).to_have_text("completed", timeout=20_000)
            await expect(row.locator(".batch-progress")).to_contain_text("12 visited: 12 done")
            await screenshot(page, "batches")

            # A slow batch (2 a second) is cancelled from its row while it runs.
            await page.get_by_label("Action").select_option("terminate")
            await page.get_by_label("Task queue").fill(slow_queue)
            await page.get_by_label("Runs per second, at most").fill("2")
            await page.get_by_role("button", name="Start batch").click()
            await expect(page.locator("#toast")).to_contain_text("Batch started")
            slow = page.locator("tr").filter(has_text=f"queue {slow_queue}")
            await expect(slow.locator(".badge")).to_have_text("running")
            await slow.get_by_role("button", name="Cancel").click()
            await expect(slow.locator(".badge")).to_have_text("cancelled")
            counts = (await http.get(f"/api/workflow-counts?task_queue={slow_queue}")).json()
            await browser.close()
            return counts, problems

    counts, problems = run_async(main(), timeout=120)
    assert counts["running"] > 20, counts
    assert problems == [], problems
