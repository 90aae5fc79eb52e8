//! Importing closed runs from history bundles: written once, repeats recognised, conflicts and
//! broken bundles refused with nothing written.

use super::*;
use capstan_engine::import::{ImportStamp, ImportedRun, InFlight, CONTRACT_VERSION, IMPORT_SOURCE};

const CHECKSUM: &str = "c0ffee00c0ffee00c0ffee00c0ffee00c0ffee00c0ffee00c0ffee00c0ffee00";

/// A closed run's history as a bundle would carry it, under another instance and run id.
fn as_bundle(
    source: &RunState,
    history: &[HistoryEvent],
    workflow_id: &str,
    run_id: &str,
    run_number: u32,
    dedupe_key: &str,
) -> ImportedRun {
    let stamp = ImportStamp {
        source: IMPORT_SOURCE.into(),
        import_id: format!("import-{run_id}"),
        dedupe_key: dedupe_key.into(),
        contract_version: CONTRACT_VERSION,
        imported_at: NOW + 5,
        source_runtime: "embedded".into(),
        bundle_checksum: CHECKSUM.into(),
        source_namespace: Some("legacy".into()),
        imported_by: None,
    };
    let mut bundle = ImportedRun::copy_of(source, history, WorkflowId(workflow_id.into()), RunId(run_id.into()), stamp);
    bundle.run_number = run_number;
    bundle
}

fn whole() -> InFlight {
    InFlight {
        history_complete: true,
        ..InFlight::default()
    }
}

fn conflict_rule<T: std::fmt::Debug>(result: StoreResult<T>) -> String {
    match result {
        Err(StoreError::Refused(refusal)) if refusal.reason == Reason::ImportRunConflict => {
            refusal.details["rule"].as_str().expect("a rule").to_string()
        }
        other => panic!("expected an import conflict, got {other:?}"),
    }
}

