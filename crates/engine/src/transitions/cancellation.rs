//! Cooperative cancellation: the request, its delivery at one authored call, the cancelled close.

use crate::transitions::close::close_run;
use crate::transitions::{events, iso8601, require_open, stop_prepared_attempt};
use crate::{
    check_workflow_lease, require_workflow_code, AwaitedStops, CancellationDelivery, CancellationRequest, ClosedReason, EventType, Reason,
    Refusal, RunStatus,
};
use crate::{
    ActivityAttemptId, ActivityCancellationPolicy, ActivityExecution, ChildCancellation, ChildLink, CommandId, Cx, RunId, RunState,
    StepKind, TaskClosure, TaskDetail, TaskId, TaskKind, TimerPurpose, TimerState, WorkflowFailure, WorkflowId,
};
use serde_json::{json, Map};

/// What a `request-cancellation` call found or made.
#[derive(Clone, Debug, PartialEq)]
pub struct CancellationOutcome {
    /// The run already had a request: it is returned unchanged.
    pub duplicate: bool,
    pub request: CancellationRequest,
}

/// Records a cooperative cancellation request (`CooperativeCancellationRequested`): the run stays
/// open, its next workflow task carries the request, and the workflow gets until
/// `cleanup_deadline_at` to finish. One request per run; a repeat returns the first, even after
/// the run closed.
pub fn request_cancellation(
    run: &mut RunState,
    cx: &mut Cx,
    reason: Option<String>,
    cleanup_timeout_seconds: i64,
    command_id: CommandId,
) -> Result<CancellationOutcome, Refusal> {
    if let Some(request) = &run.cancellation {
        return Ok(CancellationOutcome {
            duplicate: true,
            request: request.clone(),
        });
    }
    require_open(run)?;
    require_workflow_code(run)?;
    run.command_count += 1;
    let deadline = cx.now + cleanup_timeout_seconds * 1000;
    let request = CancellationRequest {
        request_id: command_id,
        reason,
        requested_at: cx.now,
        cleanup_deadline_at: deadline,
        resolved_after_request: Default::default(),
        delivery: None,
        awaiting: None,
    };
    let payload = events::cooperative_cancellation_requested(run, &request);
    run.append(
        cx,
        EventType::CooperativeCancellationRequested,
        payload,
        None,
        Some(&request.request_id),
    );
    run.cancellation = Some(request.clone());
    let deadline_task = run.new_task(cx, TaskKind::RunDeadline, "", TaskDetail::CancellationDeadline);
    run.task_mut(cx, &deadline_task).expect("just created").deadline_at = Some(deadline);
    // A worker holding the lease learns of the request from its heartbeat and reloads history:
    // it must see the request event.
    run.extend_leased_history(cx);
    run.want_workflow_task(cx, None);
    Ok(CancellationOutcome { duplicate: false, request })
}

/// The authored call a worker delivers the cancellation to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeliveryRequest {
    pub request_id: String,
    pub sequence: u32,
    pub call_kind: String,
    pub sequence_span: u32,
    pub operation_sequence: Option<u32>,
    pub operation_sequence_span: u32,
}

const CALL_KINDS: &[&str] = &[
    "activity",
    "local_activity",
    "timer",
    "condition",
    "signal",
    "child",
    "parallel",
    "selection_handle",
    "service_operation",
];

fn call_kind_fits(kind: &str, step: &StepKind) -> bool {
    match kind {
        "activity" | "local_activity" => matches!(step, StepKind::Activity(_)),
        "timer" => matches!(step, StepKind::Timer),
        "condition" => matches!(step, StepKind::ConditionWait),
        "signal" => matches!(step, StepKind::SignalWait(_)),
        "child" => matches!(step, StepKind::ChildWorkflow(_)),
        "service_operation" => matches!(step, StepKind::ServiceCall),
        _ => true,
    }
}

