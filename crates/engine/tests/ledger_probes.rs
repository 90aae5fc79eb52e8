//! Reconciliation probes in the engine: started with an unknown outcome, answered by their host
//! run's end, and recorded as a resolution (or left to the operator) — plus the idempotency key
//! and preview the definition points at.

mod ledger_world;
mod support;

use capstan_engine::ledger_probe::*;
use capstan_engine::*;
use ledger_world::*;
use serde_json::{json, Value};

const LOOKUP: &str = "pay.lookup";

fn probed(extra: Value) -> ActionDefinition {
    let mut document = json!({"probe": {"activity_type": LOOKUP, "max_attempts": 2}});
    document.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    defined(RecoveryMode::NonAtomic, document)
}

/// Dispatches the ready `pay` attempt and has its worker fail: the outcome becomes unknown.
fn fail_dispatch(world: &mut World, definition: &ActionDefinition) -> LedgerEntry {
    let (task, attempt) = world.dispatch(Some(definition)).expect("a dispatch");
    world
        .apply(|run, cx| {
            cx.memo = Some(&JsonCodec);
            let failure = ActivityFailure {
                message: "connection reset".into(),
                ..Default::default()
            };
            fail_activity(run, cx, &task, &attempt, "a", failure)
        })
        .unwrap();
    world.entries(LedgerState::OutcomeUnknown)[0].clone()
}

/// Runs the newest probe's host to its end: its worker leases the probe and `report`s; returns
/// the answer its close hands the store.
fn run_probe(
    world: &World,
    report: impl Fn(&mut RunState, &mut Cx, &TaskId, &ActivityAttemptId) -> Result<Receipt, Refusal>,
) -> ProbeAnswer {
    let mut host = world.probes.last().expect("a probe was started").clone();
    let mut ids = SequentialIds::new("probe");
    let limits = Limits::default();
    let mut answer = None;
    for _ in 0..PROBE_ATTEMPTS_MAX {
        let Some(task) = host
            .tasks
            .values()
            .find(|t| t.kind == TaskKind::Activity && t.is_ready())
            .map(|t| t.id.clone())
        else {
            break;
        };
        // A retry waits out its backoff.
        let now = host.tasks[&task].available_at.max(world.now);
        let mut cx = Cx::new(now, &mut ids, &limits);
        cx.memo = Some(&JsonCodec);
        let leased = lease_activity_task(&mut host, &mut cx, &task, "prober", 10_000).unwrap();
        let TaskDetail::Activity {
            attempt_id: Some(attempt), ..
        } = leased.detail
        else {
            panic!("no attempt")
        };
        report(&mut host, &mut cx, &task, &attempt).unwrap();
        answer = cx.effects.probe_answer.take().or(answer);
    }
    assert!(host.is_closed(), "the probe's host run ends with its activity");
    answer.expect("a closing probe answers")
}

fn answering(answer: Value) -> impl Fn(&mut RunState, &mut Cx, &TaskId, &ActivityAttemptId) -> Result<Receipt, Refusal> {
    move |host, cx, task, attempt| complete_activity(host, cx, task, attempt, "prober", Payload::avro(answer.to_string()))
}

fn settle(world: &mut World, answer: &ProbeAnswer) -> Option<LedgerEntry> {
    let stored = world.ledger[&answer.target.ledger_key].clone();
    world.apply(|run, cx| Ok(answer_probe(run, cx, stored, answer))).unwrap()
}

