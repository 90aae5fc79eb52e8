//! Redrive: the plan read from a failed run's history, and the successor it builds.

mod support;

use capstan_engine::*;
use serde_json::json;
use support::*;

/// A run that completed step 1, then failed at step 2 (one attempt) and failed with it,
/// recording the boundary as the SDKs do.
fn failed_at_step_two() -> Sim {
    let mut sim = Sim::start();
    sim.complete_workflow("w", vec![activity(None)]).unwrap();
    let (task, attempt) = sim.lease_activity("w");
    sim.apply(|run, cx| complete_activity(run, cx, &task, &attempt, "w", Payload::avro("first")))
        .unwrap();
    sim.complete_workflow("w", vec![activity(Some(retry(1)))]).unwrap();
    let (task, attempt) = sim.lease_activity("w");
    sim.apply(|run, cx| fail_activity(run, cx, &task, &attempt, "w", failure("Broken")))
        .unwrap();
    let failed_execution = sim
        .history
        .iter()
        .rev()
        .find(|e| e.event_type == EventType::ActivityFailed)
        .unwrap()
        .payload["activity_execution_id"]
        .as_str()
        .unwrap()
        .to_string();
    sim.complete_workflow("w", vec![fail_with(Some(boundary(2, &failed_execution)))])
        .unwrap();
    assert_eq!(sim.run.status, RunStatus::Failed);
    sim
}

fn boundary(step: i64, execution: &str) -> FailureBoundary {
    FailureBoundary {
        failed_step_sequence: step,
        failed_activity_execution_id: execution.into(),
    }
}

fn fail_with(boundary: Option<FailureBoundary>) -> WorkflowCommand {
    WorkflowCommand::FailWorkflow(WorkflowFailure {
        message: "boom".into(),
        exception_type: Some("Broken".into()),
        boundary,
        ..Default::default()
    })
}

fn recorded_boundary(sim: &Sim) -> Option<FailureBoundary> {
    sim.run.failure.as_ref().and_then(|f| f.boundary.clone())
}

fn plan_of(sim: &Sim) -> Result<RedrivePlan, Refusal> {
    redrive_plan(&sim.history, recorded_boundary(sim).as_ref())
}

#[test]
fn a_line_of_activities_is_resumed_at_its_failed_step() {
    let mut sim = failed_at_step_two();
    let plan = plan_of(&sim).unwrap();
    assert_eq!((plan.resume_step_sequence, plan.completed.len()), (2, 1));
    let outcome = sim
        .apply(|run, cx| {
            let outcome = redrive(run, cx, &plan, "cmd-redrive".into(), Some("fix-1".into()))?;
            let (next, effects) = *cx.effects.successor.take().expect("a successor");
            Ok((outcome, next, effects))
        })
        .unwrap();
    let (outcome, next, effects) = outcome;
    assert!(outcome.fresh);
    assert_eq!(sim.run.redriven_to.as_ref(), Some(&outcome.redrive));
    assert_eq!(sim.run.status, RunStatus::Failed, "the source stays as it was");
    assert_eq!((next.run_number, next.next_step), (2, 2));
    assert_eq!(next.continued_from_run_id.as_ref(), Some(&sim.run.run_id));
    assert!(next.workflow_task.is_some(), "a workflow task runs the failed step again");
    let types: Vec<_> = effects.events.iter().map(|e| e.event_type.as_str()).collect();
    assert_eq!(types, ["StartAccepted", "WorkflowStarted", "ActivityCompleted"]);
    assert_eq!(effects.events[0].payload["outcome"], json!("redriven"));
    assert_eq!(effects.events[1].payload["recovery_kind"], json!("redrive"));
    assert_eq!(effects.events[1].payload["resume_step_sequence"], json!(2));
    let reused = &effects.events[2].payload;
    assert_eq!((reused["sequence"].clone(), reused["result"].clone()), (json!(1), json!("first")));
    assert_eq!(reused["reused_from_run_id"], json!(sim.run.run_id));
    assert_ne!(reused["activity_execution_id"], reused["reused_activity_execution_id"]);
    // The successor's chain continues the source's.
    assert_eq!(effects.events[0].prev_hash, sim.run.last_hash);
    assert!(verify_chain_from(&sim.run.last_hash, &effects.events).is_ok());
    // Once redriven, the source answers with the same successor and records nothing more.
    let again = sim.apply(|run, cx| redrive(run, cx, &plan, "cmd-again".into(), None)).unwrap();
    assert!(!again.fresh);
    assert_eq!(again.redrive, outcome.redrive);
}

#[test]
fn a_failure_without_a_recorded_boundary_cannot_be_redriven() {
    let mut sim = Sim::start();
    sim.complete_workflow("w", vec![activity(None)]).unwrap();
    let (task, attempt) = sim.lease_activity("w");
    sim.apply(|run, cx| complete_activity(run, cx, &task, &attempt, "w", Payload::avro("first")))
        .unwrap();
    sim.complete_workflow("w", vec![fail_with(None)]).unwrap();
    assert_eq!(plan_of(&sim).unwrap_err().reason, Reason::UnrecordedFailureBoundary);
}

#[test]
fn a_boundary_that_does_not_match_the_history_is_refused() {
    let sim = failed_at_step_two();
    let wrong_execution = boundary(2, "someone-else");
    assert_eq!(
        redrive_plan(&sim.history, Some(&wrong_execution)).unwrap_err().reason,
        Reason::InvalidFailedStep
    );
    let recorded = recorded_boundary(&sim).unwrap();
    let wrong_step = boundary(1, &recorded.failed_activity_execution_id);
    assert_eq!(
        redrive_plan(&sim.history, Some(&wrong_step)).unwrap_err().reason,
        Reason::UnsupportedHistory
    );
}

#[test]
fn anything_but_worker_activities_is_unsupported() {
    let mut sim = Sim::start();
    sim.complete_workflow("w", vec![timer_command(1)]).unwrap();
    sim.advance(1_000);
    sim.complete_workflow("w", vec![fail_with(Some(boundary(1, "x")))]).unwrap();
    let refused = plan_of(&sim).unwrap_err();
    assert_eq!(refused.reason, Reason::UnsupportedHistory);
    assert_eq!(refused.details["event_type"], json!("TimerScheduled"));
}

#[test]
fn a_local_activity_step_is_refused_as_such() {
    let mut sim = failed_at_step_two();
    sim.history[3].payload.insert("execution_mode".into(), json!("local"));
    assert_eq!(plan_of(&sim).unwrap_err().reason, Reason::UnsupportedLocalActivity);
}

#[test]
fn only_a_failed_run_within_its_deadline_is_redriven() {
    let mut sim = failed_at_step_two();
    let plan = plan_of(&sim).unwrap();
    sim.now = sim.run.execution_deadline_at.unwrap();
    let late = sim.apply(|run, cx| redrive(run, cx, &plan, "c".into(), None)).unwrap_err();
    assert_eq!(late.reason, Reason::ExecutionDeadlineElapsed);
    let mut completed = Sim::start();
    completed.complete_workflow("w", vec![complete("done")]).unwrap();
    let refused = completed.apply(|run, cx| redrive(run, cx, &plan, "c".into(), None)).unwrap_err();
    assert_eq!(refused.reason, Reason::RunNotFailed);
}
