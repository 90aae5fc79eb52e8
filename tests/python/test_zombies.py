"""Zombies: a paused process that wakes up and acts on what it believed it owned.

Kleppmann's fencing scenario, with real processes on a PostgreSQL or MariaDB cluster: a node (or a worker)
is frozen at the worst moment (``SIGSTOP``), the rest of the cluster takes its work over with a
higher fence, and the frozen process is resumed (``SIGCONT``). What it does next must be
refused with a DW reason and leave no trace, and anything it answers must not claim a fact
that was not committed.

Nodes freeze themselves at named pause points (``CAPSTAN_TEST_PAUSE_AT``, see
``crates/pause``), so each test hits its window every time:

* ``duty_claimed``: a node claimed due timers (or a workflow task's lease expiry) and froze
  before applying them; another node takes the duties over with duty fence + 1 and applies them
  once; the woken node's attempts are refused ``stale_fence``;
* ``duty_locked``: a node froze inside a duty's transaction, the run's row locked; the database
  ends its session (idle-in-transaction timeout), the other node fires the timer once, the woken
  node's commit fails, and the node goes on working;
* ``schedules_due``: a node read which schedules were due and froze; another node fires them;
  the woken node does not fire an occurrence a second time;
* ``workflow_task_completing`` / ``activity_reporting``: a node froze holding a worker's report
  while the lease expired and another worker's attempt completed; the woken node answers the
  first worker 409 with a fence reason, and history holds only the second worker's fact;
* ``session_renewing``: a node froze holding a session holder's renewal while the session's
  lease ran out and another worker reacquired it (fence 2); the woken node refuses the renewal;
* a Python SDK worker process frozen past its activity lease while another worker's attempt
  completes: its late report is withheld or refused and changes nothing;
* a sticky-cache owner (a Python SDK worker process) frozen while another worker takes the run
  over and moves the claim; woken, with a stale cache, it finishes the run from history.

Every test runs on PostgreSQL (``CAPSTAN_TEST_POSTGRES_URL``) and on MariaDB
(``CAPSTAN_TEST_MYSQL_URL``); run with ``.venv/bin/python -m pytest tests/python/test_zombies.py``.
"""
from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from capstan_harness import (
    ControlPlane,
    RawWorker,
    assert_hash_chain,
    assert_history_invariants,
    complete_workflow_command,
    decode_envelope,
    envelope,
    event_type,
    events_of,
    make_client,
    payload_of,
    process_state,
    run_async,
    start_timer_command,
    type_sequence,
    unique,
    wait_for_history,
)

PAUSE = "CAPSTAN_TEST_PAUSE_AT"
WORKFLOW_FENCE_REFUSALS = {"lease_owner_mismatch", "workflow_task_attempt_mismatch", "task_not_leased"}
ACTIVITY_FENCE_REFUSALS = {"attempt_closed", "lease_owner_mismatch", "task_not_leased", "attempt_not_found"}
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def log_lines(node, message: str, *, since: int = 0) -> list[str]:
    """Lines of ``node``'s log (from character ``since``) that contain ``message``."""
    return [line for line in _ANSI.sub("", node.log_text())[since:].splitlines() if message in line]


def log_size(node) -> int:
    return len(_ANSI.sub("", node.log_text()))


async def wait_until(what: str, probe, *, within: float) -> None:
    deadline = time.monotonic() + within
    while not probe():
        assert time.monotonic() < deadline, f"timed out after {within}s waiting for {what}"
        await asyncio.sleep(0.05)


def check_run(events: list[dict], *, terminal: str = "WorkflowCompleted", context: str = "") -> None:
    assert_history_invariants(events, terminal=terminal, context=context)
    assert_hash_chain(events, context=context)


def paused_node_cluster(cluster_factory, point: str, *flags: str):
    """A two-node cluster whose node A freezes itself at ``point``; neither node is started."""
    cluster = cluster_factory.create(2, *flags, start=False)
    cluster[0].env[PAUSE] = point
    return cluster


# ── a. duties claimed by a node that froze before applying them ─────────


