//! The hand-off: a task made ready goes to a poll parked on this node in the transaction that
//! makes it, to a poll that may take it only, never to a poll whose client went, and a lease
//! whose answer was not read is kept to be given back.

use super::{activity, start_request, NOW};
use crate::*;
use std::time::Duration;

fn poller(kind: TaskKind, queue: &str, worker_id: &str, types: &[&str]) -> Poller {
    Poller {
        namespace: "default".into(),
        kind,
        queue: queue.into(),
        worker_id: worker_id.into(),
        build_id: None,
        types: types.iter().map(|t| t.to_string()).collect(),
        lease_ms: 60_000,
        poll: None,
    }
}

/// The lease handed to `parked`, if one is (a hand-off is answered when its commit resolves).
async fn handed(parked: &mut Parked) -> Option<HandedOff> {
    tokio::time::timeout(Duration::from_millis(200), parked.handed())
        .await
        .ok()
        .flatten()
}

async fn start<S: Store>(store: &S, workflow_id: &str, queue: &str) -> RunState {
    store
        .start_workflow(start_request(workflow_id, queue), DuplicatePolicy::Fail, NOW)
        .await
        .expect("start")
        .1
}

pub async fn a_ready_task_goes_to_a_parked_poll_in_the_transaction_that_makes_it<S: Store>(store: S) {
    let mut workflow_poll = store.park_poll(Poller {
        poll: Some(PollKey {
            namespace: "default".into(),
            task_queue: "ho".into(),
            worker_id: "w".into(),
            kind: TaskKind::Workflow,
            poll_request_id: "poll-1".into(),
        }),
        ..poller(TaskKind::Workflow, "ho", "w", &[])
    });
    assert_eq!(store.parked_polls(), 1);
    let run = start(&store, "ho-1", "ho").await;
    let HandedOff { task, run: leased_run } = handed(&mut workflow_poll).await.expect("the start's workflow task, handed over");
    assert_eq!(store.parked_polls(), 0);
    let lease = task.lease().expect("leased").clone();
    assert_eq!((lease.owner.as_str(), lease.fence, lease.expires_at), ("w", 1, NOW + 60_000));
    // The run was written once, with the lease: the stored document and row say so.
    let stored = store.load_run("default", RunLocator::Task(task.id.clone())).await.unwrap().unwrap();
    assert_eq!(stored.tasks[&task.id].lease(), Some(&lease));
    assert_eq!(stored, leased_run);
    let ready = store.has_ready_task("default", TaskKind::Workflow, "ho", &[], NOW).await.unwrap();
    assert!(!ready.any, "nothing is left for a claim");
    let claimed = store
        .claim_task("default", TaskKind::Workflow, "ho", &[], "other", 60_000, NOW, None)
        .await
        .unwrap();
    assert!(claimed.is_none());
    // The poll's request id is remembered with the lease, as a claim's is.
    let key = PollKey {
        namespace: "default".into(),
        task_queue: "ho".into(),
        worker_id: "w".into(),
        kind: TaskKind::Workflow,
        poll_request_id: "poll-1".into(),
    };
    assert_eq!(super::recall(&store, key).await, Some((task.id.clone(), 1)));

    // The activity the completion schedules goes to the parked activity poll, in the
    // completion's transaction: its start follows its scheduling in history.
    let mut activity_poll = store.park_poll(poller(TaskKind::Activity, "ho", "a", &[]));
    let id = task.id.clone();
    store
        .mutate_run("default", RunLocator::Task(id.clone()), NOW, move |run, cx| {
            complete_workflow_task(run, cx, &id, "w", 1, vec![activity()])
        })
        .await
        .expect("complete");
    let HandedOff { task, .. } = handed(&mut activity_poll).await.expect("the activity, handed over");
    assert_eq!(task.lease().map(|l| l.owner.as_str()), Some("a"));
    let history = store.history(&run.run_id, 0, u64::MAX / 2, 100).await.unwrap();
    let types: Vec<_> = history.iter().map(|e| e.event_type).collect();
    let scheduled = types.iter().position(|t| *t == EventType::ActivityScheduled).expect("scheduled");
    assert_eq!(types.get(scheduled + 1), Some(&EventType::ActivityStarted));
}

pub async fn a_parked_poll_is_handed_only_what_it_may_take<S: Store>(store: S) {
    let mut other_types = store.park_poll(poller(TaskKind::Workflow, "hq", "w1", &["another.workflow"]));
    let mut other_queue = store.park_poll(poller(TaskKind::Workflow, "elsewhere", "w2", &[]));
    let mut activities = store.park_poll(poller(TaskKind::Activity, "hq", "w3", &[]));
    start(&store, "hq-1", "hq").await;
    assert!(handed(&mut other_types).await.is_none());
    assert!(handed(&mut other_queue).await.is_none());
    assert!(handed(&mut activities).await.is_none());
    assert_eq!(store.parked_polls(), 3, "all still parked");
    // The task stayed ready for a claim.
    let claimed = store
        .claim_task("default", TaskKind::Workflow, "hq", &[], "w", 60_000, NOW, None)
        .await
        .unwrap();
    assert!(claimed.is_some());

    // A queue with flow-control limits is left to claims (its limits row comes first).
    store
        .set_queue_limits(
            "default",
            "limited",
            TaskKind::Workflow,
            capstan_engine::flow::QueueLimits {
                max_leased_tasks: Some(5),
                ..Default::default()
            },
            NOW,
        )
        .await
        .unwrap();
    let mut limited = store.park_poll(poller(TaskKind::Workflow, "limited", "w", &[]));
    start(&store, "limited-1", "limited").await;
    assert!(handed(&mut limited).await.is_none());
    let claimed = store
        .claim_task("default", TaskKind::Workflow, "limited", &[], "w", 60_000, NOW, None)
        .await
        .unwrap();
    assert!(claimed.is_some());
}

pub async fn a_parked_poll_whose_client_went_takes_nothing<S: Store>(store: S) {
    let gone = store.park_poll(poller(TaskKind::Workflow, "hg", "w", &[]));
    drop(gone);
    assert_eq!(store.parked_polls(), 0);
    start(&store, "hg-1", "hg").await;
    let claimed = store
        .claim_task("default", TaskKind::Workflow, "hg", &[], "w2", 60_000, NOW, None)
        .await
        .unwrap();
    assert!(claimed.is_some(), "the task was not swallowed");
    assert!(store.take_undelivered_hand_offs().is_empty());
}

pub async fn a_hand_off_whose_answer_was_not_read_is_kept_to_give_back<S: Store>(store: S) {
    let parked = store.park_poll(poller(TaskKind::Workflow, "hu", "w", &[]));
    let run = start(&store, "hu-1", "hu").await;
    // The lease was sent at commit; the poll goes before reading it.
    drop(parked);
    let undelivered = store.take_undelivered_hand_offs();
    assert_eq!(undelivered.len(), 1);
    assert_eq!(undelivered[0].run.run_id, run.run_id);
    assert_eq!(undelivered[0].task.lease().map(|l| l.owner.as_str()), Some("w"));
    assert!(store.take_undelivered_hand_offs().is_empty(), "taken once");
}
