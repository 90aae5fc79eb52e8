//! The recovery ledger in the engine: pinning, dispatch entries, unknown outcomes, resolution.

mod ledger_world;
mod support;

use capstan_engine::*;
use ledger_world::*;
use serde_json::{json, Map};

#[test]
fn a_failed_dispatch_is_unknown_until_an_operator_confirms_the_effect() {
    let pay = definition(RecoveryMode::NonAtomic, 1);
    let mut world = World::start();
    world.schedule_pay(Some(&pay));
    let execution = world.run.activities.values().next().unwrap().clone();
    assert_eq!(
        execution.action.as_ref().map(|p| p.definition_hash.clone()),
        Some(pay.definition_hash.clone()),
        "scheduling pins the definition"
    );

    let (task, attempt) = world.dispatch(Some(&pay)).unwrap();
    let (entry,) = (world.entries(LedgerState::Dispatched)[0].clone(),);
    assert_eq!(entry.activity_execution_id, execution.id);
    assert_eq!(
        entry.input_hash,
        ledger::digest("amount-100"),
        "hashes only: the input is never copied"
    );
    assert_eq!(entry.idempotency_key_hash, ledger::digest(execution.id.as_str()));

    // The worker's exception after dispatch: no retry, nothing in history, the run is blocked.
    world
        .apply(|run, cx| fail_activity(run, cx, &task, &attempt, "a", failure("timeout talking to the bank")))
        .unwrap();
    assert_eq!(world.entries(LedgerState::OutcomeUnknown).len(), 1);
    assert_eq!(
        world.count(EventType::ActivityRetryScheduled) + world.count(EventType::ActivityFailed),
        0
    );
    assert!(world.ready(TaskKind::Activity).is_none(), "no automatic retry");
    let refused = world.apply(|run, cx| repair(run, cx, "r".into())).unwrap_err();
    assert_eq!(refused.reason, Reason::OutcomeUnknownRequiresResolution);

    // Resolution: the effect happened; the step completes with the operator's result.
    let key = entry.ledger_key.clone();
    let resolved = world
        .apply(|run, cx| {
            resolve_ledger_entry(
                run,
                cx,
                &key,
                LedgerDecision::EffectConfirmed {
                    result: Payload::avro("receipt"),
                },
                json!({"provider_ref": "tx-9"}),
                "admin",
            )
        })
        .unwrap();
    assert_eq!(resolved.state, LedgerState::EffectConfirmed);
    let completed = world
        .history
        .iter()
        .rev()
        .find(|e| e.event_type == EventType::ActivityCompleted)
        .unwrap();
    assert_eq!(completed.payload["result"], json!("receipt"));
    assert_eq!(completed.payload["resolved_by"], json!("operator"));
    assert!(world.run.activities.is_empty());
    assert!(world.ready(TaskKind::Workflow).is_some(), "the workflow continues");
    let again = world
        .apply(|run, cx| resolve_ledger_entry(run, cx, &key, LedgerDecision::EffectAbsent, json!({}), "admin"))
        .unwrap_err();
    assert_eq!(
        again.reason,
        Reason::LedgerEntryNotFound,
        "a settled entry is no longer the run's to resolve"
    );
    // Dispatched, outcome unknown, confirmed: one chain.
    assert_eq!(world.checkpoints.len(), 3);
    assert_eq!(ledger::verify_checkpoints(&world.checkpoints), Ok(()));
    verify_chain(&world.history).unwrap();
}

#[test]
fn effect_absent_allows_exactly_one_new_dispatch_with_the_same_idempotency_key() {
    let pay = definition(RecoveryMode::NonAtomic, 1);
    let mut world = World::start();
    world.schedule_pay(Some(&pay));
    let (task, _) = world.dispatch(Some(&pay)).unwrap();
    // The lease runs out: the worker vanished after dispatch.
    world.now += LEASE_MS + 1;
    let due: Vec<TaskId> = world
        .run
        .tasks
        .values()
        .filter(|t| t.deadline_at.is_some_and(|d| d <= world.now))
        .map(|t| t.id.clone())
        .collect();
    for id in due {
        world.apply(|run, cx| Ok(on_deadline(run, cx, &id))).unwrap();
    }
    assert!(!world.run.tasks.contains_key(&task));
    let first = world.entries(LedgerState::OutcomeUnknown)[0].clone();
    assert_eq!(first.unknown_reason.as_ref().unwrap()["kind"], json!("timeout"));

    world
        .apply(|run, cx| {
            resolve_ledger_entry(
                run,
                cx,
                &first.ledger_key,
                LedgerDecision::EffectAbsent,
                json!({"note": "bank has no record"}),
                "admin",
            )
        })
        .unwrap();
    assert_eq!(world.count(EventType::ActivityRetryScheduled), 1);
    let (task, attempt) = world.dispatch(Some(&pay)).expect("one deliberate retry");
    let second = world.entries(LedgerState::Dispatched)[0].clone();
    assert_ne!(second.ledger_key, first.ledger_key, "a new ledger entry");
    assert_eq!(second.idempotency_key_hash, first.idempotency_key_hash, "the same provider key");
    assert_eq!(second.attempt_number, 2);
    world
        .apply(|run, cx| complete_activity(run, cx, &task, &attempt, "a", Payload::avro("ok")))
        .unwrap();
    assert_eq!(world.ledger[&second.ledger_key].state, LedgerState::Verified);
    assert_eq!(ledger::verify_checkpoints(&world.checkpoints), Ok(()));
}