async def _runs_with_due_timers(control, worker, node_url, queue, prefix, count):
    runs = {}
    for i in range(count):
        wid = f"{prefix}-{i}"
        runs[wid] = (await control.start_workflow("zombie.timer", wid, queue, [i]))["run_id"]
    await worker.register(node_url)
    first = {}
    while len(first) < count:
        task = await worker.next_workflow_task(node_url, within=15)
        first[task["workflow_id"]] = task
    replies = await asyncio.gather(*(
        worker.complete_workflow_task(node_url, task, [start_timer_command(1)]) for task in first.values()
    ))
    assert all(r.status_code == 200 for r in replies), [r.text for r in replies]
    return runs, first


def test_timers_claimed_by_a_frozen_node_fire_once_and_its_wakeup_is_fenced(cluster_factory):
    duty_seconds = 2
    count = 6
    cluster = paused_node_cluster(cluster_factory, "duty_claimed", "--duty-lease-seconds", str(duty_seconds))
    a, b = cluster
    database = cluster.database
    a.start()  # B joins once A froze, so A alone claims the due timers
    queue = unique("zombie-timer")

    async def main():
        async with ControlPlane(a.url) as on_a, RawWorker(queue) as worker:
            node_a = (await on_a.cluster_info())["server_id"]
            runs, first = await _runs_with_due_timers(on_a, worker, a.url, queue, unique("ztimer"), count)
            await a.wait_stopped(within=15, what="the duty_claimed pause point")
            claimed = {row[0]: int(row[1]) for row in database.query(
                f"SELECT task_id, duty_fence FROM tasks WHERE kind = 'timer' AND duty_owner = '{node_a}' "
                f"AND status IN ('ready', 'leased')"
            )}
            assert claimed, "node A froze after claiming, yet holds no timer claim"
            print(f"A froze holding {len(claimed)} timer claims (fences {sorted(set(claimed.values()))})")

            b.spawn()
            await b.wait_ready_async()
            async with ControlPlane(b.url) as on_b:
                node_b = (await on_b.cluster_info())["server_id"]
                fired = {}
                while len(fired) < count:
                    task = await worker.next_workflow_task(b.url, within=duty_seconds + 20, what="a post-timer task")
                    assert len(events_of(task["history_events"], "TimerFired")) == 1, type_sequence(task["history_events"])
                    fired[task["workflow_id"]] = task
                rows = {row[0]: (row[1], int(row[2])) for row in database.query(
                    "SELECT task_id, duty_owner, duty_fence FROM tasks WHERE kind = 'timer'"
                )}
                for task_id, fence in claimed.items():
                    owner, now_fence = rows[task_id]
                    assert now_fence == fence + 1, f"{task_id}: taken over with fence {now_fence}, A held {fence}"
                    assert owner in (node_b, None, ""), f"{task_id}: duty owner {owner}"
                before = {wid: await on_b.history(wid, run_id) for wid, run_id in runs.items()}

                mark = log_size(a)
                a.resume()
                await wait_until(
                    "A's refused duties", lambda: len(log_lines(a, "duty taken over by another node", since=mark)) >= len(claimed),
                    within=15,
                )
                refused = log_lines(a, "duty taken over by another node", since=mark)
                assert all("stale_fence" in line for line in refused), refused
                assert not log_lines(a, "deadline reached", since=mark), "the woken node applied a duty it had lost"
                print(f"A woke and was refused {len(refused)} duties (stale_fence); nothing applied")
                for wid, run_id in runs.items():
                    assert await on_b.history(wid, run_id) == before[wid], f"{wid}: history changed after A woke"

                replies = await asyncio.gather(*(
                    worker.complete_workflow_task(b.url, task, [complete_workflow_command("woke")]) for task in fired.values()
                ))
                assert all(r.status_code == 200 for r in replies), [r.text for r in replies]
                for wid, run_id in runs.items():
                    events = await on_b.history(wid, run_id)
                    check_run(events, context=f"{wid} {type_sequence(events)}")
                    assert type_sequence(events).count("TimerFired") == 1, type_sequence(events)

    run_async(main(), timeout=90)


