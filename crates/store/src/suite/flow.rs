//! Flow control: a queue's leased-task cap and dispatch rate hold claims back, change at once,
//! and hold across nodes sharing one database.

use super::{start_request, NOW};
use crate::*;
use capstan_engine::flow::QueueLimits;

async fn backlog<S: Store>(store: &S, queue: &str, count: usize) {
    for i in 0..count {
        store
            .start_workflow(start_request(&format!("{queue}-{i}"), queue), DuplicatePolicy::Fail, NOW)
            .await
            .expect("start");
    }
}

async fn claim<S: Store>(store: &S, queue: &str, owner: &str, now: Millis) -> StoreResult<Option<(Task, RunState)>> {
    store
        .claim_task("default", TaskKind::Workflow, queue, &[], owner, 60_000, now, None)
        .await
}

/// The refusal a held-back claim gets: why, and how soon to look again.
fn held(result: StoreResult<Option<(Task, RunState)>>) -> (String, i64) {
    match result {
        Err(StoreError::Refused(refusal)) if refusal.reason == Reason::TaskQueueThrottled => (
            refusal.details["held_by"].as_str().unwrap_or_default().to_string(),
            refusal.details["retry_after_ms"].as_i64().unwrap_or_default(),
        ),
        other => panic!("expected the claim held back, got {other:?}"),
    }
}

fn cap(leased: u32) -> QueueLimits {
    QueueLimits {
        max_leased_tasks: Some(leased),
        ..QueueLimits::default()
    }
}

/// No more tasks leased at once than the cap; a raised cap and a cleared one take effect for
/// the next claim; another kind or queue is not held.
pub async fn a_leased_task_cap_holds_claims_back<S: Store>(store: S) {
    backlog(&store, "capped", 4).await;
    store
        .set_queue_limits("default", "capped", TaskKind::Workflow, cap(2), NOW)
        .await
        .unwrap();
    assert!(claim(&store, "capped", "w1", NOW).await.unwrap().is_some());
    assert!(claim(&store, "capped", "w2", NOW).await.unwrap().is_some());
    assert_eq!(held(claim(&store, "capped", "w3", NOW).await), ("max_leased_tasks".into(), 250));
    let set = store.queue_limits("default", "capped").await.unwrap();
    assert_eq!((set.len(), set[0].kind, set[0].leased), (1, TaskKind::Workflow, 2));
    assert_eq!(set[0].limits, cap(2));
    // Activity tasks of the queue, and other queues, are not held back.
    assert!(store
        .claim_task("default", TaskKind::Activity, "capped", &[], "a", 60_000, NOW, None)
        .await
        .unwrap()
        .is_none());
    store
        .set_queue_limits("default", "capped", TaskKind::Workflow, cap(3), NOW)
        .await
        .unwrap();
    assert!(claim(&store, "capped", "w3", NOW).await.unwrap().is_some(), "a raised cap at once");
    store
        .set_queue_limits("default", "capped", TaskKind::Workflow, QueueLimits::default(), NOW)
        .await
        .unwrap();
    assert!(store.queue_limits("default", "capped").await.unwrap().is_empty());
    assert!(claim(&store, "capped", "w4", NOW).await.unwrap().is_some(), "a cleared cap at once");
}

/// A rate limit lets its burst through at once, then one lease per interval; a held-back claim
/// is told when the next token is due, and a claim that finds nothing pays nothing.
pub async fn a_dispatch_rate_lets_its_burst_through_then_holds_the_rate<S: Store>(store: S) {
    let limits = QueueLimits {
        dispatch_rate_per_second: Some(2.0),
        dispatch_burst: Some(2),
        ..QueueLimits::default()
    };
    store
        .set_queue_limits("default", "rated", TaskKind::Workflow, limits, NOW)
        .await
        .unwrap();
    assert!(
        claim(&store, "rated", "w0", NOW).await.unwrap().is_none(),
        "nothing to lease costs no token"
    );
    backlog(&store, "rated", 5).await;
    assert!(claim(&store, "rated", "w1", NOW).await.unwrap().is_some());
    assert!(claim(&store, "rated", "w2", NOW).await.unwrap().is_some());
    assert_eq!(held(claim(&store, "rated", "w3", NOW).await), ("dispatch_rate".into(), 500));
    assert_eq!(held(claim(&store, "rated", "w3", NOW + 499).await).1, 1);
    assert!(claim(&store, "rated", "w3", NOW + 500).await.unwrap().is_some());
    assert_eq!(held(claim(&store, "rated", "w4", NOW + 500).await).0, "dispatch_rate");
    assert!(claim(&store, "rated", "w4", NOW + 1_000).await.unwrap().is_some());
}

