"""Moving closed runs between servers by DW's embedded-v2 import, with the `capstan import` CLI:
a migration from a running server (`--from`, resumable by its progress file and idempotent), a
directory of exported bundles imported by a process killed halfway and run again, and the
results checked by the published Python SDK's replayer, its bundle verifier, a worker answering
a query from the imported history, and `capstan verify` offline.
"""
from __future__ import annotations

import asyncio
import json
import subprocess

import httpx
import pytest
from durable_workflow import activity, workflow
from durable_workflow.history_bundle_verify import verify_bundle
from durable_workflow.workflow import replay

from capstan_harness import capstan_binary, make_client, run_async, running_worker, unique, wait_result

CONTROL = {"X-Durable-Workflow-Control-Plane-Version": "2", "X-Namespace": "default"}


@activity.defn(name="import.shout")
def shout(text: str) -> str:
    return text.upper()


@workflow.defn(name="import.greeter")
class Greeter:
    @workflow.query("spoken")
    def spoken(self) -> str:
        return getattr(self, "said", "")

    def run(self, ctx, name, rounds=0):
        self.said = yield ctx.schedule_activity("import.shout", [name])
        if rounds > 0:
            return ctx.continue_as_new(name, rounds - 1)
        return self.said


def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([str(capstan_binary()), *args], capture_output=True, text=True, timeout=timeout)


def runs_of(url: str, workflow_id: str) -> list[dict]:
    answer = httpx.get(f"{url}/api/workflows/{workflow_id}/runs", headers=CONTROL)
    assert answer.status_code == 200, answer.text
    return sorted(answer.json()["runs"], key=lambda run: run["run_number"])


def export(url: str, workflow_id: str, run_id: str) -> dict:
    answer = httpx.get(f"{url}/api/workflows/{workflow_id}/runs/{run_id}/history/export", headers=CONTROL)
    assert answer.status_code == 200, answer.text
    return answer.json()


def facts(bundle: dict) -> list[tuple]:
    return [(e["id"], e["type"], json.dumps(e["payload"], sort_keys=True), e["recorded_at"]) for e in bundle["history_events"]]


def run_source(source, queue: str) -> list[str]:
    """Six closed workflows on `source`, one of them over three runs (continue-as-new)."""
    ids = [unique("moved") for _ in range(6)]

    async def main():
        async with make_client(source.url) as client:
            async with running_worker(source.url, queue, workflows=[Greeter], activities=[shout]) as worker:
                handles = [
                    await client.start_workflow(workflow_type="import.greeter", task_queue=queue, workflow_id=wid,
                                                input=[f"name-{i}", 2 if i == 0 else 0])
                    for i, wid in enumerate(ids)
                ]
                for handle in handles:
                    await wait_result(handle, timeout=60, workers=[worker])

    run_async(main(), timeout=120)
    return ids


