//! Run counts kept in the transactions that change them: every count the API reads from them
//! equals a full count, through starts, closes, continue-as-new and retention. (Every other
//! check of the suite ends with the same comparison: `run_counts_are_exact`.)

use super::*;

/// Counts by bucket of the current runs, from the kept counts (a type and queue filter only)
/// and from a full count (a substring filter every run matches).
async fn both_ways<S: Store>(store: &S, workflow_type: Option<&str>) -> (RunCounts, RunCounts) {
    let kept = ListFilter {
        workflow_type: workflow_type.map(str::to_string),
        ..ListFilter::default()
    };
    let counted = ListFilter {
        query: Some(String::new()),
        ..kept.clone()
    };
    (
        store.count_runs("default", kept).await.unwrap(),
        store.count_runs("default", counted).await.unwrap(),
    )
}

fn counts(running: u64, completed: u64, failed: u64) -> RunCounts {
    RunCounts {
        running,
        completed,
        failed,
        paused: 0,
        at_least: false,
    }
}

async fn runs_by_status<S: Store>(store: &S) -> Vec<(String, i64)> {
    store.system_counts("default", NOW).await.unwrap().runs_by_status
}

pub async fn run_counts_follow_every_change_and_can_be_rebuilt<S: Store>(store: S) {
    for id in ["c-done", "c-ended", "c-next", "c-open"] {
        started(&store, id, "q").await;
    }
    let mut other = start_request("c-other", "elsewhere");
    other.workflow_type = "suite.other".into();
    store.start_workflow(other, DuplicatePolicy::Fail, NOW).await.unwrap();
    let (kept, counted) = both_ways(&store, None).await;
    assert_eq!((kept, counted), (counts(5, 0, 0), counts(5, 0, 0)));
    assert_eq!(both_ways(&store, Some("suite.other")).await.0, counts(1, 0, 0));

    // A completion, a termination, and a continue-as-new (its successor is current and open).
    let done = WorkflowCommand::CompleteWorkflow {
        result: Payload::avro("wwHioz3/VYAiNwwA"),
    };
    let closed = complete_next(&store, "q", vec![done]).await;
    assert!(closed.is_closed());
    let terminated = store
        .mutate_run("default", RunLocator::Current(WorkflowId("c-ended".into())), NOW, |run, cx| {
            close_by_command(run, cx, CloseCommand::Terminate, None, "t".into())
        })
        .await
        .unwrap()
        .1;
    let continued = WorkflowCommand::ContinueAsNew {
        arguments: Payload::avro("wwHioz3/VYAiNwwA"),
        workflow_type: None,
        queue: None,
        tags: Default::default(),
        observability_context: None,
    };
    let before = complete_next(&store, "q", vec![continued]).await;
    assert!(before.is_closed());
    let (kept, counted) = both_ways(&store, Some("suite.workflow")).await;
    assert_eq!(kept, counted);
    assert_eq!(
        kept,
        counts(2, 1, 1),
        "the successor is open and current; its predecessor is not current"
    );
    assert_eq!(
        runs_by_status(&store).await,
        [
            ("completed".to_string(), 2),
            ("running".to_string(), 3),
            ("terminated".to_string(), 1)
        ],
        "every run, current or not"
    );
    assert!(store.run_count_drift(Some("default")).await.unwrap().is_empty());

    // Retention takes an instance's runs out of the counts with it.
    let cutoff = NOW + 1;
    let pruned = store
        .prune_instances("default", vec![terminated.workflow_id.as_str().to_string()], cutoff)
        .await
        .unwrap();
    assert_eq!(pruned, 1);
    assert_eq!(both_ways(&store, None).await.0, counts(3, 1, 0));
    assert_eq!(
        runs_by_status(&store).await,
        [("completed".to_string(), 2), ("running".to_string(), 3)]
    );
    // Exact counts: nothing to rebuild.
    assert_eq!(store.recount_runs(None).await.unwrap(), 0);
    assert_eq!(store.recount_runs(Some("default")).await.unwrap(), 0);
}
