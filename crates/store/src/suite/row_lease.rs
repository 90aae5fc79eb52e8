//! A claim's workflow-task lease written to its task row alone: every reader and writer sees
//! the lease before the run document holds it, and the report, a signal and the lease's expiry
//! act on it as on a lease the document held.

use super::{all_history, started, timer, NOW};
use crate::*;

async fn claim<S: Store>(store: &S, worker: &str, now: Millis) -> Option<(Task, RunState)> {
    store
        .claim_task("default", TaskKind::Workflow, "rl", &[], worker, 60_000, now, None)
        .await
        .unwrap()
}

pub async fn a_lease_on_its_row_is_seen_by_every_reader_and_writer<S: Store>(store: S) {
    let run = started(&store, "row-lease", "rl").await;
    let instance = RunLocator::Current(run.workflow_id.clone());
    let (task, leased) = claim(&store, "w", NOW).await.expect("the workflow task");
    let lease = task.lease().expect("leased").clone();
    assert_eq!((lease.owner.as_str(), lease.fence), ("w", 1));

    // Readers see the run as the claim left it, and no second claim takes the task.
    let read = store.load_run("default", instance.clone()).await.unwrap().unwrap();
    assert_eq!(read, leased);
    assert_eq!(read.status, RunStatus::Running);
    assert!(claim(&store, "other", NOW).await.is_none());

    // A signal sees the lease: it is held back until the lease ends, as DW does.
    let (_, signalled) = store
        .mutate_run("default", instance.clone(), NOW + 1, |run, cx| {
            signal(run, cx, "go", Payload::avro("x"), CommandId("sig-1".into()))
        })
        .await
        .unwrap();
    assert_eq!(signalled.tasks[&task.id].lease(), Some(&lease));
    assert_eq!(
        signalled.last_sequence, leased.last_sequence,
        "the signal waits for the lease to end"
    );
    assert_eq!(signalled.deferred_signals.len(), 1);

    // A report under a lease that is not this one is refused; the lease's own report closes it,
    // records the held-back signal and wakes the workflow for it.
    let id = task.id.clone();
    let stale = store
        .mutate_run("default", RunLocator::Task(id.clone()), NOW + 2, {
            let id = id.clone();
            move |run, cx| complete_workflow_task(run, cx, &id, "w", 2, vec![timer(3_600)])
        })
        .await;
    let refused = stale.expect_err("a report under another fence is refused").to_string();
    assert!(refused.contains("attempt does not match"), "{refused}");
    let (_, reported) = store
        .mutate_run("default", RunLocator::Task(id.clone()), NOW + 2, move |run, cx| {
            complete_workflow_task(run, cx, &id, "w", 1, vec![timer(3_600)])
        })
        .await
        .unwrap();
    let history = all_history(&store, &reported).await;
    verify_chain(&history).unwrap();
    let kinds: Vec<EventType> = history.iter().map(|e| e.event_type).collect();
    assert!(kinds.contains(&EventType::SignalReceived), "{kinds:?}");

    // The next lease, also on its row alone, expires: the sweep finds it and offers the task
    // again under a higher fence.
    let (next, _) = claim(&store, "w", NOW + 3).await.expect("the signal's workflow task");
    let expires_at = next.lease().expect("leased").expires_at;
    let due = store.claim_due_tasks("node-a", expires_at, 10, 30_000).await.unwrap();
    assert_eq!(due.iter().map(|d| &d.task_id).collect::<Vec<_>>(), [&next.id]);
    let id = next.id.clone();
    let (expired, _) = store
        .run_duty(&due[0], expires_at, move |run, cx| Ok(on_deadline(run, cx, &id)))
        .await
        .unwrap();
    assert!(expired, "the lease ran out");
    let (again, _) = claim(&store, "w2", expires_at).await.expect("offered again");
    assert_eq!(again.id, next.id);
    assert_eq!(again.fence, next.fence + 1);
    assert!(claim(&store, "w3", expires_at).await.is_none());
}