fn step_is_open(run: &RunState, step: u32) -> bool {
    run.activities.values().any(|a| a.step == step)
        || run.timers.values().any(|t| t.step == step && t.purpose == TimerPurpose::User)
        || run.condition_waits.iter().any(|w| w.step == step)
        || run.signal_waits.iter().any(|w| w.step == step)
        || run.children.contains_key(&step)
        || run.service_waits.contains_key(&step)
}

pub(super) fn cancellation_delivered(run: &RunState) -> bool {
    run.cancellation.as_ref().is_some_and(|r| r.delivery.is_some())
}

/// Commits the delivery of the run's cancellation request at one authored call, on the
/// worker's live lease (`CooperativeCancellationDelivered`). The interrupted call ends: a
/// pending timer is cancelled (`TimerCancelled`), a running activity too (`ActivityCancelled`),
/// an open wait is dropped; a child keeps running. The same delivery again is answered as
/// before; any other is refused. A waited-on service call is cancelled.
pub fn deliver_cancellation(
    run: &mut RunState,
    cx: &mut Cx,
    task_id: &TaskId,
    owner: &str,
    attempt: u64,
    delivery: DeliveryRequest,
) -> Result<DeliveryOutcome, Refusal> {
    check_workflow_lease(run, cx.now, task_id, owner, attempt)?;
    let request = match check_delivery(run, cx, task_id, &delivery)? {
        Checked::Repeated(done) => return Ok(DeliveryOutcome::Delivered(done)),
        Checked::Eligible(request) => request,
    };
    let (base, span) = match delivery.operation_sequence {
        Some(operation) => (operation, delivery.operation_sequence_span),
        None => (delivery.sequence, delivery.sequence_span),
    };
    if let Some(waiting) = wait_for_stops(run, cx, task_id, &delivery, &request, base..base + span)? {
        run.release_workflow_task(cx, task_id);
        return Ok(DeliveryOutcome::Waiting(waiting));
    }
    for step in base..base + span {
        interrupt_step(run, cx, step);
    }
    Ok(DeliveryOutcome::Delivered(record_delivery(run, cx, task_id, delivery, &request)))
}

/// What checking a delivery found: the same delivery made before, or a request it may go on.
enum Checked {
    Repeated(CancellationDelivery),
    Eligible(CancellationRequest),
}

/// Whether `delivery` names the same authored call as one recorded before.
fn same_call(delivery: &DeliveryRequest, sequence: u32, call_kind: &str, span: u32, operation: Option<u32>, operation_span: u32) -> bool {
    delivery.sequence == sequence
        && delivery.call_kind == call_kind
        && delivery.sequence_span == span
        && delivery.operation_sequence == operation
        && delivery.operation_sequence_span == operation_span
}

/// Whether the delivery describes one authored call at all.
fn describes_one_call(delivery: &DeliveryRequest) -> bool {
    CALL_KINDS.contains(&delivery.call_kind.as_str())
        && delivery.sequence >= 1
        && (1..=1000).contains(&delivery.sequence_span)
        && (delivery.call_kind == "parallel" || delivery.sequence_span == 1)
        && match delivery.operation_sequence {
            Some(operation) => {
                delivery.call_kind == "selection_handle"
                    && operation >= 1
                    && operation < delivery.sequence
                    && delivery.operation_sequence_span <= delivery.sequence - operation
            }
            None => delivery.call_kind != "selection_handle" && delivery.operation_sequence_span == 1,
        }
}

