//! Dispatch order: priority first, then fairness classes by weight, and what a queue shows of it.

use super::{start_request, NOW};
use crate::*;

async fn start_with<S: Store>(store: &S, workflow_id: &str, at: Millis, scheduling: TaskScheduling) {
    let start = StartRun {
        scheduling,
        ..start_request(workflow_id, "shared")
    };
    store.start_workflow(start, DuplicatePolicy::Fail, at).await.expect("start");
}

fn with(priority: u8, key: Option<&str>, weight: u16) -> TaskScheduling {
    TaskScheduling {
        priority,
        fairness_key: key.map(str::to_string),
        fairness_weight: weight,
    }
}

/// The workflow ids of the next `count` claims of the shared queue, each by its own worker.
async fn claimed_ids<S: Store>(store: &S, count: usize) -> Vec<String> {
    let mut ids = Vec::new();
    for i in 0..count {
        let claimed = store
            .claim_task(
                "default",
                TaskKind::Workflow,
                "shared",
                &[],
                &format!("w{i}"),
                60_000,
                NOW + 1_000,
                None,
            )
            .await
            .expect("claim");
        let Some((_, run)) = claimed else { break };
        ids.push(run.workflow_id.0);
    }
    ids
}

/// Lower priority numbers first whatever the arrival order; the same priority in arrival
/// order; the run keeps what it was started with.
pub async fn claims_take_the_most_urgent_task_first<S: Store>(store: S) {
    start_with(&store, "late-9", NOW, with(9, None, 1)).await;
    start_with(&store, "urgent-0", NOW + 1, with(0, None, 1)).await;
    start_with(&store, "normal-a", NOW + 2, with(5, None, 1)).await;
    start_with(&store, "normal-b", NOW + 3, with(5, None, 1)).await;
    assert_eq!(claimed_ids(&store, 5).await, ["urgent-0", "normal-a", "normal-b", "late-9"]);
    let run = store
        .load_run("default", RunLocator::Current(WorkflowId("urgent-0".into())))
        .await
        .expect("load")
        .expect("run");
    assert_eq!(run.scheduling, with(0, None, 1));
}

/// Inside one priority, classes take turns by weight (a class weighted 3 gets three for the
/// other's one) and stay first-in, first-out; a more urgent task still goes first.
pub async fn fairness_classes_share_a_priority_by_weight<S: Store>(store: S) {
    for i in 0..4 {
        start_with(&store, &format!("alpha-{i}"), NOW + i, with(5, Some("alpha"), 1)).await;
    }
    for i in 0..4 {
        start_with(&store, &format!("beta-{i}"), NOW + 10 + i, with(5, Some("beta"), 1)).await;
    }
    assert_eq!(
        claimed_ids(&store, 4).await,
        ["alpha-0", "beta-0", "alpha-1", "beta-1"],
        "equal weights alternate although alpha arrived first"
    );
    start_with(&store, "urgent", NOW + 20, with(1, Some("alpha"), 1)).await;
    assert_eq!(claimed_ids(&store, 1).await, ["urgent"]);

    for i in 0..8 {
        start_with(&store, &format!("heavy-{i}"), NOW + 100 + i, with(3, Some("heavy"), 3)).await;
        start_with(&store, &format!("light-{i}"), NOW + 100 + i, with(3, Some("light"), 1)).await;
    }
    let first_eight = claimed_ids(&store, 8).await;
    let heavy = first_eight.iter().filter(|id| id.starts_with("heavy")).count();
    assert_eq!(heavy, 6, "weights 3:1 share 6:2, got {first_eight:?}");
    let heavy_order: Vec<_> = first_eight.iter().filter(|id| id.starts_with("heavy")).cloned().collect();
    assert_eq!(
        heavy_order,
        (0..6).map(|i| format!("heavy-{i}")).collect::<Vec<_>>(),
        "a class stays in order"
    );
}

/// The queue's ready tasks by kind, priority and class, with each class's recent dispatch.
pub async fn a_queue_shows_its_ready_tasks_by_priority_and_class<S: Store>(store: S) {
    start_with(&store, "a1", NOW, with(2, Some("tenant-a"), 4)).await;
    start_with(&store, "a2", NOW + 1, with(2, Some("tenant-a"), 4)).await;
    start_with(&store, "d1", NOW + 2, with(2, None, 1)).await;
    start_with(&store, "b1", NOW + 3, with(7, Some("tenant-b"), 1)).await;
    assert_eq!(claimed_ids(&store, 1).await, ["a1"]);
    let shares = store.priority_fairness("default", "shared", NOW + 1_000).await.expect("shares");
    assert_eq!(shares.activity, KindShares::default());
    let workflow = shares.workflow;
    assert_eq!(workflow.ready_tasks, 3);
    let class = |key: Option<&str>, count, weight| ClassCount {
        fairness_key: key.map(str::to_string),
        count,
        fairness_weight: weight,
    };
    assert_eq!(
        workflow.tiers,
        [
            PriorityTier {
                priority: 2,
                count: 2,
                classes: vec![class(None, 1, 1), class(Some("tenant-a"), 1, 4)]
            },
            PriorityTier {
                priority: 7,
                count: 1,
                classes: vec![class(Some("tenant-b"), 1, 1)]
            },
        ]
    );
    let scores: Vec<_> = workflow
        .recent_dispatch
        .iter()
        .map(|(key, score)| (key.as_deref(), *score))
        .collect();
    assert_eq!(scores, [(None, 0.0), (Some("tenant-a"), 1.0), (Some("tenant-b"), 0.0)]);
    let elsewhere = store.priority_fairness("default", "other", NOW).await.expect("shares");
    assert_eq!(elsewhere, QueueShares::default());
}
