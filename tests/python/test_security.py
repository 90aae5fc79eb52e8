"""What must never leave a run's own payloads: a consequential action's raw input, its payload
blobs and the operator's credential. A declared action runs with a secret in its input on a
server with token auth and debug logging; afterwards the secret, the encoded argument blob and
the token are searched for in the ledger (API and database rows), the server's logs, the
Prometheus and JSON metrics, and the integrity and system endpoints. Hashes only.

Also: list filters and ids are bound, never spliced into SQL (hostile strings are data).
"""
from __future__ import annotations

import asyncio
import sqlite3
import time
import urllib.parse

import httpx
from durable_workflow import ActivityRetryPolicy, activity, workflow

from capstan_harness import CONTROL_HEADERS, envelope, make_client, run_async, unique, wait_result

CALLS: dict[str, int] = {}


@activity.defn(name="sec.charge")
def charge(card: str) -> dict:
    CALLS[card] = CALLS.get(card, 0) + 1
    if CALLS[card] == 1:
        raise RuntimeError("the provider hung up")  # outcome unknown: an operator decides
    return {"charged": True}


@workflow.defn(name="sec.checkout")
class Checkout:
    def run(self, ctx, card):
        receipt = yield ctx.schedule_activity(
            "sec.charge", [card], start_to_close_timeout=5,
            retry_policy=ActivityRetryPolicy(max_attempts=3, backoff_seconds=[1]),
        )
        return receipt


def test_no_secret_reaches_the_ledger_logs_or_metrics(server_factory, run_worker, monkeypatch):
    monkeypatch.setenv("CAPSTAN_LOG", "debug")
    token = "tok-" + unique("secret")
    card = "card-4111111111111111-" + unique("x")
    monkeypatch.setenv("CAPSTAN_TOKEN", token)  # from the environment, as an operator would (not argv)
    server = server_factory.create("--auth", "token", "--log-format", "json")
    queue = unique("sec")
    workflow_id = unique("sec-wf")
    headers = {**CONTROL_HEADERS, "Authorization": f"Bearer {token}"}

    async def main():
        async with httpx.AsyncClient(base_url=server.url, headers=headers, timeout=30.0) as http, \
                run_worker(server.url, queue, workflows=[Checkout], activities=[charge], token=token) as worker, \
                make_client(server.url, token=token) as client:
            defined = await http.put("/api/action-definitions/sec.charge", json={"recovery_mode": "non_atomic"})
            assert defined.status_code == 200, defined.text
            handle = await client.start_workflow(workflow_type="sec.checkout", task_queue=queue, workflow_id=workflow_id, input=[card])
            deadline = time.monotonic() + 20
            while True:
                entries = (await http.get("/api/ledger", params={"state": "outcome_unknown", "workflow_id": workflow_id})).json()["entries"]
                if entries or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.1)
            assert entries, "the failed dispatch left no outcome_unknown entry"
            resolved = await http.post(f"/api/ledger/{entries[0]['ledger_key']}/resolve",
                                       json={"decision": "effect_absent", "evidence": {"note": "no charge at the provider"}})
            assert resolved.status_code == 200, resolved.text
            result = await wait_result(handle, timeout=30, workers=[worker])
            history = (await http.get(f"/api/workflows/{workflow_id}/runs/{handle.run_id}/history", params={"page_size": 1000})).json()["events"]
            outputs = {
                "ledger list": (await http.get("/api/ledger", params={"workflow_id": workflow_id})).text,
                "ledger entry": (await http.get(f"/api/ledger/{entries[0]['ledger_key']}")).text,
                "action definitions": (await http.get("/api/action-definitions")).text,
                "integrity incidents": (await http.get("/api/integrity-incidents")).text,
                "system metrics": (await http.get("/api/system/metrics")).text,
                "operator metrics": (await http.get("/api/system/operator-metrics")).text,
                "prometheus": (await http.get("/metrics")).text,
                "workers": (await http.get("/api/workers")).text,
            }
        return result, history, outputs

    result, history, outputs = run_async(main(), timeout=90)
    assert result == {"charged": True}, result
    assert any(e["event_type"] == "ActivityScheduled" for e in history)
    blob = envelope([card])["blob"]  # the arguments exactly as the SDK encodes them for the worker
    with sqlite3.connect(server.data_dir / "capstan.db") as db:
        for table in ("ledger_entries", "ledger_checkpoints", "action_definitions", "integrity_incidents", "workers"):
            columns = [row[1] for row in db.execute(f"PRAGMA table_info({table})")]
            rows = db.execute(f"SELECT * FROM {table}").fetchall()
            outputs[f"table {table}"] = "\n".join(str(row) for row in rows)
            assert columns, table
    outputs["server log"] = server.log_path.read_text(errors="replace")
    assert len(outputs["table ledger_entries"]) > 0 and "sec.charge" in outputs["server log"]
    for name, text in outputs.items():
        assert card not in text, f"the raw action input is in the {name}"
        assert blob not in text, f"the encoded argument payload is in the {name}"
        assert token not in text, f"the token is in the {name}"


def test_hostile_filters_and_ids_are_data(server_url):
    hostile = ["x' OR '1'='1", "x\"; DROP TABLE runs; --", "%' --", "\\'; SELECT 1; --", "名前' UNION SELECT state FROM runs --"]

    async def main():
        async with httpx.AsyncClient(base_url=server_url, headers=CONTROL_HEADERS, timeout=30.0) as http:
            before = (await http.get("/api/workflow-counts")).json()["total"]
            answers = []
            for text in hostile:
                for params in ({"query": text}, {"workflow_type": text}, {"task_queue": text}, {"status": text},
                               {"query": f'WorkflowType = "{text}"'}, {"next_page_token": text}):
                    response = await http.get("/api/workflows", params=params)
                    answers.append((params, response.status_code, response.json()))
                response = await http.get("/api/workflows/" + urllib.parse.quote(text, safe=""))
                answers.append((text, response.status_code, response.json()))
            after = (await http.get("/api/workflow-counts")).json()["total"]
            return before, after, answers

    before, after, answers = run_async(main(), timeout=60)
    assert before == after
    for params, status, body in answers:
        assert status in (200, 400, 404, 422), (params, status, body)
        if status == 200:
            assert body.get("workflows", []) == [], (params, body)
        else:
            assert body["reason"] and body["message"], (params, body)