def test_a_lease_expiry_claimed_by_a_frozen_node_is_applied_once(cluster_factory):
    duty_seconds = 2
    cluster = paused_node_cluster(
        cluster_factory, "duty_claimed", "--duty-lease-seconds", str(duty_seconds), "--workflow-task-lease-seconds", "1",
    )
    a, b = cluster
    database = cluster.database
    a.start()
    queue = unique("zombie-lease")
    workflow_id = unique("zlease")

    async def main():
        async with ControlPlane(a.url) as on_a, RawWorker(queue, worker_id=unique("w1")) as w1, \
                RawWorker(queue, worker_id=unique("w2")) as w2:
            node_a = (await on_a.cluster_info())["server_id"]
            run_id = (await on_a.start_workflow("zombie.lease", workflow_id, queue, [1]))["run_id"]
            await w1.register(a.url)
            first = await w1.next_workflow_task(a.url, within=15)
            # W1 never answers: A's clock claims the lease expiry and freezes.
            await a.wait_stopped(within=15, what="the duty_claimed pause point")
            (claim,) = database.query(
                f"SELECT task_id, duty_fence FROM tasks WHERE task_id = '{first['task_id']}' AND duty_owner = '{node_a}'"
            )
            b.spawn()
            await b.wait_ready_async()
            await w2.register(b.url)
            second = await w2.next_workflow_task(b.url, within=duty_seconds + 15, what="the re-offered task")
            assert second["task_id"] == first["task_id"] and second["workflow_task_attempt"] == 2, second
            ((fence,),) = database.query(f"SELECT duty_fence FROM tasks WHERE task_id = '{first['task_id']}'")
            assert int(fence) == int(claim[1]) + 1, (claim, fence)

            mark = log_size(a)
            a.resume()
            await wait_until("A's refused duty", lambda: log_lines(a, "duty taken over by another node", since=mark), within=15)
            assert "stale_fence" in log_lines(a, "duty taken over by another node", since=mark)[0]
            # W1's lease is gone; the one W2 holds was not expired a second time by the woken node.
            late = await w1.complete_workflow_task(b.url, first, [complete_workflow_command("w1")])
            assert late.status_code == 409 and late.json().get("reason") in WORKFLOW_FENCE_REFUSALS, late.text
            assert late.json().get("recorded") is not True, late.text
            done = await w2.complete_workflow_task(b.url, second, [complete_workflow_command("w2")])
            assert done.status_code == 200, done.text
            async with ControlPlane(b.url) as on_b:
                events = await on_b.history(workflow_id, run_id)
            check_run(events, context=type_sequence(events))
            (completed,) = events_of(events, "WorkflowCompleted")
            assert decode_envelope({"codec": "avro", "blob": payload_of(completed)["output"]}) == "w2"

    run_async(main(), timeout=90)


# ── b. a node frozen inside a duty's transaction ─────────────────────────


def test_a_node_frozen_inside_a_duty_transaction_loses_it_and_recovers(cluster_factory):
    duty_seconds = 2
    cluster = paused_node_cluster(cluster_factory, "duty_locked", "--duty-lease-seconds", str(duty_seconds))
    a, b = cluster
    if cluster.database.kind == "postgres":
        # A's sessions are ended by the database after 3 s idle inside a transaction (30 s by
        # default; a setting named in the URL's options wins).
        idle_seconds = 3
        a.database = f"{cluster.database.url}?options=-c%20idle_in_transaction_session_timeout%3D{idle_seconds}s"
    else:
        idle_seconds = 30  # MariaDB: the store's session setting, which the URL cannot change
    a.start()
    queue = unique("zombie-locked")

    async def main():
        async with ControlPlane(a.url) as on_a, RawWorker(queue) as worker:
            runs, _ = await _runs_with_due_timers(on_a, worker, a.url, queue, unique("zlocked"), 1)
            ((wid, run_id),) = runs.items()
            await a.wait_stopped(within=15, what="the duty_locked pause point")
            frozen_at = time.monotonic()
            b.spawn()
            await b.wait_ready_async()
            async with ControlPlane(b.url) as on_b:
                task = await worker.next_workflow_task(b.url, within=idle_seconds + 2 * duty_seconds + 15,
                                                       what="the post-timer task")
                waited = time.monotonic() - frozen_at
                print(f"B fired the timer {waited:.2f}s after A froze holding its run's lock")
                assert len(events_of(task["history_events"], "TimerFired")) == 1
                before = await on_b.history(wid, run_id)

                mark = log_size(a)
                a.resume()
                await wait_until("A's failed duty transaction",
                                 lambda: log_lines(a, "clock: deadline transition failed", since=mark), within=15)
                assert not log_lines(a, "deadline reached", since=mark)
                assert await on_b.history(wid, run_id) == before, "the woken node's transaction left a trace"

                # A goes on working: its pool replaces the dead session.
                reply = await worker.complete_workflow_task(a.url, task, [complete_workflow_command("done")])
                assert reply.status_code == 200, reply.text
                more = unique("zlocked-after")
                after = (await on_a.start_workflow("zombie.after", more, queue, []))["run_id"]
                events = await on_a.history(more, after)
                assert "WorkflowStarted" in type_sequence(events), type_sequence(events)
                events = await on_b.history(wid, run_id)
                check_run(events, context=type_sequence(events))
                assert type_sequence(events).count("TimerFired") == 1

    run_async(main(), timeout=90)