def test_closed_runs_migrate_from_a_running_server_resumably(server_factory, tmp_path):
    source = server_factory.create()
    target = server_factory.create()
    queue = unique("import")
    ids = run_source(source, queue)
    progress = tmp_path / "progress.json"

    first = cli("import", "--from", source.url, "--server", target.url, "--progress", str(progress))
    assert first.returncode == 0, (first.stdout, first.stderr)
    assert "8 imported" in first.stdout, first.stdout  # five one-run instances and one of three runs
    again = cli("import", "--from", source.url, "--server", target.url, "--progress", str(progress))
    assert again.returncode == 0 and "8 skipped (done before)" in again.stdout, again.stdout
    fresh = cli("import", "--from", source.url, "--server", target.url, "--progress", str(tmp_path / "other.json"))
    assert fresh.returncode == 0 and "8 already_imported" in fresh.stdout, fresh.stdout

    for index, workflow_id in enumerate(ids):
        source_runs, target_runs = runs_of(source.url, workflow_id), runs_of(target.url, workflow_id)
        assert [r["run_id"] for r in target_runs] == [r["run_id"] for r in source_runs]
        for run in source_runs:
            original, imported = export(source.url, workflow_id, run["run_id"]), export(target.url, workflow_id, run["run_id"])
            assert facts(imported) == facts(original), workflow_id
            # Its chain starts from the checksum of the bundle it came from (each export is
            # stamped with its time, so that is the one the import read, not this one).
            run_detail = httpx.get(f"{target.url}/api/workflows/{workflow_id}/runs/{run['run_id']}", headers=CONTROL).json()
            assert imported["workflow"]["history_chain_origin"] == run_detail["import_bundle_checksum"] != "0" * 64
            # DW's own verifier accepts the imported run's bundle; the SDK replays its history.
            assert verify_bundle(imported)["status"] == "ok", verify_bundle(imported)["findings"]
            arguments = [f"name-{index}", (2 if index == 0 else 0) - (run["run_number"] - 1)]
            outcome = replay(Greeter, imported["history_events"], arguments, workflow_id=workflow_id, run_id=run["run_id"])
            assert [type(c).__name__ for c in outcome.commands] in (["CompleteWorkflow"], ["ContinueAsNew"]), outcome.commands
        described = httpx.get(f"{target.url}/api/workflows/{workflow_id}", headers=CONTROL).json()
        assert described["run_id"] == source_runs[-1]["run_id"] and described["status"] == "completed", described
        assert described["engine_source"] == "embedded_v2_import"

    shown = cli("workflow", "describe", ids[0], "--server", target.url)
    assert shown.returncode == 0 and "imported: from capstan at " in shown.stdout, shown.stdout

    # A worker on the target answers a query from an imported history: its code replays it.
    async def query():
        async with make_client(target.url) as client:
            async with running_worker(target.url, queue, workflows=[Greeter], activities=[shout]):
                return await client.get_workflow_handle(ids[1]).query("spoken")

    assert run_async(query(), timeout=60)["result"] == "NAME-1"


def test_a_directory_import_killed_halfway_finishes_on_the_second_run(server_factory, tmp_path):
    source = server_factory.create()
    queue = unique("import-dir")
    ids = run_source(source, queue)
    bundles = tmp_path / "bundles"
    bundles.mkdir()
    runs = [(wid, run["run_id"]) for wid in ids for run in runs_of(source.url, wid)]
    for index, (workflow_id, run_id) in enumerate(runs):
        (bundles / f"{index:03}.json").write_text(json.dumps(export(source.url, workflow_id, run_id)))
    target = server_factory.create()

    # The first import is killed once it has imported something.
    process = subprocess.Popen([str(capstan_binary()), "import", str(bundles), "--server", target.url],
                               stdout=subprocess.PIPE, text=True)
    first_line = process.stdout.readline()
    process.kill()
    process.wait(timeout=10)
    assert first_line.startswith("imported"), first_line
    done = cli("import", str(bundles), "--server", target.url)
    assert done.returncode == 0, (done.stdout, done.stderr)
    counts = done.stdout.strip().splitlines()[-1]
    imported = sum(int(part.split()[0]) for part in counts.split(", ") if part.endswith(" imported"))
    repeated = sum(int(part.split()[0]) for part in counts.split(", ") if part.endswith("already_imported"))
    assert imported + repeated == len(runs) and repeated >= 1, counts

    for workflow_id, run_id in runs:
        assert facts(export(target.url, workflow_id, run_id)) == facts(export(source.url, workflow_id, run_id))
    target.terminate()
    verified = cli("verify", "--data-dir", str(target.data_dir), "--json")
    assert verified.returncode == 0, (verified.stdout, verified.stderr)
    report = json.loads(verified.stdout)
    assert report["runs_checked"] == len(runs) and not report["problems"], report


@workflow.defn(name="import.waiter")
class Waiter:
    def __init__(self) -> None:
        self.done = False
        self.note = ""

    @workflow.signal("finish")
    def finish(self, note: str) -> None:
        self.note = note
        self.done = True

    def run(self, ctx, name):
        said = yield ctx.schedule_activity("import.shout", [name])
        yield ctx.wait_condition(lambda: self.done)
        yield ctx.sleep(1)
        return f"{said} {self.note}"


