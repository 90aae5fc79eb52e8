//! Scenario tests of the engine's transitions: commands in, history out.

mod support;

use capstan_engine::*;
use serde_json::{json, Map};
use support::*;

#[test]
fn a_run_whose_invariants_broke_is_caught() {
    let mut sim = Sim::start();
    let (task_id, _) = sim.lease_workflow("w1");
    assert_eq!(sim.run.invariants_hold(), Ok(()));

    let mut lost = sim.run.clone();
    lost.tasks.remove(&task_id);
    assert!(lost.invariants_hold().unwrap_err().contains("is not open"));

    let mut above = sim.run.clone();
    above.tasks.get_mut(&task_id).unwrap().fence = above.fence_high_water + 1;
    assert!(above.invariants_hold().unwrap_err().contains("above the high water"));

    let mut headless = sim.run.clone();
    headless.last_hash.clear();
    assert!(headless.invariants_hold().unwrap_err().contains("without a head hash"));
}

#[test]
fn start_records_accepted_and_started_and_offers_one_workflow_task() {
    let sim = Sim::start();
    assert_eq!(sim.event_types(), ["StartAccepted", "WorkflowStarted"]);
    assert_eq!(sim.run.status, RunStatus::Pending);
    let workflow_tasks = sim.run.tasks.values().filter(|t| t.kind == TaskKind::Workflow).count();
    assert_eq!(workflow_tasks, 1);
    assert!(sim.run.tasks.values().any(|t| t.kind == TaskKind::RunDeadline));
    verify_chain(&sim.history).unwrap();
}

#[test]
fn one_activity_then_complete_walks_the_documented_history() {
    let mut sim = Sim::start();
    sim.complete_workflow("w", vec![activity(None)]).unwrap();
    assert_eq!(sim.run.status, RunStatus::Waiting);
    let (task, attempt) = sim.lease_activity("w");
    let receipt = sim
        .apply(|run, cx| complete_activity(run, cx, &task, &attempt, "w", Payload::avro("result")))
        .unwrap();
    assert!(receipt.next_task_id.is_some(), "the result wakes the workflow");
    sim.complete_workflow("w", vec![complete("done")]).unwrap();
    assert_eq!(
        sim.event_types(),
        [
            "StartAccepted",
            "WorkflowStarted",
            "ActivityScheduled",
            "ActivityStarted",
            "ActivityCompleted",
            "WorkflowCompleted"
        ]
    );
    let steps: Vec<_> = sim.history[2..5].iter().map(|e| e.payload["sequence"].clone()).collect();
    assert_eq!(steps, [json!(1), json!(1), json!(1)]);
    assert_eq!(sim.history[4].payload["result"], json!("result"));
    assert_eq!(sim.run.status, RunStatus::Completed);
    assert_eq!(sim.run.output, Some(Payload::avro("done")));
    assert!(sim.run.tasks.is_empty(), "a closed run holds no open task");
    verify_chain(&sim.history).unwrap();
}

#[test]
fn step_sequences_count_commands_not_events() {
    let mut sim = Sim::start();
    let timer = WorkflowCommand::StartTimer {
        delay_seconds: 5,
        tags: Map::new(),
    };
    let wait = WorkflowCommand::OpenConditionWait {
        condition_key: Some("k".into()),
        fingerprint: None,
        timeout_seconds: Some(10),
        tags: Map::new(),
        occurrence_id: None,
    };
    sim.complete_workflow("w", vec![activity(None), timer, wait]).unwrap();
    let steps: Vec<(String, u64)> = sim.history[2..]
        .iter()
        .map(|e| (e.event_type.as_str().to_string(), e.payload["sequence"].as_u64().unwrap()))
        .collect();
    assert_eq!(
        steps,
        [
            ("ActivityScheduled".into(), 1),
            ("TimerScheduled".into(), 2),
            ("ConditionWaitOpened".into(), 3),
            ("TimerScheduled".into(), 3) // the wait's timeout timer shares its step
        ]
    );
}

#[test]
fn stale_and_foreign_workflow_reports_are_refused_without_a_trace() {
    let mut sim = Sim::start();
    let (task, fence) = sim.lease_workflow("a");
    let events = sim.history.len();
    let wrong_owner = sim
        .apply(|run, cx| complete_workflow_task(run, cx, &task, "b", fence, vec![complete("x")]))
        .unwrap_err();
    assert_eq!(wrong_owner.reason, Reason::LeaseOwnerMismatch);
    let wrong_attempt = sim
        .apply(|run, cx| complete_workflow_task(run, cx, &task, "a", fence + 1, vec![complete("x")]))
        .unwrap_err();
    assert_eq!(wrong_attempt.reason, Reason::WorkflowTaskAttemptMismatch);
    assert_eq!(sim.history.len(), events);

    // The lease expires; the clock re-offers the same task and the next lease has a higher fence.
    sim.advance(LEASE_MS + 1);
    let late = sim
        .apply(|run, cx| complete_workflow_task(run, cx, &task, "a", fence, vec![complete("x")]))
        .unwrap_err();
    assert_eq!(late.reason, Reason::TaskNotLeased);
    let (again, new_fence) = sim.lease_workflow("b");
    assert_eq!(again, task, "the same task id is redelivered");
    assert_eq!(new_fence, fence + 1);
    let stale = sim
        .apply(|run, cx| complete_workflow_task(run, cx, &task, "a", fence, vec![complete("x")]))
        .unwrap_err();
    assert_eq!(stale.reason, Reason::LeaseOwnerMismatch);
    sim.apply(|run, cx| complete_workflow_task(run, cx, &task, "b", new_fence, vec![complete("y")]))
        .unwrap();
    assert_eq!(sim.count(EventType::WorkflowCompleted), 1);
}

#[test]
fn an_identical_retried_completion_gets_the_original_receipt() {
    let mut sim = Sim::start();
    let (task, fence) = sim.lease_workflow("a");
    let first = sim
        .apply(|run, cx| complete_workflow_task(run, cx, &task, "a", fence, vec![activity(None)]))
        .unwrap();
    let events = sim.history.len();
    let again = sim
        .apply(|run, cx| complete_workflow_task(run, cx, &task, "a", fence, vec![activity(None)]))
        .unwrap();
    assert!(again.retained && !first.retained);
    assert_eq!(again.created_task_ids, first.created_task_ids);
    assert_eq!(sim.history.len(), events, "a retained receipt writes nothing");
    assert_eq!(sim.count(EventType::ActivityScheduled), 1);
}

#[test]
fn activity_retries_keep_the_execution_id_and_issue_new_attempt_ids() {
    let mut sim = Sim::start();
    sim.complete_workflow("w", vec![activity(Some(retry(3)))]).unwrap();
    let (t1, a1) = sim.lease_activity("w");
    sim.apply(|run, cx| fail_activity(run, cx, &t1, &a1, "w", failure("Flaky")))
        .unwrap();
    sim.advance(1_000);
    let (t2, a2) = sim.lease_activity("w");
    assert_ne!(t1, t2);
    assert_ne!(a1, a2);
    // The first attempt's late result is refused.
    let late = sim
        .apply(|run, cx| complete_activity(run, cx, &t1, &a1, "w", Payload::avro("late")))
        .unwrap_err();
    assert_eq!(late.reason, Reason::AttemptClosed);
    sim.apply(|run, cx| complete_activity(run, cx, &t2, &a2, "w", Payload::avro("ok")))
        .unwrap();
    let executions: std::collections::BTreeSet<_> = sim
        .history
        .iter()
        .filter(|e| e.event_type.as_str().starts_with("Activity"))
        .map(|e| e.payload["activity_execution_id"].to_string())
        .collect();
    assert_eq!(executions.len(), 1);
    assert_eq!(sim.count(EventType::ActivityRetryScheduled), 1);
    assert_eq!(sim.count(EventType::ActivityCompleted), 1);
    let attempts: Vec<_> = sim
        .history
        .iter()
        .filter(|e| e.event_type == EventType::ActivityStarted)
        .map(|e| e.payload["attempt_number"].clone())
        .collect();
    assert_eq!(attempts, [json!(1), json!(2)]);
}

#[test]
fn non_retryable_failures_and_exhausted_policies_end_the_activity() {
    let mut sim = Sim::start();
    sim.complete_workflow("w", vec![activity(Some(retry(5))), activity(Some(retry(1)))])
        .unwrap();
    let (t1, a1) = sim.lease_activity("w");
    sim.apply(|run, cx| fail_activity(run, cx, &t1, &a1, "w", failure("Fatal")))
        .unwrap();
    let (t2, a2) = sim.lease_activity("w");
    sim.apply(|run, cx| fail_activity(run, cx, &t2, &a2, "w", failure("Flaky")))
        .unwrap();
    assert_eq!(sim.count(EventType::ActivityFailed), 2);
    assert_eq!(sim.count(EventType::ActivityRetryScheduled), 0);
    assert!(sim.run.activities.is_empty());
}

#[test]
fn an_expired_activity_lease_is_a_timed_out_attempt_that_retries() {
    let mut sim = Sim::start();
    sim.complete_workflow("w", vec![activity(Some(retry(2)))]).unwrap();
    let (t1, a1) = sim.lease_activity("w");
    sim.advance(LEASE_MS);
    assert_eq!(sim.count(EventType::ActivityRetryScheduled), 1);
    let late = sim
        .apply(|run, cx| complete_activity(run, cx, &t1, &a1, "w", Payload::avro("late")))
        .unwrap_err();
    assert_eq!(late.reason, Reason::AttemptClosed);
    sim.advance(1_000);
    let (_t2, _a2) = sim.lease_activity("w");
    sim.advance(LEASE_MS);
    assert_eq!(
        sim.count(EventType::ActivityTimedOut),
        1,
        "the second expiry exhausts max_attempts 2"
    );
}

#[test]
fn timers_fire_once_and_wake_the_workflow() {
    let mut sim = Sim::start();
    sim.complete_workflow(
        "w",
        vec![WorkflowCommand::StartTimer {
            delay_seconds: 5,
            tags: Map::new(),
        }],
    )
    .unwrap();
    sim.advance(4_999);
    assert_eq!(sim.count(EventType::TimerFired), 0);
    sim.advance(1);
    sim.advance(10_000);
    assert_eq!(sim.count(EventType::TimerFired), 1);
    let fired = sim.history.iter().find(|e| e.event_type == EventType::TimerFired).unwrap();
    assert_eq!(fired.payload["sequence"], json!(1));
    assert!(fired.payload.get("timer_kind").is_none(), "user timers carry no timer_kind");
    assert!(sim.run.tasks.values().any(|t| t.kind == TaskKind::Workflow && t.is_ready()));
}