# ── c. a node frozen after reading which schedules are due ──────────────


def test_a_schedule_read_by_a_frozen_node_fires_each_occurrence_once(cluster_factory):
    from durable_workflow import ScheduleAction, ScheduleSpec

    cluster = paused_node_cluster(cluster_factory, "schedules_due")
    a, b = cluster
    database = cluster.database
    a.start()
    queue = unique("zombie-sched")
    schedule_id = unique("zsched")

    async def main():
        async with make_client(a.url) as on_a:
            await on_a.create_schedule(
                schedule_id=schedule_id,
                spec=ScheduleSpec(intervals=[{"every": "PT1S"}]),
                action=ScheduleAction(workflow_type="zombie.tick", task_queue=queue, input=["tick"]),
                overlap_policy="allow_all",
            )
            await a.wait_stopped(within=15, what="the schedules_due pause point")
        b.spawn()
        await b.wait_ready_async()
        async with make_client(b.url) as on_b:
            await asyncio.sleep(3)
            mark = log_size(a)
            a.resume()
            await asyncio.sleep(2.5)
            handle = on_b.get_schedule_handle(schedule_id)
            await handle.pause(note="test over")
        fired_by_a = len(log_lines(a, "schedule fired", since=mark))
        fired_by_b = len(log_lines(b, "schedule fired"))
        async with ControlPlane(b.url) as on_b:
            resp = await on_b.http.get(f"/api/schedules/{schedule_id}/history", params={"limit": 1000})
        assert resp.status_code == 200, resp.text
        triggered = [e for e in resp.json()["events"] if event_type(e) == "ScheduleTriggered"]
        occurrences = Counter(payload_of(e)["occurrence_time"] for e in triggered)
        print(f"{len(triggered)} occurrences fired (by B {fired_by_b}, by the woken A {fired_by_a})")
        assert triggered and fired_by_b >= 1, "B never fired the schedule A froze over"
        assert all(n == 1 for n in occurrences.values()), f"occurrences fired twice: {occurrences}"
        numbers = [payload_of(e)["trigger_number"] for e in triggered]
        assert numbers == list(range(1, len(numbers) + 1)), numbers
        started = database.query("SELECT count(*) FROM runs WHERE workflow_type = 'zombie.tick'")
        assert int(started[0][0]) == len(triggered), (started, len(triggered))

    run_async(main(), timeout=60)


# ── d. a node frozen holding a worker's report ──────────────────────────


