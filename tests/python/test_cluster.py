"""Several ``capstan serve`` nodes sharing one database.

Every test runs twice: on PostgreSQL (``CAPSTAN_TEST_POSTGRES_URL``) and on
MariaDB (``CAPSTAN_TEST_MYSQL_URL``); both are required, the tests fail
without them. Every test gets a fresh database and its own nodes, named A, B,
C; the database is dropped afterwards.

* a task crosses three nodes: started on A, polled on B, completed on A,
  described on C;
* a workflow-task lease survives the node that granted it (SIGKILL), and the
  fence refuses the first worker's late completion;
* durable timers claimed by a node that dies are taken over by another node
  and fire exactly once;
* a long poll on one node wakes up for a workflow started on another;
* a worker registered again through another node, for other types, gets no task of a type it
  dropped;
* Python SDK workers on two nodes, the client on a third, one node SIGKILLed
  mid-flight: every workflow completes exactly once.
"""
from __future__ import annotations

import asyncio
import os
import re
import subprocess
import statistics
import time
from collections import Counter

import httpx
from durable_workflow import ActivityRetryPolicy, activity, workflow

from capstan_harness import (
    BackgroundWorker,
    ControlPlane,
    RawWorker,
    assert_hash_chain,
    assert_history_invariants,
    complete_workflow_command,
    decode_envelope,
    event_type,
    events_of,
    fetch_history,
    make_client,
    payload_of,
    run_async,
    start_timer_command,
    type_sequence,
    unique,
    wait_result,
)

FENCE_REFUSALS = {"lease_owner_mismatch", "workflow_task_attempt_mismatch", "task_not_leased"}

_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def log_task_ids(server, message: str) -> set[str]:
    """task_id=... of every log line of ``server`` containing ``message``."""
    found = set()
    for line in _ANSI.sub("", server.log_text()).splitlines():
        if message in line:
            match = re.search(r"task_id=(\S+)", line)
            if match:
                found.add(match.group(1))
    return found


def check_run(events: list[dict], *, terminal: str = "WorkflowCompleted", context: str = "") -> dict:
    summary = assert_history_invariants(events, terminal=terminal, context=context)
    assert_hash_chain(events, context=context)
    return summary


# ── a. one workflow task crosses three nodes ─────────────────────────────


def test_task_started_polled_completed_described_on_different_nodes(cluster_factory):
    a, b, c = cluster_factory.create(3)
    queue = unique("cluster-cross")
    workflow_id = unique("cross")

    async def main():
        async with ControlPlane(a.url) as on_a, ControlPlane(c.url) as on_c, RawWorker(queue) as worker:
            started = await on_a.start_workflow("cluster.cross", workflow_id, queue, ["hello"])
            run_id = started["run_id"]

            await worker.register(b.url)
            task = await worker.next_workflow_task(b.url, within=15)
            assert task["workflow_id"] == workflow_id and task["run_id"] == run_id, task
            assert task["workflow_type"] == "cluster.cross"
            assert task["workflow_task_attempt"] == 1
            assert task["lease_owner"] == worker.worker_id
            assert task["payload_codec"] == "avro"
            assert decode_envelope(task["arguments"]) == ["hello"]
            assert "WorkflowStarted" in type_sequence(task["history_events"]), task["history_events"]

            resp = await worker.complete_workflow_task(a.url, task, [complete_workflow_command("done:hello")])
            assert resp.status_code == 200, f"complete via A -> {resp.status_code}: {resp.text}"
            receipt = resp.json()
            assert receipt.get("outcome") == "completed" and receipt.get("recorded") is True, receipt
            assert receipt.get("run_status") == "completed", receipt

            described = await on_c.describe(workflow_id)
            assert described["status"] == "completed", described
            assert described["run_id"] == run_id
            assert described.get("is_terminal") is True, described
            assert decode_envelope(described["output_envelope"]) == "done:hello"

            events = await on_c.history(workflow_id, run_id)
            check_run(events, context=workflow_id)
            (completed,) = events_of(events, "WorkflowCompleted")
            assert completed.get("workflow_task_id") == task["task_id"], completed
            assert decode_envelope({"codec": "avro", "blob": payload_of(completed)["output"]}) == "done:hello"

            # every node reads the same history
            async with ControlPlane(b.url) as on_b:
                assert await on_b.history(workflow_id, run_id) == events

    run_async(main(), timeout=60)


