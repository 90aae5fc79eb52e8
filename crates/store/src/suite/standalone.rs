//! Standalone activities' host runs: an id is taken while its activity is open, reusable once
//! it ended, and never shared with a workflow or another namespace.

use super::*;

fn standalone(activity_id: &str, namespace: &str, run: &str) -> StartStandaloneActivity {
    StartStandaloneActivity {
        run: StartRun {
            scheduling: Default::default(),
            namespace: namespace.into(),
            run_id: RunId(run.into()),
            command_id: CommandId(format!("cmd-{run}")),
            ..start_request(activity_id, "q")
        },
        activity_type: "suite.activity".into(),
        activity_class: "suite.activity".into(),
        retry_policy: None,
        timeouts: ActivityTimeouts::default(),
    }
}

pub async fn standalone_activities_hold_their_id_until_they_end<S: Store>(store: S) {
    let first = store
        .start_standalone_activity(standalone("act", "default", "run-a"), NOW)
        .await
        .unwrap();
    assert_eq!((first.run_number, first.workflow_type.as_str()), (1, STANDALONE_ACTIVITY_TYPE));
    let (_, claimed) = store
        .claim_task("default", TaskKind::Activity, "q", &[], "w", 60_000, NOW, None)
        .await
        .unwrap()
        .expect("the activity task is ready at once");
    assert_eq!(claimed.run_id, first.run_id);
    let none = store
        .claim_task("default", TaskKind::Workflow, "q", &[], "w", 60_000, NOW, None)
        .await
        .unwrap();
    assert!(none.is_none(), "a host run has no workflow task");
    let again = store.start_standalone_activity(standalone("act", "default", "run-b"), NOW).await;
    assert_eq!(reason(again), Reason::ValidationFailed, "taken while its activity is open");
    let elsewhere = store.start_standalone_activity(standalone("act", "other", "run-c"), NOW).await;
    assert_eq!(reason(elsewhere), Reason::ActivityIdReservedInNamespace);
    store
        .mutate_run("default", RunLocator::Current(first.workflow_id.clone()), NOW, |run, cx| {
            close_by_command(run, cx, CloseCommand::Cancel, None, "c".into())
        })
        .await
        .unwrap();
    let second = store
        .start_standalone_activity(standalone("act", "default", "run-d"), NOW + 1)
        .await
        .unwrap();
    assert_eq!(second.run_number, 2);
    let current = store
        .load_run("default", RunLocator::Current(first.workflow_id.clone()))
        .await
        .unwrap()
        .expect("current");
    assert_eq!(current.run_id, second.run_id);
    assert_eq!(store.runs_of("default", &first.workflow_id).await.unwrap().len(), 2);
    started(&store, "wf", "q").await;
    let over_workflow = store.start_standalone_activity(standalone("wf", "default", "run-e"), NOW).await;
    assert_eq!(reason(over_workflow), Reason::ValidationFailed);
}

pub async fn concurrent_starts_of_one_activity_id_start_it_once<S: Store + Clone>(store: S) {
    let starts = (0..6).map(|i| {
        let store = store.clone();
        async move {
            store
                .start_standalone_activity(standalone("race", "default", &format!("run-{i}")), NOW)
                .await
        }
    });
    let results = futures_join(starts.collect()).await;
    assert_eq!(results.iter().filter(|r| r.is_ok()).count(), 1, "{results:?}");
    for refused in results.into_iter().filter(Result::is_err) {
        assert_eq!(reason(refused), Reason::ValidationFailed);
    }
    assert_eq!(store.runs_of("default", &WorkflowId("race".into())).await.unwrap().len(), 1);
}