#[test]
fn a_definition_changed_after_scheduling_is_refused_before_dispatch() {
    let mut world = World::start();
    world.schedule_pay(Some(&definition(RecoveryMode::NonAtomic, 1)));
    assert!(world.dispatch(Some(&definition(RecoveryMode::NonAtomic, 2))).is_none());
    let failed = world
        .history
        .iter()
        .rev()
        .find(|e| e.event_type == EventType::ActivityFailed)
        .unwrap();
    assert_eq!(failed.payload["exception_type"], json!("definition_changed"));
    assert_eq!(failed.payload["non_retryable"], json!(true));
    assert!(world.ledger.is_empty(), "nothing dispatched, nothing ledgered");
    assert!(world.ready(TaskKind::Workflow).is_some());

    // A definition declared between scheduling and dispatch applies at the claim.
    let mut world = World::start();
    world.schedule_pay(None);
    world.dispatch(Some(&definition(RecoveryMode::NonAtomic, 1))).unwrap();
    assert_eq!(world.entries(LedgerState::Dispatched).len(), 1);
    // Undeclared activities are never ledgered.
    let mut world = World::start();
    world.schedule_pay(None);
    world.dispatch(None).unwrap();
    assert!(world.ledger.is_empty());
}

#[test]
fn closing_the_run_during_a_dispatch_leaves_its_outcome_unknown() {
    let pay = definition(RecoveryMode::NonAtomic, 1);
    let mut world = World::start();
    world.schedule_pay(Some(&pay));
    world.dispatch(Some(&pay)).unwrap();
    world
        .apply(|run, cx| close_by_command(run, cx, CloseCommand::Cancel, None, "c".into()))
        .unwrap();
    let entry = world.entries(LedgerState::OutcomeUnknown)[0].clone();
    assert_eq!(entry.unknown_reason.as_ref().unwrap()["kind"], json!("run_closed"));
    // Resolving it on the closed run records the evidence and changes nothing else.
    let events = world.history.len();
    world
        .apply(|run, cx| {
            resolve_ledger_entry(
                run,
                cx,
                &entry.ledger_key,
                LedgerDecision::EffectAbsent,
                json!({"note": "n"}),
                "admin",
            )
        })
        .unwrap();
    assert_eq!(world.history.len(), events);
    assert_eq!(world.ledger[&entry.ledger_key].state, LedgerState::EffectAbsent);
}