#[test]
fn an_unknown_outcome_starts_one_probe_whose_found_answer_confirms_the_effect() {
    let pay = probed(json!({"verification": {"result_schema": {"type": "object", "required": ["charged"]}}}));
    let mut world = World::start();
    world.schedule_pay_with(Some(&pay), r#"[{"amount": 100}]"#);
    let execution = world.run.activities.values().next().unwrap().clone();
    let entry = fail_dispatch(&mut world, &pay);

    // The probe: a standalone activity on the action's queue, asked by the idempotency key.
    assert_eq!(world.probes.len(), 1);
    let host = &world.probes[0];
    assert_eq!(host.workflow_id, probe_workflow_id(&entry.ledger_key));
    assert_eq!(host.workflow_type, STANDALONE_ACTIVITY_TYPE);
    let probe = host.activities.values().next().unwrap();
    assert_eq!(
        (probe.activity_type.as_str(), probe.queue.as_str()),
        (LOOKUP, execution.queue.as_str())
    );
    assert_eq!(probe.retry_policy.max_attempts, Some(2), "bounded attempts");
    let question: Value = serde_json::from_str(&probe.arguments.blob).unwrap();
    assert_eq!(question[0]["idempotency_key"], json!(execution.id));
    assert_eq!(question[0]["ledger_key"], json!(entry.ledger_key));
    assert_eq!(entry.probe.as_ref().unwrap()["state"], json!("dispatched"));
    let unknown = world.checkpoints.last().unwrap();
    assert_eq!(unknown.details["probe"]["workflow_id"], json!(host.workflow_id));

    let answer = run_probe(
        &world,
        answering(json!({"outcome": "found", "evidence": {"provider_ref": "ch_1"}, "result": {"charged": true}})),
    );
    let resolved = settle(&mut world, &answer).expect("recorded");
    assert_eq!(resolved.state, LedgerState::EffectConfirmed);
    let resolution = resolved.resolution.unwrap();
    assert_eq!(resolution["principal"], json!("probe:pay.lookup"));
    assert_eq!(resolution["evidence"]["answer"]["provider_ref"], json!("ch_1"));
    assert_eq!(resolved.probe.unwrap()["state"], json!("found"));
    let completed = world
        .history
        .iter()
        .rev()
        .find(|e| e.event_type == EventType::ActivityCompleted)
        .unwrap();
    assert_eq!(completed.payload["result"], json!(r#"{"charged":true}"#));
    assert_eq!(
        completed.payload["resolved_by"],
        json!("probe"),
        "a probe, not an operator, settled it"
    );
    assert!(world.ready(TaskKind::Workflow).is_some(), "the workflow continues");
    assert_eq!(world.count(EventType::ActivityStarted), 1, "the action itself never ran again");

    // A redelivered answer finds the entry settled and records nothing.
    let checkpoints = world.checkpoints.len();
    assert_eq!(settle(&mut world, &answer), None);
    assert_eq!(world.checkpoints.len(), checkpoints);
    assert_eq!(ledger::verify_checkpoints(&world.checkpoints), Ok(()));
    verify_chain(&world.history).unwrap();
}

#[test]
fn an_absent_answer_retries_the_action_once_and_a_second_absent_is_left_to_the_operator() {
    let pay = probed(json!({}));
    let mut world = World::start();
    world.schedule_pay(Some(&pay));
    let first = fail_dispatch(&mut world, &pay);
    let absent = json!({"outcome": "absent", "evidence": {"searched": "orders by key"}});
    let answer = run_probe(&world, answering(absent.clone()));
    assert_eq!(settle(&mut world, &answer).unwrap().state, LedgerState::EffectAbsent);
    assert_eq!(world.count(EventType::ActivityRetryScheduled), 1, "one deliberate retry");

    let second = fail_dispatch(&mut world, &pay);
    assert_ne!(second.ledger_key, first.ledger_key);
    assert_eq!(second.idempotency_key_hash, first.idempotency_key_hash, "the same provider key");
    assert_eq!(world.probes.len(), 2, "each unknown dispatch gets its own probe");
    let answer = run_probe(&world, answering(absent));
    let recorded = settle(&mut world, &answer).unwrap();
    assert_eq!(
        recorded.state,
        LedgerState::OutcomeUnknown,
        "a probe does not drive the action round and round"
    );
    assert_eq!(recorded.probe.unwrap()["state"], json!("inconclusive"));
    assert_eq!(world.checkpoints.last().unwrap().details["probe"], json!("inconclusive"));
    assert_eq!(world.count(EventType::ActivityRetryScheduled), 1);
    assert!(world.ready(TaskKind::Activity).is_none());

    // The operator still decides.
    let key = second.ledger_key.clone();
    let evidence = json!({"note": "bank console shows nothing"});
    world
        .apply(|run, cx| resolve_ledger_entry(run, cx, &key, LedgerDecision::EffectAbsent, evidence, "admin"))
        .unwrap();
    assert_eq!(world.count(EventType::ActivityRetryScheduled), 2);
    assert_eq!(ledger::verify_checkpoints(&world.checkpoints), Ok(()));
}

#[test]
fn answers_the_step_cannot_take_leave_the_entry_to_the_operator() {
    let pay = probed(json!({"verification": {"result_schema": {"type": "object", "required": ["charged"]}}}));
    let cases = [
        (
            "inconclusive",
            json!({"outcome": "inconclusive", "evidence": {"note": "provider timed out"}}),
        ),
        ("no evidence", json!({"outcome": "found", "result": {"charged": true}})),
        (
            "fails the checks",
            json!({"outcome": "found", "evidence": {"ref": "x"}, "result": {"maybe": 1}}),
        ),
        ("not an answer", json!("yes")),
    ];
    for (case, reply) in cases {
        let mut world = World::start();
        world.schedule_pay(Some(&pay));
        fail_dispatch(&mut world, &pay);
        let answer = run_probe(&world, answering(reply));
        assert_eq!(answer.verdict.name() == "inconclusive", case != "fails the checks", "{case}");
        let recorded = settle(&mut world, &answer).unwrap();
        assert_eq!(recorded.state, LedgerState::OutcomeUnknown, "{case}");
        assert_eq!(world.count(EventType::ActivityCompleted), 0, "{case}");
        assert!(
            world.run.activities.values().all(|a| a.blocked_by.is_some()),
            "{case}: still blocked"
        );
    }
    // A probe whose every attempt fails ends without an answer: inconclusive too.
    let mut world = World::start();
    world.schedule_pay(Some(&pay));
    fail_dispatch(&mut world, &pay);
    let answer = run_probe(&world, |host, cx, task, attempt| {
        let failure = ActivityFailure {
            message: "lookup API down".into(),
            ..Default::default()
        };
        fail_activity(host, cx, task, attempt, "prober", failure)
    });
    assert_eq!(answer.verdict.evidence()["problem"], json!("the probe ended without an answer"));
    assert_eq!(settle(&mut world, &answer).unwrap().state, LedgerState::OutcomeUnknown);
}

#[test]
fn the_key_and_preview_come_from_the_arguments_where_the_definition_points() {
    let pay = probed(json!({"idempotency_key": "/0/order_id", "preview": "/0/preview"}));
    let mut world = World::start();
    world.schedule_pay_with(Some(&pay), r#"[{"order_id": "ord-7", "preview": {"to": "acme", "amount": 100}}]"#);
    let (task, attempt) = world.dispatch(Some(&pay)).unwrap();
    let entry = world.entries(LedgerState::Dispatched)[0].clone();
    assert_eq!(entry.idempotency_key_hash, ledger::digest("ord-7"));
    assert_eq!(
        entry.preview_hash.as_deref(),
        Some(ledger::digest(r#"{"amount":100,"to":"acme"}"#).as_str())
    );
    assert_eq!(world.checkpoints[0].details["preview_hash"], json!(entry.preview_hash));
    world
        .apply(|run, cx| {
            cx.memo = Some(&JsonCodec);
            fail_activity(run, cx, &task, &attempt, "a", ActivityFailure::default())
        })
        .unwrap();
    let question: Value = serde_json::from_str(&world.probes[0].activities.values().next().unwrap().arguments.blob).unwrap();
    assert_eq!(question[0]["idempotency_key"], json!("ord-7"));

    for (arguments, refusal) in [
        (r#"[{"preview": "x"}]"#, "idempotency_key_required"),
        (r#"[{"order_id": "ord-8"}]"#, "preview_required"),
    ] {
        let mut world = World::start();
        world.schedule_pay_with(Some(&pay), arguments);
        assert!(world.dispatch(Some(&pay)).is_none(), "refused before dispatch");
        let failed = world.history.iter().find(|e| e.event_type == EventType::ActivityFailed).unwrap();
        assert!(
            failed.payload.values().any(|v| v == &json!(refusal)),
            "{refusal}: {:?}",
            failed.payload
        );
        assert!(world.ledger.is_empty(), "nothing dispatched, nothing ledgered");
    }
}

#[test]
fn an_answer_is_not_recorded_while_an_integrity_incident_blocks_the_instance() {
    let pay = probed(json!({}));
    let mut world = World::start();
    world.schedule_pay(Some(&pay));
    fail_dispatch(&mut world, &pay);
    // Inconclusive: its checkpoint would extend the chain with no resolution refusing it.
    let answer = run_probe(
        &world,
        answering(json!({"outcome": "inconclusive", "evidence": {"note": "unsure"}})),
    );
    world
        .apply(|run, cx| {
            block_for_integrity(run, cx, "incident-1");
            Ok(())
        })
        .unwrap();
    let checkpoints = world.checkpoints.len();
    assert_eq!(settle(&mut world, &answer), None);
    assert_eq!(world.checkpoints.len(), checkpoints, "nothing extends a blocked chain");
    assert_eq!(
        world.ledger[&answer.target.ledger_key].probe.as_ref().unwrap()["state"],
        json!("dispatched")
    );
}

#[test]
fn a_definition_pointing_into_arguments_that_came_after_scheduling_refuses_the_dispatch() {
    for (extra, refusal) in [
        (json!({"preview": "/0/preview"}), "preview_required"),
        (json!({"idempotency_key": "/0/order_id"}), "idempotency_key_required"),
    ] {
        let pay = probed(extra);
        let mut world = World::start();
        world.schedule_pay(None);
        assert!(world.dispatch(Some(&pay)).is_none(), "{refusal}: refused at the claim");
        let failed = world.history.iter().find(|e| e.event_type == EventType::ActivityFailed).unwrap();
        assert!(
            failed.payload.values().any(|v| v == &json!(refusal)),
            "{refusal}: {:?}",
            failed.payload
        );
        assert!(world.ledger.is_empty());
    }
}
