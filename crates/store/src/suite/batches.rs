//! Batch operations' rows: created once per request id and at most so many running at once,
//! claimed by one node at a time under a duty fence (a live claim skipped, an expired one taken
//! over with a higher fence), advanced only under the fence that claimed it, cancelled.

use super::NOW;
use crate::*;
use serde_json::json;

fn batch(id: &str, request_id: Option<&str>) -> BatchOperation {
    BatchOperation {
        namespace: "default".into(),
        batch_id: id.into(),
        action: "terminate".into(),
        request: json!({"action": "terminate", "query": "x"}),
        state: "running".into(),
        progress: json!({"matched": 0}),
        principal: Some(Principal::token("ops")),
        request_id: request_id.map(str::to_string),
        created_at: NOW,
        updated_at: NOW,
        finished_at: None,
        next_step_at: NOW,
    }
}

pub async fn batch_operations_are_claimed_under_a_fence_advanced_and_cancelled<S: Store>(store: S) {
    let (first, created) = store.create_batch(batch("b-1", Some("req-1")), 2).await.unwrap();
    assert!(created);
    assert_eq!(first, batch("b-1", Some("req-1")));
    // A repeat of the request id is the first batch.
    let (again, created) = store.create_batch(batch("b-other", Some("req-1")), 2).await.unwrap();
    assert!(!created);
    assert_eq!(again.batch_id, "b-1");
    store.create_batch(batch("b-2", None), 2).await.unwrap();
    let refused = store.create_batch(batch("b-3", None), 2).await.unwrap_err();
    assert!(
        matches!(&refused, StoreError::Refused(r) if r.reason == Reason::BatchOperationsExhausted),
        "{refused:?}"
    );
    let listed: Vec<String> = store
        .batches("default", 10)
        .await
        .unwrap()
        .into_iter()
        .map(|b| b.batch_id)
        .collect();
    assert_eq!(listed.len(), 2);
    assert_eq!(store.next_batch_step().await.unwrap(), Some(NOW));

    // One node claims; another skips the held batch and takes the other one.
    let (claimed, fence) = store.claim_batch("node-a", NOW, 1_000).await.unwrap().expect("a due batch");
    assert_eq!(fence, 1);
    let (other, _) = store.claim_batch("node-b", NOW, 1_000).await.unwrap().expect("the other batch");
    assert_ne!(other.batch_id, claimed.batch_id);
    assert!(store.claim_batch("node-c", NOW, 1_000).await.unwrap().is_none(), "both are held");

    // Node A pauses past its hold: node B takes its batch over with a higher fence, and A's
    // late step saves nothing.
    let (taken, taken_fence) = store
        .claim_batch("node-b", NOW + 1_000, 1_000)
        .await
        .unwrap()
        .expect("expired hold");
    assert_eq!((taken.batch_id.as_str(), taken_fence), (claimed.batch_id.as_str(), 2));
    let late = BatchStep {
        batch_id: claimed.batch_id.clone(),
        fence,
        progress: json!({"matched": 99}),
        next_step_at: NOW + 1_000,
        finished: None,
    };
    let refused = store.advance_batch(late, NOW + 1_000).await.unwrap_err();
    assert!(
        matches!(&refused, StoreError::Refused(r) if r.reason == Reason::StaleFence),
        "{refused:?}"
    );
    let step = BatchStep {
        batch_id: claimed.batch_id.clone(),
        fence: taken_fence,
        progress: json!({"matched": 5}),
        next_step_at: NOW + 5_000,
        finished: None,
    };
    store.advance_batch(step, NOW + 1_000).await.unwrap();
    let saved = store.batch("default", &claimed.batch_id).await.unwrap().unwrap();
    assert_eq!(
        (saved.progress, saved.next_step_at, saved.state.as_str()),
        (json!({"matched": 5}), NOW + 5_000, "running")
    );
    // The other batch's holder (node B) let its hold run out: node C takes it over. Then it is
    // cancelled: node C's step saves nothing, and nothing claims it again.
    let (retaken, retaken_fence) = store
        .claim_batch("node-c", NOW + 2_000, 1_000)
        .await
        .unwrap()
        .expect("the expired other");
    assert_eq!((retaken.batch_id.as_str(), retaken_fence), (other.batch_id.as_str(), 2));
    assert!(
        store.claim_batch("node-a", NOW + 2_000, 1_000).await.unwrap().is_none(),
        "the first is not due yet"
    );
    let cancelled = store.cancel_batch("default", &other.batch_id, NOW + 2_000).await.unwrap().unwrap();
    assert_eq!(cancelled.state, "cancelled");
    let after_cancel = BatchStep {
        batch_id: other.batch_id.clone(),
        fence: retaken_fence,
        progress: json!({}),
        next_step_at: NOW,
        finished: None,
    };
    assert!(store.advance_batch(after_cancel, NOW + 2_000).await.is_err());

    // The last step completes the first; a cancel then changes nothing.
    let (due, fence) = store.claim_batch("node-a", NOW + 5_000, 1_000).await.unwrap().expect("due again");
    assert_eq!(due.batch_id, claimed.batch_id);
    let last = BatchStep {
        batch_id: claimed.batch_id.clone(),
        fence,
        progress: json!({"matched": 7}),
        next_step_at: NOW + 5_000,
        finished: Some("completed".into()),
    };
    store.advance_batch(last, NOW + 5_000).await.unwrap();
    let done = store
        .cancel_batch("default", &claimed.batch_id, NOW + 6_000)
        .await
        .unwrap()
        .unwrap();
    assert_eq!((done.state.as_str(), done.finished_at), ("completed", Some(NOW + 5_000)));
    assert!(store.claim_batch("node-a", NOW + 60_000, 1_000).await.unwrap().is_none());
    assert_eq!(store.next_batch_step().await.unwrap(), None);
    assert!(store.cancel_batch("default", "nope", NOW).await.unwrap().is_none());
    assert!(store.batch("elsewhere", &other.batch_id).await.unwrap().is_none(), "per namespace");
}