#[test]
fn irreversible_actions_without_an_approval_reference_are_never_dispatched() {
    let wipe = definition(RecoveryMode::Irreversible, 1);
    let mut world = World::start();
    world.schedule_pay_with(Some(&wipe), r#"[{"target": "prod-db"}]"#);
    assert!(world.dispatch(Some(&wipe)).is_none());
    let failed = world
        .history
        .iter()
        .rev()
        .find(|e| e.event_type == EventType::ActivityFailed)
        .unwrap();
    assert_eq!(failed.payload["exception_type"], json!("approval_required"));
    assert_eq!(failed.payload["non_retryable"], json!(true));
    assert!(world.ledger.is_empty(), "no ledger dispatch entry");

    let mut world = World::start();
    world.schedule_pay_with(Some(&wipe), r#"[{"target": "prod-db", "approval_ref": "CAB-42"}]"#);
    world.dispatch(Some(&wipe)).expect("approved: dispatched");
    assert_eq!(world.entries(LedgerState::Dispatched).len(), 1);
    let pin = world.run.activities.values().next().unwrap().action.clone().unwrap();
    assert_eq!(
        pin.reference_hash,
        Some(ledger::digest("\"CAB-42\"")),
        "the approval is pinned by hash"
    );
}

#[test]
fn a_result_that_fails_verification_leaves_the_outcome_unknown() {
    let mut document: Map<String, serde_json::Value> = json!({"recovery_mode": "non_atomic",
        "verification": {"result_schema": {"type": "object", "required": ["status"]}, "declared_effects": ["payment"]}})
    .as_object()
    .unwrap()
    .clone();
    let pay = ActionDefinition {
        namespace: "default".into(),
        activity_type: "pay".into(),
        version: 1,
        recovery_mode: RecoveryMode::NonAtomic,
        definition_hash: ActionDefinition::hash_of("pay", &document),
        document: std::mem::take(&mut document),
        updated_at: 0,
    };
    for (result, conclusive) in [
        (r#"{"status": "charged", "effects": ["payment"]}"#, true),
        (r#"{"amount": 5}"#, false),
        (r#"{"status": "charged", "effects": ["refund"]}"#, false),
        ("not json at all", false),
    ] {
        let mut world = World::start();
        world.schedule_pay(Some(&pay));
        let (task, attempt) = world.dispatch(Some(&pay)).unwrap();
        world
            .apply(|run, cx| {
                cx.memo = Some(&JsonCodec);
                complete_activity(run, cx, &task, &attempt, "a", Payload::avro(result))
            })
            .unwrap();
        assert_eq!(world.count(EventType::ActivityCompleted), usize::from(conclusive), "{result}");
        let expected = if conclusive {
            LedgerState::Verified
        } else {
            LedgerState::OutcomeUnknown
        };
        assert_eq!(world.ledger.values().next().unwrap().state, expected, "{result}");
        if !conclusive {
            let reason = world.ledger.values().next().unwrap().unknown_reason.clone().unwrap();
            assert_eq!(reason["kind"], json!("invalid_result"));
        }
    }
}

#[test]
fn a_pending_result_is_polled_again_under_a_new_entry_with_the_same_key() {
    let pay = defined(
        RecoveryMode::NonAtomic,
        json!({"pending": {"pointer": "/status", "values": ["processing"]}, "poll_interval_seconds": 5}),
    );
    let mut world = World::start();
    world.schedule_pay(Some(&pay));
    report(&mut world, &pay, r#"{"status": "processing"}"#);
    assert_eq!(world.count(EventType::ActivityCompleted), 0);
    assert_eq!(world.entries(LedgerState::Pending).len(), 1, "a visible handoff");
    assert!(world.ready(TaskKind::Activity).is_none(), "the next poll waits for the interval");
    world.now += 5_000;
    report(&mut world, &pay, r#"{"status": "done"}"#);
    assert_eq!(world.count(EventType::ActivityCompleted), 1);
    let entries: Vec<&LedgerEntry> = world.ledger.values().collect();
    assert_eq!(entries.len(), 2);
    assert_eq!(entries[0].idempotency_key_hash, entries[1].idempotency_key_hash);
    assert_eq!(world.entries(LedgerState::Verified).len(), 1);
    assert_eq!(ledger::verify_checkpoints(&world.checkpoints), Ok(()));
}

#[test]
fn linked_runs_advance_only_on_a_conclusive_descriptor() {
    let pipeline = defined(RecoveryMode::LinkedRun, json!({"poll_interval_seconds": 1}));
    // running → poll again; succeeded → the step completes.
    let mut world = World::start();
    world.schedule_pay(Some(&pipeline));
    report(&mut world, &pipeline, r#"{"status": "running", "run": "etl-7"}"#);
    assert_eq!(world.entries(LedgerState::Pending).len(), 1);
    world.now += 1_000;
    report(&mut world, &pipeline, r#"{"status": "succeeded", "run": "etl-7"}"#);
    assert_eq!(world.count(EventType::ActivityCompleted), 1);
    // failed → a final, non-retryable failure.
    let mut world = World::start();
    world.schedule_pay(Some(&pipeline));
    report(&mut world, &pipeline, r#"{"status": "failed"}"#);
    let failed = world
        .history
        .iter()
        .rev()
        .find(|e| e.event_type == EventType::ActivityFailed)
        .unwrap();
    assert_eq!(failed.payload["exception_type"], json!("linked_run_failed"));
    assert_eq!(failed.payload["non_retryable"], json!(true));
    assert!(world.run.activities.is_empty());
    // unknown_publication → a recovery handoff: nothing but cancellation (or resolution) moves it.
    let mut world = World::start();
    world.schedule_pay(Some(&pipeline));
    report(&mut world, &pipeline, r#"{"status": "unknown_publication"}"#);
    let unknown = world.entries(LedgerState::OutcomeUnknown)[0].clone();
    assert_eq!(unknown.unknown_reason.as_ref().unwrap()["kind"], json!("unknown_publication"));
    assert_eq!(
        world.apply(|run, cx| repair(run, cx, "r".into())).unwrap_err().reason,
        Reason::OutcomeUnknownRequiresResolution
    );
    world
        .apply(|run, cx| close_by_command(run, cx, CloseCommand::Cancel, None, "c".into()))
        .unwrap();
    assert_eq!(world.run.status, RunStatus::Cancelled);
}

#[test]
fn a_run_blocked_by_an_integrity_incident_offers_nothing_until_cleared() {
    let pay = definition(RecoveryMode::NonAtomic, 1);
    let mut world = World::start();
    world.schedule_pay(Some(&pay));
    world
        .apply(|run, cx| {
            block_for_integrity(run, cx, "incident-1");
            Ok(())
        })
        .unwrap();
    let id = world.ready(TaskKind::Activity).unwrap();
    let refused = world
        .apply(|run, cx| lease_activity_task_with(run, cx, &id, "a", LEASE_MS, Some(&pay)))
        .unwrap_err();
    assert_eq!(refused.reason, Reason::IntegrityIncidentOpen);
    assert_eq!(refused.details["incident_id"], json!("incident-1"));
    world
        .apply(|run, cx| {
            clear_integrity_block(run, cx);
            Ok(())
        })
        .unwrap();
    assert!(world.dispatch(Some(&pay)).is_some());
}
