"""Trace context end to end: the Python SDK's optional telemetry (``durable-workflow[telemetry]``,
``ExecutionTelemetry``) against a real ``capstan serve``, which advertises
``observability_context``.

A caller starts a workflow inside its own span; the server keeps the carrier as the run's origin
and hands it back on the run's workflow and activity tasks, so the worker's task spans join the
caller's trace as its children, with nothing discarded or filtered on the way.
"""
from __future__ import annotations

from durable_workflow import Client, activity, workflow
from durable_workflow.telemetry import ExecutionTelemetry
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from capstan_harness import NAMESPACE, run_async, unique, wait_result


@activity.defn(name="traced.greet")
def greet(name: str) -> str:
    return f"hello {name}"


@workflow.defn(name="traced.greeting")
class Greeting:
    def run(self, ctx, name):
        return (yield ctx.schedule_activity("traced.greet", [name]))


def test_task_spans_join_the_callers_trace(server_url, worker_url, run_worker):
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    telemetry = ExecutionTelemetry(tracer_provider=provider)
    tracer = provider.get_tracer("capstan-tests")
    queue = unique("traced")

    async def main():
        async with run_worker(worker_url, queue, workflows=[Greeting], activities=[greet],
                              interceptors=[telemetry]) as worker:
            async with Client(server_url, namespace=NAMESPACE, telemetry=telemetry) as client:
                info = await client.get_cluster_info()
                with tracer.start_as_current_span("caller") as caller:
                    handle = await client.start_workflow(workflow_type="traced.greeting", task_queue=queue,
                                                         workflow_id=unique("traced-wf"), input=["trace"])
                result = await wait_result(handle, timeout=60, workers=[worker])
        return info, caller.get_span_context(), result

    info, caller, result = run_async(main(), timeout=120)
    assert result == "hello trace"
    assert info["worker_protocol"]["server_capabilities"]["observability_context"]["supported"] is True
    spans = exporter.get_finished_spans()
    tasks = [s for s in spans if s.name in ("durable.workflow.task", "durable.activity.task")]
    assert {s.name for s in tasks} == {"durable.workflow.task", "durable.activity.task"}, [s.name for s in spans]
    for span in tasks:
        assert span.context.trace_id == caller.trace_id, span.name
        assert span.parent is not None and span.parent.span_id == caller.span_id, span.name
        assert "durable.observability_context" not in (span.attributes or {}), dict(span.attributes)
