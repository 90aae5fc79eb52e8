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

/// One claim of the shared queue at `at`, by `worker`.
async fn claim_at<S: Store>(store: &S, worker: &str, at: Millis) -> StoreResult<Option<String>> {
    let claimed = store
        .claim_task("default", TaskKind::Workflow, "shared", &[], worker, 60_000, at, None)
        .await?;
    Ok(claimed.map(|(_, run)| run.workflow_id.0))
}

fn held_by(result: StoreResult<Option<String>>) -> String {
    match result {
        Err(StoreError::Refused(refusal)) if refusal.reason == Reason::TaskQueueThrottled => {
            refusal.details["held_by"].as_str().unwrap_or_default().to_string()
        }
        other => panic!("expected the claim held back, got {other:?}"),
    }
}

fn key_cap(cap: u32) -> capstan_engine::flow::KeyLimits {
    capstan_engine::flow::KeyLimits {
        max_leased_tasks: Some(cap),
        ..Default::default()
    }
}

/// A fairness key's own cap holds its tasks back while the other keys' still go out; a key's
/// own entry replaces the default; when every key is held the claim is throttled by name.
pub async fn a_fairness_keys_cap_holds_only_that_keys_tasks<S: Store>(store: S) {
    for i in 0..3 {
        start_with(&store, &format!("a-{i}"), NOW + i, with(5, Some("tenant-a"), 1)).await;
        start_with(&store, &format!("b-{i}"), NOW + 10 + i, with(5, Some("tenant-b"), 1)).await;
    }
    let limits = capstan_engine::flow::QueueLimits {
        fairness_key_limits: Some(key_cap(1)),
        ..Default::default()
    };
    store
        .set_queue_limits("default", "shared", TaskKind::Workflow, limits.clone(), NOW)
        .await
        .unwrap();
    let at = NOW + 1_000;
    let mut first_two = vec![
        claim_at(&store, "w1", at).await.unwrap().unwrap(),
        claim_at(&store, "w2", at).await.unwrap().unwrap(),
    ];
    first_two.sort();
    assert_eq!(first_two, ["a-0", "b-0"], "one of each key, the cap of one reached by both");
    assert_eq!(held_by(claim_at(&store, "w3", at).await), "fairness_key_max_leased_tasks");

    let limits = capstan_engine::flow::QueueLimits {
        fairness_key_overrides: [("tenant-b".to_string(), key_cap(2))].into(),
        ..limits
    };
    store
        .set_queue_limits("default", "shared", TaskKind::Workflow, limits, NOW)
        .await
        .unwrap();
    assert_eq!(
        claim_at(&store, "w4", at).await.unwrap().as_deref(),
        Some("b-1"),
        "its own cap of two"
    );
    assert_eq!(held_by(claim_at(&store, "w5", at).await), "fairness_key_max_leased_tasks");
}

/// A fairness key's rate: its burst at once, then one lease per token, while a key without a
/// limit of its own (freed by an empty entry) goes out unhindered.
pub async fn a_fairness_keys_rate_holds_its_rate<S: Store>(store: S) {
    for i in 0..4 {
        start_with(&store, &format!("r-{i}"), NOW + i, with(5, Some("rated"), 1)).await;
        start_with(&store, &format!("f-{i}"), NOW + 10 + i, with(5, Some("free"), 1)).await;
    }
    let limits = capstan_engine::flow::QueueLimits {
        fairness_key_limits: Some(capstan_engine::flow::KeyLimits {
            dispatch_rate_per_second: Some(1.0),
            dispatch_burst: Some(1),
            max_leased_tasks: None,
        }),
        fairness_key_overrides: [("free".to_string(), Default::default())].into(),
        ..Default::default()
    };
    store
        .set_queue_limits("default", "shared", TaskKind::Workflow, limits, NOW)
        .await
        .unwrap();
    let at = NOW + 1_000;
    let mut ids = Vec::new();
    for i in 0..5 {
        ids.push(claim_at(&store, &format!("w{i}"), at).await.unwrap().unwrap());
    }
    ids.sort();
    assert_eq!(
        ids,
        ["f-0", "f-1", "f-2", "f-3", "r-0"],
        "the rated key's burst of one, the free key's all"
    );
    assert_eq!(held_by(claim_at(&store, "w5", at).await), "fairness_key_dispatch_rate");
    assert_eq!(
        claim_at(&store, "w6", at + 1_000).await.unwrap().as_deref(),
        Some("r-1"),
        "a token a second later"
    );
}

/// Weights an operator gives fairness keys replace those their runs were started with.
pub async fn operator_weights_replace_the_started_ones<S: Store>(store: S) {
    for i in 0..8 {
        start_with(&store, &format!("heavy-{i}"), NOW + i, with(5, Some("heavy"), 1)).await;
        start_with(&store, &format!("light-{i}"), NOW + i, with(5, Some("light"), 1)).await;
    }
    let limits = capstan_engine::flow::QueueLimits {
        fairness_weights: [("heavy".to_string(), 3)].into(),
        ..Default::default()
    };
    store
        .set_queue_limits("default", "shared", TaskKind::Workflow, limits, NOW)
        .await
        .unwrap();
    let first_eight = claimed_ids(&store, 8).await;
    let heavy = first_eight.iter().filter(|id| id.starts_with("heavy")).count();
    assert_eq!(heavy, 6, "operator weights 3:1 share 6:2, got {first_eight:?}");
}

/// A class whose whole backlog arrived after another's deep one is not among the oldest ready
/// tasks a claim reads, yet gets its share: the oldest task of every class with ready work is
/// offered too.
pub async fn a_class_behind_a_deep_backlog_still_gets_its_share<S: Store>(store: S) {
    for i in 0..30 {
        start_with(&store, &format!("deep-{i:02}"), NOW + i, with(5, Some("deep"), 1)).await;
    }
    for i in 0..4 {
        start_with(&store, &format!("late-{i}"), NOW + 100 + i, with(5, Some("late"), 3)).await;
    }
    start_with(&store, "plain", NOW + 200, with(5, None, 1)).await;
    let first = claimed_ids(&store, 8).await;
    let late = first.iter().filter(|id| id.starts_with("late")).count();
    assert_eq!(late, 4, "weights 3:1 give the late class its share at once: {first:?}");
    assert!(first.contains(&"plain".to_string()), "the default class too: {first:?}");
    let deep: Vec<_> = first.iter().filter(|id| id.starts_with("deep")).cloned().collect();
    assert_eq!(deep, ["deep-00", "deep-01", "deep-02"], "a class stays in order: {first:?}");
}

/// With many classes behind a deep backlog, a claim reads the oldest task of only the few the
/// fair order wants next, and every class still gets its turn.
pub async fn many_classes_behind_a_deep_backlog_each_get_a_turn<S: Store>(store: S) {
    for i in 0..20 {
        start_with(&store, &format!("deep-{i:02}"), NOW + i, with(5, Some("deep"), 1)).await;
    }
    for tenant in 0..6 {
        for i in 0..2 {
            start_with(
                &store,
                &format!("t{tenant}-{i}"),
                NOW + 100 + tenant * 10 + i,
                with(5, Some(&format!("t{tenant}")), 1),
            )
            .await;
        }
    }
    let first = claimed_ids(&store, 7).await;
    let classes: std::collections::BTreeSet<&str> = first.iter().map(|id| id.split('-').next().unwrap_or_default()).collect();
    assert_eq!(classes.len(), 7, "seven claims, seven classes: {first:?}");
}