/// Refuses a delivery that names another request, no single call, another call than an earlier
/// delivery, a call after the next one, a call of another kind, or a call settled before the
/// request; answers a repeat with the earlier delivery.
fn check_delivery(run: &RunState, cx: &Cx, task_id: &TaskId, delivery: &DeliveryRequest) -> Result<Checked, Refusal> {
    let refuse = |reason, message: &str| Refusal::new(reason, message).with("task_id", task_id.as_str());
    let Some(request) = run.cancellation.clone() else {
        return Err(refuse(Reason::CancellationRequestMismatch, "The run has no cancellation request."));
    };
    if request.request_id.as_str() != delivery.request_id {
        return Err(refuse(
            Reason::CancellationRequestMismatch,
            "The delivery names another cancellation request.",
        )
        .with("request_id", request.request_id.as_str()));
    }
    if !describes_one_call(delivery) {
        return Err(refuse(
            Reason::InvalidCancellationDelivery,
            "The delivery does not describe one authored call.",
        ));
    }
    if let Some(done) = &request.delivery {
        let same = same_call(
            delivery,
            done.sequence,
            &done.call_kind,
            done.sequence_span,
            done.operation_sequence,
            done.operation_sequence_span,
        );
        return if same {
            Ok(Checked::Repeated(done.clone()))
        } else {
            Err(refuse(
                Reason::CancellationDeliveryMismatch,
                "The cancellation was delivered at another call.",
            )
            .with("sequence", done.sequence))
        };
    }
    if cx.now >= request.cleanup_deadline_at {
        return Err(refuse(Reason::RunCancelled, "The cancellation cleanup deadline has passed."));
    }
    let (base, span) = match delivery.operation_sequence {
        Some(operation) => (operation, delivery.operation_sequence_span),
        None => (delivery.sequence, delivery.sequence_span),
    };
    if delivery.sequence > run.next_step {
        return Err(refuse(
            Reason::CancellationDeliverySequenceMismatch,
            "The delivery names a call after the next one the workflow can make.",
        )
        .with("next_sequence", run.next_step));
    }
    if !matches!(delivery.call_kind.as_str(), "parallel" | "selection_handle") {
        if let Some(step) = run.steps.get(&delivery.sequence) {
            if !call_kind_fits(&delivery.call_kind, step) {
                return Err(refuse(
                    Reason::CancellationDeliveryShapeMismatch,
                    "The recorded call at that sequence is of another kind.",
                ));
            }
        }
    }
    let resolved_before = |step: u32| step < run.next_step && !step_is_open(run, step) && !request.resolved_after_request.contains(&step);
    if (base..base + span).all(resolved_before) {
        return Err(refuse(
            Reason::CancellationDeliveryNotEligible,
            "That call settled before the cancellation was requested.",
        ));
    }
    Ok(Checked::Eligible(request))
}

/// A delivery at a call whose activities or children must stop first
/// (`wait_cancellation_completed`): what it still waits for, if anything. The first such
/// delivery stops them and records what it waits for; a later one at the same call goes on
/// once they have stopped (recording each child's resolution).
fn wait_for_stops(
    run: &mut RunState,
    cx: &mut Cx,
    task_id: &TaskId,
    delivery: &DeliveryRequest,
    request: &CancellationRequest,
    steps: std::ops::Range<u32>,
) -> Result<Option<Reason>, Refusal> {
    let Some(awaiting) = &request.awaiting else {
        return Ok(start_waiting(run, cx, task_id, delivery, request, steps));
    };
    let same = same_call(
        delivery,
        awaiting.sequence,
        &awaiting.call_kind,
        awaiting.sequence_span,
        awaiting.operation_sequence,
        awaiting.operation_sequence_span,
    );
    if !same {
        return Err(Refusal::new(
            Reason::CancellationWaitBoundaryMismatch,
            "The delivery waits at another call; deliver it there.",
        )
        .with("task_id", task_id.as_str())
        .with("sequence", awaiting.sequence));
    }
    if let Some(waiting) = still_waiting(run, awaiting) {
        return Ok(Some(waiting));
    }
    for (step, workflow_id, run_id) in awaiting.children.clone() {
        let payload = obj!(
            "sequence" => step,
            "cancellation_policy" => "wait_cancellation_completed",
            "parent_request_id" => request.request_id,
            "child_workflow_instance_id" => workflow_id,
            "child_workflow_run_id" => run_id,
            "reason" => "child_closed",
        );
        run.append(
            cx,
            EventType::ChildCancellationResolved,
            payload,
            Some(task_id),
            Some(&request.request_id),
        );
    }
    Ok(None)
}