/// Pollers on two nodes claim one capped queue at once: together they never hold more leases
/// than the cap (the limits row in the database is the only authority).
pub async fn two_nodes_together_keep_a_leased_task_cap<S: Store + Clone>(node_a: S, node_b: S) {
    backlog(&node_a, "shared-cap", 12).await;
    node_a
        .set_queue_limits("default", "shared-cap", TaskKind::Workflow, cap(3), NOW)
        .await
        .unwrap();
    let poll = |store: S, owner: String| {
        tokio::spawn(async move {
            let mut won = 0;
            for _ in 0..6 {
                match claim(&store, "shared-cap", &owner, NOW).await {
                    Ok(Some(_)) => won += 1,
                    Ok(None) => {}
                    Err(StoreError::Refused(refusal)) if refusal.reason == Reason::TaskQueueThrottled => {}
                    Err(other) => panic!("{other:?}"),
                }
            }
            won
        })
    };
    let pollers: Vec<_> = (0..4)
        .map(|i| poll(if i % 2 == 0 { node_a.clone() } else { node_b.clone() }, format!("p{i}")))
        .collect();
    let mut leased = 0;
    for poller in pollers {
        leased += poller.await.unwrap();
    }
    assert_eq!(leased, 3, "exactly the cap leased across both nodes");
    let set = node_b.queue_limits("default", "shared-cap").await.unwrap();
    assert_eq!(set[0].leased, 3);
}

/// A limit set through node A holds claims through node B within a second, although node B
/// had read a moment before that the queue had none.
pub async fn a_limit_set_on_one_node_holds_on_another_within_a_second<S: Store>(node_a: S, node_b: S) {
    backlog(&node_a, "late-cap", 3).await;
    // Node B reads which queues have limits (none yet) on a claim of another queue.
    assert!(claim(&node_b, "elsewhere", "b0", NOW).await.unwrap().is_none());
    node_a
        .set_queue_limits("default", "late-cap", TaskKind::Workflow, cap(1), NOW)
        .await
        .unwrap();
    assert!(claim(&node_a, "late-cap", "a1", NOW).await.unwrap().is_some());
    let later = NOW + crate::limited_queues::REFRESH_MS;
    assert_eq!(held(claim(&node_b, "late-cap", "b1", later).await).0, "max_leased_tasks");
    // A pause set through node A holds on node B within the same second.
    backlog(&node_a, "late-pause", 1).await;
    let record = PauseRecord {
        paused_at: later,
        reason: None,
        principal: None,
    };
    assert!(node_a
        .set_queue_pause("default", "late-pause", TaskKind::Workflow, Some(record), later)
        .await
        .unwrap());
    let after = later + crate::limited_queues::REFRESH_MS;
    assert_eq!(held(claim(&node_b, "late-pause", "b2", after).await).0, "paused");
}

/// A paused kind of a queue's tasks: no claim leases one (the claim is held back, `paused`),
/// the queue's other kind and its limits are untouched, setting or clearing limits keeps the
/// pause, and a resume lets claims through at once.
pub async fn a_paused_queue_kind_leases_nothing_until_resumed<S: Store>(store: S) {
    backlog(&store, "held-q", 2).await;
    let record = PauseRecord {
        paused_at: NOW,
        reason: Some("deploying the workers".into()),
        principal: Some(Principal::token("ops")),
    };
    let pause = |on: bool| store.set_queue_pause("default", "held-q", TaskKind::Workflow, on.then(|| record.clone()), NOW);
    assert!(pause(true).await.unwrap());
    assert!(!pause(true).await.unwrap(), "a paused kind needs nothing");
    assert_eq!(held(claim(&store, "held-q", "w1", NOW).await), ("paused".into(), 1_000));
    let set = store.queue_limits("default", "held-q").await.unwrap();
    assert_eq!((set.len(), set[0].limits.paused.as_ref()), (1, Some(&record)));
    // Limits set and cleared meanwhile leave the pause alone.
    store
        .set_queue_limits("default", "held-q", TaskKind::Workflow, cap(5), NOW)
        .await
        .unwrap();
    assert_eq!(held(claim(&store, "held-q", "w1", NOW).await).0, "paused");
    store
        .set_queue_limits("default", "held-q", TaskKind::Workflow, QueueLimits::default(), NOW)
        .await
        .unwrap();
    assert_eq!(held(claim(&store, "held-q", "w1", NOW).await).0, "paused");
    // The other kind goes on (it has nothing here to lease, and is not held).
    assert!(store
        .claim_task("default", TaskKind::Activity, "held-q", &[], "a", 60_000, NOW, None)
        .await
        .unwrap()
        .is_none());
    // The backlog stays, visible.
    assert_eq!(
        store
            .queue_loads(NOW, 100)
            .await
            .unwrap()
            .iter()
            .find(|l| l.queue == "held-q")
            .map(|l| l.ready),
        Some(2)
    );

    assert!(pause(false).await.unwrap());
    assert!(!pause(false).await.unwrap(), "a running kind needs nothing");
    assert!(
        store.queue_limits("default", "held-q").await.unwrap().is_empty(),
        "no limits, no pause: no row"
    );
    assert!(claim(&store, "held-q", "w1", NOW).await.unwrap().is_some(), "resumed at once");
}
