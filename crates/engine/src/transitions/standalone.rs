//! A standalone activity's host run: started with its activity scheduled as step 1, and closed
//! by that activity's end (see [`crate::standalone`]).

use crate::standalone::StandaloneActivity;
use crate::transitions::close::close_run;
use crate::transitions::commands::{schedule_activity, At};
use crate::transitions::{blank_run, events};
use crate::{
    ActivityExecution, ActivityTimeouts, Cx, FailureBoundary, RetryPolicy, RunState, ScheduleActivity, StepKind, StepTags, TaskId,
    WorkflowFailure,
};
use crate::{ClosedReason, EventType, Payload, RunStatus, StartRun};

/// A client's standalone activity, already validated.
#[derive(Clone, Debug)]
pub struct StartStandaloneActivity {
    /// The host run: `workflow_id` is the activity id, `input` the activity's arguments.
    pub run: StartRun,
    pub activity_type: String,
    pub activity_class: String,
    /// `None`: one attempt, no retry (DW's default for standalone activities).
    pub retry_policy: Option<RetryPolicy>,
    pub timeouts: ActivityTimeouts,
}

/// The policy of a standalone activity that gave none: a single attempt.
pub fn standalone_default_retry() -> RetryPolicy {
    RetryPolicy {
        max_attempts: Some(1),
        backoff_seconds: Vec::new(),
        non_retryable_error_types: Vec::new(),
    }
}

/// Creates host run `run_number` of an activity id: `StartAccepted`, `WorkflowStarted` and
/// `ActivityScheduled` with a ready activity task; never a workflow task.
pub fn start_standalone_activity(cx: &mut Cx, start: StartStandaloneActivity, run_number: u32) -> RunState {
    let StartStandaloneActivity {
        run: mut host,
        activity_type,
        activity_class,
        retry_policy,
        timeouts,
    } = start;
    host.workflow_type = crate::standalone::STANDALONE_ACTIVITY_TYPE.to_string();
    host.execution_timeout_seconds = None;
    host.run_timeout_seconds = None;
    let arguments = host.input.clone();
    super::start::acting_for(cx, &host);
    let mut run = blank_run(cx, host, run_number, None);
    let command = run.start_command_id.clone();
    let accepted = events::start_accepted(&run);
    run.append(cx, EventType::StartAccepted, accepted, None, Some(&command));
    let started = events::workflow_started(&run);
    run.append(cx, EventType::WorkflowStarted, started, None, Some(&command));
    run.status = RunStatus::Running;
    let step = run.next_step;
    run.steps.insert(step, StepKind::Activity(activity_type.clone()));
    run.next_step += 1;
    let schedule = ScheduleActivity {
        activity_type: activity_type.clone(),
        arguments,
        queue: None,
        retry_policy: Some(retry_policy.unwrap_or_else(standalone_default_retry)),
        timeouts: timeouts.clone(),
        cancellation_policy: None,
        worker_session: None,
        tags: StepTags::default(),
    };
    schedule_activity(&mut run, cx, At { step, task: None }, schedule);
    let execution = run.activities.values().next().expect("just scheduled");
    run.standalone = Some(StandaloneActivity {
        execution_id: execution.id.clone(),
        activity_type,
        activity_class,
        schedule_to_start_deadline_at: timeouts.schedule_to_start_seconds.map(|s| cx.now + s * 1000),
        schedule_to_close_deadline_at: execution.schedule_to_close_deadline,
        attempt_count: 0,
        outcome: None,
    });
    run
}

/// How an activity execution ended, for [`activity_resolved`].
pub(super) enum Resolution<'a> {
    Completed(&'a Payload),
    Failed {
        message: &'a str,
        exception_type: Option<&'a str>,
        exception_class: Option<&'a str>,
    },
    TimedOut {
        timeout_kind: &'a str,
    },
}

/// An activity execution ended (its final event is recorded and it left `run.activities`): the
/// workflow is woken to see it, or, on a standalone activity's host run, the run closes with the
/// activity's outcome. Returns the workflow task that will see it, if any.
pub(super) fn activity_resolved(
    run: &mut RunState,
    cx: &mut Cx,
    execution: &ActivityExecution,
    resolution: Resolution<'_>,
) -> Option<TaskId> {
    let Some(standalone) = run.standalone.as_mut() else {
        return run.want_workflow_task(cx, None);
    };
    if run.status.is_terminal() || standalone.execution_id != execution.id {
        return None;
    }
    standalone.attempt_count = execution.attempt_count;
    match resolution {
        Resolution::Completed(result) => {
            standalone.outcome = Some("completed".into());
            let payload = events::workflow_completed(result);
            run.output = Some(result.clone());
            close_run(run, cx, RunStatus::Completed, ClosedReason::Completed);
            run.append(cx, EventType::WorkflowCompleted, payload, None, None);
        }
        Resolution::Failed {
            message,
            exception_type,
            exception_class,
        } => {
            standalone.outcome = Some("failed".into());
            let failure = host_failure(execution, message.to_string(), exception_type, exception_class);
            close_host_failed(run, cx, execution, failure, ClosedReason::Failed);
        }
        Resolution::TimedOut { timeout_kind } => {
            standalone.outcome = Some("failed".into());
            let message = format!("The activity timed out ({timeout_kind}).");
            let failure = host_failure(execution, message, Some("ActivityTimedOut"), Some("ActivityTimedOut"));
            close_host_failed(run, cx, execution, failure, ClosedReason::TimedOut);
        }
    }
    None
}

fn host_failure(
    execution: &ActivityExecution,
    message: String,
    exception_type: Option<&str>,
    exception_class: Option<&str>,
) -> WorkflowFailure {
    WorkflowFailure {
        message,
        exception_type: exception_type.map(str::to_string),
        exception_class: exception_class.map(str::to_string),
        exception: None,
        non_retryable: true,
        boundary: Some(FailureBoundary {
            failed_step_sequence: i64::from(execution.step),
            failed_activity_execution_id: execution.id.to_string(),
        }),
    }
}

fn close_host_failed(run: &mut RunState, cx: &mut Cx, execution: &ActivityExecution, failure: WorkflowFailure, reason: ClosedReason) {
    let failure_id: String = cx.ids.next_id();
    let payload = events::host_run_failed(&failure_id, &failure, &execution.id, reason == ClosedReason::TimedOut);
    run.failure = Some(failure);
    close_run(run, cx, RunStatus::Failed, reason);
    run.append(cx, EventType::WorkflowFailed, payload, None, None);
}
