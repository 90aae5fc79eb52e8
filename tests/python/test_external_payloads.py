"""External payload storage end to end with ``durable-workflow==2.12.0`` against a real
``capstan serve`` (SQLite, or a two-node PostgreSQL cluster with CAPSTAN_TEST_BACKEND=postgres).

- Runtime transport: with a namespace policy set through ``Client.set_namespace_external_storage``,
  the SDK's client and worker upload every payload above the threshold to
  ``/api/external-payloads/v1`` and history holds only references; the workflow, its activity and
  the caller see the right values, which the SDK fetched and verified.
- Direct references: a client and worker configured with the SDK's own
  ``LocalFilesystemExternalStorage`` driver send ``{codec, external_storage}`` envelopes, which
  the server keeps verbatim and hands back.
- S3: the same runtime transport over an S3-compatible server (moto, in server mode).
- Restart: a payload uploaded before a restart is still served after it.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import httpx
from durable_workflow import Client, activity, workflow
from durable_workflow.external_storage import LocalFilesystemExternalStorage

from capstan_harness import (
    CONTROL_HEADERS, fetch_history_raw, make_client, moto_server, run_async, unique, wait_result,
)

BIG = 40_000  # characters: far above the 1 KiB threshold, below the inline limit either way


@activity.defn(name="payloads.expand")
def expand(text: str, times: int) -> str:
    return text * times


@workflow.defn(name="payloads.roundtrip")
class RoundTrip:
    """Takes a large input, has an activity return a larger value, returns a large result."""

    def run(self, ctx, blob):
        expanded = yield ctx.schedule_activity("payloads.expand", [blob, 2])
        digest = hashlib.sha256(expanded.encode()).hexdigest()
        return {"length": len(expanded), "sha256": digest, "tail": expanded[-BIG:]}


EVERYTHING = {"workflows": [RoundTrip], "activities": [expand]}


def expected(blob: str) -> dict:
    expanded = blob * 2
    return {"length": len(expanded), "sha256": hashlib.sha256(expanded.encode()).hexdigest(), "tail": expanded[-BIG:]}


def longest_string(value) -> int:
    """The longest string anywhere in a document: an inline payload above the threshold would be one."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, dict):
        return max((longest_string(item) for item in value.values()), default=0)
    if isinstance(value, list):
        return max((longest_string(item) for item in value), default=0)
    return 0


def references(history, key):
    text = json.dumps(history)
    return text.count(f'"{key}"')


def test_large_payloads_travel_by_reference_through_the_runtime_transport(server_url, worker_url, run_worker, tmp_path):
    queue = unique("payloads")
    workflow_id = unique("payloads-wf")
    blob = "x" * BIG
    root = tmp_path / "objects"

    async def main():
        async with make_client(server_url) as client:
            described = await client.set_namespace_external_storage(
                "default", driver="local", threshold_bytes=1024, config={"uri": f"file://{root}"},
            )
            assert described.external_payload_storage.driver == "local"
            assert described.external_payload_storage.threshold_bytes == 1024
            probe = await client.test_external_storage(small_payload_bytes=16, large_payload_bytes=4096)
            assert probe.status == "passed" and probe.driver == "local"
            assert probe.large_payload.sha256 == hashlib.sha256(b"l" * 4096).hexdigest()
        # Fresh clients: each resolves the transport from cluster info once.
        async with run_worker(worker_url, queue, **EVERYTHING):
            async with make_client(server_url) as client:
                handle = await client.start_workflow(workflow_type="payloads.roundtrip", task_queue=queue,
                                                     workflow_id=workflow_id, input=[blob])
                result = await wait_result(handle, timeout=60)
                run_id = (await handle.describe()).run_id
        return result, run_id

    result, run_id = run_async(main(), timeout=120)
    assert result == expected(blob)
    history = run_async(fetch_history_raw(server_url, workflow_id, run_id), timeout=30)
    # Input, activity result and workflow result are references in history (the activity's
    # arguments ride on its task, uploaded too).
    assert references(history, "external_payload") >= 3, json.dumps(history)[:2000]
    assert longest_string(history) <= 1024, "nothing above the threshold is inline"
    stored = sorted((root / "runtime" / "default").iterdir())
    assert len(stored) >= 4
    assert any(path.stat().st_size > 2 * BIG for path in stored), "the activity result's bytes are in storage"
    # A changed object is refused, never served.
    victim = max(stored, key=lambda path: path.stat().st_size)
    reference_id = victim.name
    with httpx.Client(base_url=f"{server_url}/api", headers=CONTROL_HEADERS) as http:
        assert http.get(f"/external-payloads/v1/{reference_id}").status_code == 200
        original = victim.read_bytes()
        victim.write_bytes(original[:-1] + b"!")
        refused = http.get(f"/external-payloads/v1/{reference_id}")
        assert refused.status_code == 409 and refused.json()["reason"] == "external_payload_integrity_mismatch"
        victim.write_bytes(original)


