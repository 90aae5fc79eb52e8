//! What several nodes on one shared database must show, whatever the database: run by each
//! shared backend's test file with two stores on one database (`node_a`, `node_b`).

use super::{start_request, NOW};
use crate::*;
use std::time::Duration;

/// A task made ready through node A wakes pollers listening on node B (PostgreSQL: NOTIFY;
/// MySQL: the wake-up log), within half a second of one of a few starts.
pub async fn a_ready_task_on_one_node_wakes_pollers_on_another<S: Store>(node_a: S, node_b: S) {
    let mut wakeups = node_b.wakeups().await.unwrap().expect("a shared database publishes wake-ups");
    // Give the listener a moment to subscribe, then prove it hears a start on node A.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let mut started = 0;
    loop {
        node_a
            .start_workflow(start_request(&format!("wake-{started}"), "wake-q"), DuplicatePolicy::Fail, NOW)
            .await
            .unwrap();
        started += 1;
        match tokio::time::timeout(Duration::from_millis(500), wakeups.recv()).await {
            Ok(Some((namespace, kind, queue))) => {
                assert_eq!(
                    (namespace.as_str(), kind, queue.as_str()),
                    ("default", TaskKind::Workflow, "wake-q")
                );
                break;
            }
            _ if std::time::Instant::now() < deadline => continue,
            _ => panic!("no wake-up reached node B after {started} starts on node A"),
        }
    }
}

/// Pollers on two nodes drain one queue: every task leased, none twice.
pub async fn two_nodes_never_lease_one_task_twice<S: Store + Clone>(node_a: S, node_b: S) {
    for i in 0..20 {
        node_a
            .start_workflow(start_request(&format!("race-{i}"), "race-q"), DuplicatePolicy::Fail, NOW)
            .await
            .unwrap();
    }
    let poll = |store: S, owner: &'static str| {
        tokio::spawn(async move {
            let mut won = Vec::new();
            while let Some((task, _)) = store
                .claim_task("default", TaskKind::Workflow, "race-q", &[], owner, 60_000, NOW, None)
                .await
                .unwrap()
            {
                won.push(task.id);
            }
            won
        })
    };
    let (a, b) = (poll(node_a.clone(), "a"), poll(node_b.clone(), "b"));
    let (a, b) = (a.await.unwrap(), b.await.unwrap());
    let mut all: Vec<_> = a.iter().chain(b.iter()).cloned().collect();
    assert_eq!(all.len(), 20, "every task leased");
    all.sort();
    all.dedup();
    assert_eq!(all.len(), 20, "no task leased twice");
}

/// A transaction abandoned before COMMIT (a refused transition) is rolled back before its
/// connection serves anyone else: no run lock outlives it. Node A refuses transitions of a run
/// (each had locked the run row); node B, on connections of its own, must then get the lock
/// at once, each time.
pub async fn an_abandoned_transaction_is_rolled_back_before_its_connection_is_reused<S: Store>(node_a: S, node_b: S) {
    let (_, run) = node_a
        .start_workflow(start_request("abandoned", "abandoned-q"), DuplicatePolicy::Fail, NOW)
        .await
        .unwrap();
    let locator = || RunLocator::Current(run.workflow_id.clone());
    for _ in 0..3 {
        let refused = node_a
            .mutate_run("default", locator(), NOW, |_, _| {
                Err::<(), _>(Refusal::new(Reason::RunClosed, "refused on purpose"))
            })
            .await;
        assert!(matches!(refused, Err(StoreError::Refused(_))), "{refused:?}");
        let started = std::time::Instant::now();
        node_b
            .mutate_run("default", locator(), NOW, |_, _| Ok(()))
            .await
            .expect("the run's lock is free");
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "node B waited on a lock node A abandoned"
        );
    }
}
