//! Standalone activities: a host run that runs one activity, has no workflow task, and closes
//! with its activity.

mod support;

use capstan_engine::*;
use serde_json::json;
use support::*;

fn no_workflow_task_ever(sim: &Sim) {
    assert!(sim.run.workflow_task.is_none());
    assert!(sim.run.tasks.values().all(|t| t.kind != TaskKind::Workflow), "{:?}", sim.run.tasks);
    assert!(sim.history.iter().all(|e| e.workflow_task_id.is_none()));
}

#[test]
fn the_start_schedules_the_activity_and_no_workflow_task() {
    let sim = Sim::start_standalone(None, ActivityTimeouts::default());
    assert_eq!(sim.event_types(), ["StartAccepted", "WorkflowStarted", "ActivityScheduled"]);
    assert_eq!(sim.run.status, RunStatus::Running);
    assert_eq!(sim.run.workflow_type, STANDALONE_ACTIVITY_TYPE);
    let scheduled = &sim.history[2].payload;
    assert_eq!(scheduled["sequence"], json!(1));
    assert_eq!(scheduled["activity_type"], json!("standalone.add"));
    let execution = sim.run.activities.values().next().expect("scheduled");
    assert_eq!(
        execution.retry_policy,
        standalone_default_retry(),
        "one attempt unless the client asked"
    );
    let standalone = sim.run.standalone.as_ref().expect("a host run");
    assert_eq!(standalone.execution_id, execution.id);
    assert_eq!(standalone.activity_class, "AddActivity");
    sim.ready_task(TaskKind::Activity);
    no_workflow_task_ever(&sim);
}

#[test]
fn a_completed_activity_completes_the_run_with_its_result() {
    let mut sim = Sim::start_standalone(None, ActivityTimeouts::default());
    let (task, attempt) = sim.lease_activity("w");
    let receipt = sim
        .apply(|run, cx| complete_activity(run, cx, &task, &attempt, "w", Payload::avro("result")))
        .unwrap();
    assert_eq!(receipt.next_task_id, None);
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
    assert_eq!(
        (sim.run.status, sim.run.closed_reason),
        (RunStatus::Completed, Some(ClosedReason::Completed))
    );
    assert_eq!(sim.run.output, Some(Payload::avro("result")));
    let standalone = sim.run.standalone.as_ref().unwrap();
    assert_eq!((standalone.outcome.as_deref(), standalone.attempt_count), (Some("completed"), 1));
    // A redelivered report records nothing twice.
    let before = sim.history.len();
    let _ = sim.apply(|run, cx| complete_activity(run, cx, &task, &attempt, "w", Payload::avro("result")));
    assert_eq!(sim.history.len(), before);
    no_workflow_task_ever(&sim);
}

#[test]
fn a_final_failure_fails_the_run_from_the_activity_execution() {
    let mut sim = Sim::start_standalone(None, ActivityTimeouts::default());
    let (task, attempt) = sim.lease_activity("w");
    sim.apply(|run, cx| fail_activity(run, cx, &task, &attempt, "w", failure("Flaky")))
        .unwrap();
    assert_eq!(sim.count(EventType::ActivityRetryScheduled), 0, "the default is one attempt");
    assert_eq!(
        (sim.run.status, sim.run.closed_reason),
        (RunStatus::Failed, Some(ClosedReason::Failed))
    );
    let failed = sim.history.last().unwrap();
    assert_eq!(failed.event_type, EventType::WorkflowFailed);
    let execution_id = sim.run.standalone.as_ref().unwrap().execution_id.clone();
    assert_eq!(failed.payload["source_kind"], json!("activity_execution"));
    assert_eq!(failed.payload["source_id"], json!(execution_id));
    assert_eq!(failed.payload["message"], json!("boom"));
    assert_eq!(failed.payload["exception_type"], json!("Flaky"));
    let boundary = sim.run.failure.as_ref().unwrap().boundary.clone().unwrap();
    assert_eq!(
        (boundary.failed_step_sequence, boundary.failed_activity_execution_id),
        (1, execution_id.to_string())
    );
    no_workflow_task_ever(&sim);
}