@pytest.mark.parametrize("shape", ["capstan", "dw_embedded"])
def test_open_runs_move_mid_flight_and_the_same_workers_finish_them(server_factory, tmp_path, shape):
    """Runs waiting for a signal move to a new server; the SDK's worker there replays their
    histories, the signal reaches them there, and their timers fire there. From Capstan they
    move with the state Capstan kept (`--from`); in DW's embedded shape, without it, they are
    rebuilt from their histories and sections (a directory of bundles)."""
    source = server_factory.create()
    target = server_factory.create()
    queue = unique("import-open")
    ids = [unique("waiting") for _ in range(4)]

    async def start_and_park():
        async with make_client(source.url) as client:
            async with running_worker(source.url, queue, workflows=[Waiter], activities=[shout]):
                for i, workflow_id in enumerate(ids):
                    await client.start_workflow(workflow_type="import.waiter", task_queue=queue,
                                                workflow_id=workflow_id, input=[f"n{i}"])
                for _ in range(200):
                    described = [httpx.get(f"{source.url}/api/workflows/{wid}", headers=CONTROL).json() for wid in ids]
                    working = [t for d in described for t in d["open_tasks"] if t["kind"] in ("workflow", "activity")]
                    if all(d["status"] == "waiting" for d in described) and not working:
                        return described
                    await asyncio.sleep(0.1)
                raise AssertionError(f"the runs never parked: {described}")

    run_async(start_and_park(), timeout=90)
    # The old workers have stopped; the runs move.
    if shape == "capstan":
        moved = cli("import", "--from", source.url, "--server", target.url, "--progress", str(tmp_path / "p.json"))
    else:
        for workflow_id in ids:
            bundle = export(source.url, workflow_id, runs_of(source.url, workflow_id)[0]["run_id"])
            bundle.pop("capstan_run_state")
            (tmp_path / f"{workflow_id}.json").write_text(json.dumps(as_dw_embedded(bundle)))
        moved = cli("import", str(tmp_path), "--server", target.url)
    assert moved.returncode == 0 and "4 imported" in moved.stdout, (moved.stdout, moved.stderr)

    async def finish_on_target():
        async with make_client(target.url) as client:
            async with running_worker(target.url, queue, workflows=[Waiter], activities=[shout]) as worker:
                results = []
                for workflow_id in ids:
                    handle = client.get_workflow_handle(workflow_id)
                    await handle.signal("finish", ["moved"])
                    results.append(await wait_result(handle, timeout=60, workers=[worker]))
                return results

    assert run_async(finish_on_target(), timeout=120) == [f"N{i} moved" for i in range(4)]
    for workflow_id in ids:
        run_id = runs_of(target.url, workflow_id)[0]["run_id"]
        bundle = export(target.url, workflow_id, run_id)
        kinds = [e["type"] for e in bundle["history_events"]]
        assert kinds.count("ActivityCompleted") == 1 and kinds[-1] == "WorkflowCompleted", kinds
        assert verify_bundle(bundle)["status"] == "ok"
        outcome = replay(Waiter, bundle["history_events"], [f"n{ids.index(workflow_id)}"], workflow_id=workflow_id, run_id=run_id)
        assert [type(c).__name__ for c in outcome.commands] == ["CompleteWorkflow"], outcome.commands


