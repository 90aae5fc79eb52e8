//! Redrive: the failed run's successor, resumed at the failed step (see [`crate::redrive`]).

use crate::redrive::{reused_completion, Redrive, RedrivePlan};
use crate::transitions::close::relink;
use crate::transitions::{begin_run, blank_run, events};
use crate::{
    ActivityExecutionId, CommandId, Cx, EventType, LedgerState, Millis, Reason, Refusal, RunId, RunState, RunStatus, StartRun, StepKind,
};
use serde_json::{json, Value};

/// A redrive's answer: the record, and whether this call made it (`false`: an earlier one did).
#[derive(Clone, Debug, PartialEq)]
pub struct RedriveOutcome {
    pub redrive: Redrive,
    pub fresh: bool,
}

/// Redrives failed run `run` by `plan` (made from its history): its successor becomes the
/// instance's next run, with the completed steps copied and a workflow task to run the failed
/// step again. The source only records that it was redriven. A source redriven before answers
/// with its successor and changes nothing.
pub fn redrive(
    run: &mut RunState,
    cx: &mut Cx,
    plan: &RedrivePlan,
    command_id: CommandId,
    request_id: Option<String>,
) -> Result<RedriveOutcome, Refusal> {
    if let Some(done) = &run.redriven_to {
        return Ok(RedriveOutcome {
            redrive: done.clone(),
            fresh: false,
        });
    }
    check_redrivable(run, cx.now)?;
    if run.last_sequence != plan.source_events {
        return Err(Refusal::new(
            Reason::UnsupportedHistory,
            "The run's history changed since the redrive was planned.",
        ));
    }
    let (mut next, mut next_effects) = {
        let mut next_cx = Cx::new(cx.now, &mut *cx.ids, cx.limits);
        // The successor's events, copied completions included, are the redriver's doing.
        next_cx.principal = cx.principal.clone();
        let successor_run_id: RunId = next_cx.id();
        let record = Redrive {
            source_run_id: run.run_id.clone(),
            successor_run_id: successor_run_id.clone(),
            resume_step_sequence: plan.resume_step_sequence,
            command_id: command_id.clone(),
            request_id,
        };
        let next = successor(run, &mut next_cx, plan, record);
        (next, next_cx.effects)
    };
    relink(&mut next, &mut next_effects, &run.last_hash);
    let record = next.redriven_from.clone().expect("just set");
    run.redriven_to = Some(record.clone());
    cx.effects.successor = Some(Box::new((next, next_effects)));
    Ok(RedriveOutcome {
        redrive: record,
        fresh: true,
    })
}

/// What the run itself must be for a redrive: failed, not a child, within its execution
/// deadline, with no consequential action's outcome unknown.
fn check_redrivable(run: &RunState, now: Millis) -> Result<(), Refusal> {
    if run.status != RunStatus::Failed {
        return Err(Refusal::new(Reason::RunNotFailed, "Only a failed run can be redriven.").with("status", run.status.as_str()));
    }
    if run.parent.is_some() {
        return Err(Refusal::new(
            Reason::UnsupportedSourceLink,
            "A child run cannot be redriven (its parent already heard of its failure).",
        ));
    }
    if run.execution_deadline_at.is_some_and(|deadline| deadline <= now) {
        return Err(Refusal::new(
            Reason::ExecutionDeadlineElapsed,
            "The workflow's execution deadline has passed.",
        ));
    }
    if let Some(entry) = run.ledger.values().find(|e| e.state == LedgerState::OutcomeUnknown) {
        return Err(Refusal::new(
            Reason::OutcomeUnknownRequiresResolution,
            "A consequential action's outcome is unknown: resolve it before redriving.",
        )
        .with("ledger_key", entry.ledger_key.clone()));
    }
    Ok(())
}

/// The successor: the source's start again (same input, type, queue, pin), `StartAccepted`
/// (`outcome: redriven`), `WorkflowStarted` naming the redrive, the copied completions, and a
/// workflow task.
fn successor(source: &RunState, cx: &mut Cx, plan: &RedrivePlan, record: Redrive) -> RunState {
    let start = StartRun {
        scheduling: source.scheduling.clone(),
        namespace: source.namespace.clone(),
        workflow_id: source.workflow_id.clone(),
        run_id: record.successor_run_id.clone(),
        workflow_type: source.workflow_type.clone(),
        task_queue: source.task_queue.clone(),
        input: source.input.clone(),
        execution_timeout_seconds: source.execution_timeout_seconds,
        run_timeout_seconds: source.run_timeout_seconds,
        business_key: source.business_key.clone(),
        memo: source.memo.clone(),
        search_attributes: source.search_attributes.clone(),
        command_id: record.command_id.clone(),
        contract: source.contract.clone(),
        compatibility: source.compatibility.clone(),
        origin_trace: source.origin_trace.clone(),
        principal: cx.principal.clone(),
    };
    let mut run = blank_run(cx, start, source.run_number + 1, source.execution_deadline_at);
    run.continued_from_run_id = Some(source.run_id.clone());
    run.ledger_head = source.ledger_head.clone();
    run.memo_merged = source.memo_merged.clone();
    run.redriven_from = Some(record.clone());
    let mut accepted = events::start_accepted(&run);
    accepted.insert("outcome".into(), json!("redriven"));
    if let Some(request_id) = &record.request_id {
        accepted.insert("request_id".into(), json!(request_id));
    }
    run.append(cx, EventType::StartAccepted, accepted, None, Some(&record.command_id));
    let mut run = begin_run(run, cx);
    for step in &plan.completed {
        let sequence = step.payload.get("sequence").and_then(Value::as_u64).expect("planned") as u32;
        let activity_type = step.payload.get("activity_type").and_then(Value::as_str).expect("planned");
        run.steps.insert(sequence, StepKind::Activity(activity_type.to_string()));
        let execution_id: ActivityExecutionId = cx.id();
        let payload = reused_completion(step, &source.run_id, &execution_id);
        run.append(cx, EventType::ActivityCompleted, payload, None, None);
    }
    run.next_step = plan.resume_step_sequence;
    run
}
