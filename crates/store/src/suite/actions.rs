//! Suite checks of declared and atomic actions: the ledger written in the claim transaction,
//! and atomic handlers committing or rolling back with their completion.

use super::*;

pub async fn declared_actions_are_ledgered_in_the_claim_transaction<S: Store>(store: S) {
    let document = |marker: i64| {
        json!({"recovery_mode": "non_atomic", "marker": marker})
            .as_object()
            .unwrap()
            .clone()
    };
    let first = store
        .put_action_definition("default", "suite.activity", RecoveryMode::NonAtomic, document(1), NOW)
        .await
        .unwrap();
    assert_eq!(first.version, 1);
    let same = store
        .put_action_definition("default", "suite.activity", RecoveryMode::NonAtomic, document(1), NOW + 1)
        .await
        .unwrap();
    assert_eq!(
        (same.version, &same.definition_hash),
        (1, &first.definition_hash),
        "same content, same version"
    );
    assert!(
        store.action_definitions("other").await.unwrap().is_empty(),
        "definitions are namespaced"
    );

    started(&store, "ledgered", "q").await;
    complete_next(&store, "q", vec![activity()]).await;
    let (task, run) = store
        .claim_task("default", TaskKind::Activity, "q", &[], "a", 60_000, NOW, None)
        .await
        .unwrap()
        .expect("dispatched");
    let entries = store.ledger_entries("default", LedgerFilter::default(), 10).await.unwrap();
    assert_eq!(entries.len(), 1, "the entry committed with the claim");
    assert_eq!(entries[0].state, LedgerState::Dispatched);
    assert_eq!(entries[0].definition_hash, first.definition_hash);
    assert_eq!(
        store.ledger_entry("default", &entries[0].ledger_key).await.unwrap().as_ref(),
        Some(&entries[0])
    );
    assert!(store.ledger_entry("other", &entries[0].ledger_key).await.unwrap().is_none());

    // The worker's failure leaves the outcome unknown; filters find it.
    let TaskDetail::Activity {
        attempt_id: Some(attempt), ..
    } = task.detail.clone()
    else {
        panic!("no attempt")
    };
    let id = task.id.clone();
    store
        .mutate_run("default", RunLocator::Task(id.clone()), NOW, move |run, cx| {
            fail_activity(
                run,
                cx,
                &id,
                &attempt,
                "a",
                ActivityFailure {
                    message: "lost".into(),
                    ..Default::default()
                },
            )
        })
        .await
        .unwrap();
    let unknown = LedgerFilter {
        state: Some(LedgerState::OutcomeUnknown),
        workflow_id: Some("ledgered".into()),
        activity_type: Some("suite.activity".into()),
    };
    assert_eq!(store.ledger_entries("default", unknown, 10).await.unwrap().len(), 1);
    let checkpoints = store.ledger_checkpoints("default", &run.workflow_id).await.unwrap();
    assert_eq!(checkpoints.len(), 2);
    assert_eq!(ledger::verify_checkpoints(&checkpoints), Ok(()));

    // A definition changed before the next dispatch refuses it.
    let second = store
        .put_action_definition("default", "suite.activity", RecoveryMode::NonAtomic, document(2), NOW)
        .await
        .unwrap();
    assert_eq!(second.version, 2);
    started(&store, "changed", "q2").await;
    // Scheduling pins the definition in force (the server hands it to the transition).
    let (task, _) = store
        .claim_task("default", TaskKind::Workflow, "q2", &[], "w", 60_000, NOW, None)
        .await
        .unwrap()
        .expect("a workflow task");
    let catalog: std::collections::BTreeMap<String, ActionDefinition> = store
        .action_definitions("default")
        .await
        .unwrap()
        .into_iter()
        .map(|d| (d.activity_type.clone(), d))
        .collect();
    let (id, fence) = (task.id.clone(), task.fence);
    store
        .mutate_run("default", RunLocator::Task(id.clone()), NOW, move |run, cx| {
            cx.actions = Some(std::sync::Arc::new(catalog));
            complete_workflow_task(run, cx, &id, "w", fence, vec![activity()])
        })
        .await
        .unwrap();
    store
        .put_action_definition("default", "suite.activity", RecoveryMode::NonAtomic, document(3), NOW)
        .await
        .unwrap();
    assert!(store
        .claim_task("default", TaskKind::Activity, "q2", &[], "a", 60_000, NOW, None)
        .await
        .unwrap()
        .is_none());
    let changed = store
        .load_run("default", RunLocator::Current(WorkflowId("changed".into())))
        .await
        .unwrap()
        .unwrap();
    let failed = all_history(&store, &changed)
        .await
        .into_iter()
        .find(|e| e.event_type == EventType::ActivityFailed)
        .unwrap();
    assert_eq!(failed.payload["exception_type"], json!("definition_changed"));
}