def test_a_workflow_task_completion_held_by_a_frozen_node_is_refused_after_takeover(cluster_factory):
    a, b = paused_node_cluster(cluster_factory, "workflow_task_completing", "--workflow-task-lease-seconds", "2")
    a.start()
    b.start()
    queue = unique("zombie-wft")
    workflow_id = unique("zwft")

    async def main():
        async with ControlPlane(b.url) as on_b, RawWorker(queue, worker_id=unique("w1")) as w1, \
                RawWorker(queue, worker_id=unique("w2")) as w2:
            run_id = (await on_b.start_workflow("zombie.wft", workflow_id, queue, [1]))["run_id"]
            await w1.register(b.url)
            first = await w1.next_workflow_task(b.url, within=15)
            in_flight = asyncio.create_task(
                w1.complete_workflow_task(a.url, first, [complete_workflow_command("from-w1")], timeout=60)
            )
            await a.wait_stopped(within=15, what="the workflow_task_completing pause point")
            await w2.register(b.url)
            second = await w2.next_workflow_task(b.url, within=20, what="the re-offered task")
            assert second["workflow_task_attempt"] == 2, second
            done = await w2.complete_workflow_task(b.url, second, [complete_workflow_command("from-w2")])
            assert done.status_code == 200 and done.json().get("run_status") == "completed", done.text
            before = await on_b.history(workflow_id, run_id)

            assert not in_flight.done()
            a.resume()
            answer = await asyncio.wait_for(in_flight, timeout=30)
            print(f"the woken node answered W1: {answer.status_code} {answer.text[:200]}")
            assert answer.status_code == 409, answer.text
            assert answer.json().get("reason") in WORKFLOW_FENCE_REFUSALS | {"run_closed"}, answer.text
            assert answer.json().get("recorded") is not True, answer.text
            assert await on_b.history(workflow_id, run_id) == before, "the refused completion left a trace"
            check_run(before, context=type_sequence(before))
            (completed,) = events_of(before, "WorkflowCompleted")
            assert decode_envelope({"codec": "avro", "blob": payload_of(completed)["output"]}) == "from-w2"

    run_async(main(), timeout=60)


def test_an_activity_report_held_by_a_frozen_node_is_refused_after_takeover(cluster_factory):
    a, b = paused_node_cluster(
        cluster_factory, "activity_reporting", "--activity-task-lease-seconds", "2", "--duty-lease-seconds", "2",
    )
    a.start()
    b.start()
    queue = unique("zombie-act")
    workflow_id = unique("zact")

    async def main():
        async with ControlPlane(b.url) as on_b, RawWorker(queue, worker_id=unique("w1")) as w1, \
                RawWorker(queue, worker_id=unique("w2")) as w2:
            run_id = (await on_b.start_workflow("zombie.act", workflow_id, queue, [1]))["run_id"]
            await w1.register(b.url)
            await w2.register(b.url)
            task = await w1.next_workflow_task(b.url, within=15)
            schedule = {"type": "schedule_activity", "activity_type": "zombie.work", "arguments": envelope([1]),
                        "retry_policy": {"max_attempts": 3, "backoff_seconds": [1]}}
            reply = await w1.complete_workflow_task(b.url, task, [schedule])
            assert reply.status_code == 200, reply.text
            first = await w1.next_activity_task(b.url, within=15)
            assert first["attempt_number"] == 1, first
            in_flight = asyncio.create_task(w1.complete_activity_task(a.url, first, "from-w1", timeout=60))
            await a.wait_stopped(within=15, what="the activity_reporting pause point")

            second = await w2.next_activity_task(b.url, within=20, what="the retried attempt")
            assert second["attempt_number"] == 2 and second["activity_execution_id"] == first["activity_execution_id"], second
            done = await w2.complete_activity_task(b.url, second, "from-w2")
            assert done.status_code == 200, done.text
            before = await on_b.history(workflow_id, run_id)
            assert len(events_of(before, "ActivityCompleted")) == 1, type_sequence(before)

            a.resume()
            answer = await asyncio.wait_for(in_flight, timeout=30)
            print(f"the woken node answered W1: {answer.status_code} {answer.text[:200]}")
            assert answer.status_code == 409, answer.text
            assert answer.json().get("reason") in ACTIVITY_FENCE_REFUSALS, answer.text
            assert answer.json().get("recorded") is not True, answer.text
            assert await on_b.history(workflow_id, run_id) == before, "the refused report left a trace"
            (completed,) = events_of(before, "ActivityCompleted")
            assert payload_of(completed).get("activity_attempt_id") == second["activity_attempt_id"], completed

    run_async(main(), timeout=60)