/// Stops the running attempts (activities, prepared local attempts) and children of `steps`
/// whose policy waits for them, and records what the delivery now waits for; `None` when
/// nothing there waits.
fn start_waiting(
    run: &mut RunState,
    cx: &mut Cx,
    task_id: &TaskId,
    delivery: &DeliveryRequest,
    request: &CancellationRequest,
    steps: std::ops::Range<u32>,
) -> Option<Reason> {
    let waits: Vec<ActivityExecution> = steps
        .clone()
        .flat_map(|step| run.activities.values().filter(move |a| a.step == step))
        .filter(|a| a.cancellation_policy == Some(ActivityCancellationPolicy::WaitCancellationCompleted))
        .filter(|a| running_attempt(run, &a.task_id).is_some())
        .cloned()
        .collect();
    let local_waits = stop_waiting_local_attempts(run, cx, steps.clone());
    let children = ask_children_to_cancel(run, cx, steps, request, task_id);
    if waits.is_empty() && local_waits.is_empty() && children.is_empty() {
        return None;
    }
    let mut attempts: Vec<ActivityAttemptId> = waits
        .iter()
        .filter_map(|a| running_attempt(run, &a.task_id))
        .map(|(attempt, _)| attempt)
        .collect();
    attempts.extend(local_waits);
    for activity in &waits {
        stop_activity(run, cx, activity);
    }
    let awaiting = AwaitedStops {
        sequence: delivery.sequence,
        call_kind: delivery.call_kind.clone(),
        sequence_span: delivery.sequence_span,
        operation_sequence: delivery.operation_sequence,
        operation_sequence_span: delivery.operation_sequence_span,
        attempts,
        children,
    };
    let waiting = still_waiting(run, &awaiting);
    debug_assert!(waiting.is_some(), "a delivery that stopped something waits for it");
    run.cancellation.as_mut().expect("checked").awaiting = Some(awaiting);
    waiting
}

/// Records the delivery (`CooperativeCancellationDelivered`) on the run's request.
fn record_delivery(
    run: &mut RunState,
    cx: &mut Cx,
    task_id: &TaskId,
    delivery: DeliveryRequest,
    request: &CancellationRequest,
) -> CancellationDelivery {
    let done = CancellationDelivery {
        sequence: delivery.sequence,
        call_kind: delivery.call_kind,
        sequence_span: delivery.sequence_span,
        operation_sequence: delivery.operation_sequence,
        operation_sequence_span: delivery.operation_sequence_span,
        delivered_at: cx.now,
        delivery_event_id: None,
    };
    let payload = events::cooperative_cancellation_delivered(run, &request.request_id, &done);
    let event_id = run.append(
        cx,
        EventType::CooperativeCancellationDelivered,
        payload,
        Some(task_id),
        Some(&request.request_id),
    );
    let done = CancellationDelivery {
        delivery_event_id: Some(event_id),
        ..done
    };
    let request = run.cancellation.as_mut().expect("checked");
    request.delivery = Some(done.clone());
    request.awaiting = None;
    run.extend_leased_history(cx);
    done
}

/// What a delivery came to.
#[derive(Clone, Debug, PartialEq)]
pub enum DeliveryOutcome {
    Delivered(CancellationDelivery),
    /// What is at the call must end first (`wait_cancellation_completed`): its activities'
    /// attempts were cancelled and its children asked to cancel, the worker's claim was
    /// released, and the run gets a new workflow task once every stopped attempt's worker has
    /// acknowledged its stop and every child has closed (or the cleanup deadline closes the
    /// run). The reason says which it waits for (`cancellation_waiting_for_activity|child`).
    Waiting(Reason),
}

/// What a deferred delivery still waits for, if anything.
fn still_waiting(run: &RunState, awaiting: &AwaitedStops) -> Option<Reason> {
    if !super::activity_stop::stops_acknowledged(run, awaiting) {
        return Some(Reason::CancellationWaitingForActivity);
    }
    if awaiting.children.iter().any(|(step, _, _)| run.children.contains_key(step)) {
        return Some(Reason::CancellationWaitingForChild);
    }
    None
}