#[test]
fn a_signal_resumes_a_condition_wait_and_cancels_its_timeout() {
    let mut sim = Sim::start();
    let wait = WorkflowCommand::OpenConditionWait {
        condition_key: Some("approved".into()),
        fingerprint: Some("fp".into()),
        timeout_seconds: Some(30),
        tags: Map::new(),
        occurrence_id: None,
    };
    sim.complete_workflow("w", vec![wait]).unwrap();
    sim.apply(|run, cx| signal(run, cx, "approve", Payload::avro("yes"), "cmd-sig".into()))
        .unwrap();
    let (task, fence) = sim.lease_workflow("w");
    let resume = &sim.run.tasks[&task].detail;
    assert!(
        matches!(resume, TaskDetail::Workflow { resume: Some(ResumeContext::Signal { signal_name, .. }), .. } if signal_name == "approve")
    );
    sim.apply(|run, cx| complete_workflow_task(run, cx, &task, "w", fence, vec![complete("done")]))
        .unwrap();
    assert_eq!(
        sim.event_types()[2..],
        [
            "ConditionWaitOpened",
            "TimerScheduled",
            "SignalReceived",
            "ConditionWaitSatisfied",
            "WorkflowCompleted"
        ]
    );
    sim.advance(60_000);
    assert_eq!(sim.count(EventType::TimerFired), 0, "the cancelled timeout never fires");
}

#[test]
fn a_condition_wait_that_times_out_records_its_timer_then_its_own_timeout() {
    let mut sim = Sim::start();
    let wait = WorkflowCommand::OpenConditionWait {
        condition_key: Some("approved".into()),
        fingerprint: Some("fp".into()),
        timeout_seconds: Some(30),
        tags: json!({"parallel_group_path": [{"parallel_group_id": "g"}]})
            .as_object()
            .unwrap()
            .clone(),
        occurrence_id: Some("occ-1".into()),
    };
    sim.complete_workflow("w", vec![wait]).unwrap();
    let opened = sim
        .history
        .iter()
        .find(|e| e.event_type == EventType::ConditionWaitOpened)
        .unwrap()
        .payload
        .clone();
    sim.advance(30_000);
    let n = sim.history.len();
    assert_eq!(sim.event_types()[n - 2..], ["TimerFired", "ConditionWaitTimedOut"]);
    let (fired, timed_out) = (&sim.history[n - 2].payload, &sim.history[n - 1].payload);
    assert_eq!(fired["timer_kind"], "condition_timeout");
    for key in [
        "condition_wait_id",
        "condition_key",
        "condition_definition_fingerprint",
        "sequence",
        "timeout_seconds",
    ] {
        assert_eq!(timed_out[key], opened[key], "{key}");
    }
    assert_eq!(timed_out["timer_id"], fired["timer_id"]);
    assert_eq!(timed_out["condition_wait_occurrence_id"], "occ-1");
    assert_eq!(
        timed_out["parallel_group_path"], opened["parallel_group_path"],
        "the wait's step tags go with it"
    );
    assert!(sim.run.condition_waits.is_empty());
    assert!(sim.run.tasks.values().any(|t| t.kind == TaskKind::Workflow && t.is_ready()));
}

#[test]
fn reopening_the_same_condition_wait_records_no_satisfied_row() {
    let mut sim = Sim::start();
    sim.complete_workflow("w", vec![open_wait()]).unwrap();
    sim.apply(|run, cx| signal(run, cx, "poke", Payload::avro("1"), "c1".into()))
        .unwrap();
    sim.complete_workflow("w", vec![open_wait()]).unwrap();
    assert_eq!(sim.count(EventType::ConditionWaitSatisfied), 0);
    assert_eq!(sim.count(EventType::ConditionWaitOpened), 2);
    assert_eq!(sim.run.condition_waits.len(), 1);
}

#[test]
fn a_signal_wait_is_applied_with_the_signal_value() {
    let mut sim = Sim::start();
    sim.complete_workflow(
        "w",
        vec![WorkflowCommand::OpenSignalWait {
            signal_name: "go".into(),
            timeout_seconds: None,
            tags: Map::new(),
        }],
    )
    .unwrap();
    sim.apply(|run, cx| signal(run, cx, "go", Payload::avro("value-blob"), "c1".into()))
        .unwrap();
    sim.complete_workflow("w", vec![complete("done")]).unwrap();
    let applied = sim
        .history
        .iter()
        .find(|e| e.event_type == EventType::SignalApplied)
        .expect("SignalApplied");
    assert_eq!(applied.payload["value"], json!("value-blob"));
    assert_eq!(applied.payload["sequence"], json!(1));
}

#[test]
fn signals_during_a_lease_get_their_own_resume_tasks_afterwards() {
    let mut sim = Sim::start();
    let (task, fence) = sim.lease_workflow("w");
    sim.apply(|run, cx| signal(run, cx, "a", Payload::avro("1"), "c1".into())).unwrap();
    sim.apply(|run, cx| signal(run, cx, "b", Payload::avro("2"), "c2".into())).unwrap();
    assert_eq!(
        sim.run.tasks.values().filter(|t| t.kind == TaskKind::Workflow).count(),
        1,
        "one workflow task at a time"
    );
    sim.apply(|run, cx| {
        complete_workflow_task(
            run,
            cx,
            &task,
            "w",
            fence,
            vec![WorkflowCommand::StartTimer {
                delay_seconds: 100,
                tags: Map::new(),
            }],
        )
    })
    .unwrap();
    for expected in ["a", "b"] {
        let (task, fence) = sim.lease_workflow("w");
        let TaskDetail::Workflow {
            resume: Some(ResumeContext::Signal { signal_name, .. }),
            ..
        } = &sim.run.tasks[&task].detail
        else {
            panic!("expected a resume context")
        };
        assert_eq!(signal_name, expected);
        let timer = WorkflowCommand::StartTimer {
            delay_seconds: 100,
            tags: Map::new(),
        };
        sim.apply(|run, cx| complete_workflow_task(run, cx, &task, "w", fence, vec![timer]))
            .unwrap();
    }
    assert!(sim.run.workflow_task.is_none());
}

#[test]
fn cancel_closes_everything_and_late_reports_are_ignored() {
    let mut sim = Sim::start();
    sim.complete_workflow(
        "w",
        vec![
            activity(None),
            WorkflowCommand::StartTimer {
                delay_seconds: 5,
                tags: Map::new(),
            },
        ],
    )
    .unwrap();
    let (task, attempt) = sim.lease_activity("w");
    sim.apply(|run, cx| close_by_command(run, cx, CloseCommand::Cancel, Some("user".into()), "c".into()))
        .unwrap();
    assert_eq!(sim.run.status, RunStatus::Cancelled);
    assert!(sim.run.tasks.is_empty());
    let late = sim
        .apply(|run, cx| complete_activity(run, cx, &task, &attempt, "w", Payload::avro("x")))
        .unwrap_err();
    assert_eq!(late.reason, Reason::RunCancelled);
    let beat = sim
        .apply(|run, cx| heartbeat_activity(run, cx, &task, &attempt, "w", LEASE_MS, None))
        .unwrap();
    assert!(beat.cancel_requested && !beat.can_continue);
    sim.advance(10_000);
    assert_eq!(*sim.event_types().last().unwrap(), "WorkflowCancelled");
    let again = sim
        .apply(|run, cx| close_by_command(run, cx, CloseCommand::Terminate, None, "c2".into()))
        .unwrap_err();
    assert_eq!(again.reason, Reason::RunNotActive);
    let signal_closed = sim
        .apply(|run, cx| signal(run, cx, "s", Payload::avro("1"), "c3".into()))
        .unwrap_err();
    assert_eq!(signal_closed.reason, Reason::RunNotActive);
}

#[test]
fn the_run_timeout_fails_the_run_as_timed_out() {
    let mut sim = Sim::start();
    sim.advance(600_000);
    assert_eq!(sim.run.status, RunStatus::Failed);
    assert_eq!(sim.run.closed_reason, Some(ClosedReason::TimedOut));
    assert_eq!(*sim.event_types().last().unwrap(), "WorkflowTimedOut");
    assert!(sim.run.tasks.is_empty());
}

#[test]
fn command_validation_refuses_without_changing_the_run() {
    let mut sim = Sim::start();
    let (task, fence) = sim.lease_workflow("w");
    let before = sim.run.clone();
    let not_last = sim
        .apply(|run, cx| complete_workflow_task(run, cx, &task, "w", fence, vec![complete("x"), activity(None)]))
        .unwrap_err();
    assert_eq!(not_last.reason, Reason::InvalidCommands);
    let empty = sim
        .apply(|run, cx| complete_workflow_task(run, cx, &task, "w", fence, vec![]))
        .unwrap_err();
    assert_eq!(empty.reason, Reason::InvalidCommands);
    let marker = WorkflowCommand::RecordVersionMarker {
        change_id: "c".into(),
        version: 5,
        min_supported: 1,
        max_supported: 2,
        tags: Map::new(),
    };
    assert_eq!(
        sim.apply(|run, cx| complete_workflow_task(run, cx, &task, "w", fence, vec![marker]))
            .unwrap_err()
            .reason,
        Reason::InvalidCommands
    );
    assert_eq!(sim.run, before);
}

#[test]
fn resent_parallel_group_members_are_replays_not_new_steps() {
    let mut sim = Sim::start();
    let member = |index: u64| {
        let mut tags = Map::new();
        tags.insert("parallel_group_base_sequence".into(), json!(1));
        tags.insert("parallel_group_index".into(), json!(index));
        tags.insert("parallel_group_size".into(), json!(2));
        WorkflowCommand::ScheduleActivity(ScheduleActivity {
            activity_type: "greet".into(),
            arguments: Payload::avro("args"),
            queue: None,
            retry_policy: None,
            timeouts: ActivityTimeouts::default(),
            tags,
            cancellation_policy: None,
            worker_session: None,
        })
    };
    sim.complete_workflow("w", vec![member(0), member(1)]).unwrap();
    let (task, attempt) = sim.lease_activity("w");
    sim.apply(|run, cx| complete_activity(run, cx, &task, &attempt, "w", Payload::avro("r")))
        .unwrap();
    // Python re-sends the whole group while a member is open.
    sim.complete_workflow("w", vec![member(0), member(1)]).unwrap();
    assert_eq!(sim.count(EventType::ActivityScheduled), 2);
    assert_eq!(sim.run.next_step, 3);
}

