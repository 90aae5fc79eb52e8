"""Typed search attributes through the published Python SDK (``durable-workflow==2.12.0``):
definitions per namespace, typed values at start and upserted from workflow code, queries with
ranges, OR/NOT and keyword-list membership, and the typed errors for undefined keys, wrong
literals and injection probes.
"""
from __future__ import annotations

import pytest
from durable_workflow import Client, workflow

from capstan_harness import make_client, run_async, unique, wait_result


@workflow.defn(name="sa.order")
class OrderWorkflow:
    def run(self, ctx, amount):
        yield ctx.upsert_search_attributes({"Stage": "shipped", "Amount": amount * 2})
        return amount


TYPES = {"Stage": "keyword", "Note": "text", "Amount": "int", "Score": "double", "Vip": "bool",
         "DueAt": "datetime", "Labels": "keyword_list"}


def test_typed_attributes_are_defined_set_upserted_and_queried(server_url, worker_url, run_worker):
    namespace = unique("sa-ns")
    queue = unique("sa")

    async def main():
        async with make_client(server_url) as admin:
            await admin.create_namespace(namespace)
        async with make_client(server_url, namespace=namespace) as client, \
                make_client(server_url) as default_client, \
                run_worker(worker_url, queue, workflows=[OrderWorkflow], namespace=namespace) as worker:
            for name, kind in TYPES.items():
                created = await client.create_search_attribute(name, kind)
                assert created["name"] == name and created["type"] == kind
            refusals = []
            for name in ("wf_id", "__internal", "WorkflowId"):
                with pytest.raises(Exception) as refused:
                    await client.create_search_attribute(name, "keyword")
                refusals.append(str(refused.value))
            schema = await client.list_search_attributes()
            other_schema = await default_client.list_search_attributes()
            handles = []
            for i, (vip, labels) in enumerate([(True, ["red", "blue"]), (False, ["blue"]), (False, ["green", "red"])]):
                handle = await client.start_workflow(
                    workflow_type="sa.order", task_queue=queue, workflow_id=unique(f"order{i}"), input=[10 ** i],
                    search_attributes={"Stage": "new", "Vip": vip, "Labels": labels, "Score": i + 0.5,
                                       "DueAt": f"2026-0{i + 1}-01T00:00:00Z", "Note": f"order number {i}"},
                )
                assert await wait_result(handle, timeout=30, workers=[worker]) == 10 ** i
                handles.append(handle)
            queries = {}
            for q in ['Stage = "shipped"', "Amount > 15", "Amount >= 2 AND Amount < 200", 'Labels = "red"',
                      'NOT Vip = true', 'Vip = true OR Score > 2', 'DueAt >= "2026-02-01T00:00:00Z"']:
                queries[q] = sorted(e.workflow_id for e in (await client.list_workflows(query=q)).executions)
            errors = {}
            for q in ['Amount = "ten"', 'Unknown = "x"', 'Stage = "new" OR 1=1']:
                with pytest.raises(Exception) as refused:
                    await client.list_workflows(query=q)
                errors[q] = (type(refused.value).__name__, str(refused.value))
            with pytest.raises(Exception) as undefined_error:
                await client.start_workflow(workflow_type="sa.order", task_queue=queue, workflow_id=unique("bad"),
                                            input=[1], search_attributes={"Undefined": "x"})
            invisible = (await default_client.list_workflows(query='WorkflowType = "sa.order"')).executions
        undefined = (type(undefined_error.value).__name__, str(undefined_error.value))
        return schema, other_schema, refusals, [h.workflow_id for h in handles], queries, errors, undefined, invisible

    schema, other_schema, refusals, ids, queries, errors, undefined, invisible = run_async(main(), timeout=90)
    assert {k: schema.custom_attributes[k] for k in TYPES} == TYPES
    assert "WorkflowType" in schema.system_attributes
    assert "Amount" not in other_schema.custom_attributes, "definitions are per namespace"
    assert len(refusals) == 3
    assert queries['Stage = "shipped"'] == sorted(ids), "the upsert from workflow code is queryable"
    assert queries["Amount > 15"] == sorted(ids[1:])
    assert queries["Amount >= 2 AND Amount < 200"] == sorted(ids[:2])
    assert queries['Labels = "red"'] == sorted([ids[0], ids[2]])
    assert queries["NOT Vip = true"] == sorted(ids[1:])
    assert queries["Vip = true OR Score > 2"] == sorted([ids[0], ids[2]])
    assert queries['DueAt >= "2026-02-01T00:00:00Z"'] == sorted(ids[1:])
    # Typed errors (the SDK maps a 422 to InvalidArgument), each naming what is wrong.
    assert {kind for kind, _ in errors.values()} == {"InvalidArgument"}, errors
    assert "int attribute" in errors['Amount = "ten"'][1] and "not a search attribute" in errors['Unknown = "x"'][1]
    assert undefined[0] == "InvalidArgument" and "Undefined" in undefined[1], undefined
    assert invisible == [], "values never leak into another namespace's queries"
