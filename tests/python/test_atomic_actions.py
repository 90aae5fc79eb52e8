"""Atomic actions through the published Python SDK (``durable-workflow==2.12.0``).

An application embeds Capstan (``examples/atomic_bank.rs``) and registers handlers
for ``bank.debit`` and ``bank.balance``; an operator declares them ``recovery_mode: atomic``. A
workflow schedules them like any activity, but no worker ever receives them: Capstan runs each
handler inside the transaction that records the activity's completion, so the bank's rows and
the workflow's history commit together. A handler that fails rolls its writes back and the
attempt fails like any activity attempt; no outcome is ever unknown.
"""
from __future__ import annotations

import httpx
import pytest
from durable_workflow import ActivityRetryPolicy, workflow

from capstan_harness import (
    CONTROL_HEADERS,
    REPO_ROOT,
    CapstanServer,
    ScratchDatabase,
    assert_history_invariants,
    events_of,
    fetch_history,
    make_client,
    payload_of,
    postgres_admin_url,
    run_async,
    unique,
    wait_result,
)

EXAMPLE = REPO_ROOT / "target" / "debug" / "examples" / "atomic_bank"


@workflow.defn(name="bank.pay")
class PayWorkflow:
    def run(self, ctx, account, first, second):
        once = ActivityRetryPolicy(max_attempts=1)
        paid = yield ctx.schedule_activity("bank.debit", [f"{account}-1", account, first], start_to_close_timeout=10, retry_policy=once)
        try:
            yield ctx.schedule_activity("bank.debit", [f"{account}-2", account, second], start_to_close_timeout=10, retry_policy=once)
            refused = None
        except Exception as failure:  # noqa: BLE001 - reported in the result
            refused = str(failure)
        books = yield ctx.schedule_activity("bank.balance", [account], start_to_close_timeout=10)
        return {"paid": paid, "refused": refused, "books": books}


@pytest.fixture(params=["sqlite", "postgres"])
def bank_server(request, tmp_path):
    database = None
    if request.param == "postgres":
        database = ScratchDatabase(postgres_admin_url()).create()
    server = CapstanServer(
        tmp_path / "bank-data", tmp_path / "bank.log", binary=EXAMPLE, database=database.url if database else None,
    )
    server.start()
    try:
        yield server, database
    finally:
        server.terminate()
        if database is not None:
            database.drop()


def bank_rows(server: CapstanServer, database: ScratchDatabase | None, account: str) -> tuple[list, list]:
    """The application's rows, read straight from the database Capstan and the bank share."""
    accounts = f"SELECT account, balance FROM bank_accounts WHERE account = '{account}'"
    transfers = f"SELECT transfer_id, amount FROM bank_transfers WHERE account = '{account}' ORDER BY transfer_id"
    if database is not None:
        return database.query(accounts), database.query(transfers)
    import sqlite3

    with sqlite3.connect(server.data_dir / "capstan.db") as db:
        return ([[str(v) for v in row] for row in db.execute(accounts)],
                [[str(v) for v in row] for row in db.execute(transfers)])


def test_atomic_actions_commit_with_the_history_and_roll_back_on_failure(bank_server, run_worker):
    server, database = bank_server
    queue = unique("bank")
    workflow_id = unique("pay")
    account = unique("alice")

    async def main():
        async with httpx.AsyncClient(base_url=server.url, headers=CONTROL_HEADERS, timeout=30.0) as http:
            for activity_type in ("bank.debit", "bank.balance"):
                response = await http.put(f"/api/action-definitions/{activity_type}", json={"recovery_mode": "atomic"})
                assert response.status_code == 200, response.text
            # The worker has the workflow only: if an atomic task reached it, the task would fail.
            async with run_worker(server.url, queue, workflows=[PayWorkflow], activities=[]) as worker, \
                    make_client(server.url) as client:
                handle = await client.start_workflow(
                    workflow_type="bank.pay", task_queue=queue, workflow_id=workflow_id, input=[account, 30, 100],
                )
                outcome = await wait_result(handle, timeout=60, workers=[worker])
                events = await fetch_history(client, workflow_id, handle.run_id)
            entries = (await http.get("/api/ledger", params={"workflow_id": workflow_id})).json()["entries"]
        return outcome, events, entries

    outcome, events, entries = run_async(main(), timeout=120)
    assert outcome["paid"] == {"transfer_id": f"{account}-1", "balance": 70}, outcome
    assert "insufficient funds: balance 70, debit 100" in outcome["refused"], outcome
    assert outcome["books"] == {"balance": 70, "transfers": 1}, "the refused debit's transfer row was rolled back"
    assert_history_invariants(events, terminal="WorkflowCompleted")
    assert len(events_of(events, "ActivityCompleted")) == 2
    (failed,) = events_of(events, "ActivityFailed")
    assert "insufficient funds" in str(payload_of(failed)), payload_of(failed)
    assert not events_of(events, "ActivityRetryScheduled")
    # What the workflow saw is what the database holds.
    accounts, transfers = bank_rows(server, database, account)
    assert accounts == [[account, "70"]], accounts
    assert transfers == [[f"{account}-1", "30"]], transfers
    # Run by Capstan itself, never by a worker; and not ledgered: an atomic step's transaction
    # either committed or did not, so there is no outcome to resolve.
    scheduled = [payload_of(e) for e in events_of(events, "ActivityScheduled")]
    assert len(scheduled) == 3 and all("__capstan_atomic" in str(p) for p in scheduled), scheduled
    assert entries == [], entries