/// Children at the interrupted calls whose `cancellation_policy` asks for it are asked to cancel
/// (cooperatively, in the same transaction: `ChildCancellationRequested` here, the request on
/// the child). Answers those the delivery must wait for (`wait_cancellation_completed`).
fn ask_children_to_cancel(
    run: &mut RunState,
    cx: &mut Cx,
    steps: std::ops::Range<u32>,
    request: &CancellationRequest,
    task_id: &TaskId,
) -> Vec<(u32, WorkflowId, RunId)> {
    let children: Vec<(u32, ChildLink)> = steps
        .filter_map(|step| run.children.get(&step).map(|link| (step, link.clone())))
        .filter(|(_, link)| matches!(link.cancellation_policy.as_str(), "try_cancel" | "wait_cancellation_completed"))
        .collect();
    let mut waits = Vec::new();
    for (step, link) in children {
        let child_request: CommandId = cx.id();
        let timeout_seconds = ((request.cleanup_deadline_at - cx.now) / 1000).max(1);
        let payload = obj!(
            "sequence" => step,
            "cancellation_policy" => link.cancellation_policy,
            "parent_request_id" => request.request_id,
            "root_request_id" => request.request_id,
            "cleanup_deadline_at" => iso8601(request.cleanup_deadline_at),
            "child_workflow_instance_id" => link.workflow_id,
            "child_workflow_run_id" => link.run_id,
            "child_request_id" => child_request,
            "child_cleanup_deadline_at" => iso8601(cx.now + timeout_seconds * 1000),
        );
        run.append(
            cx,
            EventType::ChildCancellationRequested,
            payload,
            Some(task_id),
            Some(&request.request_id),
        );
        cx.effects.cancel_children.push(ChildCancellation {
            workflow_id: link.workflow_id.clone(),
            request_id: child_request,
            cleanup_timeout_seconds: timeout_seconds,
            reason: Some("parent cancellation delivered at the child's call".into()),
        });
        if link.cancellation_policy == "wait_cancellation_completed" {
            waits.push((step, link.workflow_id, link.run_id));
        }
    }
    waits
}

/// Prepared local attempts at the interrupted calls whose policy waits for their stop: stopped
/// now if still running; answers those whose stop is not yet acknowledged.
fn stop_waiting_local_attempts(run: &mut RunState, cx: &mut Cx, steps: std::ops::Range<u32>) -> Vec<ActivityAttemptId> {
    let mut waiting = Vec::new();
    for step in steps {
        let Some(local) = run.prepared_locals.get(&step) else { continue };
        if local.descriptor.cancellation_policy != Some(ActivityCancellationPolicy::WaitCancellationCompleted) {
            continue;
        }
        let Some(attempt_id) = local.attempt.as_ref().map(|a| a.attempt_id.clone()) else {
            continue;
        };
        stop_prepared_attempt(run, cx, step);
        if run.stopped_attempts.get(&attempt_id).is_some_and(|s| s.acknowledgement.is_none()) {
            waiting.push(attempt_id);
        }
    }
    waiting
}