/// A delete step's instances go in the transaction that saves its progress, under its fence:
/// a stale step deletes nothing, and so does one whose page changed (a run still open).
pub async fn a_delete_step_removes_its_closed_instances_with_its_progress<S: Store>(store: S) {
    for id in ["gone-1", "gone-2", "still-open"] {
        super::started(&store, id, "q").await;
    }
    for id in ["gone-1", "gone-2"] {
        store
            .mutate_run("default", RunLocator::Current(WorkflowId(id.into())), NOW, |run, cx| {
                close_by_command(run, cx, CloseCommand::Terminate, None, "c".into())
            })
            .await
            .unwrap();
    }
    let deletion = |id: &str| AuditEvent {
        audit_id: format!("delete-{id}"),
        namespace: "default".into(),
        workflow_id: id.into(),
        run_id: Some(format!("run-{id}")),
        action: "workflow.delete".into(),
        principal: Some(Principal::token("admin")),
        recorded_at: NOW,
        detail: Default::default(),
    };
    let mut delete_batch = batch("b-delete", None);
    delete_batch.action = "delete".into();
    store.create_batch(delete_batch, 2).await.unwrap();
    let (_, fence) = store.claim_batch("node-a", NOW, 1_000).await.unwrap().expect("due");
    let step = |fence: u64, matched: u64| BatchStep {
        batch_id: "b-delete".into(),
        fence,
        progress: json!({"matched": matched}),
        next_step_at: NOW,
        finished: None,
    };

    let stale = store
        .advance_batch_deleting(step(fence - 1, 9), NOW, vec![deletion("gone-1")])
        .await
        .unwrap_err();
    assert!(
        matches!(&stale, StoreError::Refused(r) if r.reason == Reason::StaleFence),
        "{stale:?}"
    );
    let changed = store
        .advance_batch_deleting(step(fence, 9), NOW, vec![deletion("gone-1"), deletion("still-open")])
        .await
        .unwrap_err();
    assert!(
        matches!(&changed, StoreError::Refused(r) if r.reason == Reason::RunNotClosed),
        "{changed:?}"
    );
    assert!(exists(&store, "gone-1").await, "a refused step deletes nothing");
    let saved = store.batch("default", "b-delete").await.unwrap().unwrap();
    assert_eq!(saved.progress, json!({"matched": 0}), "nor saves its progress");

    store
        .advance_batch_deleting(step(fence, 2), NOW, vec![deletion("gone-1"), deletion("gone-2")])
        .await
        .unwrap();
    assert!(!exists(&store, "gone-1").await && !exists(&store, "gone-2").await);
    assert!(exists(&store, "still-open").await);
    let saved = store.batch("default", "b-delete").await.unwrap().unwrap();
    assert_eq!(saved.progress, json!({"matched": 2}));
    assert!(store.history(&RunId("run-gone-1".into()), 0, 100, 100).await.unwrap().is_empty());
    // What is kept of a deleted instance is who deleted it.
    let trail = store.audit_events("default", "gone-1", None, 10).await.unwrap();
    assert_eq!(
        trail.iter().map(|e| (e.action.as_str(), e.principal.clone())).collect::<Vec<_>>(),
        [("workflow.delete", Some(Principal::token("admin")))]
    );
    // The id is free again.
    super::started(&store, "gone-1", "q").await;
}

async fn exists<S: Store>(store: &S, workflow_id: &str) -> bool {
    store
        .load_run("default", RunLocator::Current(WorkflowId(workflow_id.into())))
        .await
        .unwrap()
        .is_some()
}