pub async fn imported_closed_runs_are_written_once_and_conflicts_refused<S: Store>(store: S) {
    started(&store, "source", "q").await;
    let done = WorkflowCommand::CompleteWorkflow {
        result: Payload::avro("wwHioz3/VYAiNwwA"),
    };
    let source = complete_next(&store, "q", vec![done]).await;
    assert!(source.is_closed());
    let history = all_history(&store, &source).await;
    let bundle = as_bundle(&source, &history, "moved", "run-moved", 1, "run-moved:4:t");

    // A dry run checks everything and writes nothing.
    let outcome = store.import_run(bundle.clone(), whole(), NOW + 5, true).await.unwrap();
    assert!(matches!(outcome, ImportOutcome::WouldImport(_)), "{outcome:?}");
    let moved = RunLocator::Current(WorkflowId("moved".into()));
    assert!(store.load_run("default", moved.clone()).await.unwrap().is_none());

    let ImportOutcome::Imported(run) = store.import_run(bundle.clone(), whole(), NOW + 5, false).await.unwrap() else {
        panic!("imported")
    };
    assert_eq!(store.load_run("default", moved.clone()).await.unwrap().as_ref(), Some(&run));
    assert_eq!((run.status, run.closed_reason), (source.status, source.closed_reason));
    assert_eq!(run.output, source.output);
    assert_eq!(run.import.as_ref().map(|s| s.dedupe_key.as_str()), Some("run-moved:4:t"));
    assert!(run.tasks.is_empty() && run.workflow_task.is_none(), "a closed run has no open work");
    let copied = all_history(&store, &run).await;
    let facts = |events: &[HistoryEvent]| {
        events
            .iter()
            .map(|e| {
                (
                    e.id.clone(),
                    e.event_type,
                    e.payload.clone(),
                    e.recorded_at,
                    e.workflow_command_id.clone(),
                )
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(facts(&copied), facts(&history), "the history is copied exactly");
    verify_chain_from(CHECKSUM, &copied).expect("re-chained from the bundle's checksum");
    assert_eq!(run.chain_origin, CHECKSUM);

    // The same bundle again is a repeat; another bundle of the run id is a conflict.
    let again = store.import_run(bundle.clone(), whole(), NOW + 9, false).await.unwrap();
    assert!(matches!(again, ImportOutcome::AlreadyImported(ref r) if *r == run), "{again:?}");
    let mut other = bundle.clone();
    other.stamp.dedupe_key = "run-moved:9:later".into();
    assert_eq!(
        conflict_rule(store.import_run(other, whole(), NOW, false).await),
        "target.run_id_conflict"
    );
    let native = as_bundle(&source, &history, "source", "run-source", 1, "k");
    assert_eq!(
        conflict_rule(store.import_run(native, whole(), NOW, false).await),
        "target.run_id_conflict"
    );
    let same_number = as_bundle(&source, &history, "moved", "run-moved-b", 1, "k");
    assert_eq!(
        conflict_rule(store.import_run(same_number, whole(), NOW, false).await),
        "target.run_number_conflict"
    );

    // A later run of the instance becomes its current run; an open run here is not replaced.
    let mut second = as_bundle(&source, &history, "moved", "run-moved-2", 2, "k2");
    second.continued_from_run_id = Some(RunId("run-moved".into()));
    let ImportOutcome::Imported(later) = store.import_run(second, whole(), NOW, false).await.unwrap() else {
        panic!("imported")
    };
    let current = store.load_run("default", moved).await.unwrap().expect("current");
    assert_eq!(current.run_id, later.run_id);
    assert_eq!(store.runs_of("default", &WorkflowId("moved".into())).await.unwrap().len(), 2);
    started(&store, "busy", "q").await;
    let over_open = as_bundle(&source, &history, "busy", "run-busy-2", 2, "k3");
    assert_eq!(
        conflict_rule(store.import_run(over_open, whole(), NOW, false).await),
        "target.instance_open"
    );

    // A bundle that breaks a rule is refused by it, and nothing is written.
    let incomplete = as_bundle(&source, &history, "partial", "run-partial", 1, "k4");
    let refused = store.import_run(incomplete, InFlight::default(), NOW, false).await;
    assert_eq!(reason(refused), Reason::ImportRejected);
    let partial = RunLocator::Current(WorkflowId("partial".into()));
    assert!(store.load_run("default", partial).await.unwrap().is_none());
}

/// An open run goes on from the state its source kept, as its instance's current run; it may
/// not go on beside a later run of its instance.
pub async fn an_open_run_is_imported_from_its_carried_state_as_the_current_run<S: Store>(store: S) {
    let source = started(&store, "open-source", "q").await;
    let history = all_history(&store, &source).await;
    let carried = |workflow_id: &str, run_id: &str| {
        let mut state = source.clone();
        state.workflow_id = WorkflowId(workflow_id.into());
        state.run_id = RunId(run_id.into());
        // Task ids are global: the copy in this same store goes on without the source's.
        state.tasks.clear();
        state.workflow_task = None;
        let mut bundle = as_bundle(&source, &history, workflow_id, run_id, 1, "open:1");
        bundle.carried_state = Some(Box::new(state));
        bundle
    };
    let ImportOutcome::Imported(run) = store
        .import_run(carried("moved-open", "run-moved-open"), whole(), NOW, false)
        .await
        .unwrap()
    else {
        panic!("imported")
    };
    assert!(!run.is_closed());
    assert_eq!(run.chain_origin, CHECKSUM);
    let current = store
        .load_run("default", RunLocator::Current(WorkflowId("moved-open".into())))
        .await
        .unwrap()
        .expect("current");
    assert_eq!(current.run_id, run.run_id);
    verify_chain_from(CHECKSUM, &all_history(&store, &run).await).expect("re-chained from the bundle's checksum");

    // An instance here whose run 2 has closed: the open run 1 may not go on beside it.
    let done = WorkflowCommand::CompleteWorkflow {
        result: Payload::avro("wwHioz3/VYAiNwwA"),
    };
    started(&store, "closed-source", "q2").await;
    let closed = complete_next(&store, "q2", vec![done]).await;
    let closed_history = all_history(&store, &closed).await;
    let later = as_bundle(&closed, &closed_history, "two-runs", "run-two-2", 2, "two:2");
    store.import_run(later, whole(), NOW, false).await.unwrap();
    assert_eq!(
        conflict_rule(store.import_run(carried("two-runs", "run-two-1"), whole(), NOW, false).await),
        "target.newer_run_present"
    );
}