/// Ends what an interrupted step was waiting for.
fn interrupt_step(run: &mut RunState, cx: &mut Cx, step: u32) {
    let timers: Vec<TimerState> = run.timers.values().filter(|t| t.step == step).cloned().collect();
    for timer in timers {
        run.timers.remove(&timer.id);
        run.close_task(cx, &timer.task_id, TaskClosure::Cancelled);
        if timer.purpose == TimerPurpose::User {
            let payload = events::timer_cancelled(&timer, cx.now);
            run.append(cx, EventType::TimerCancelled, payload, None, None);
        }
    }
    // An `abandon` activity is left running: the workflow stops waiting for it, the activity
    // does not stop (until the run closes, which ends every task of the run).
    let activities: Vec<ActivityExecution> = run
        .activities
        .values()
        .filter(|a| a.step == step && a.cancellation_policy != Some(ActivityCancellationPolicy::Abandon))
        .cloned()
        .collect();
    for activity in activities {
        stop_activity(run, cx, &activity);
    }
    // A prepared local attempt still running at the call is stopped; the call is over.
    if run.prepared_locals.contains_key(&step) {
        stop_prepared_attempt(run, cx, step);
        run.prepared_locals.remove(&step);
    }
    run.condition_waits.retain(|w| w.step != step);
    run.signal_waits.retain(|w| w.step != step);
    // A sync service call the workflow waited on is cancelled (the store ends the call and, by
    // its operation's policy, its linked run); no row at the call: the delivery is its end.
    if let Some(wait) = run.service_waits.remove(&step) {
        cx.effects.service_cancels.push(wait.service_call_id);
    }
}

/// Cancels an activity at an interrupted call (`ActivityCancelled`); a running attempt's worker
/// gets a stop receipt to acknowledge.
fn stop_activity(run: &mut RunState, cx: &mut Cx, activity: &ActivityExecution) {
    let running = running_attempt(run, &activity.task_id);
    run.activities.remove(&activity.id);
    run.close_task(cx, &activity.task_id, TaskClosure::Cancelled);
    let payload = events::activity_cancelled(events::Cancelled::Delivered(activity));
    run.append(cx, EventType::ActivityCancelled, payload, None, None);
    if let (Some((attempt_id, lease_owner)), Some(request)) = (running, run.cancellation.clone()) {
        let cancellation_event_id = cx.effects.events.last().expect("appended").id.clone();
        let stopped = crate::activity_stop::StoppedAttempt::stopped_by(
            &request,
            activity.task_id.clone(),
            activity.id.clone(),
            lease_owner,
            cancellation_event_id,
        );
        run.stopped_attempts.insert(attempt_id, stopped);
    }
}

/// The attempt running in an activity task, and its holder.
fn running_attempt(run: &RunState, task_id: &TaskId) -> Option<(ActivityAttemptId, String)> {
    let task = run.tasks.get(task_id)?;
    match (&task.detail, task.lease()) {
        (
            TaskDetail::Activity {
                attempt_id: Some(attempt), ..
            },
            Some(lease),
        ) => Some((attempt.clone(), lease.owner.clone())),
        _ => None,
    }
}

/// The workflow finished its cleanup after the delivery: the run ends cancelled.
pub(super) fn close_cancelled_cooperatively(run: &mut RunState, cx: &mut Cx, wt: Option<&TaskId>, outcome: &str) {
    close_run(run, cx, RunStatus::Cancelled, ClosedReason::Cancelled);
    append_cooperative_cancelled(run, cx, wt, outcome);
}

/// `WorkflowCancelled` of a cooperative cancellation: `completed` cleanup or `deadline_expired`.
pub(super) fn append_cooperative_cancelled(run: &mut RunState, cx: &mut Cx, wt: Option<&TaskId>, outcome: &str) {
    let request = run.cancellation.clone().expect("a cooperative close has a request");
    let reason = if outcome == "completed" {
        "Cooperative cancellation completed."
    } else {
        "Cooperative cancellation cleanup deadline expired."
    };
    let message = format!("Workflow cancelled: {reason}");
    let failure_id: String = cx.ids.next_id();
    let by = events::CancelledBy::Cooperative {
        request: &request,
        outcome,
        reason,
        finished_at: cx.now,
    };
    let payload = events::workflow_cancelled(run, &failure_id, by, &message);
    run.failure = Some(WorkflowFailure {
        message,
        exception_type: Some("WorkflowCancelled".into()),
        exception_class: Some("WorkflowCancelled".into()),
        ..Default::default()
    });
    run.append(cx, EventType::WorkflowCancelled, payload, wt, Some(&request.request_id));
}