#[test]
fn continue_as_new_closes_the_run_and_starts_the_next_with_one_chain() {
    let mut sim = Sim::start();
    let contract = CommandContract {
        signals: vec!["go".into()],
        ..Default::default()
    };
    sim.run.contract = Some(contract.clone());
    let tenant = TaskScheduling {
        priority: 2,
        fairness_key: Some("tenant-a".into()),
        fairness_weight: 7,
    };
    sim.run.scheduling = tenant.clone();
    let (task, fence) = sim.lease_workflow("w");
    let next_input = Payload::avro("next-input");
    let command = WorkflowCommand::ContinueAsNew {
        arguments: next_input.clone(),
        workflow_type: None,
        queue: None,
        tags: Map::new(),
        observability_context: None,
    };
    let limits = sim.limits.clone();
    let mut cx = Cx::new(sim.now, &mut sim.ids, &limits);
    complete_workflow_task(&mut sim.run, &mut cx, &task, "w", fence, vec![command]).unwrap();
    let effects = cx.effects;
    sim.history.extend(effects.events.clone());

    assert_eq!(sim.run.status, RunStatus::Completed);
    assert_eq!(sim.run.closed_reason, Some(ClosedReason::Continued));
    assert!(sim.run.tasks.is_empty());
    let last = sim.history.last().unwrap();
    assert_eq!(last.event_type, EventType::WorkflowContinuedAsNew);
    assert_eq!(last.payload["sequence"], json!(1), "continue-as-new records its step");

    let (next, next_effects) = *effects.successor.expect("a successor run");
    assert_eq!(last.payload["continued_to_run_id"], json!(next.run_id));
    assert_eq!((next.workflow_id.as_str(), next.run_number), ("wf-1", 2));
    assert_eq!(next.input, next_input);
    assert_eq!(next.scheduling, tenant, "the next run keeps its priority and fairness class");
    assert_eq!(next.continued_from_run_id.as_ref(), Some(&sim.run.run_id));
    assert_eq!(
        next.execution_deadline_at, sim.run.execution_deadline_at,
        "the execution deadline carries over"
    );
    assert_eq!(next.run_deadline_at, Some(sim.now + 600_000), "the run deadline restarts");
    let types: Vec<_> = next_effects.events.iter().map(|e| e.event_type.as_str()).collect();
    assert_eq!(types, ["WorkflowStarted"], "a continued run has no StartAccepted");
    assert_eq!(next_effects.events[0].payload["continued_from_run_id"], json!(sim.run.run_id));
    assert_eq!(next.contract, Some(contract), "same type and queue: the contract carries over");
    assert_eq!(next_effects.events[0].payload["declared_signals"], json!(["go"]));
    assert_eq!(
        next.tasks.values().filter(|t| t.kind == TaskKind::Workflow && t.is_ready()).count(),
        1
    );
    // One chain across runs: the new run's first event links to the old run's last hash.
    verify_chain(&sim.history).unwrap();
    verify_chain_from(&sim.run.last_hash, &next_effects.events).unwrap();
    assert_eq!(next.chain_origin, sim.run.last_hash);
    assert!(verify_chain(&next_effects.events).is_err(), "it does not restart from genesis");
}

/// A stand-in codec: entries are JSON objects in the blob; merged is the sorted JSON map.
struct JsonMemo;

impl MemoCodec for JsonMemo {
    fn merge(&self, base: MemoBase<'_>, entries: &Payload) -> Result<MergedMemo, String> {
        let mut memo: std::collections::BTreeMap<String, serde_json::Value> = match base {
            MemoBase::Start(json) => json.clone().into_iter().collect(),
            MemoBase::Merged(payload) => serde_json::from_str(&payload.blob).map_err(|e| e.to_string())?,
        };
        let updates: Map<String, serde_json::Value> = serde_json::from_str(&entries.blob).map_err(|e| e.to_string())?;
        for (key, value) in updates {
            if value.is_null() {
                memo.remove(&key);
            } else {
                memo.insert(key, value);
            }
        }
        Ok(MergedMemo {
            merged: Payload::avro(serde_json::to_string(&memo).unwrap()),
            projection: memo.into_iter().collect(),
        })
    }
}