def metric(text: str, name: str, **labels: str) -> float | None:
    """The value of the sample of ``name`` carrying ``labels`` (None when absent)."""
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        if all(f'{key}="{value}"' in line for key, value in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return None


def test_metrics_count_a_fact_on_the_node_that_committed_it_and_read_the_database_alike(cluster_factory):
    """A run started through A and completed through B: A counts the start, B the close, C
    neither (counters are per node; Prometheus sums them). The queue's backlog is read from the
    database, so every node reports the same figure."""
    a, b, c = cluster_factory.create(3)
    queue = unique("cluster-metrics")
    workflow_id = unique("metered")

    async def scrape(node) -> str:
        async with httpx.AsyncClient(base_url=node.url, timeout=15.0) as http:
            resp = await http.get("/metrics")
            assert resp.status_code == 200, resp.text
            return resp.text

    async def main():
        async with ControlPlane(a.url) as on_a, RawWorker(queue) as worker:
            await on_a.start_workflow("cluster.metered", workflow_id, queue, [])
            await on_a.start_workflow("cluster.metered", unique("waiting"), queue, [])
            backlog = [metric(await scrape(node), "capstan_task_queue_ready", kind="workflow", queue=queue) for node in (a, b, c)]
            assert backlog == [2.0, 2.0, 2.0], backlog
            await worker.register(b.url)
            task = await worker.next_workflow_task(b.url, within=15)
            resp = await worker.complete_workflow_task(b.url, task, [complete_workflow_command("done")])
            assert resp.status_code == 200, resp.text
            texts = {name: await scrape(node) for name, node in (("a", a), ("b", b), ("c", c))}
        started = {name: metric(text, "capstan_workflows_started_total", workflow_type="cluster.metered") for name, text in texts.items()}
        closed = {name: metric(text, "capstan_workflows_closed_total", workflow_type="cluster.metered", reason="completed")
                  for name, text in texts.items()}
        assert started == {"a": 2.0, "b": 0.0, "c": None}, started  # B knows the type from its close
        assert closed == {"a": 0.0, "b": 1.0, "c": None}, closed
        ready = {name: metric(text, "capstan_task_queue_ready", kind="workflow", queue=queue) for name, text in texts.items()}
        assert ready == {"a": 1.0, "b": 1.0, "c": 1.0}, ready
        for text in texts.values():
            assert metric(text, "capstan_db_pool_max_connections") >= 1

    run_async(main(), timeout=60)


# ── b. a workflow-task lease outlives the node that granted it ───────────


def test_workflow_task_lease_handover_after_node_crash(cluster_factory):
    lease_seconds = 2
    a, b = cluster_factory.create(2, "--workflow-task-lease-seconds", str(lease_seconds))
    queue = unique("cluster-lease")
    workflow_id = unique("lease")

    async def main():
        async with ControlPlane(a.url) as on_a, ControlPlane(b.url) as on_b, \
                RawWorker(queue, worker_id=unique("w1")) as w1, RawWorker(queue, worker_id=unique("w2")) as w2:
            run_id = (await on_a.start_workflow("cluster.lease", workflow_id, queue, [1]))["run_id"]

            await w1.register(a.url)
            first = await w1.next_workflow_task(a.url, within=15)
            leased_at = time.monotonic()
            assert first["run_id"] == run_id and first["workflow_task_attempt"] == 1, first
            assert first["lease_owner"] == w1.worker_id

            a.kill()  # node A crashes while W1 holds the lease it granted

            await w2.register(b.url)
            second = await w2.next_workflow_task(b.url, within=lease_seconds + 15, what="the re-offered task")
            handover = time.monotonic() - leased_at
            print(f"lease handover A -> B after {handover:.2f}s (lease {lease_seconds}s)")
            assert second["task_id"] == first["task_id"], (first["task_id"], second["task_id"])
            assert second["workflow_task_attempt"] == 2, second
            assert second["lease_owner"] == w2.worker_id, second
            assert handover >= lease_seconds - 0.5, f"task re-offered {handover:.2f}s into a {lease_seconds}s lease"

            before = await on_b.history(workflow_id, run_id)

            # W1 wakes up and reports through the surviving node: fenced off
            late = await w1.complete_workflow_task(b.url, first, [complete_workflow_command("from-w1")])
            assert late.status_code == 409, f"W1's late complete -> {late.status_code}: {late.text}"
            assert late.json().get("reason") in FENCE_REFUSALS, late.text
            assert late.json().get("recorded") is not True, late.text
            assert await on_b.history(workflow_id, run_id) == before, "a refused completion changed the history"
            print(f"W1's late complete through B: 409 {late.json().get('reason')}")

            done = await w2.complete_workflow_task(b.url, second, [complete_workflow_command("from-w2")])
            assert done.status_code == 200, f"W2's complete -> {done.status_code}: {done.text}"
            assert done.json().get("run_status") == "completed", done.text

            # W1 retrying after the run closed is still refused and changes nothing
            again = await w1.complete_workflow_task(b.url, first, [complete_workflow_command("from-w1")])
            assert again.status_code == 409, f"W1's complete after close -> {again.status_code}: {again.text}"

            described = await on_b.describe(workflow_id)
            assert described["status"] == "completed", described
            assert decode_envelope(described["output_envelope"]) == "from-w2"

            events = await on_b.history(workflow_id, run_id)
            check_run(events, context=f"{workflow_id} {type_sequence(events)}")
            assert len(events_of(events, "WorkflowCompleted")) == 1, type_sequence(events)
            (completed,) = events_of(events, "WorkflowCompleted")
            assert decode_envelope({"codec": "avro", "blob": payload_of(completed)["output"]}) == "from-w2"
            assert events[: len(before)] == before, "events recorded before the handover were rewritten"

    run_async(main(), timeout=60)


# ── c. durable timers outlive the node that claimed them ─────────────────


def test_timers_claimed_by_a_dead_node_fire_once_on_another(cluster_factory):
    duty_seconds = 2
    count = 40
    cluster = cluster_factory.create(2, "--duty-lease-seconds", str(duty_seconds), start=False)
    a, b = cluster
    database = cluster.database
    a.start()  # B joins only after A died, so A alone claims the due timers
    queue = unique("cluster-timer")
    prefix = unique("timer")

    async def main():
        async with ControlPlane(a.url) as on_a, RawWorker(queue) as worker:
            node_a = (await on_a.cluster_info())["server_id"]
            runs = {}
            for i in range(count):
                wid = f"{prefix}-{i}"
                runs[wid] = (await on_a.start_workflow("cluster.timer", wid, queue, [i]))["run_id"]

            await worker.register(a.url)
            first_tasks = {}
            while len(first_tasks) < count:
                task = await worker.next_workflow_task(a.url, within=15)
                assert task["workflow_id"] not in first_tasks, f"second task for {task['workflow_id']}"
                first_tasks[task["workflow_id"]] = task
            # one burst, so the timers come due close together
            replies = await asyncio.gather(*(
                worker.complete_workflow_task(a.url, task, [start_timer_command(1)]) for task in first_tasks.values()
            ))
            for reply in replies:
                assert reply.status_code == 200, f"complete(start_timer) -> {reply.status_code}: {reply.text}"

            # Freeze A until every timer is overdue, then let it claim them all
            # at once and SIGKILL it as soon as the claim is visible.
            a.pause()
            (due_at, db_now), = database.query(
                f"SELECT max(deadline_at), {database.now_ms_sql} FROM tasks WHERE kind = 'timer'"
            )
            await asyncio.sleep(max(0, int(due_at) - int(db_now)) / 1000 + 0.2)
            a.resume()
            deadline = time.monotonic() + 10
            while True:
                (claimed, pending), = database.query(
                    f"SELECT COALESCE(SUM(CASE WHEN duty_owner = '{node_a}' THEN 1 ELSE 0 END), 0), count(*) "
                    f"FROM tasks WHERE kind = 'timer' AND status IN ('ready', 'leased')"
                )
                if int(claimed) > 0 or int(pending) == 0:
                    break
                assert time.monotonic() < deadline, "node A never claimed the overdue timers"
            a.kill()
            killed_at = time.monotonic()
            print(f"SIGKILLed A with {claimed} timers claimed by it and not fired, {pending} pending in all")

            b.spawn()
            await b.wait_ready_async()

            async with ControlPlane(b.url) as on_b:
                second_tasks = {}
                while len(second_tasks) < count:
                    task = await worker.next_workflow_task(b.url, within=duty_seconds + 20, what="a post-timer task")
                    wid = task["workflow_id"]
                    assert wid not in second_tasks, f"two workflow tasks for {wid}"
                    assert task["task_id"] != first_tasks[wid]["task_id"]
                    fired = events_of(task["history_events"], "TimerFired")
                    assert len(fired) == 1, f"{wid} task history: {type_sequence(task['history_events'])}"
                    second_tasks[wid] = task
                print(f"all {count} post-timer tasks polled on B {time.monotonic() - killed_at:.2f}s after the kill")

                replies = await asyncio.gather(*(
                    worker.complete_workflow_task(b.url, task, [complete_workflow_command(f"woke {wid}")])
                    for wid, task in second_tasks.items()
                ))
                for reply in replies:
                    assert reply.status_code == 200, f"complete -> {reply.status_code}: {reply.text}"

                for wid, run_id in runs.items():
                    events = await on_b.history(wid, run_id)
                    context = f"{wid} {type_sequence(events)}"
                    summary = check_run(events, context=context)
                    assert len(summary["timers_scheduled"]) == 1, context
                    assert summary["timers_fired"] == summary["timers_scheduled"], context
                    assert type_sequence(events).count("TimerFired") == 1, context

        # Who fired what. Exactly-once is proven by the histories above; this
        # shows the takeover really happened. A claims with duty fence 1; B's
        # takeover of an expired claim bumps it to 2. (A SIGKILLed between its
        # commit and its log line leaves a fired timer in no log: not counted.)
        timer_rows = database.query("SELECT task_id, status, duty_fence FROM tasks WHERE kind = 'timer'")
        assert len(timer_rows) == count, timer_rows
        assert {row[1] for row in timer_rows} == {"completed"}, timer_rows
        timer_ids = {row[0] for row in timer_rows}
        fired_by_a = log_task_ids(a, "deadline reached") & timer_ids
        fired_by_b = log_task_ids(b, "deadline reached") & timer_ids
        taken_over = {row[0] for row in timer_rows if int(row[2]) >= 2} & fired_by_b
        print(f"timers fired by A before the crash: {len(fired_by_a)} (logged), by B: {len(fired_by_b)}, "
              f"taken over from A's expired claim (duty fence >= 2): {len(taken_over)}")
        assert not fired_by_a & fired_by_b, f"timers fired on both nodes: {sorted(fired_by_a & fired_by_b)}"
        assert taken_over, (
            f"no timer was claimed by A and taken over by B (claimed at kill: {claimed}); "
            f"the crash came too late to exercise the takeover"
        )

    run_async(main(), timeout=90)


# ── d. a long poll on one node wakes for work started on another ─────────


def test_long_poll_wakes_up_for_a_workflow_started_on_another_node(cluster_factory):
    a, b = cluster_factory.create(2)
    queue = unique("cluster-wake")
    trials = 5

    async def main():
        latencies = []
        async with ControlPlane(a.url) as on_a, RawWorker(queue) as worker:
            await worker.register(b.url)
            # drain: nothing is ready on this fresh queue
            assert await worker.poll_workflow_task(b.url, timeout_seconds=0) is None
            for trial in range(trials):
                workflow_id = unique(f"wake-{trial}")
                poll = asyncio.create_task(worker.poll_workflow_task(b.url, timeout_seconds=30))
                # let the poll reach the server and park (it cannot be observed from outside)
                await asyncio.sleep(0.3)
                assert not poll.done(), f"the poll returned before any work existed: {poll.result()}"
                began = time.monotonic()
                started = await on_a.start_workflow("cluster.wake", workflow_id, queue, [trial])
                task = await asyncio.wait_for(poll, timeout=35)
                latency = time.monotonic() - began
                latencies.append(latency)
                assert task is not None, f"trial {trial}: the 30 s poll on B timed out empty"
                assert task["workflow_id"] == workflow_id and task["run_id"] == started["run_id"], task
                assert latency < 3.0, f"trial {trial}: B's poll answered {latency:.2f}s after the start on A"
                reply = await worker.complete_workflow_task(b.url, task, [complete_workflow_command(trial)])
                assert reply.status_code == 200, reply.text
        print("cross-node wake-up latency (start on A -> task from B's poll): "
              + ", ".join(f"{x * 1000:.0f} ms" for x in latencies)
              + f"; median {statistics.median(latencies) * 1000:.0f} ms")

    run_async(main(), timeout=90)


def test_a_worker_registered_again_through_another_node_is_polled_on_its_new_registration(cluster_factory):
    """A node serves a poll from the registration it last saw, and every look reads the
    registration as it stands: a worker that registered again elsewhere, for other types, is
    never handed a task of a type it dropped."""
    a, b = cluster_factory.create(2)
    queue = unique("cluster-rereg")

    async def main():
        async with ControlPlane(a.url) as on_a, RawWorker(queue) as worker:
            async def register(node, workflow_type: str) -> None:
                resp = await worker.post(node.url, "/worker/register", {
                    "worker_id": worker.worker_id,
                    "task_queue": queue,
                    "runtime": "python",
                    "sdk_version": "capstan-tests/raw",
                    "supported_workflow_types": [workflow_type],
                    "supported_activity_types": [],
                })
                assert resp.status_code in (200, 201), f"register via {node.url} -> {resp.status_code}: {resp.text[:500]}"

            await register(a, "cluster.dropped")
            assert await worker.poll_workflow_task(a.url, timeout_seconds=0) is None
            await register(b, "cluster.kept")
            await on_a.start_workflow("cluster.dropped", unique("dropped"), queue, [1])
            for _ in range(2):
                task = await worker.poll_workflow_task(a.url, timeout_seconds=1)
                assert task is None, f"A handed the worker a type its registration through B dropped: {task}"
            kept = unique("kept")
            await on_a.start_workflow("cluster.kept", kept, queue, [2])
            task = await worker.next_workflow_task(a.url, within=15)
            assert task["workflow_id"] == kept and task["workflow_type"] == "cluster.kept", task

    run_async(main(), timeout=60)


# ── e. SDK workers on two nodes, client on a third, one node crashes ─────

WORKFLOWS = 20
# What the activity side has seen in this process, per worker id.
INFLIGHT: dict[tuple[int, str], str] = {}
EXECUTIONS: Counter[int] = Counter()
RETRY = ActivityRetryPolicy(max_attempts=8, backoff_seconds=[1] * 7)


@activity.defn(name="cluster.work")
async def cluster_work(index: int, seconds: float) -> str:
    info = activity.context().info
    token = (index, info.activity_attempt_id)
    EXECUTIONS[index] += 1
    INFLIGHT[token] = info.worker_id
    try:
        await asyncio.sleep(seconds)
    finally:
        INFLIGHT.pop(token, None)
    return f"worked-{index}"


@workflow.defn(name="cluster.pipeline")
class ClusterPipeline:
    """an activity, then a 1 s durable timer."""

    def run(self, ctx, index, seconds):
        worked = yield ctx.schedule_activity("cluster.work", [index, seconds], retry_policy=RETRY)
        yield ctx.sleep(1)
        return f"{worked}+slept"


def _activity_seconds(index: int) -> float:
    return 0.3 + (index % 4) * 0.4  # 0.3 .. 1.5 s, shorter than the 3 s activity lease


async def _pending_timers(client, handles) -> int:
    histories = await asyncio.gather(*(fetch_history(client, h.workflow_id, h.run_id) for h in handles))
    pending = 0
    for events in histories:
        fired = {payload_of(e).get("timer_id") for e in events_of(events, "TimerFired")}
        pending += sum(1 for e in events_of(events, "TimerScheduled") if payload_of(e).get("timer_id") not in fired)
    return pending


def test_sdk_workers_on_two_nodes_survive_a_node_crash(cluster_factory):
    a, b, c = cluster_factory.create(
        3,
        "--workflow-task-lease-seconds", "3",
        "--activity-task-lease-seconds", "3",
        "--duty-lease-seconds", "2",
    )
    queue = unique("cluster-sdk")
    prefix = unique("cluster-sdk-wf")
    INFLIGHT.clear()
    EXECUTIONS.clear()

    async def main():
        options = {"max_concurrent_workflow_tasks": 10, "max_concurrent_activity_tasks": 10, "poll_timeout": 5.0}
        on_a = BackgroundWorker(a.url, queue, workflows=[ClusterPipeline], activities=[cluster_work],
                                name=unique("sdk-on-A"), **options)
        on_b_workers = [BackgroundWorker(b.url, queue, workflows=[ClusterPipeline], activities=[cluster_work],
                                         name=unique("sdk-on-B"), **options)]
        replaced = []
        try:
            await on_a.start()
            await on_b_workers[0].start()
            async with make_client(c.url) as client:
                handles = await asyncio.gather(*(
                    client.start_workflow(
                        workflow_type="cluster.pipeline", task_queue=queue, workflow_id=f"{prefix}-{i}",
                        input=[i, _activity_seconds(i)],
                    )
                    for i in range(WORKFLOWS)
                ))

                # Crash A once its worker runs activities and timers are pending.
                deadline = time.monotonic() + 30
                pending_timers = 0
                while True:
                    on_a_inflight = [k for k, w in INFLIGHT.items() if w == on_a.name]
                    if on_a_inflight:
                        pending_timers = await _pending_timers(client, handles)
                        if pending_timers >= 1:
                            break
                    assert time.monotonic() < deadline, (
                        f"never reached the crash point: in flight {INFLIGHT}, {pending_timers} pending timers"
                    )
                    await asyncio.sleep(0.05)
                inflight_at_crash = sorted(index for index, _ in INFLIGHT)
                a.kill()
                crashed_at = time.monotonic()
                print(f"SIGKILLed A with activities in flight for {inflight_at_crash} "
                      f"({len([1 for w in INFLIGHT.values() if w == on_a.name])} on A's worker), "
                      f"{pending_timers} pending timers")

                async def keep_b_workers_alive() -> None:
                    while True:
                        for worker in list(on_b_workers):
                            if not worker.alive:
                                replaced.append(f"{worker.name}: {worker.failure()!r}")
                                on_b_workers.remove(worker)
                                await worker.stop()
                                fresh = BackgroundWorker(b.url, queue, workflows=[ClusterPipeline],
                                                         activities=[cluster_work], **options)
                                await fresh.start()
                                on_b_workers.append(fresh)
                        await asyncio.sleep(0.5)

                watchdog = asyncio.create_task(keep_b_workers_alive())
                try:
                    results = await asyncio.gather(*(
                        wait_result(h, timeout=60, workers=on_b_workers) for h in handles
                    ))
                finally:
                    watchdog.cancel()
                print(f"all {WORKFLOWS} workflows completed {time.monotonic() - crashed_at:.1f}s after the crash")
                assert results == [f"worked-{i}+slept" for i in range(WORKFLOWS)]

                described = await asyncio.gather(*(h.describe() for h in handles))
                assert {d.status for d in described} == {"completed"}, [(d.workflow_id, d.status) for d in described]
                histories = await asyncio.gather(*(fetch_history(client, h.workflow_id, h.run_id) for h in handles))
        finally:
            await on_a.stop(timeout=3.0)  # its node is gone: do not wait for a deregistration
            for worker in on_b_workers:
                await worker.stop()

        for handle, events in zip(handles, histories):
            context = f"{handle.workflow_id} {type_sequence(events)}"
            summary = check_run(events, context=context)
            terminals = [t for t in type_sequence(events) if t in ("WorkflowCompleted", "WorkflowFailed",
                                                                     "WorkflowCancelled", "WorkflowTerminated",
                                                                     "WorkflowTimedOut")]
            assert terminals == ["WorkflowCompleted"], context
            assert summary["activities_scheduled"] == 1, context
            completed = Counter(payload_of(e).get("activity_execution_id") for e in events_of(events, "ActivityCompleted"))
            assert list(completed.values()) == [1], f"ActivityCompleted per execution: {dict(completed)} {context}"
            assert len(summary["timers_scheduled"]) == 1, context
            assert summary["timers_fired"] == summary["timers_scheduled"], f"every timer fires exactly once: {context}"
            order = [event_type(e) for e in events if event_type(e) in ("ActivityCompleted", "TimerScheduled", "TimerFired")]
            assert order == ["ActivityCompleted", "TimerScheduled", "TimerFired"], context

        reruns = {i: n for i, n in EXECUTIONS.items() if n > 1}
        print(f"activities executed more than once (at-least-once redelivery): {reruns or 'none'}")
        if replaced:
            print(f"worker loops on B that died and were replaced: {replaced}")
        assert set(EXECUTIONS) == set(range(WORKFLOWS))

    run_async(main(), timeout=110)


# ── e. a run held by a paused transaction delays only itself ─────────────

def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux /proc)."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_a_run_held_by_a_paused_transaction_delays_only_that_run(cluster_factory):
    """A session that locks one run's row and then idles inside its transaction (as a node
    frozen mid-transaction does): the clock passes over that run, fires every other due timer at
    once, sleeps rather than spins while its claim on the held run is live, and fires the held
    run's timer once the lock is gone. Exactly once each."""
    duty_seconds = 3
    count = 10
    cluster = cluster_factory.create(1, "--duty-lease-seconds", str(duty_seconds))
    (node,) = cluster
    queue = unique("held-timer")
    prefix = unique("held")

    async def main():
        async with ControlPlane(node.url) as control, RawWorker(queue) as worker:
            runs = {}
            for i in range(count):
                wid = f"{prefix}-{i}"
                runs[wid] = (await control.start_workflow("cluster.timer", wid, queue, [i]))["run_id"]
            await worker.register(node.url)
            first = {}
            while len(first) < count:
                task = await worker.next_workflow_task(node.url, within=15)
                first[task["workflow_id"]] = task
            held_wid = f"{prefix}-0"
            replies = await asyncio.gather(*(
                worker.complete_workflow_task(node.url, task, [start_timer_command(2)]) for task in first.values()
            ))
            assert all(reply.status_code == 200 for reply in replies), [r.text for r in replies]
            # Hold the run's row lock from another session, idle inside its transaction.
            holder = subprocess.Popen(
                cluster.database.session_args(),
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            )
            try:
                holder.stdin.write(f"BEGIN;\nSELECT 1 FROM runs WHERE run_id = '{runs[held_wid]}' FOR UPDATE;\n"
                                   "SELECT 'holding';\n")
                holder.stdin.flush()
                assert "holding" in holder.stdout.readline() + holder.stdout.readline(), "the lock is held"
                started = time.monotonic()
                fired = {}
                while len(fired) < count - 1:
                    task = await worker.next_workflow_task(node.url, within=10, what="a post-timer task")
                    assert task["workflow_id"] != held_wid, "the held run's timer fired under the lock"
                    fired[task["workflow_id"]] = task
                print(f"{count - 1} other timers fired {time.monotonic() - started:.2f}s after the lock was taken")
                assert time.monotonic() - started < 2 + duty_seconds, "the other runs waited for the held one"
                # The clock holds a claim on the held run's timer: it retries it, backing off, and
                # sleeps in between rather than spinning.
                before = _cpu_seconds(node.proc.pid)
                await asyncio.sleep(1.5)
                spent = _cpu_seconds(node.proc.pid) - before
                print(f"node CPU while its claim on the held run was live: {spent:.2f}s in 1.5s")
                assert spent < 0.5, f"the clock spun: {spent:.2f}s of CPU in 1.5s"
            finally:
                holder.stdin.write("COMMIT;\n")
                holder.stdin.close()
                holder.wait(timeout=10)
            task = await worker.next_workflow_task(node.url, within=duty_seconds + 10, what="the held run's post-timer task")
            assert task["workflow_id"] == held_wid
            fired[held_wid] = task
            replies = await asyncio.gather(*(
                worker.complete_workflow_task(node.url, task, [complete_workflow_command("done")]) for task in fired.values()
            ))
            assert all(reply.status_code == 200 for reply in replies), [r.text for r in replies]
            for wid, run_id in runs.items():
                events = await control.history(wid, run_id)
                assert type_sequence(events).count("TimerFired") == 1, f"{wid} {type_sequence(events)}"

    run_async(main(), timeout=90)
