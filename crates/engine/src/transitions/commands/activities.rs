//! `schedule_activity`: a new activity execution and the task of its first attempt.

use crate::transitions::commands::At;
use crate::transitions::{events, set_ready_activity_deadline};
use crate::{
    ActionPin, ActivityExecution, ActivityExecutionId, Cx, EventType, RecoveryMode, RetryPolicy, RunState, ScheduleActivity, TaskDetail,
    TaskKind, ATOMIC_QUEUE,
};

/// Schedules an activity: its execution, its first task (on the atomic queue for an atomic
/// declared action) and `ActivityScheduled`.
pub(in crate::transitions) fn schedule_activity(run: &mut RunState, cx: &mut Cx, at: At, schedule: ScheduleActivity) {
    let At { step, task: wt } = at;
    let now = cx.now;
    let execution_id: ActivityExecutionId = cx.id();
    let queue = schedule
        .queue
        .clone()
        .filter(|q| !q.is_empty())
        .unwrap_or_else(|| run.task_queue.clone());
    let retry_policy_given = schedule.retry_policy.is_some();
    let retry_policy = schedule.retry_policy.clone().unwrap_or_else(RetryPolicy::server_default);
    let schedule_to_close_deadline = schedule.timeouts.schedule_to_close_seconds.map(|s| now + s * 1000);
    let task = run.new_task(
        cx,
        TaskKind::Activity,
        &queue,
        TaskDetail::Activity {
            execution_id: execution_id.clone(),
            activity_type: schedule.activity_type.clone(),
            attempt_number: 1,
            attempt_id: None,
            last_heartbeat_at: None,
            started_at: None,
        },
    );
    let execution = ActivityExecution {
        id: execution_id,
        step,
        activity_type: schedule.activity_type,
        queue,
        arguments: schedule.arguments,
        retry_policy,
        retry_policy_given,
        timeouts: schedule.timeouts,
        scheduled_at: now,
        schedule_to_close_deadline,
        attempt_count: 0,
        attempt_ids: Vec::new(),
        task_id: task.clone(),
        last_heartbeat_details: None,
        tags: schedule.tags,
        action: None,
        ledger_key: None,
        blocked_by: None,
        cancellation_policy: schedule.cancellation_policy,
        worker_session: schedule.worker_session,
        probe_retries: 0,
    };
    let mut execution = execution;
    if let Some(definition) = cx.actions.as_ref().and_then(|actions| actions.get(&execution.activity_type)) {
        let arguments = cx.memo.and_then(|codec| codec.to_json(&execution.arguments).ok());
        execution.action = Some(ActionPin::for_arguments(definition, arguments.as_ref()));
        // An atomic action runs in the server, never on a worker: its task goes to the
        // internal queue the server's atomic executor polls.
        if definition.recovery_mode == RecoveryMode::Atomic {
            execution.queue = ATOMIC_QUEUE.to_string();
            let task_id = execution.task_id.clone();
            run.task_mut(cx, &task_id).expect("just created").queue = ATOMIC_QUEUE.to_string();
        }
    }
    set_ready_activity_deadline(run, cx, &task, &execution, now);
    let payload = events::activity_scheduled(events::Scheduled::Worker {
        execution: &execution,
        task_id: &task,
    });
    run.activities.insert(execution.id.clone(), execution);
    run.append(cx, EventType::ActivityScheduled, payload, wt, None);
}
