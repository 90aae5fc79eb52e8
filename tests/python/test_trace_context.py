"""Trace context end to end: the Python SDK's optional telemetry (``durable-workflow[telemetry]``,
``ExecutionTelemetry``) against a real ``capstan serve``, which advertises
``observability_context``.

A caller starts a workflow inside its own span; the server keeps the carrier as the run's origin
and hands it back on the run's workflow and activity tasks, so the worker's task spans join the
caller's trace as its children, with nothing discarded or filtered on the way. A traced signal
becomes a link on the task that delivers it, and with an OTLP endpoint configured the server's
own dispatch spans arrive at a collector and are linked from the worker's task spans.
"""
from __future__ import annotations

import asyncio
import http.server
import json
import threading
import time

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


def _in_memory_telemetry():
    """The SDK's telemetry recording into memory, and a tracer for the test's own spans."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return exporter, ExecutionTelemetry(tracer_provider=provider), provider.get_tracer("capstan-tests")


def test_task_spans_join_the_callers_trace(server_url, worker_url, run_worker):
    exporter, telemetry, tracer = _in_memory_telemetry()
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


async def _eventually(probe, *, timeout):
    deadline = time.monotonic() + timeout
    while (value := probe()) is None:
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.1)
    return value


class _OtlpReceiver:
    """A collector stand-in: accepts OTLP/HTTP JSON on ``POST /v1/traces`` and keeps the spans."""

    def __init__(self) -> None:
        spans = self.spans = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - the stdlib's name
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                for resource in body.get("resourceSpans", []):
                    service = {a["key"]: a["value"] for a in resource.get("resource", {}).get("attributes", [])}
                    for scope in resource.get("scopeSpans", []):
                        for span in scope.get("spans", []):
                            spans.append((service, span))
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()


@workflow.defn(name="traced.approval")
class TracedApproval:
    def __init__(self) -> None:
        self.approver = None

    @workflow.signal("approve")
    def approve(self, approver: str) -> None:
        self.approver = approver

    def run(self, ctx, name):
        yield ctx.wait_condition(lambda: self.approver is not None)
        return (yield ctx.schedule_activity("traced.greet", [self.approver]))


def test_server_dispatch_spans_and_signal_links_reach_the_workers_spans(server_factory, run_worker, monkeypatch):
    """With an OTLP endpoint, the server exports a ``capstan.task.dispatch`` span per task lease in
    the caller's trace, and the SDK links it from its task span; the workflow task that delivers a
    traced signal links the signaller's span."""
    receiver = _OtlpReceiver()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", receiver.url)
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "capstan-under-test")
    server = server_factory.create()
    exporter, telemetry, tracer = _in_memory_telemetry()
    queue = unique("traced-dispatch")

    async def main():
        async with run_worker(server.url, queue, workflows=[TracedApproval], activities=[greet],
                              interceptors=[telemetry]) as worker:
            async with Client(server.url, namespace=NAMESPACE, telemetry=telemetry) as client:
                await client.get_cluster_info()
                with tracer.start_as_current_span("caller") as caller:
                    handle = await client.start_workflow(workflow_type="traced.approval", task_queue=queue,
                                                         workflow_id=unique("traced-dispatch-wf"), input=["x"])
                with tracer.start_as_current_span("signaller") as signaller:
                    await handle.signal("approve", ["ada"])
                result = await wait_result(handle, timeout=60, workers=[worker])
        return caller.get_span_context(), signaller.get_span_context(), result

    try:
        caller, signaller, result = run_async(main(), timeout=120)
        assert result == "hello ada"
        tasks = [s for s in exporter.get_finished_spans()
                 if s.name in ("durable.workflow.task", "durable.activity.task")]
        dispatch_links = {}
        for span in tasks:
            attributes = dict(span.attributes or {})
            for diagnostic in ("durable.observability_context", "durable.dispatch_context",
                               "durable.observability_links"):
                assert diagnostic not in attributes, (span.name, attributes)
            kinds = [link.attributes["durable.link.type"] for link in span.links]
            assert kinds.count("dispatch") == 1, (span.name, kinds)
            for link in span.links:
                if link.attributes["durable.link.type"] == "dispatch":
                    assert link.context.trace_id == caller.trace_id
                    dispatch_links[format(link.context.span_id, "016x")] = span.name
        command_links = [link for span in tasks for link in span.links
                         if link.attributes["durable.link.type"] == "command"]
        assert len(command_links) == 1, command_links
        assert command_links[0].context.span_id == signaller.span_id
        assert command_links[0].context.trace_id == signaller.trace_id

        def exported():
            found = {span["spanId"]: (service, span) for service, span in receiver.spans
                     if span["name"] == "capstan.task.dispatch"}
            return found if set(dispatch_links) <= set(found) else None

        found = run_async(_eventually(exported, timeout=20), timeout=30)
        for span_id in dispatch_links:
            service, span = found[span_id]
            assert service["service.name"] == {"stringValue": "capstan-under-test"}
            assert span["traceId"] == format(caller.trace_id, "032x")
            assert span["parentSpanId"] == format(caller.span_id, "016x")
            assert span["kind"] == 4, span  # SPAN_KIND_PRODUCER
            assert int(span["endTimeUnixNano"]) >= int(span["startTimeUnixNano"])
    finally:
        receiver.close()