def test_a_session_renewal_held_by_a_frozen_node_is_refused_after_reacquisition(cluster_factory):
    a, b = paused_node_cluster(cluster_factory, "session_renewing")
    a.start()
    b.start()
    queue = unique("zombie-session")
    session_id = unique("zsession")
    options = {"session_id": session_id, "requirements": ["gpu"], "lease_seconds": 2, "ttl_seconds": 600,
               "max_concurrent_activities": 1, "create_if_missing": True, "allow_reacquire_after_failure": True}

    async def main():
        async with RawWorker(queue, worker_id=unique("holder")) as holder, \
                RawWorker(queue, worker_id=unique("rival")) as rival:
            for worker in (holder, rival):
                resp = await worker.post(b.url, "/worker/register", {
                    "worker_id": worker.worker_id, "task_queue": queue, "runtime": "python",
                    "sdk_version": "capstan-tests/raw", "supported_workflow_types": [], "supported_activity_types": [],
                    "capabilities": ["worker_sessions", "gpu"], "max_concurrent_worker_sessions": 1,
                })
                assert resp.status_code == 201, resp.text
            created = await holder.post(b.url, "/worker/sessions", {**options, "worker_id": holder.worker_id})
            assert created.status_code == 201 and created.json()["session"]["fence"] == 1, created.text
            in_flight = asyncio.create_task(holder.post(
                a.url, f"/worker/sessions/{session_id}/heartbeat",
                {"worker_id": holder.worker_id, "lease_seconds": 2}, timeout=60,
            ))
            await a.wait_stopped(within=15, what="the session_renewing pause point")
            await asyncio.sleep(2.5)  # the holder's lease runs out while its renewal is frozen
            taken = await rival.post(b.url, "/worker/sessions", {**options, "worker_id": rival.worker_id})
            assert taken.status_code in (200, 201), taken.text
            session = taken.json()["session"]
            assert (session["lease_owner"], session["fence"]) == (rival.worker_id, 2), taken.text

            a.resume()
            answer = await asyncio.wait_for(in_flight, timeout=30)
            print(f"the woken node answered the holder's renewal: {answer.status_code} {answer.text[:160]}")
            assert answer.status_code == 409 and answer.json().get("reason") == "session_owner_mismatch", answer.text
            renewed = await rival.post(b.url, f"/worker/sessions/{session_id}/heartbeat", {"worker_id": rival.worker_id})
            assert renewed.status_code == 200, renewed.text
            assert (renewed.json()["session"]["lease_owner"], renewed.json()["session"]["fence"]) == (rival.worker_id, 2)

    run_async(main(), timeout=60)


# ── e. a worker process frozen past its activity lease ──────────────────

WORKER_SCRIPT = Path(__file__).with_name("zombie_worker.py")