#[test]
fn memo_upserts_merge_through_the_codec_and_take_a_step() {
    let mut sim = Sim::start();
    sim.run.memo.insert("origin".into(), json!("api"));
    let upsert = |blob: &str| WorkflowCommand::UpsertMemo {
        entries: Payload::avro(blob),
        tags: Map::new(),
    };
    // Without a codec the command is refused and nothing changes.
    let (task, fence) = sim.lease_workflow("w");
    let refused = sim
        .apply(|run, cx| complete_workflow_task(run, cx, &task, "w", fence, vec![upsert(r#"{"a": 1}"#)]))
        .unwrap_err();
    assert_eq!(refused.reason, Reason::InvalidCommands);
    let commands = vec![
        upsert(r#"{"a": 1, "origin": null}"#),
        upsert(r#"{"b": 2}"#),
        WorkflowCommand::StartTimer {
            delay_seconds: 9,
            tags: Map::new(),
        },
    ];
    sim.apply(|run, cx| {
        cx.memo = Some(&JsonMemo);
        complete_workflow_task(run, cx, &task, "w", fence, commands)
    })
    .unwrap();
    assert_eq!(serde_json::Value::Object(sim.run.memo.clone()), json!({"a": 1, "b": 2}));
    let upserts: Vec<_> = sim.history.iter().filter(|e| e.event_type == EventType::MemoUpserted).collect();
    assert_eq!(upserts.len(), 2);
    assert_eq!(upserts[0].payload["sequence"], json!(1));
    assert_eq!(upserts[1].payload["merged"], json!({"codec": "avro", "blob": r#"{"a":1,"b":2}"#}));
    let timer = sim.history.iter().find(|e| e.event_type == EventType::TimerScheduled).unwrap();
    assert_eq!(timer.payload["sequence"], json!(3), "each upsert consumed a step");
}

#[test]
fn an_update_gets_its_own_task_and_a_regular_task_follows() {
    let mut sim = Sim::start();
    let wait = WorkflowCommand::OpenConditionWait {
        condition_key: Some("k".into()),
        fingerprint: None,
        timeout_seconds: None,
        tags: Map::new(),
        occurrence_id: None,
    };
    sim.complete_workflow("w", vec![wait.clone()]).unwrap();
    let (update_id, _) = sim
        .apply(|run, cx| accept_update(run, cx, "add", Payload::avro("args"), "c-up".into()))
        .unwrap();
    let (task, fence) = sim.lease_workflow("w");
    assert!(
        matches!(&sim.run.tasks[&task].detail, TaskDetail::Workflow { resume: Some(ResumeContext::Update { update_id: id, .. }), .. } if *id == update_id)
    );
    let settle = WorkflowCommand::CompleteUpdate {
        update_id: update_id.clone(),
        result: Payload::avro("1"),
    };
    sim.apply(|run, cx| complete_workflow_task(run, cx, &task, "w", fence, vec![settle]))
        .unwrap();
    assert_eq!(sim.run.updates[&update_id].status, UpdateStatus::Completed);
    let applied = sim.history.iter().find(|e| e.event_type == EventType::UpdateApplied).unwrap();
    assert_eq!(applied.payload["sequence"], json!(1), "bound to the open condition wait");
    // The regular task after it resolves the wait like a signal would.
    let (task, fence) = sim.lease_workflow("w");
    assert!(matches!(
        &sim.run.tasks[&task].detail,
        TaskDetail::Workflow {
            resume: Some(ResumeContext::AfterUpdate { .. }),
            ..
        }
    ));
    sim.apply(|run, cx| complete_workflow_task(run, cx, &task, "w", fence, vec![complete("done")]))
        .unwrap();
    assert_eq!(sim.count(EventType::ConditionWaitSatisfied), 1);

    // A settled update cannot be settled again; an unknown one is refused.
    let mut other = Sim::start();
    let (id, _) = other
        .apply(|run, cx| accept_update(run, cx, "add", Payload::avro("a"), "c".into()))
        .unwrap();
    let (task, fence) = other.lease_workflow("w");
    let failure = WorkflowFailure {
        message: "no".into(),
        ..Default::default()
    };
    other
        .apply(|run, cx| {
            complete_workflow_task(
                run,
                cx,
                &task,
                "w",
                fence,
                vec![WorkflowCommand::FailUpdate {
                    update_id: id.clone(),
                    failure,
                }],
            )
        })
        .unwrap();
    assert_eq!(other.count(EventType::UpdateApplied), 0, "a failed update is not applied");
    assert_eq!(other.run.updates[&id].status, UpdateStatus::Failed);
    let (task, fence) = other.lease_workflow("w");
    let again = WorkflowCommand::CompleteUpdate {
        update_id: id,
        result: Payload::avro("x"),
    };
    let refused = other
        .apply(|run, cx| complete_workflow_task(run, cx, &task, "w", fence, vec![again]))
        .unwrap_err();
    assert_eq!(refused.reason, Reason::InvalidCommands);
}

#[test]
fn updates_wait_behind_a_leased_task_and_fail_when_the_run_closes() {
    let mut sim = Sim::start();
    let (task, fence) = sim.lease_workflow("w");
    let (first, _) = sim
        .apply(|run, cx| accept_update(run, cx, "a", Payload::avro("1"), "c1".into()))
        .unwrap();
    sim.apply(|run, cx| signal(run, cx, "s", Payload::avro("x"), "c2".into())).unwrap();
    assert_eq!(sim.run.tasks.values().filter(|t| t.kind == TaskKind::Workflow).count(), 1);
    let timer = WorkflowCommand::StartTimer {
        delay_seconds: 60,
        tags: Map::new(),
    };
    sim.apply(|run, cx| complete_workflow_task(run, cx, &task, "w", fence, vec![timer]))
        .unwrap();
    // The update's task comes first, ahead of the signal that arrived after it.
    let (next, _) = sim.lease_workflow("w");
    assert!(
        matches!(&sim.run.tasks[&next].detail, TaskDetail::Workflow { resume: Some(ResumeContext::Update { update_id, .. }), .. } if *update_id == first)
    );
    sim.apply(|run, cx| close_by_command(run, cx, CloseCommand::Terminate, None, "t".into()))
        .unwrap();
    assert_eq!(
        sim.run.updates[&first].status,
        UpdateStatus::Failed,
        "closing the run settles open updates"
    );
    assert_eq!(
        sim.apply(|run, cx| accept_update(run, cx, "a", Payload::avro("1"), "c3".into()))
            .unwrap_err()
            .reason,
        Reason::RunNotActive
    );
}

#[test]
fn a_child_starts_in_the_same_transition_and_reports_back_to_its_parent() {
    let mut parent = Sim::start();
    parent.run.scheduling.priority = 1;
    let (task, fence) = parent.lease_workflow("w");
    let child = StartChild {
        workflow_type: "child".into(),
        arguments: Payload::avro("child-args"),
        queue: None,
        workflow_id: None,
        parent_close_policy: "terminate".into(),
        cancellation_policy: "abandon".into(),
        execution_timeout_seconds: None,
        run_timeout_seconds: None,
        retry_policy: None,
        tags: json!({"parallel_group_id": "g1", "parallel_group_index": 0, "parallel_group_size": 1, "parallel_group_base_sequence": 1})
            .as_object()
            .unwrap()
            .clone(),
        observability_context: None,
    };
    let limits = parent.limits.clone();
    let mut cx = Cx::new(parent.now, &mut parent.ids, &limits);
    complete_workflow_task(
        &mut parent.run,
        &mut cx,
        &task,
        "w",
        fence,
        vec![WorkflowCommand::StartChildWorkflow(child)],
    )
    .unwrap();
    let effects = cx.effects;
    let (child_run, child_effects) = effects.children_started.first().cloned().expect("a child run");
    assert_eq!(child_run.scheduling.priority, 1, "a child inherits its parent's priority");
    assert_eq!(
        child_run.workflow_id.as_str(),
        "wf-1:run-1:1",
        "derived from the parent's ids and step"
    );
    assert_eq!(child_run.parent.as_ref().map(|p| p.sequence), Some(1));
    assert_eq!(child_effects.events[0].payload["parent_workflow_instance_id"], json!("wf-1"));
    let types: Vec<_> = effects.events.iter().map(|e| e.event_type.as_str()).collect();
    assert_eq!(types, ["ChildWorkflowScheduled", "ChildRunStarted"]);
    assert_eq!(parent.run.children.len(), 1);

    // The child completes: its close carries a notice for the parent.
    let mut child_sim = Sim {
        run: child_run,
        ids: SequentialIds::new("c"),
        limits: Limits::default(),
        now: parent.now,
        history: child_effects.events,
    };
    let (ctask, cfence) = child_sim.lease_workflow("w");
    let mut cx = Cx::new(child_sim.now, &mut child_sim.ids, &limits);
    complete_workflow_task(&mut child_sim.run, &mut cx, &ctask, "w", cfence, vec![complete("child-result")]).unwrap();
    let notice = cx.effects.parent_notice.clone().expect("the parent hears of it");
    assert_eq!(notice.closed_reason, Some(ClosedReason::Completed));
    assert!(parent.apply(|run, cx| resolve_child(run, cx, &notice)).unwrap());
    let resolved = parent.history.last().unwrap();
    assert_eq!(resolved.event_type, EventType::ChildRunCompleted);
    assert_eq!(resolved.payload["output"], json!("child-result"));
    assert_eq!(resolved.payload["sequence"], json!(1));
    // The resolution repeats the call's identity and group tags: an SDK resolving a parallel
    // group of children out of order matches the event to its member by them.
    let scheduled = effects
        .events
        .iter()
        .find(|e| e.event_type == EventType::ChildWorkflowScheduled)
        .unwrap();
    for field in [
        "child_call_id",
        "workflow_link_id",
        "child_workflow_type",
        "parent_close_policy",
        "parallel_group_id",
        "parallel_group_index",
        "parallel_group_size",
        "parallel_group_base_sequence",
    ] {
        assert_eq!(resolved.payload[field], scheduled.payload[field], "{field}");
        assert!(!resolved.payload[field].is_null(), "{field}");
    }
    assert!(parent.run.children.is_empty());
    assert!(
        !parent.apply(|run, cx| resolve_child(run, cx, &notice)).unwrap(),
        "a second notice is a no-op"
    );
    assert!(
        parent.run.tasks.values().any(|t| t.kind == TaskKind::Workflow && t.is_ready()),
        "the parent wakes"
    );
}

#[test]
fn a_closing_parent_ends_children_by_their_policy() {
    let mut parent = Sim::start();
    let start_child = |policy: &str| {
        WorkflowCommand::StartChildWorkflow(StartChild {
            workflow_type: "child".into(),
            arguments: Payload::avro("a"),
            queue: None,
            workflow_id: None,
            parent_close_policy: policy.into(),
            cancellation_policy: "abandon".into(),
            execution_timeout_seconds: None,
            run_timeout_seconds: None,
            retry_policy: None,
            tags: Map::new(),
            observability_context: None,
        })
    };
    parent
        .complete_workflow(
            "w",
            vec![start_child("terminate"), start_child("abandon"), start_child("request_cancel")],
        )
        .unwrap();
    let limits = parent.limits.clone();
    let mut cx = Cx::new(parent.now, &mut parent.ids, &limits);
    close_by_command(&mut parent.run, &mut cx, CloseCommand::Cancel, None, "c".into()).unwrap();
    let closing: Vec<_> = cx
        .effects
        .close_children
        .iter()
        .map(|(id, command)| (id.as_str().to_string(), *command))
        .collect();
    assert_eq!(
        closing,
        [
            ("wf-1:run-1:1".to_string(), CloseCommand::Terminate),
            ("wf-1:run-1:3".to_string(), CloseCommand::Cancel)
        ]
    );
    // The parent records each policy it applied, before its terminal event.
    let kinds: Vec<_> = cx.effects.events.iter().map(|e| e.event_type).collect();
    assert_eq!(
        kinds,
        [
            EventType::CancelRequested,
            EventType::ParentClosePolicyApplied,
            EventType::ParentClosePolicyApplied,
            EventType::WorkflowCancelled
        ]
    );
    let applied: Vec<_> = cx.effects.events[1..3]
        .iter()
        .map(|e| (e.payload["child_instance_id"].clone(), e.payload["policy"].clone()))
        .collect();
    assert_eq!(
        applied,
        [
            (json!("wf-1:run-1:1"), json!("terminate")),
            (json!("wf-1:run-1:3"), json!("request_cancel"))
        ]
    );
}

/// A "slow" activity with a 3 s heartbeat timeout.
fn heartbeating_activity(max_attempts: u32, start_to_close_seconds: i64) -> WorkflowCommand {
    WorkflowCommand::ScheduleActivity(ScheduleActivity {
        activity_type: "slow".into(),
        arguments: Payload::avro("a"),
        queue: None,
        retry_policy: Some(retry(max_attempts)),
        timeouts: ActivityTimeouts {
            start_to_close_seconds: Some(start_to_close_seconds),
            heartbeat_seconds: Some(3),
            ..Default::default()
        },
        cancellation_policy: None,
        worker_session: None,
        tags: Map::new(),
    })
}

#[test]
fn heartbeats_move_the_heartbeat_deadline_not_start_to_close_and_details_reach_the_retry() {
    let mut sim = Sim::start();
    let schedule = heartbeating_activity(2, 10);
    sim.complete_workflow("w", vec![schedule]).unwrap();
    let (task, attempt) = sim.lease_activity("w");
    for second in [2, 4, 6, 8] {
        sim.advance(2_000);
        assert_eq!(
            sim.count(EventType::ActivityRetryScheduled),
            0,
            "heartbeating at {second}s keeps the attempt alive"
        );
        let details = Some(json!({"progress": if second < 6 { 1 } else { 2 }}));
        let beat = sim
            .apply(|run, cx| heartbeat_activity(run, cx, &task, &attempt, "w", LEASE_MS, details))
            .unwrap();
        assert!(beat.can_continue);
    }
    assert_eq!(
        sim.count(EventType::ActivityHeartbeatRecorded),
        2,
        "only changed details are recorded"
    );
    sim.advance(2_000); // 10 s after the start: the start-to-close budget is spent
    let retried = sim
        .history
        .iter()
        .find(|e| e.event_type == EventType::ActivityRetryScheduled)
        .expect("start_to_close timed the attempt out");
    assert_eq!(retried.payload["timeout_kind"], json!("start_to_close"));
    assert_eq!(retried.payload["last_heartbeat_details"], json!({"progress": 2}));
    let execution = sim.run.activities.values().next().unwrap();
    assert_eq!(
        execution.last_heartbeat_details,
        Some(json!({"progress": 2})),
        "kept for the next attempt"
    );
}

#[test]
fn lease_renewals_keep_a_silent_attempt_alive_past_its_first_lease_and_record_nothing() {
    let mut sim = Sim::start();
    sim.complete_workflow("w", vec![activity(Some(retry(1)))]).unwrap();
    let (task, attempt) = sim.lease_activity("w");
    let first_expiry = sim.run.tasks[&task].lease().unwrap().expires_at;
    let events = sim.history.len();

    sim.advance(10_000); // a sixth of the term: the held grant is confirmed as it stands
    let held = confirm_activity_lease(&sim.run, sim.now, &task, &attempt, "w", LEASE_MS)
        .unwrap()
        .expect("a fresh lease needs no write");
    assert_eq!((held.lease.expires_at, held.extended), (first_expiry, false));

    sim.advance(30_000); // two thirds of the term: due for extension
    assert_eq!(
        confirm_activity_lease(&sim.run, sim.now, &task, &attempt, "w", LEASE_MS).unwrap(),
        None
    );
    let renewed = sim
        .apply(|run, cx| renew_activity_lease(run, cx, &task, &attempt, "w", LEASE_MS))
        .unwrap();
    assert_eq!(
        (renewed.lease.expires_at, renewed.extended, renewed.attempt_number),
        (sim.now + LEASE_MS, true, 1)
    );
    assert_eq!(renewed.last_heartbeat_at, None, "a renewal is not a heartbeat");

    sim.advance(45_000); // past the first lease: the renewed one holds
    assert!(sim.now > first_expiry);
    assert!(sim.run.tasks[&task].lease().is_some(), "still leased to its worker");
    assert_eq!(sim.history.len(), events, "renewals record nothing in history");
    sim.apply(|run, cx| complete_activity(run, cx, &task, &attempt, "w", Payload::avro("done")))
        .unwrap();
    assert_eq!(sim.count(EventType::ActivityCompleted), 1);
}

#[test]
fn a_lease_renewal_moves_neither_the_heartbeat_deadline_nor_an_expired_lease() {
    let mut sim = Sim::start();
    sim.complete_workflow("w", vec![heartbeating_activity(1, 60)]).unwrap(); // heartbeat 3 s
    let (task, attempt) = sim.lease_activity("w");
    let started = sim.now;
    sim.advance(2_000);
    let renewed = sim
        .apply(|run, cx| renew_activity_lease(run, cx, &task, &attempt, "w", LEASE_MS))
        .unwrap();
    assert_eq!(renewed.heartbeat_deadline_at, Some(started + 3_000));
    // The wrong worker and a made-up attempt are refused; nothing is granted to them.
    let intruder = sim
        .apply(|run, cx| renew_activity_lease(run, cx, &task, &attempt, "intruder", LEASE_MS))
        .unwrap_err();
    assert_eq!(intruder.reason, Reason::LeaseOwnerMismatch);
    let stranger = ActivityAttemptId("no-such-attempt".into());
    let unknown = sim
        .apply(|run, cx| renew_activity_lease(run, cx, &task, &stranger, "w", LEASE_MS))
        .unwrap_err();
    assert_eq!(unknown.reason, Reason::AttemptNotFound);
    sim.advance(1_500); // 3.5 s without a heartbeat: renewals did not keep the attempt alive
    let timed_out = sim
        .history
        .iter()
        .find(|e| e.event_type == EventType::ActivityTimedOut)
        .expect("the heartbeat timeout fired despite the renewal");
    assert_eq!(timed_out.payload["timeout_kind"], json!("heartbeat"));
    let late = sim
        .apply(|run, cx| renew_activity_lease(run, cx, &task, &attempt, "w", LEASE_MS))
        .unwrap_err();
    assert!(
        matches!(late.reason, Reason::AttemptClosed | Reason::RunClosed | Reason::LeaseExpired),
        "{late:?}"
    );
}

#[test]
fn a_missed_heartbeat_times_the_attempt_out() {
    let mut sim = Sim::start();
    let schedule = heartbeating_activity(1, 60);
    sim.complete_workflow("w", vec![schedule]).unwrap();
    sim.lease_activity("w");
    sim.advance(3_000);
    let timed_out = sim
        .history
        .iter()
        .find(|e| e.event_type == EventType::ActivityTimedOut)
        .expect("timed out");
    assert_eq!(timed_out.payload["timeout_kind"], json!("heartbeat"));
}

#[test]
fn a_completion_racing_the_run_deadline_is_refused_and_the_clock_times_the_run_out() {
    let mut sim = Sim::start(); // run timeout 600 s
    sim.now += 599_000;
    let (task, fence) = sim.lease_workflow("w");
    sim.now += 1_000; // the deadline passes while the lease is live, before the clock looked
    let late = sim
        .apply(|run, cx| complete_workflow_task(run, cx, &task, "w", fence, vec![complete("too late")]))
        .unwrap_err();
    assert_eq!(late.reason, Reason::RunTimedOut);
    assert_eq!(sim.count(EventType::WorkflowCompleted), 0);
    sim.advance(0);
    assert_eq!(sim.run.closed_reason, Some(ClosedReason::TimedOut));
    assert_eq!(sim.count(EventType::WorkflowTimedOut), 1);
}

fn open_wait() -> WorkflowCommand {
    WorkflowCommand::OpenConditionWait {
        condition_key: Some("k".into()),
        fingerprint: Some("fp".into()),
        timeout_seconds: None,
        tags: Map::new(),
        occurrence_id: None,
    }
}

/// The deterministic repro of the conformance finding: `a`, `b` during the first lease and
/// `close` during the second. Each signal must be recorded after the events of the task that was
/// leased when it arrived, never before them, so replay binds it to the wait that task opened.
#[test]
fn a_signal_arriving_during_a_lease_is_recorded_after_that_tasks_events() {
    let mut sim = Sim::start();
    let send = |sim: &mut Sim, name: &str, id: &str| {
        let (name, id) = (name.to_string(), id.to_string());
        sim.apply(move |run, cx| signal(run, cx, &name, Payload::avro("1"), id.into()))
            .unwrap();
    };
    let (task, fence) = sim.lease_workflow("w");
    send(&mut sim, "append", "c-a");
    send(&mut sim, "append", "c-b");
    assert_eq!(sim.count(EventType::SignalReceived), 0, "held back while the task is leased");
    sim.apply(|run, cx| complete_workflow_task(run, cx, &task, "w", fence, vec![open_wait()]))
        .unwrap();
    let (task, fence) = sim.lease_workflow("w");
    send(&mut sim, "close", "c-close");
    sim.apply(|run, cx| complete_workflow_task(run, cx, &task, "w", fence, vec![open_wait()]))
        .unwrap();
    let tail: Vec<_> = sim.event_types().into_iter().skip_while(|t| *t != "ConditionWaitOpened").collect();
    assert_eq!(
        tail,
        [
            "ConditionWaitOpened",
            "SignalReceived",
            "SignalReceived",
            "ConditionWaitOpened",
            "SignalReceived"
        ],
        "{:?}",
        sim.event_types()
    );
    let names: Vec<_> = sim
        .history
        .iter()
        .filter(|e| e.event_type == EventType::SignalReceived)
        .map(|e| e.payload["workflow_command_id"].clone())
        .collect();
    assert_eq!(names, [json!("c-a"), json!("c-b"), json!("c-close")], "arrival order kept");

    // A signal while no task is leased is recorded at once.
    while sim.run.workflow_task.is_some() {
        sim.complete_workflow("w", vec![open_wait()]).unwrap();
    }
    send(&mut sim, "now", "c-now");
    assert_eq!(sim.history.last().unwrap().event_type, EventType::SignalReceived);
}

#[test]
fn deferred_signals_are_recorded_when_the_lease_expires_or_the_run_closes() {
    let mut sim = Sim::start();
    let (_task, _fence) = sim.lease_workflow("w");
    sim.apply(|run, cx| signal(run, cx, "s", Payload::avro("1"), "c1".into())).unwrap();
    sim.advance(LEASE_MS + 1);
    assert_eq!(sim.count(EventType::SignalReceived), 1, "the lost lease ends the hold");
    assert!(sim.run.deferred_signals.is_empty());

    let (task, fence) = sim.lease_workflow("w");
    sim.apply(|run, cx| signal(run, cx, "s", Payload::avro("f"), "c-f".into())).unwrap();
    let failure = WorkflowTaskFailure {
        message: "boom".into(),
        ..Default::default()
    };
    sim.apply(|run, cx| fail_workflow_task(run, cx, &task, "w", fence, failure))
        .unwrap();
    assert_eq!(sim.count(EventType::SignalReceived), 2, "a failed task ends the hold");
    sim.advance(5_000);

    let (_task, _fence) = sim.lease_workflow("w");
    sim.apply(|run, cx| signal(run, cx, "s", Payload::avro("2"), "c2".into())).unwrap();
    sim.apply(|run, cx| close_by_command(run, cx, CloseCommand::Terminate, None, "t".into()))
        .unwrap();
    let types = sim.event_types();
    let received = types.iter().rposition(|t| *t == "SignalReceived").expect("recorded");
    let closed = types.iter().position(|t| *t == "WorkflowTerminated").expect("closed");
    assert!(received < closed, "accepted before the close, recorded before it: {types:?}");
}

#[test]
fn a_failing_workflow_task_keeps_its_cause_until_a_task_completes() {
    let mut sim = Sim::start();
    let events_before = sim.history.len();
    for (round, message) in ["diverged at step 2", "diverged again"].into_iter().enumerate() {
        let (task, fence) = sim.lease_workflow("w");
        let failure = WorkflowTaskFailure {
            message: message.into(),
            failure_type: Some("NonDeterministicError".into()),
            reason: Some("history_shape_mismatch".into()),
            sequence: Some(2),
            stack_trace: Some("at workflow.run()".into()),
        };
        sim.apply(|run, cx| fail_workflow_task(run, cx, &task, "w", fence, failure))
            .unwrap();
        let note = sim.run.workflow_task_failure.clone().expect("the failure is kept");
        assert_eq!(
            (note.message.as_str(), note.attempt, note.consecutive),
            (message, fence, round as u32 + 1)
        );
        assert_eq!(note.reason.as_deref(), Some("history_shape_mismatch"));
        assert_eq!(note.stack_trace.as_deref(), Some("at workflow.run()"));
        assert_eq!((note.sequence, note.task_id), (Some(2), task));
        sim.advance(60_000); // the longest backoff
    }
    assert_eq!(sim.history.len(), events_before, "a task failure writes no history, as in DW");
    let first = sim.run.workflow_task_failure.as_ref().unwrap().first_failed_at;
    assert!(
        first < sim.run.workflow_task_failure.as_ref().unwrap().failed_at,
        "the streak keeps its start"
    );

    sim.complete_workflow("w", vec![timer_command(60)]).unwrap();
    assert_eq!(sim.run.workflow_task_failure, None, "a completed task ends the streak");
}

#[test]
fn admission_uses_the_recorded_contract_then_the_registered_one() {
    let mut sim = Sim::start();
    let declared = CommandContract {
        signals: vec!["approve".into()],
        updates: vec!["add".into()],
        ..Default::default()
    };
    let other = CommandContract {
        signals: vec!["other".into()],
        ..Default::default()
    };
    // Nothing recorded, nothing registered: everything is admitted.
    assert!(admit_signal(&sim.run, "anything", None).is_ok());
    assert!(admit_update(&sim.run, "anything", None).is_ok());
    // Nothing recorded: the registered contract decides.
    let refused = admit_signal(&sim.run, "anything", Some(&declared)).unwrap_err();
    assert_eq!(refused.reason, Reason::UnknownSignal);
    assert_eq!(refused.details["declared_signals"], json!(["approve"]));
    assert_eq!(
        admit_update(&sim.run, "nope", Some(&declared)).unwrap_err().reason,
        Reason::UpdateRejected
    );
    assert!(admit_update(&sim.run, "add", Some(&declared)).is_ok());
    // Recorded at start: it wins over whatever is registered now.
    sim.run.contract = Some(declared.clone());
    assert!(admit_signal(&sim.run, "approve", Some(&other)).is_ok());
    assert_eq!(
        admit_signal(&sim.run, "other", Some(&other)).unwrap_err().reason,
        Reason::UnknownSignal
    );
    // A closed run refuses as closed, whatever the name.
    close_by_command(
        &mut sim.run,
        &mut Cx::new(sim.now, &mut sim.ids, &sim.limits),
        CloseCommand::Terminate,
        None,
        "t".into(),
    )
    .unwrap();
    assert_eq!(admit_signal(&sim.run, "approve", None).unwrap_err().reason, Reason::RunNotActive);
}

#[test]
fn the_contract_is_recorded_on_workflow_started_and_carried_by_continue_as_new() {
    let limits = Limits::default();
    let mut ids = SequentialIds::new("id");
    let mut cx = Cx::new(1_000, &mut ids, &limits);
    let contract = CommandContract {
        queries: vec!["state".into()],
        updates: vec!["add".into()],
        ..Default::default()
    };
    let run = start_run(
        &mut cx,
        StartRun {
            scheduling: Default::default(),
            namespace: "default".into(),
            workflow_id: "wf".into(),
            run_id: "run".into(),
            workflow_type: "t".into(),
            task_queue: "q".into(),
            input: Payload::avro("in"),
            execution_timeout_seconds: None,
            run_timeout_seconds: None,
            business_key: None,
            memo: Map::new(),
            search_attributes: Map::new(),
            command_id: "start".into(),
            contract: Some(contract.clone()),
            compatibility: None,
            origin_trace: None,
            principal: None,
        },
    );
    let started = cx
        .effects
        .events
        .iter()
        .find(|e| e.event_type == EventType::WorkflowStarted)
        .unwrap();
    assert_eq!(started.payload["declared_updates"], json!(["add"]));
    assert_eq!(started.payload["declared_queries"], json!(["state"]));
    assert_eq!(started.payload["declared_signals"], json!([]));
    assert_eq!(run.contract, Some(contract));
}

#[test]
fn a_rejected_update_is_recorded_without_a_task() {
    let mut sim = Sim::start();
    let wait = WorkflowCommand::OpenConditionWait {
        condition_key: Some("k".into()),
        fingerprint: None,
        timeout_seconds: None,
        tags: Map::new(),
        occurrence_id: None,
    };
    sim.complete_workflow("w", vec![wait]).unwrap();
    let tasks_before = sim.run.tasks.len();
    let rejection = UpdateRejection {
        message: "forbidden".into(),
        failure_type: Some("InvalidArgument".into()),
        validation_errors: Some(json!({"item": ["must not be forbidden"]})),
    };
    let (update_id, _) = sim
        .apply(|run, cx| reject_update(run, cx, "add", Payload::avro("a"), rejection, "c-rej".into()))
        .unwrap();
    let last = sim.history.last().unwrap();
    assert_eq!(last.event_type, EventType::UpdateRejected);
    assert_eq!(last.payload["update_id"], json!(update_id));
    assert_eq!(last.payload["validation_errors"], json!({"item": ["must not be forbidden"]}));
    assert_eq!(sim.run.tasks.len(), tasks_before, "nothing runs for a rejected update");
    assert!(sim.run.pending_updates.is_empty());
    let record = &sim.run.updates[&update_id];
    assert_eq!(record.status, UpdateStatus::Rejected);
    assert_eq!(record.failure.as_ref().unwrap().exception_type.as_deref(), Some("InvalidArgument"));
}

/// Delivers the run's cancellation request at `sequence` on a fresh lease.
fn deliver_at(sim: &mut Sim, sequence: u32, call_kind: &str) -> Result<CancellationDelivery, Refusal> {
    match deliver_or_wait_at(sim, sequence, call_kind)? {
        DeliveryOutcome::Delivered(done) => Ok(done),
        DeliveryOutcome::Waiting(reason) => panic!("the delivery was deferred ({reason:?})"),
    }
}

fn deliver_or_wait_at(sim: &mut Sim, sequence: u32, call_kind: &str) -> Result<DeliveryOutcome, Refusal> {
    let leased = sim.run.workflow_task.clone().and_then(|id| {
        let task = &sim.run.tasks[&id];
        task.lease().map(|lease| (id.clone(), lease.fence))
    });
    let (task, fence) = leased.unwrap_or_else(|| sim.lease_workflow("w"));
    let request_id = sim.run.cancellation.as_ref().unwrap().request_id.to_string();
    let delivery = DeliveryRequest {
        request_id,
        sequence,
        call_kind: call_kind.into(),
        sequence_span: 1,
        operation_sequence: None,
        operation_sequence_span: 1,
    };
    sim.apply(|run, cx| deliver_cancellation(run, cx, &task, "w", fence, delivery))
}

#[test]
fn a_delivery_that_stops_a_running_attempt_leaves_a_receipt_acknowledged_once() {
    let mut sim = Sim::start();
    sim.complete_workflow("w", vec![activity(None), activity(None)]).unwrap();
    let (stopped, attempt) = sim.lease_activity("a");
    let (_, untouched) = sim.lease_activity("a");
    sim.apply(|run, cx| request_cancellation(run, cx, Some("stop".into()), 60, "req-1".into()))
        .unwrap();
    deliver_at(&mut sim, 1, "activity").unwrap();
    let cancelled_id = sim
        .history
        .iter()
        .find(|e| e.event_type == EventType::ActivityCancelled)
        .unwrap()
        .id
        .clone();
    let receipt = stopped_attempt(&sim.run, &stopped, &attempt).expect("a receipt for the stopped attempt");
    assert_eq!((receipt.lease_owner.as_str(), receipt.request_id.as_str()), ("a", "req-1"));
    assert_eq!(receipt.cancellation_event_id, cancelled_id);
    assert_eq!(receipt.receipt_view()["callback_state"], json!("unknown"));

    // Only the holder, for this request, and only for an attempt a cancellation stopped.
    let ack = |owner: &'static str, request: &'static str, attempt: ActivityAttemptId, task: TaskId| {
        move |run: &mut RunState, cx: &mut Cx| acknowledge_activity_cancellation(run, cx, &task, &attempt, owner, request)
    };
    let refused = sim.apply(ack("b", "req-1", attempt.clone(), stopped.clone())).unwrap_err();
    assert_eq!(refused.reason, Reason::LeaseOwnerMismatch);
    let refused = sim.apply(ack("a", "req-2", attempt.clone(), stopped.clone())).unwrap_err();
    assert_eq!(refused.reason, Reason::CancellationRequestMismatch);
    let running_task = sim.run.activities.values().next().unwrap().task_id.clone();
    let refused = sim.apply(ack("a", "req-1", untouched, running_task)).unwrap_err();
    assert_eq!(refused.reason, Reason::ActivityNotCancelled);

    let events = sim.history.len();
    let first = sim.apply(ack("a", "req-1", attempt.clone(), stopped.clone())).unwrap();
    assert!(!first.duplicate && first.acknowledgement.in_history);
    assert_eq!(sim.history.len(), events + 1);
    let recorded = sim.history.last().unwrap();
    assert_eq!(recorded.event_type, EventType::ActivityCancellationAcknowledged);
    assert_eq!(recorded.id.as_str(), first.acknowledgement.id);
    assert_eq!(recorded.payload["cancellation_history_event_id"], json!(cancelled_id));
    let again = sim.apply(ack("a", "req-1", attempt.clone(), stopped.clone())).unwrap();
    assert!(again.duplicate);
    assert_eq!(again.acknowledgement, first.acknowledgement);
    assert_eq!(sim.history.len(), events + 1, "a repeat records nothing");
}

#[test]
fn a_call_whose_activity_waits_for_its_stop_is_delivered_after_the_stop_is_acknowledged() {
    let mut sim = Sim::start();
    let WorkflowCommand::ScheduleActivity(mut waiting) = activity(None) else {
        unreachable!()
    };
    waiting.cancellation_policy = Some(ActivityCancellationPolicy::WaitCancellationCompleted);
    sim.complete_workflow("w", vec![WorkflowCommand::ScheduleActivity(waiting), timer_command(3600)])
        .unwrap();
    let (stopped, attempt) = sim.lease_activity("a");
    sim.apply(|run, cx| request_cancellation(run, cx, Some("stop".into()), 60, "req-1".into()))
        .unwrap();

    // The first delivery stops the attempt, records no delivery and releases the claim.
    assert_eq!(
        deliver_or_wait_at(&mut sim, 1, "activity").unwrap(),
        DeliveryOutcome::Waiting(Reason::CancellationWaitingForActivity)
    );
    assert_eq!(sim.count(EventType::ActivityCancelled), 1);
    assert_eq!(sim.count(EventType::CooperativeCancellationDelivered), 0);
    assert!(
        sim.run.workflow_task.is_none(),
        "the claim was released and nothing replaces it yet"
    );
    assert!(stopped_attempt(&sim.run, &stopped, &attempt).is_some());

    // A signal brings a task early: delivering elsewhere is refused, here it still waits.
    sim.apply(|run, cx| signal(run, cx, "poke", Payload::avro("x"), "sig".into()))
        .unwrap();
    assert_eq!(
        deliver_or_wait_at(&mut sim, 2, "timer").unwrap_err().reason,
        Reason::CancellationWaitBoundaryMismatch
    );
    assert_eq!(
        deliver_or_wait_at(&mut sim, 1, "activity").unwrap(),
        DeliveryOutcome::Waiting(Reason::CancellationWaitingForActivity)
    );
    assert!(sim.run.workflow_task.is_none());

    // The worker acknowledges its stop: a new task, on which the same delivery goes through.
    sim.apply(|run, cx| acknowledge_activity_cancellation(run, cx, &stopped, &attempt, "a", "req-1"))
        .unwrap();
    assert!(sim.run.workflow_task.is_some(), "the acknowledgement wakes the run");
    let done = deliver_at(&mut sim, 1, "activity").expect("delivered after the stop");
    assert_eq!((done.sequence, done.call_kind.as_str()), (1, "activity"));
    let order: Vec<EventType> = sim
        .history
        .iter()
        .map(|e| e.event_type)
        .filter(|t| {
            matches!(
                t,
                EventType::ActivityCancelled | EventType::ActivityCancellationAcknowledged | EventType::CooperativeCancellationDelivered
            )
        })
        .collect();
    assert_eq!(
        order,
        [
            EventType::ActivityCancelled,
            EventType::ActivityCancellationAcknowledged,
            EventType::CooperativeCancellationDelivered
        ]
    );
}

#[test]
fn an_abandoned_activity_keeps_running_past_the_delivery_until_the_run_closes() {
    let mut sim = Sim::start();
    let WorkflowCommand::ScheduleActivity(mut abandoned) = activity(None) else {
        unreachable!()
    };
    abandoned.cancellation_policy = Some(ActivityCancellationPolicy::Abandon);
    sim.complete_workflow("w", vec![WorkflowCommand::ScheduleActivity(abandoned)])
        .unwrap();
    let (task, attempt) = sim.lease_activity("a");
    sim.apply(|run, cx| request_cancellation(run, cx, None, 60, "req-1".into()))
        .unwrap();
    deliver_at(&mut sim, 1, "activity").expect("delivered at once");
    assert_eq!(sim.count(EventType::ActivityCancelled), 0, "the activity was not stopped");
    let beat = sim
        .apply(|run, cx| heartbeat_activity(run, cx, &task, &attempt, "a", LEASE_MS, None))
        .unwrap();
    assert!(beat.can_continue && !beat.cancel_requested);
    // Its result still lands while the run is open: one terminal fact for the call.
    sim.apply(|run, cx| complete_activity(run, cx, &task, &attempt, "a", Payload::avro("late")))
        .unwrap();
    assert_eq!(sim.count(EventType::ActivityCompleted), 1);
    assert_eq!(sim.count(EventType::ActivityCancelled), 0);
}

#[test]
fn a_delivery_at_a_waiting_child_call_asks_the_child_and_waits_for_its_end() {
    let mut parent = Sim::start();
    let (task, fence) = parent.lease_workflow("w");
    let child = StartChild {
        workflow_type: "child".into(),
        arguments: Payload::avro("child-args"),
        queue: None,
        workflow_id: None,
        parent_close_policy: "terminate".into(),
        cancellation_policy: "wait_cancellation_completed".into(),
        execution_timeout_seconds: None,
        run_timeout_seconds: None,
        retry_policy: None,
        tags: Map::new(),
        observability_context: None,
    };
    let limits = parent.limits.clone();
    let mut cx = Cx::new(parent.now, &mut parent.ids, &limits);
    complete_workflow_task(
        &mut parent.run,
        &mut cx,
        &task,
        "w",
        fence,
        vec![WorkflowCommand::StartChildWorkflow(child)],
    )
    .unwrap();
    let (child_run, _) = cx.effects.children_started.first().cloned().expect("a child run");
    parent
        .apply(|run, cx| request_cancellation(run, cx, None, 60, "req-1".into()))
        .unwrap();

    // The delivery asks the child to cancel, in the same transaction, and waits for it.
    let (task, fence) = parent.lease_workflow("w");
    let request_id = "req-1".to_string();
    let delivery = DeliveryRequest {
        request_id: request_id.clone(),
        sequence: 1,
        call_kind: "child".into(),
        sequence_span: 1,
        operation_sequence: None,
        operation_sequence_span: 1,
    };
    let mut cx = Cx::new(parent.now, &mut parent.ids, &limits);
    let outcome = deliver_cancellation(&mut parent.run, &mut cx, &task, "w", fence, delivery).unwrap();
    assert_eq!(outcome, DeliveryOutcome::Waiting(Reason::CancellationWaitingForChild));
    let asked = cx.effects.cancel_children.clone();
    assert_eq!(asked.len(), 1);
    assert_eq!(asked[0].workflow_id, child_run.workflow_id);
    let requested = cx
        .effects
        .events
        .iter()
        .find(|e| e.event_type == EventType::ChildCancellationRequested)
        .unwrap();
    assert_eq!(requested.payload["child_request_id"], json!(asked[0].request_id));
    assert!(parent.run.workflow_task.is_none(), "the claim was released");

    // The child ends cancelled; the parent hears of it, and the same delivery goes through.
    let notice = ChildOutcome {
        parent: child_run.parent.clone().unwrap(),
        child_workflow_id: child_run.workflow_id.clone(),
        child_run_id: child_run.run_id.clone(),
        status: RunStatus::Cancelled,
        closed_reason: Some(ClosedReason::Cancelled),
        output: None,
        failure: None,
        closed_at: parent.now,
        retry: None,
    };
    assert!(parent.apply(|run, cx| resolve_child(run, cx, &notice)).unwrap());
    let done = deliver_at(&mut parent, 1, "child").expect("delivered once the child ended");
    assert_eq!(done.call_kind, "child");
    let order: Vec<&str> = parent
        .history
        .iter()
        .map(|e| e.event_type.as_str())
        .filter(|t| t.starts_with("ChildRun") || t.starts_with("ChildCancellation") || *t == "CooperativeCancellationDelivered")
        .collect();
    // (The events before it were applied outside the Sim's history, and checked above.)
    assert_eq!(
        order,
        ["ChildRunCancelled", "ChildCancellationResolved", "CooperativeCancellationDelivered"]
    );
}

#[test]
fn cancellation_reaches_only_calls_not_settled_before_the_request() {
    // Two activities; the first completes before the request, the second after it.
    let mut sim = Sim::start();
    sim.complete_workflow("w", vec![activity(None), activity(None)]).unwrap();
    let (first, attempt) = sim.lease_activity("a");
    sim.apply(|run, cx| complete_activity(run, cx, &first, &attempt, "a", Payload::avro("1")))
        .unwrap();
    let (second, second_attempt) = sim.lease_activity("a");
    sim.apply(|run, cx| request_cancellation(run, cx, Some("stop".into()), 60, "req-1".into()))
        .unwrap();
    assert_eq!(sim.count(EventType::CooperativeCancellationRequested), 1);
    sim.apply(|run, cx| complete_activity(run, cx, &second, &second_attempt, "a", Payload::avro("2")))
        .unwrap();

    assert_eq!(
        deliver_at(&mut sim, 1, "activity").unwrap_err().reason,
        Reason::CancellationDeliveryNotEligible
    );
    let done = deliver_at(&mut sim, 2, "activity").expect("a call settled after the request may be interrupted");
    assert_eq!((done.sequence, done.call_kind.as_str()), (2, "activity"));
    assert_eq!(sim.count(EventType::CooperativeCancellationDelivered), 1);
    // A second request changes nothing.
    let again = sim
        .apply(|run, cx| request_cancellation(run, cx, None, 600, "req-2".into()))
        .unwrap();
    assert!(again.duplicate && again.request.request_id.as_str() == "req-1");
}

#[test]
fn a_delivered_cancellation_turns_any_ending_into_cancelled() {
    let mut sim = Sim::start();
    sim.complete_workflow("w", vec![activity(None)]).unwrap();
    sim.apply(|run, cx| request_cancellation(run, cx, None, 60, "req".into())).unwrap();
    // The pending activity is interrupted: its task goes, ActivityCancelled is recorded.
    deliver_at(&mut sim, 1, "activity").unwrap();
    assert!(sim.run.activities.is_empty());
    assert!(!sim.run.tasks.values().any(|t| t.kind == TaskKind::Activity));
    assert_eq!(sim.count(EventType::ActivityCancelled), 1);
    let task = sim.run.workflow_task.clone().unwrap();
    let fence = sim.run.tasks[&task].fence;
    let failure = WorkflowFailure {
        message: "workflow cancellation was requested".into(),
        exception_type: Some("WorkflowCancelled".into()),
        ..Default::default()
    };
    sim.apply(|run, cx| complete_workflow_task(run, cx, &task, "w", fence, vec![WorkflowCommand::FailWorkflow(failure)]))
        .unwrap();
    assert_eq!(
        (sim.run.status, sim.run.closed_reason),
        (RunStatus::Cancelled, Some(ClosedReason::Cancelled))
    );
    let last = sim.history.last().unwrap();
    assert_eq!(last.event_type, EventType::WorkflowCancelled);
    assert_eq!(last.workflow_command_id.as_ref().map(|c| c.as_str()), Some("req"));
    assert_eq!(sim.count(EventType::WorkflowFailed), 0);
    verify_chain(&sim.history).unwrap();
}

#[test]
fn an_undelivered_cancellation_closes_the_run_at_its_deadline() {
    let mut sim = Sim::start();
    sim.complete_workflow("w", vec![]).ok();
    sim.apply(|run, cx| request_cancellation(run, cx, None, 5, "req".into())).unwrap();
    sim.advance(4_000);
    assert!(!sim.run.is_closed());
    sim.advance(1_500);
    assert_eq!(sim.run.status, RunStatus::Cancelled);
    assert_eq!(sim.history.last().unwrap().payload["outcome"], json!("deadline_expired"));
    assert!(sim.run.tasks.is_empty(), "nothing is left open");
}

/// Starts a child under `policy` from a fresh parent; returns both sims.
fn parent_with_child(policy: RetryPolicy) -> (Sim, Sim) {
    let mut parent = Sim::start();
    let child = StartChild {
        workflow_type: "child".into(),
        arguments: Payload::avro("child-args"),
        queue: None,
        workflow_id: None,
        parent_close_policy: "abandon".into(),
        cancellation_policy: "abandon".into(),
        execution_timeout_seconds: None,
        run_timeout_seconds: Some(60),
        retry_policy: Some(policy),
        tags: Map::new(),
        observability_context: None,
    };
    let (task, fence) = parent.lease_workflow("w");
    let limits = parent.limits.clone();
    let mut cx = Cx::new(parent.now, &mut parent.ids, &limits);
    complete_workflow_task(
        &mut parent.run,
        &mut cx,
        &task,
        "w",
        fence,
        vec![WorkflowCommand::StartChildWorkflow(child)],
    )
    .unwrap();
    parent.history.extend(cx.effects.events.clone());
    let (child_run, child_effects) = cx.effects.children_started[0].clone();
    let child = Sim {
        run: child_run,
        ids: SequentialIds::new("c"),
        limits: Limits::default(),
        now: parent.now,
        history: child_effects.events,
    };
    (parent, child)
}

/// The child's current run fails with `exception_type`; returns the parent's notice and the
/// child's next run, if the policy retried it.
fn fail_child(child: &mut Sim, exception_type: &str) -> (ChildOutcome, Option<(RunState, Effects)>) {
    let (task, fence) = child.lease_workflow("w");
    let failure = WorkflowFailure {
        message: "boom".into(),
        exception_type: Some(exception_type.into()),
        ..Default::default()
    };
    let limits = child.limits.clone();
    let mut cx = Cx::new(child.now, &mut child.ids, &limits);
    complete_workflow_task(
        &mut child.run,
        &mut cx,
        &task,
        "w",
        fence,
        vec![WorkflowCommand::FailWorkflow(failure)],
    )
    .unwrap();
    (cx.effects.parent_notice.clone().unwrap(), cx.effects.successor.map(|s| *s))
}

#[test]
fn a_child_retry_policy_restarts_failed_runs_until_attempts_run_out() {
    let policy = RetryPolicy {
        max_attempts: Some(3),
        backoff_seconds: vec![2, 5],
        non_retryable_error_types: vec!["Fatal".into()],
    };
    let (mut parent, mut child) = parent_with_child(policy);
    let first_run = child.run.run_id.clone();
    for (attempt, backoff) in [(2u32, 2i64), (3, 5)] {
        let (notice, next) = fail_child(&mut child, "Transient");
        let retry = notice.retry.clone().expect("retried");
        assert_eq!((retry.attempt, retry.backoff_seconds), (attempt, backoff));
        let (next, next_effects) = next.expect("the instance's next run");
        assert_eq!(next.run_number, attempt);
        assert_eq!(next.retry_of_run_id.as_ref(), Some(&child.run.run_id));
        let started = &next_effects.events[0];
        assert_eq!(started.event_type, EventType::WorkflowStarted);
        assert_eq!(started.payload["retry_attempt"], json!(attempt));
        assert!(started.payload.get("continued_from_run_id").is_none());
        let task = &next.tasks[next.workflow_task.as_ref().unwrap()];
        assert_eq!(
            task.available_at,
            child.now + backoff * 1000,
            "the first task waits out the backoff"
        );
        assert!(
            verify_chain_from(&child.run.last_hash, &next_effects.events).is_ok(),
            "one chain per instance"
        );
        // The parent records the retry on the open call and is not woken.
        let tasks_before = parent.run.tasks.len();
        assert!(parent.apply(|run, cx| resolve_child(run, cx, &notice)).unwrap());
        let last = parent.history.last().unwrap();
        assert_eq!(last.event_type, EventType::ChildRunStarted);
        assert_eq!(last.payload["child_workflow_run_id"], json!(next.run_id));
        assert_eq!(last.payload["retry_of_child_workflow_run_id"], json!(child.run.run_id));
        assert_eq!(parent.run.tasks.len(), tasks_before);
        assert_eq!(parent.run.children[&1].run_id, next.run_id);
        child.run = next;
        child.history = next_effects.events;
        child.now += backoff * 1000;
    }
    // The third failure exhausts the policy: one ChildRunFailed for the last run.
    let (notice, next) = fail_child(&mut child, "Transient");
    assert!(notice.retry.is_none() && next.is_none());
    assert!(parent.apply(|run, cx| resolve_child(run, cx, &notice)).unwrap());
    let last = parent.history.last().unwrap();
    assert_eq!(last.event_type, EventType::ChildRunFailed);
    assert_eq!(last.payload["child_workflow_run_id"], json!(child.run.run_id));
    assert_ne!(child.run.run_id, first_run);
    assert_eq!(parent.count(EventType::ChildRunStarted), 3);
}

#[test]
fn non_retryable_child_failures_resolve_the_call_at_once() {
    let policy = RetryPolicy {
        max_attempts: Some(5),
        backoff_seconds: vec![],
        non_retryable_error_types: vec!["Fatal".into()],
    };
    let (_, mut child) = parent_with_child(policy);
    let (notice, next) = fail_child(&mut child, "Fatal");
    assert!(notice.retry.is_none() && next.is_none());
    // Without max_attempts a policy allows one attempt only.
    let (_, mut child) = parent_with_child(RetryPolicy {
        max_attempts: None,
        backoff_seconds: vec![1],
        non_retryable_error_types: vec![],
    });
    assert!(fail_child(&mut child, "Transient").0.retry.is_none());
}

#[test]
fn an_attempt_whose_lease_runs_out_before_its_budgets_is_named_a_lease_expiry() {
    let mut sim = Sim::start();
    // Start-to-close 120 s and no heartbeat budget: the 60 s lease runs out first.
    let schedule = WorkflowCommand::ScheduleActivity(ScheduleActivity {
        activity_type: "quiet".into(),
        arguments: Payload::avro("a"),
        queue: None,
        retry_policy: Some(retry(2)),
        timeouts: ActivityTimeouts {
            start_to_close_seconds: Some(120),
            ..Default::default()
        },
        cancellation_policy: None,
        worker_session: None,
        tags: Map::new(),
    });
    sim.complete_workflow("w", vec![schedule]).unwrap();
    sim.lease_activity("w");
    sim.advance(LEASE_MS);
    let retried = sim
        .history
        .iter()
        .find(|e| e.event_type == EventType::ActivityRetryScheduled)
        .expect("the attempt ended with its lease");
    assert_eq!(retried.payload["timeout_kind"], json!("lease_expired"), "{:?}", retried.payload);
    assert!(retried.payload["message"].as_str().unwrap().contains("lease expired"));
}

#[test]
fn the_history_budget_counts_every_event_and_observes_a_crossed_threshold() {
    use capstan_engine::history_budget::{event_size_bytes, Pressure, SIZE_WARNING_BYTES};
    let mut sim = Sim::start();
    let counted = |sim: &Sim| -> u64 {
        sim.history
            .iter()
            .map(|e| event_size_bytes(e.event_type.as_str(), &e.payload))
            .sum()
    };
    assert_eq!(sim.run.history_size_bytes, counted(&sim));
    let big = "a".repeat(SIZE_WARNING_BYTES as usize);
    let observed = sim
        .apply(|run, cx| {
            signal(run, cx, "s", Payload::avro(big), "c1".into())?;
            Ok(cx.effects.observations.clone())
        })
        .unwrap();
    assert_eq!(observed, vec![Observation::HistoryBudgetCrossed { pressure: "approaching" }]);
    assert_eq!(sim.run.history_size_bytes, counted(&sim), "the counter is the sum over the history");
    let budget = HistoryBudget::of(&sim.run);
    assert_eq!((budget.pressure, budget.dimensions), (Pressure::Approaching, vec!["size_bytes"]));
    let again = sim
        .apply(|run, cx| {
            signal(run, cx, "s", Payload::avro("small"), "c2".into())?;
            Ok(cx.effects.observations.clone())
        })
        .unwrap();
    assert!(again.is_empty(), "a threshold is observed once, when it is crossed");
}

#[test]
fn signals_past_the_pending_cap_are_refused_until_workflow_code_takes_them() {
    let mut sim = Sim::start();
    sim.limits.pending_signals_max = 3;
    for i in 0..3 {
        sim.apply(|run, cx| signal(run, cx, "s", Payload::avro("x"), format!("c{i}").into()))
            .unwrap();
    }
    assert_eq!(sim.run.pending_signal_count(), 3);
    let events = sim.history.len();
    let refused = sim
        .apply(|run, cx| signal(run, cx, "s", Payload::avro("x"), "c3".into()))
        .unwrap_err();
    assert_eq!(refused.reason, Reason::StructuralLimitExceeded);
    assert_eq!(refused.details["limit_kind"], "pending_signal_count");
    assert_eq!(
        (
            refused.details["current_value"].as_u64(),
            refused.details["configured_limit"].as_u64()
        ),
        (Some(3), Some(3))
    );
    assert_eq!(sim.history.len(), events, "a refused signal records nothing");
    // Workflow code takes the first signal: there is room again.
    sim.complete_workflow("w", vec![timer_command(60)]).unwrap();
    assert!(sim.run.pending_signal_count() < 3);
    sim.apply(|run, cx| signal(run, cx, "s", Payload::avro("x"), "c4".into())).unwrap();
}

#[test]
fn an_update_settled_by_an_earlier_task_gets_no_task_of_its_own() {
    let mut sim = Sim::start();
    let wait = WorkflowCommand::OpenConditionWait {
        condition_key: Some("k".into()),
        fingerprint: None,
        timeout_seconds: None,
        tags: Map::new(),
        occurrence_id: None,
    };
    sim.complete_workflow("w", vec![wait]).unwrap();
    // A signal's task is ready when the update arrives, so the update waits behind it.
    sim.apply(|run, cx| signal(run, cx, "s", Payload::avro("x"), "c-sig".into()))
        .unwrap();
    let (update_id, _) = sim
        .apply(|run, cx| accept_update(run, cx, "add", Payload::avro("args"), "c-up".into()))
        .unwrap();
    assert_eq!(sim.run.pending_updates.len(), 1);
    // That task's worker sees the accepted update in history and settles it.
    let (task, fence) = sim.lease_workflow("w");
    assert!(matches!(
        &sim.run.tasks[&task].detail,
        TaskDetail::Workflow {
            resume: Some(ResumeContext::Signal { .. }),
            ..
        }
    ));
    let settle = WorkflowCommand::CompleteUpdate {
        update_id: update_id.clone(),
        result: Payload::avro("1"),
    };
    sim.apply(|run, cx| complete_workflow_task(run, cx, &task, "w", fence, vec![settle]))
        .unwrap();
    assert_eq!(sim.run.updates[&update_id].status, UpdateStatus::Completed);
    assert!(sim.run.pending_updates.is_empty(), "a settled update no longer waits");
    let update_tasks = sim
        .run
        .tasks
        .values()
        .filter(|t| {
            matches!(
                &t.detail,
                TaskDetail::Workflow {
                    resume: Some(ResumeContext::Update { .. }),
                    ..
                }
            )
        })
        .count();
    assert_eq!(update_tasks, 0, "no task runs the handler of a settled update again");
}