/// A probe starts in the transaction that makes an outcome unknown, and its answer resolves the
/// entry in the transaction that closes the probe's host run.
pub async fn a_probe_answer_resolves_its_entry_where_the_probe_closes<S: Store>(store: S) {
    let store = store.with_payload_codec(&JSON_CODEC);
    let document = json!({"recovery_mode": "non_atomic", "probe": {"activity_type": "suite.lookup"}});
    store
        .put_action_definition(
            "default",
            "suite.activity",
            RecoveryMode::NonAtomic,
            document.as_object().unwrap().clone(),
            NOW,
        )
        .await
        .unwrap();
    started(&store, "probed", "pq").await;
    complete_next(&store, "pq", vec![activity()]).await;
    let report = |kind: &'static str, answer: Value| {
        let store = &store;
        async move {
            let (task, run) = store
                .claim_task("default", TaskKind::Activity, "pq", &[], "a", 60_000, NOW, None)
                .await
                .unwrap()
                .expect("an activity task");
            let TaskDetail::Activity {
                attempt_id: Some(attempt), ..
            } = task.detail.clone()
            else {
                panic!("no attempt")
            };
            let id = task.id.clone();
            store
                .mutate_run("default", RunLocator::Task(id.clone()), NOW, move |run, cx| match kind {
                    "fail" => fail_activity(run, cx, &id, &attempt, "a", ActivityFailure::default()),
                    _ => complete_activity(run, cx, &id, &attempt, "a", Payload::avro(answer.to_string())),
                })
                .await
                .unwrap();
            run
        }
    };
    let action = report("fail", Value::Null).await;
    let (entry,) = (store.ledger_entries("default", LedgerFilter::default(), 10).await.unwrap()[0].clone(),);
    assert_eq!(entry.state, LedgerState::OutcomeUnknown);
    let probe_id = capstan_engine::ledger_probe::probe_workflow_id(&entry.ledger_key);
    assert_eq!(
        entry.probe.as_ref().unwrap()["workflow_id"],
        json!(probe_id),
        "started with the unknown outcome"
    );

    let answer = json!({"outcome": "found", "evidence": {"provider_ref": "r-1"}, "result": {"ok": true}});
    let probe = report("complete", answer).await;
    assert_eq!(probe.workflow_id, probe_id, "the probe's task is on the action's queue");
    let resolved = store.ledger_entry("default", &entry.ledger_key).await.unwrap().unwrap();
    assert_eq!(resolved.state, LedgerState::EffectConfirmed, "resolved where the probe closed");
    assert_eq!(resolved.resolution.unwrap()["principal"], json!("probe:suite.lookup"));
    let history = all_history(&store, &action).await;
    let completed = history.iter().find(|e| e.event_type == EventType::ActivityCompleted).unwrap();
    assert_eq!(completed.payload["result"], json!(r#"{"ok":true}"#));
    let probe = store.load_run("default", RunLocator::Current(probe_id)).await.unwrap().unwrap();
    assert_eq!(probe.status, RunStatus::Completed);
    let checkpoints = store.ledger_checkpoints("default", &action.workflow_id).await.unwrap();
    assert_eq!(checkpoints.len(), 3);
    assert_eq!(ledger::verify_checkpoints(&checkpoints), Ok(()));
}

/// Defines `suite.credit` as an atomic action; the catalog a scheduling transition pins.
async fn define_credit<S: Store>(store: &S) -> std::sync::Arc<std::collections::BTreeMap<String, ActionDefinition>> {
    store
        .put_action_definition(
            "default",
            "suite.credit",
            RecoveryMode::Atomic,
            json!({"recovery_mode": "atomic"}).as_object().unwrap().clone(),
            NOW,
        )
        .await
        .unwrap();
    let catalog = store.action_definitions("default").await.unwrap().into_iter();
    std::sync::Arc::new(catalog.map(|d| (d.activity_type.clone(), d)).collect())
}

/// Starts `workflow` on a queue of its name and has its first workflow task schedule
/// `suite.credit` with `arguments` (two attempts at most).
async fn schedule_credit<S: Store>(
    store: &S,
    workflow: &str,
    arguments: Value,
    catalog: &std::sync::Arc<std::collections::BTreeMap<String, ActionDefinition>>,
) {
    started(store, workflow, workflow).await;
    let (task, _) = store
        .claim_task("default", TaskKind::Workflow, workflow, &[], "w", 60_000, NOW, None)
        .await
        .unwrap()
        .expect("a workflow task");
    let commands = vec![WorkflowCommand::ScheduleActivity(ScheduleActivity {
        activity_type: "suite.credit".into(),
        arguments: Payload::avro(arguments.to_string()),
        queue: None,
        retry_policy: Some(RetryPolicy {
            max_attempts: Some(2),
            backoff_seconds: vec![0],
            non_retryable_error_types: vec![],
        }),
        timeouts: ActivityTimeouts::default(),
        tags: Map::new(),
        cancellation_policy: None,
        worker_session: None,
    })];
    let (id, fence, catalog) = (task.id.clone(), task.fence, catalog.clone());
    store
        .mutate_run("default", RunLocator::Task(id.clone()), NOW, move |run, cx| {
            cx.actions = Some(catalog);
            complete_workflow_task(run, cx, &id, "w", fence, commands)
        })
        .await
        .unwrap();
}

pub async fn atomic_actions_commit_or_roll_back_with_their_completion<S: Store>(store: S) {
    let catalog = define_credit(&store).await;
    let actions = AtomicActions::new([(
        "suite.credit".to_string(),
        std::sync::Arc::new(Credit) as std::sync::Arc<dyn AtomicAction>,
    )]);
    for (workflow, fail) in [("atomic-ok", false), ("atomic-fails", true)] {
        schedule_credit(
            &store,
            workflow,
            json!([{"account": workflow, "amount": 5, "fail": fail}]),
            &catalog,
        )
        .await;
        assert!(
            store
                .claim_task("default", TaskKind::Activity, workflow, &[], "a", 60_000, NOW, None)
                .await
                .unwrap()
                .is_none(),
            "no worker ever sees an atomic task"
        );
    }
    let mut outcomes = Vec::new();
    while let Some(outcome) = store.run_atomic_task("default", actions.clone(), &JSON_CODEC, NOW).await.unwrap() {
        outcomes.push(outcome);
    }
    // One success; the failing one fails twice (its policy allows two attempts), then stops.
    assert_eq!(outcomes.len(), 3, "{outcomes:?}");
    assert!(matches!(&outcomes[0], AtomicOutcome::Completed { workflow_id } if workflow_id.as_str() == "atomic-ok"));
    assert!(outcomes[1..].iter().all(|o| matches!(o, AtomicOutcome::Failed { .. })));
    let ok = store
        .load_run("default", RunLocator::Current(WorkflowId("atomic-ok".into())))
        .await
        .unwrap()
        .unwrap();
    let completed = all_history(&store, &ok)
        .await
        .into_iter()
        .find(|e| e.event_type == EventType::ActivityCompleted)
        .unwrap();
    assert_eq!(
        completed.payload["result"],
        json!(json!({"credited": 5}).to_string()),
        "the handler read its own write"
    );
    let failed = store
        .load_run("default", RunLocator::Current(WorkflowId("atomic-fails".into())))
        .await
        .unwrap()
        .unwrap();
    let history = all_history(&store, &failed).await;
    assert_eq!(
        history.iter().filter(|e| e.event_type == EventType::ActivityRetryScheduled).count(),
        1
    );
    assert_eq!(history.iter().filter(|e| e.event_type == EventType::ActivityFailed).count(), 1);
    // The failed attempts' inserts were rolled back: a probe sees only the successful account.
    struct Probe;
    impl AtomicAction for Probe {
        fn run(&self, tx: &mut dyn AtomicTransaction, _: &Value) -> Result<Value, String> {
            let rows = tx.query("SELECT account FROM suite_balances ORDER BY account", &[])?;
            Ok(json!(rows))
        }
    }
    schedule_credit(
        &store,
        "atomic-probe",
        json!([{"account": "probe", "amount": 5, "fail": false}]),
        &catalog,
    )
    .await;
    let probe = AtomicActions::new([(
        "suite.credit".to_string(),
        std::sync::Arc::new(Probe) as std::sync::Arc<dyn AtomicAction>,
    )]);
    store.run_atomic_task("default", probe, &JSON_CODEC, NOW).await.unwrap().unwrap();
    let run = store
        .load_run("default", RunLocator::Current(WorkflowId("atomic-probe".into())))
        .await
        .unwrap()
        .unwrap();
    let seen = all_history(&store, &run)
        .await
        .into_iter()
        .find(|e| e.event_type == EventType::ActivityCompleted)
        .unwrap();
    assert_eq!(seen.payload["result"], json!(json!([["atomic-ok"]]).to_string()));
}

/// A handler that succeeds with an answer the codec cannot record fails its attempt, and its
/// writes roll back with it: they never commit beside a failed (so retried) attempt.
pub async fn an_atomic_answer_that_cannot_be_recorded_rolls_back_the_handler_writes<S: Store>(store: S) {
    let catalog = define_credit(&store).await;
    let credit = AtomicActions::new([(
        "suite.credit".to_string(),
        std::sync::Arc::new(Credit) as std::sync::Arc<dyn AtomicAction>,
    )]);
    let arguments = json!([{"account": "unrecordable", "amount": 5, "unencodable": true}]);
    schedule_credit(&store, "atomic-unrecordable", arguments, &catalog).await;
    let mut outcomes = Vec::new();
    while let Some(outcome) = store.run_atomic_task("default", credit.clone(), &JSON_CODEC, NOW).await.unwrap() {
        outcomes.push(outcome);
    }
    assert_eq!(outcomes.len(), 2, "both attempts fail: {outcomes:?}");
    assert!(outcomes
        .iter()
        .all(|o| matches!(o, AtomicOutcome::Failed { message, .. } if message.contains("cannot encode"))));
    struct Count;
    impl AtomicAction for Count {
        fn run(&self, tx: &mut dyn AtomicTransaction, _: &Value) -> Result<Value, String> {
            super::ensure_balances(tx);
            let rows = tx.query("SELECT COUNT(*) FROM suite_balances WHERE account = 'unrecordable'", &[])?;
            Ok(json!({"rows": rows[0][0]}))
        }
    }
    schedule_credit(&store, "atomic-count", json!([{}]), &catalog).await;
    let count = AtomicActions::new([(
        "suite.credit".to_string(),
        std::sync::Arc::new(Count) as std::sync::Arc<dyn AtomicAction>,
    )]);
    store.run_atomic_task("default", count, &JSON_CODEC, NOW).await.unwrap().unwrap();
    let run = store
        .load_run("default", RunLocator::Current(WorkflowId("atomic-count".into())))
        .await
        .unwrap()
        .unwrap();
    let seen = all_history(&store, &run)
        .await
        .into_iter()
        .find(|e| e.event_type == EventType::ActivityCompleted)
        .unwrap();
    assert_eq!(
        seen.payload["result"],
        json!(json!({"rows": 0}).to_string()),
        "the failed attempts wrote nothing"
    );
}

/// Schedules one `suite.credit` activity (two attempts) and runs it with `action` as its atomic
/// handler until nothing is left to run; the outcomes, in order. For a backend's own checks of
/// what a handler may do.
pub async fn run_atomic_action_of<S: Store>(store: &S, action: std::sync::Arc<dyn AtomicAction>) -> Vec<AtomicOutcome> {
    let catalog = define_credit(store).await;
    schedule_credit(store, "atomic-own", json!([{}]), &catalog).await;
    let actions = AtomicActions::new([("suite.credit".to_string(), action)]);
    let mut outcomes = Vec::new();
    while let Some(outcome) = store.run_atomic_task("default", actions.clone(), &JSON_CODEC, NOW).await.unwrap() {
        outcomes.push(outcome);
    }
    outcomes
}