def _start_worker(url: str, queue: str, name: str, marks: Path, log: Path, *, sticky: bool = False) -> subprocess.Popen:
    env = dict(os.environ, ZOMBIE_URL=url, ZOMBIE_QUEUE=queue, ZOMBIE_NAME=name, ZOMBIE_MARKS=str(marks))
    if sticky:
        env["ZOMBIE_STICKY"] = "1"
    return subprocess.Popen(
        [sys.executable, str(WORKER_SCRIPT)], env=env, stdout=open(log, "wb"), stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def test_a_worker_frozen_past_its_activity_lease_is_refused_when_it_wakes(cluster_factory, tmp_path):
    # Short leases: P1's parked polls may be handed tasks while it is frozen.
    a, b = cluster_factory.create(2, "--activity-task-lease-seconds", "2", "--workflow-task-lease-seconds", "3",
                                  "--duty-lease-seconds", "2")
    queue = unique("zombie-worker")
    workflow_id = unique("zworker")
    marks = tmp_path / "marks"
    logs = {name: tmp_path / f"{name}.log" for name in ("P1", "P2")}
    workers = {}

    def marked(text: str) -> bool:
        return marks.exists() and text in marks.read_text()

    async def main():
        workers["P1"] = _start_worker(a.url, queue, "P1", marks, logs["P1"])
        try:
            async with make_client(b.url) as client:
                handle = await client.start_workflow(workflow_type="zombie.worker", task_queue=queue,
                                                     workflow_id=workflow_id, input=[])
                await wait_until("P1 running attempt 1", lambda: marked("P1 started"), within=30)
                os.kill(workers["P1"].pid, signal.SIGSTOP)
                await wait_until("P1 stopped", lambda: process_state(workers["P1"].pid) == "T", within=5)
                workers["P2"] = _start_worker(b.url, queue, "P2", marks, logs["P2"])
                result = await handle.result(timeout=40)
                assert result == "done by P2", result
                history = [e async for e in _history(client, handle)]
                (completed,) = events_of(history, "ActivityCompleted")
                # P1's parked poll may be handed attempt 2 while it is frozen; then attempt 3 is P2's.
                assert re.search(r"^P2 started attempt [23]$", marks.read_text(), re.M), marks.read_text()

                os.kill(workers["P1"].pid, signal.SIGCONT)
                # On waking, P1 either tries its report (withheld by the SDK when the lease budget
                # ran out, refused by the attempt's fence when it gets through) or, when its lease
                # renewal wakes first, abandons the claim with no report at all.
                outcomes = ("failed to complete activity task", "activity claim abandoned")

                def woke() -> str | None:
                    return next((line for line in logs["P1"].read_text().splitlines()
                                 if any(outcome in line for outcome in outcomes)), None)

                await wait_until("P1's late report or abandoned claim", lambda: woke() is not None, within=20)
                refusal = woke()
                print(f"P1 woke: {refusal.strip()[:240]}")
                assert any(r in refusal for r in ACTIVITY_FENCE_REFUSALS | {"activity_execution_budget_expired"}), refusal
                after = [e async for e in _history(client, handle)]
                assert after == history, "the woken worker's report left a trace"
                check_run(after, context=type_sequence(after))
        finally:
            for proc in workers.values():
                with_suppressed(lambda: os.kill(proc.pid, signal.SIGCONT))
                proc.terminate()
                with_suppressed(lambda: proc.wait(timeout=10))

    run_async(main(), timeout=120)


def test_a_sticky_owner_frozen_past_its_hold_wakes_to_a_cold_replay(cluster_factory, tmp_path):
    """P1 keeps the run in its sticky cache and freezes; P2 takes the run over (forced cold
    replay after the hold) and moves the claim; P1 wakes with a stale cache, P2 dies, and P1's
    next task of the run must be replayed from history, not from what P1 remembered. (P1's parked
    long poll may be handed the task while it is frozen: the short lease hands it on.)"""
    a, b = cluster_factory.create(2, "--workflow-task-lease-seconds", "3", "--duty-lease-seconds", "2")
    queue = unique("zombie-sticky")
    workflow_id = unique("zsticky")
    marks = tmp_path / "marks"
    workers = {}

    async def waits(client, handle, count):
        await wait_for_history(client, handle.workflow_id, handle.run_id,
                               lambda evs: len(events_of(evs, "ConditionWaitOpened")) >= count,
                               what=f"{count} ConditionWaitOpened", timeout=30)

    async def main():
        workers["P1"] = _start_worker(a.url, queue, "P1", marks, tmp_path / "P1.log", sticky=True)
        try:
            async with make_client(b.url) as client, ControlPlane(b.url) as control:
                handle = await client.start_workflow(workflow_type="zombie.handoff", task_queue=queue,
                                                     workflow_id=workflow_id, input=["z"])
                await waits(client, handle, 1)
                assert (await control.describe(workflow_id))["sticky"]["worker_id"] == "P1"
                os.kill(workers["P1"].pid, signal.SIGSTOP)

                workers["P2"] = _start_worker(b.url, queue, "P2", marks, tmp_path / "P2.log", sticky=True)
                await handle.signal("go", ["one"])
                await waits(client, handle, 2)
                claim = (await control.describe(workflow_id))["sticky"]
                assert claim["worker_id"] == "P2" and claim["metrics"]["forced_cold_replay"] >= 1, claim

                os.kill(workers["P1"].pid, signal.SIGCONT)
                os.kill(workers["P2"].pid, signal.SIGKILL)  # P2 dies holding the claim
                await handle.signal("go", ["two"])
                result = await handle.result(timeout=40)
                assert result == ["z1", "z2", "one", "two"], result
                events = [e async for e in _history(client, handle)]
                check_run(events, context=type_sequence(events))
                # P2 was dead by then: the woken P1 finished the run, replayed from history.
                assert workers["P2"].poll() is not None
        finally:
            for proc in workers.values():
                with_suppressed(lambda: os.kill(proc.pid, signal.SIGCONT))
                proc.terminate()
                with_suppressed(lambda: proc.wait(timeout=10))

    run_async(main(), timeout=120)


async def _history(client, handle):
    from capstan_harness import fetch_history

    for event in await fetch_history(client, handle.workflow_id, handle.run_id):
        yield event


def with_suppressed(call) -> None:
    try:
        call()
    except Exception:  # noqa: BLE001 - teardown of processes that may be gone
        pass