def as_dw_embedded(bundle: dict) -> dict:
    """The bundle as DW's embedded runtime writes it (HistoryExport): `source_runtime:
    embedded`, the payload blob as `data` beside the codec, PHP's `[]` for an empty map, times
    with an offset, events without Capstan's chain fields; sealed again by DW's canonical form."""
    import copy
    import hashlib

    from durable_workflow.history_bundle_verify import _canonicalize

    dw = copy.deepcopy(bundle)
    dw.pop("integrity")
    workflow = dw["workflow"]
    workflow.update(source_runtime="embedded", workflow_class="App\\Workflows\\Greeter", connection="redis")
    for key in ("memo", "search_attributes"):
        workflow[key] = workflow[key] or []
    for key in ("arguments", "output"):
        section = dw["payloads"][key]
        if section["available"]:
            section["data"] = section["data"]["blob"]
            section["codec"] = "avro"
    # DW keeps an activity's arguments as a bare blob beside its codec, and a task's payload
    # as its own map (Capstan's list of pending resumes is not in it).
    for activity in dw["activities"]:
        activity["arguments"] = activity["arguments"]["blob"]
        activity["payload_codec"] = "avro"
    for task in dw["tasks"]:
        task["payload"] = []
    dw["history_events"] = [
        {
            "id": e["id"], "sequence": e["sequence"], "type": e["type"],
            "workflow_task_id": e["workflow_task_id"], "workflow_command_id": e["workflow_command_id"],
            "recorded_at": e["recorded_at"].replace("Z", "+00:00"),
            "payload": e["payload"] or [],
        }
        for e in dw["history_events"]
    ]
    dw["integrity"] = {
        "canonicalization": "json-recursive-ksort-v1", "checksum_algorithm": "sha256",
        "checksum": hashlib.sha256(_canonicalize(dw).encode()).hexdigest(),
        "signature_algorithm": None, "signature": None, "key_id": None,
    }
    return dw


def test_a_bundle_in_dws_embedded_shape_is_imported_and_replays(server_factory, tmp_path):
    source = server_factory.create()
    queue = unique("import-dw")
    ids = run_source(source, queue)
    workflow_id = ids[1]
    run_id = runs_of(source.url, workflow_id)[0]["run_id"]
    dw = as_dw_embedded(export(source.url, workflow_id, run_id))
    assert verify_bundle(dw)["status"] == "ok", verify_bundle(dw)["findings"]
    path = tmp_path / "dw-bundle.json"
    path.write_text(json.dumps(dw))
    target = server_factory.create()

    dry = cli("import", str(path), "--server", target.url, "--dry-run")
    assert dry.returncode == 0 and "1 dry_run" in dry.stdout, dry.stdout
    done = cli("import", str(path), "--server", target.url)
    assert done.returncode == 0 and "1 imported" in done.stdout, (done.stdout, done.stderr)
    described = httpx.get(f"{target.url}/api/workflows/{workflow_id}", headers=CONTROL).json()
    assert described["status"] == "completed" and described["import_source_runtime"] == "embedded", described
    imported = export(target.url, workflow_id, run_id)
    assert [e["id"] for e in imported["history_events"]] == [e["id"] for e in dw["history_events"]]
    outcome = replay(Greeter, imported["history_events"], ["name-1", 0], workflow_id=workflow_id, run_id=run_id)
    assert [type(c).__name__ for c in outcome.commands] == ["CompleteWorkflow"], outcome.commands

    # An open run whose history uses what an import cannot rebuild is refused by name.
    open_id = unique("dw-open")

    async def start_open():
        async with make_client(source.url) as client:
            handle = await client.start_workflow(workflow_type="import.greeter", task_queue=queue,
                                                 workflow_id=open_id, input=["x", 0])
            return handle.run_id

    open_run = run_async(start_open(), timeout=30)
    open_bundle = export(source.url, open_id, open_run)
    open_bundle.pop("capstan_run_state")
    last = open_bundle["history_events"][-1]
    open_bundle["history_events"].append(
        {**last, "id": unique("ev"), "sequence": last["sequence"] + 1, "type": "ServiceCallStarted", "payload": {}}
    )
    (tmp_path / "open.json").write_text(json.dumps(as_dw_embedded(open_bundle)))
    refused = cli("import", str(tmp_path / "open.json"), "--server", target.url)
    assert refused.returncode == 1 and "workflow.open_feature_unsupported" in refused.stdout, refused.stdout
