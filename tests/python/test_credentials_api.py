"""Named credentials an admin manages over the API, driven by the `capstan credentials` CLI:
a worker credential and an operator credential made at run time act through the Python SDK
as their principals; the operator's secret rotates (a new one added, the old one retired)
with no restart; the credentials live in the database, so they survive a restart; no
generated secret reaches the log, the metrics or a listing.
"""
from __future__ import annotations

import json
import subprocess

import httpx
from durable_workflow import workflow

from capstan_harness import (
    CONTROL_HEADERS,
    capstan_binary,
    fetch_history_raw,
    make_client,
    run_async,
    running_worker,
    unique,
    wait_result,
)

ROOT = "root-admin-" + "r" * 32


@workflow.defn(name="managed.greeting")
class Greeting:
    def run(self, ctx, name):
        return f"hello, {name}"
        yield  # noqa: unreachable - makes run a generator, as the SDK expects


def cli(server_url: str, *args: str) -> dict:
    done = subprocess.run(
        [str(capstan_binary()), "credentials", *args, "--server", server_url, "--token", ROOT, "--output", "json"],
        capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 0, (args, done.stdout, done.stderr)
    return json.loads(done.stdout)


def status_with(server_url: str, token: str) -> int:
    headers = {**CONTROL_HEADERS, "Authorization": f"Bearer {token}"}
    return httpx.get(f"{server_url}/api/workflows", headers=headers, timeout=10).status_code


def test_credentials_made_over_the_api_act_rotate_and_survive_a_restart(server_factory):
    server = server_factory.create("--auth", "token", "--admin-token", ROOT)
    queue = unique("managed")
    worker = cli(server.url, "create", "fleet-worker", "--role", "worker")["secret"]["token"]
    made = cli(server.url, "create", "dana", "--role", "operator", "--bind", "default")
    first, first_id = made["secret"]["token"], made["secret"]["secret_id"]
    assert made["credential"]["created_by"] == {"type": "auth:token", "id": "role:admin"}, made

    async def run_one(token: str) -> tuple[str, str]:
        async with running_worker(server.url, queue, workflows=[Greeting], token=worker), \
                make_client(server.url, token=token) as client:
            workflow_id = unique("greeted")
            handle = await client.start_workflow(workflow_type="managed.greeting", workflow_id=workflow_id,
                                                 task_queue=queue, input=["dana"])
            assert await wait_result(handle, timeout=30) == "hello, dana"
            return workflow_id, handle.run_id

    workflow_id, run_id = run_async(run_one(first), timeout=60)
    events = run_async(fetch_history_raw(server.url, workflow_id, run_id,
                                         headers={"Authorization": f"Bearer {first}"}), timeout=30)
    by_type = {event["event_type"]: event.get("principal") for event in events}
    assert by_type["WorkflowStarted"] == {"type": "auth:token", "id": "dana"}, by_type
    assert by_type["WorkflowCompleted"] == {"type": "auth:token", "id": "fleet-worker"}, by_type

    # Rotation: the new secret works beside the old one; the old one retired stops at once.
    second = cli(server.url, "add-secret", "dana")["secret"]["token"]
    assert status_with(server.url, first) == 200 and status_with(server.url, second) == 200
    retired = cli(server.url, "remove-secret", "dana", first_id)
    assert retired["secret_count"] == 1, retired
    assert status_with(server.url, first) == 401, "the retired secret still works"

    # The database keeps them: after a restart the rotated secret and the worker still act.
    server.kill()
    server.start()
    assert status_with(server.url, second) == 200
    assert status_with(server.url, first) == 401
    workflow_id, _ = run_async(run_one(second), timeout=60)

    listed = json.dumps(cli(server.url, "list"))
    metrics = httpx.get(f"{server.url}/metrics", headers={"Authorization": f"Bearer {ROOT}"}, timeout=10).text
    log = server.log_text()
    for secret in (first, second, worker):
        assert secret not in listed and secret not in metrics and secret not in log, "a secret leaked"
    assert "credential.secret_removed" in log, "credential changes are logged with who made them"
    cli(server.url, "delete", "dana")
    assert status_with(server.url, second) == 401

    # The audit trail: every change to dana, newest first, by the admin; no secret in it.
    trail = cli(server.url, "events", "dana")["events"]
    assert [e["action"] for e in trail] == ["credential.deleted", "credential.secret_removed",
                                            "credential.secret_added", "credential.created"], trail
    assert all(e["by"] == {"type": "auth:token", "id": "role:admin"} for e in trail), trail
    assert trail[1]["secret_id"] == first_id
    assert first not in json.dumps(trail) and second not in json.dumps(trail)
    table = subprocess.run(
        [str(capstan_binary()), "credentials", "events", "--server", server.url, "--token", ROOT, "--limit", "2"],
        capture_output=True, text=True, timeout=60,
    )
    assert table.returncode == 0, table.stderr
    assert "credential.deleted" in table.stdout and "role:admin" in table.stdout, table.stdout


def test_a_database_holding_an_admin_credential_needs_no_token_flag(server_factory, tmp_path):
    """`--auth token` with no token flag and no file: refused while the database holds no admin
    credential (nobody could get in), served once an admin made one over the API — so the
    bootstrap `--admin-token` can be dropped from the command line for good."""
    refused = subprocess.run(
        [str(capstan_binary()), "serve", "--listen", "127.0.0.1:0", "--data-dir", str(tmp_path / "empty"),
         "--auth", "token"],
        capture_output=True, text=True, timeout=60,
    )
    assert refused.returncode == 2, (refused.stdout, refused.stderr)
    assert "none of them such an admin" in refused.stderr, refused.stderr

    server = server_factory.create("--auth", "token", "--admin-token", ROOT)
    bound = cli(server.url, "create", "tenant-admin", "--role", "admin", "--bind", "default")["secret"]["token"]
    server.kill()
    server.extra_args = ["--auth", "token"]
    refused = subprocess.run(server.command(), capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2, "an admin bound to a namespace cannot manage credentials"
    assert "1 stored credential(s)" in refused.stderr, refused.stderr

    server.extra_args = ["--auth", "token", "--admin-token", ROOT]
    server.start()
    admin = cli(server.url, "create", "ops-admin", "--role", "admin")["secret"]["token"]
    server.kill()
    server.extra_args = ["--auth", "token"]
    server.start()
    assert status_with(server.url, admin) == 200
    assert status_with(server.url, bound) == 200
    assert status_with(server.url, ROOT) == 401, "the bootstrap token is gone from the command line"
    assert "credentials stored in the database only" in server.log_text()