def test_direct_references_from_the_sdks_own_driver_are_kept_verbatim(server_url, worker_url, run_worker, tmp_path):
    namespace = unique("direct").lower()
    queue = unique("direct-q")
    workflow_id = unique("direct-wf")
    blob = "d" * BIG
    driver = LocalFilesystemExternalStorage(tmp_path / "sdk-store")

    async def main():
        async with make_client(server_url) as admin:
            await admin.create_namespace(namespace)
        client = Client(server_url, namespace=namespace, external_storage=driver, external_storage_threshold_bytes=512)
        async with run_worker(worker_url, queue, namespace=namespace, external_storage=driver,
                              external_storage_threshold_bytes=512, **EVERYTHING):
            async with client:
                handle = await client.start_workflow(workflow_type="payloads.roundtrip", task_queue=queue,
                                                     workflow_id=workflow_id, input=[blob])
                result = await wait_result(handle, timeout=60)
                run_id = (await handle.describe()).run_id
        return result, run_id

    result, run_id = run_async(main(), timeout=120)
    assert result == expected(blob)
    async def history():
        async with httpx.AsyncClient(base_url=f"{server_url}/api", headers={**CONTROL_HEADERS, "X-Namespace": namespace}) as http:
            response = await http.get(f"/workflows/{workflow_id}/runs/{run_id}/history", params={"page_size": 1000})
            response.raise_for_status()
            return response.json()
    events = run_async(history(), timeout=30)
    text = json.dumps(events)
    assert text.count('"external_storage"') >= 3, text[:2000]
    assert "durable-workflow.v2.external-payload-reference.v1" in text
    assert any(path.is_file() for path in (tmp_path / "sdk-store").rglob("*"))


def test_s3_storage_serves_the_transport_and_survives_a_restart(server_factory, run_worker, monkeypatch):
    for name, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                        "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(name, value)
    with moto_server() as endpoint:
        import boto3

        s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
        s3.create_bucket(Bucket="capstan-payloads")
        server = server_factory.create()
        queue = unique("s3-q")
        workflow_id = unique("s3-wf")
        blob = "s" * BIG

        async def configure_and_run():
            async with make_client(server.url) as client:
                await client.set_namespace_external_storage(
                    "default", driver="s3", threshold_bytes=2048,
                    config={"bucket": "capstan-payloads", "prefix": "team-a", "endpoint": endpoint,
                            "region": "us-east-1"},
                )
                probe = await client.test_external_storage(small_payload_bytes=8, large_payload_bytes=100_000)
                assert probe.status == "passed" and probe.driver == "s3"
                assert probe.large_payload.reference_uri.startswith("s3://capstan-payloads/team-a/")
            async with run_worker(server.url, queue, **EVERYTHING):
                async with make_client(server.url) as client:
                    handle = await client.start_workflow(workflow_type="payloads.roundtrip", task_queue=queue,
                                                         workflow_id=workflow_id, input=[blob])
                    return await wait_result(handle, timeout=60)

        assert run_async(configure_and_run(), timeout=120) == expected(blob)
        keys = [item["Key"] for item in s3.list_objects_v2(Bucket="capstan-payloads").get("Contents", [])]
        assert len([k for k in keys if k.startswith("team-a/runtime/default/ep_")]) >= 4, keys
        assert not [k for k in keys if "storage-test" in k], "the probe removes its objects"

        # Kill and restart: the result, stored in S3, is still served and verified.
        server.kill()
        server.start()

        async def result_after_restart():
            async with make_client(server.url, patient=True) as client:
                return await client.get_workflow_handle(workflow_id).result(timeout=30)

        assert run_async(result_after_restart(), timeout=60) == expected(blob)