#[test]
fn a_retryable_failure_keeps_the_run_open_for_the_next_attempt() {
    let mut sim = Sim::start_standalone(Some(retry(2)), ActivityTimeouts::default());
    let (t1, a1) = sim.lease_activity("w");
    sim.apply(|run, cx| fail_activity(run, cx, &t1, &a1, "w", failure("Flaky")))
        .unwrap();
    assert_eq!(sim.run.status, RunStatus::Running);
    sim.advance(1_000);
    let (t2, a2) = sim.lease_activity("w");
    sim.apply(|run, cx| complete_activity(run, cx, &t2, &a2, "w", Payload::avro("ok")))
        .unwrap();
    assert_eq!(sim.run.status, RunStatus::Completed);
    assert_eq!(sim.run.standalone.as_ref().unwrap().attempt_count, 2);
    no_workflow_task_ever(&sim);
}

#[test]
fn an_unclaimed_activity_times_the_run_out() {
    let timeouts = ActivityTimeouts {
        schedule_to_start_seconds: Some(5),
        ..Default::default()
    };
    let mut sim = Sim::start_standalone(Some(retry(3)), timeouts);
    assert_eq!(
        sim.run.standalone.as_ref().unwrap().schedule_to_start_deadline_at,
        Some(sim.now + 5_000)
    );
    sim.advance(5_000);
    assert_eq!(sim.count(EventType::ActivityTimedOut), 1);
    assert_eq!(
        (sim.run.status, sim.run.closed_reason),
        (RunStatus::Failed, Some(ClosedReason::TimedOut))
    );
    let failed = sim.history.last().unwrap();
    assert_eq!(failed.event_type, EventType::WorkflowFailed);
    assert_eq!(failed.payload["failure_category"], json!("timeout"));
    assert_eq!(sim.run.standalone.as_ref().unwrap().attempt_count, 0);
}

#[test]
fn a_cancel_closes_the_run_and_tells_the_running_attempt() {
    let mut sim = Sim::start_standalone(None, ActivityTimeouts::default());
    let (task, attempt) = sim.lease_activity("w");
    sim.apply(|run, cx| close_by_command(run, cx, CloseCommand::Cancel, None, "cmd-cancel".into()))
        .unwrap();
    assert_eq!(sim.run.status, RunStatus::Cancelled);
    let standalone = sim.run.standalone.as_ref().unwrap();
    assert_eq!((standalone.outcome.as_deref(), standalone.attempt_count), (Some("cancelled"), 1));
    let beat = sim
        .apply(|run, cx| heartbeat_activity(run, cx, &task, &attempt, "w", LEASE_MS, None))
        .unwrap();
    assert!(beat.cancel_requested && !beat.can_continue, "{beat:?}");
    let late = sim
        .apply(|run, cx| complete_activity(run, cx, &task, &attempt, "w", Payload::avro("late")))
        .unwrap_err();
    assert_ne!(late.reason, Reason::InternalError);
    assert_eq!(sim.count(EventType::ActivityCompleted), 0);
    no_workflow_task_ever(&sim);
}

#[test]
fn a_signal_to_a_host_run_wakes_no_workflow_code() {
    let mut sim = Sim::start_standalone(None, ActivityTimeouts::default());
    sim.apply(|run, cx| signal(run, cx, "poke", Payload::avro("x"), "cmd-signal".into()))
        .unwrap();
    assert_eq!(sim.count(EventType::SignalReceived), 1);
    no_workflow_task_ever(&sim);
}

#[test]
fn updates_and_cooperative_cancellations_are_refused_on_a_host_run() {
    let mut sim = Sim::start_standalone(None, ActivityTimeouts::default());
    let before = sim.history.len();
    let update = sim
        .apply(|run, cx| accept_update(run, cx, "bump", Payload::avro("x"), "cmd-update".into()))
        .unwrap_err();
    assert_eq!(update.reason, Reason::ActivityHostRun);
    let cancel = sim
        .apply(|run, cx| request_cancellation(run, cx, None, 30, "cmd-cancel".into()))
        .unwrap_err();
    assert_eq!(cancel.reason, Reason::ActivityHostRun);
    assert_eq!(sim.history.len(), before);
    no_workflow_task_ever(&sim);
}
