//! A workflow task's commands: validated together, then applied one by one.

use super::*;

mod local_activity;
mod selection;
mod timers;
mod updates;

pub(in crate::transitions) use local_activity::*;
pub(in crate::transitions) use selection::*;
pub(in crate::transitions) use timers::*;
pub(in crate::transitions) use updates::*;

pub(super) fn validate_commands(run: &RunState, cx: &Cx, commands: &[WorkflowCommand]) -> Result<(), Refusal> {
    if commands.is_empty() {
        return Err(invalid("A workflow task completion needs at least one command."));
    }
    if commands.len() > cx.limits.commands_per_completion_max {
        return Err(
            Refusal::new(Reason::StructuralLimitExceeded, "Too many commands in one completion.")
                .with("limit_kind", "commands_per_completion")
                .with("current_value", commands.len())
                .with("configured_limit", cx.limits.commands_per_completion_max),
        );
    }
    let terminal_count = commands.iter().filter(|c| c.is_terminal()).count();
    if terminal_count > 1 || (terminal_count == 1 && !commands.last().is_some_and(|c| c.is_terminal())) {
        return Err(invalid("At most one terminal command is allowed and it must be last."));
    }
    let local_events: usize = commands
        .iter()
        .map(|c| match c {
            WorkflowCommand::RecordLocalActivity(local) => local.event_count(),
            _ => 0,
        })
        .sum();
    let events_after = run.last_sequence + 3 * commands.len() as u64 + local_events as u64;
    if events_after > cx.limits.history_events_max {
        return Err(Refusal::new(Reason::StructuralLimitExceeded, "The run's history is full.")
            .with("limit_kind", "history_events")
            .with("current_value", run.last_sequence)
            .with("configured_limit", cx.limits.history_events_max));
    }
    let new_activities = commands
        .iter()
        .filter(|c| matches!(c, WorkflowCommand::ScheduleActivity(_)))
        .count();
    if run.activities.len() + new_activities > cx.limits.pending_activities_max {
        return Err(Refusal::new(Reason::StructuralLimitExceeded, "Too many pending activities.")
            .with("limit_kind", "pending_activities")
            .with("current_value", run.activities.len() + new_activities)
            .with("configured_limit", cx.limits.pending_activities_max));
    }
    let new_timers = commands
        .iter()
        .filter(|c| matches!(c, WorkflowCommand::StartTimer { .. }) || matches!(c, WorkflowCommand::OpenConditionWait { timeout_seconds: Some(t), .. } | WorkflowCommand::OpenSignalWait { timeout_seconds: Some(t), .. } if *t > 0))
        .count();
    if run.timers.len() + new_timers > cx.limits.pending_timers_max {
        return Err(Refusal::new(Reason::StructuralLimitExceeded, "Too many pending timers.")
            .with("limit_kind", "pending_timers")
            .with("current_value", run.timers.len() + new_timers)
            .with("configured_limit", cx.limits.pending_timers_max));
    }
    for command in commands {
        let delay = match command {
            WorkflowCommand::StartTimer { delay_seconds, .. } => Some(*delay_seconds),
            WorkflowCommand::OpenConditionWait { timeout_seconds, .. } | WorkflowCommand::OpenSignalWait { timeout_seconds, .. } => {
                *timeout_seconds
            }
            _ => None,
        };
        if let Some(delay) = delay {
            if delay < 0 || delay > cx.limits.delay_seconds_max {
                return Err(invalid(format!(
                    "Delay {delay} s is outside 0..={} s.",
                    cx.limits.delay_seconds_max
                )));
            }
        }
        if let WorkflowCommand::RecordVersionMarker {
            version,
            min_supported,
            max_supported,
            ..
        } = command
        {
            if !(min_supported <= version && version <= max_supported) {
                return Err(invalid("record_version_marker needs min_supported <= version <= max_supported."));
            }
        }
    }
    Ok(())
}

/// Assigns the step sequence of a command, or `None` when it re-sends an already recorded
/// parallel-group member (a replay: no events, no step).
fn take_step(run: &mut RunState, command: &WorkflowCommand) -> Result<Option<u32>, Refusal> {
    let kind = command.step_kind().expect("only step commands take steps");
    let tags = command.tags().expect("step commands have tags");
    let base = tags.get("parallel_group_base_sequence").and_then(Value::as_u64);
    let index = tags.get("parallel_group_index").and_then(Value::as_u64);
    if let (Some(base), Some(index)) = (base, index) {
        let target = (base + index) as u32;
        if target < run.next_step {
            return match run.steps.get(&target) {
                Some(recorded) if *recorded == kind => Ok(None),
                _ => Err(invalid(format!(
                    "Parallel group member at step {target} does not match the recorded step."
                ))),
            };
        }
        if target != run.next_step {
            return Err(invalid(format!(
                "parallel_group_base_sequence + parallel_group_index = {target}, but the next step is {}.",
                run.next_step
            )));
        }
    }
    let step = run.next_step;
    run.next_step += 1;
    run.steps.insert(step, kind);
    Ok(Some(step))
}

pub(super) fn apply_command(run: &mut RunState, cx: &mut Cx, task_id: &TaskId, command: WorkflowCommand) -> Result<(), Refusal> {
    let step = if command.step_kind().is_some() {
        match take_step(run, &command)? {
            Some(step) => step,
            None => return Ok(()),
        }
    } else {
        0
    };
    let now = cx.now;
    let wt = Some(task_id);
    match command {
        WorkflowCommand::ScheduleActivity(schedule) => {
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
            set_ready_activity_deadline(run, cx, &task, &execution);
            let mut payload = activity_identity(&execution);
            payload.insert("queue".into(), json!(execution.queue));
            if execution.retry_policy_given {
                payload.insert("retry_policy".into(), execution.retry_policy.to_json());
            }
            let t = &execution.timeouts;
            for (key, value) in [
                ("start_to_close_timeout", t.start_to_close_seconds),
                ("schedule_to_start_timeout", t.schedule_to_start_seconds),
                ("schedule_to_close_timeout", t.schedule_to_close_seconds),
                ("heartbeat_timeout", t.heartbeat_seconds),
            ] {
                if let Some(value) = value {
                    payload.insert(key.into(), json!(value));
                }
            }
            payload.insert("task_id".into(), json!(task));
            run.activities.insert(execution.id.clone(), execution);
            run.append(cx, EventType::ActivityScheduled, payload, wt, None);
        }
        WorkflowCommand::RecordLocalActivity(local) => record_local_activity(run, cx, step, wt, local),
        WorkflowCommand::CancelSelectionOperation(cancel) => cancel_selection_member(run, cx, wt, cancel)?,
        WorkflowCommand::StartTimer { delay_seconds, tags } => {
            let timer = schedule_timer(run, cx, step, delay_seconds, TimerPurpose::User, tags);
            let payload = timer_payload(run, &timer);
            run.append(cx, EventType::TimerScheduled, payload, wt, None);
        }
        WorkflowCommand::OpenConditionWait {
            condition_key,
            fingerprint,
            timeout_seconds,
            tags,
        } => {
            let wait_id: WaitId = cx.id();
            let mut payload = obj!(
                "condition_wait_id" => wait_id,
                "condition_key" => condition_key,
                "condition_definition_fingerprint" => fingerprint,
                "sequence" => step,
                "timeout_seconds" => timeout_seconds,
            );
            extend(&mut payload, &tags);
            run.append(cx, EventType::ConditionWaitOpened, payload, wt, None);
            let mut wait = ConditionWait {
                id: wait_id.clone(),
                step,
                condition_key,
                fingerprint,
                timeout_seconds,
                timer_id: None,
            };
            if let Some(timeout) = timeout_seconds.filter(|t| *t > 0) {
                let timer = schedule_timer(run, cx, step, timeout, TimerPurpose::ConditionTimeout(wait_id), tags);
                wait.timer_id = Some(timer.id.clone());
                run.condition_waits.push(wait);
                let payload = timer_payload(run, &timer);
                run.append(cx, EventType::TimerScheduled, payload, wt, None);
            } else {
                run.condition_waits.push(wait);
            }
        }
        WorkflowCommand::OpenSignalWait {
            signal_name,
            timeout_seconds,
            tags,
        } => {
            let wait_id: WaitId = cx.id();
            let mut payload = obj!(
                "signal_name" => signal_name,
                "signal_wait_id" => wait_id,
                "sequence" => step,
                "timeout_seconds" => timeout_seconds,
            );
            extend(&mut payload, &tags);
            run.append(cx, EventType::SignalWaitOpened, payload, wt, None);
            let mut wait = SignalWait {
                id: wait_id.clone(),
                step,
                signal_name,
                timeout_seconds,
                timer_id: None,
            };
            match timeout_seconds {
                Some(0) => {
                    // A zero timeout resolves at once: the wait times out in this very completion.
                    let timer = TimerState {
                        id: cx.id(),
                        step,
                        delay_seconds: 0,
                        fire_at: now,
                        task_id: TaskId(String::new()),
                        purpose: TimerPurpose::SignalTimeout(wait_id),
                        tags,
                    };
                    let mut payload = timer_payload_for(&timer, Some(&wait.signal_name));
                    payload.insert("fired_at".into(), json!(iso8601(now)));
                    run.append(cx, EventType::TimerFired, payload, wt, None);
                    run.workflow_task_wanted = true;
                }
                Some(timeout) if timeout > 0 => {
                    let timer = schedule_timer(run, cx, step, timeout, TimerPurpose::SignalTimeout(wait_id), tags);
                    wait.timer_id = Some(timer.id.clone());
                    let payload = timer_payload_for(&timer, Some(&wait.signal_name));
                    run.signal_waits.push(wait);
                    run.append(cx, EventType::TimerScheduled, payload, wt, None);
                }
                _ => run.signal_waits.push(wait),
            }
        }
        WorkflowCommand::RecordSideEffect { result, tags } => {
            let mut payload = obj!("sequence" => step, "result" => result.blob, "payload_codec" => result.codec);
            extend(&mut payload, &tags);
            run.append(cx, EventType::SideEffectRecorded, payload, wt, None);
        }
        WorkflowCommand::RecordVersionMarker {
            change_id,
            version,
            min_supported,
            max_supported,
            tags,
        } => {
            let mut payload = obj!(
                "sequence" => step,
                "change_id" => change_id,
                "version" => version,
                "min_supported" => min_supported,
                "max_supported" => max_supported,
            );
            extend(&mut payload, &tags);
            run.append(cx, EventType::VersionMarkerRecorded, payload, wt, None);
        }
        WorkflowCommand::UpsertSearchAttributes { attributes, tags } => {
            for (key, value) in &attributes {
                if value.is_null() {
                    run.search_attributes.remove(key);
                } else {
                    run.search_attributes.insert(key.clone(), value.clone());
                }
            }
            let mut payload = obj!("sequence" => step, "attributes" => attributes, "merged" => run.search_attributes);
            extend(&mut payload, &tags);
            run.append(cx, EventType::SearchAttributesUpserted, payload, wt, None);
        }
        // After a cooperative cancellation reached workflow code, however the code ends its
        // cleanup, the run ends cancelled.
        WorkflowCommand::CompleteWorkflow { .. } | WorkflowCommand::FailWorkflow(_) if cancellation_delivered(run) => {
            close_cancelled_cooperatively(run, cx, wt, "completed");
        }
        WorkflowCommand::CompleteWorkflow { result } => {
            let payload = obj!("output" => result.blob, "payload_codec" => result.codec);
            run.output = Some(result);
            close_run(run, cx, RunStatus::Completed, ClosedReason::Completed);
            run.append(cx, EventType::WorkflowCompleted, payload, wt, None);
        }
        WorkflowCommand::StartChildWorkflow(child) => {
            let child_id = child
                .workflow_id
                .clone()
                .unwrap_or_else(|| format!("{}:{}:{step}", run.workflow_id, run.run_id));
            let parent = ParentLink {
                workflow_id: run.workflow_id.clone(),
                run_id: run.run_id.clone(),
                sequence: step,
                retry_policy: child.retry_policy.clone(),
                attempt: 1,
            };
            let (child_run, child_effects) = {
                let mut next = Cx::new(cx.now, &mut *cx.ids, cx.limits);
                let start = StartRun {
                    namespace: run.namespace.clone(),
                    workflow_id: WorkflowId(child_id.clone()),
                    run_id: next.id(),
                    workflow_type: child.workflow_type.clone(),
                    task_queue: child
                        .queue
                        .clone()
                        .filter(|q| !q.is_empty())
                        .unwrap_or_else(|| run.task_queue.clone()),
                    input: child.arguments.clone(),
                    execution_timeout_seconds: child.execution_timeout_seconds,
                    run_timeout_seconds: child.run_timeout_seconds,
                    business_key: None,
                    memo: Map::new(),
                    search_attributes: Map::new(),
                    command_id: next.id(),
                    contract: None,
                    compatibility: None,
                };
                let execution_deadline_at = start.execution_timeout_seconds.map(|s| next.now + s * 1000);
                let mut child_run = blank_run(&next, start, 1, execution_deadline_at);
                child_run.parent = Some(parent);
                let child_run = begin_run(child_run, &mut next);
                (child_run, next.effects)
            };
            let mut payload = obj!(
                "sequence" => step,
                "child_workflow_instance_id" => child_run.workflow_id,
                "child_workflow_run_id" => child_run.run_id,
                "child_workflow_type" => child_run.workflow_type,
                "child_call_id" => child_run.start_command_id,
                "workflow_link_id" => child_run.start_command_id,
                "parent_close_policy" => child.parent_close_policy,
                "cancellation_policy" => child.cancellation_policy,
                "task_queue" => child_run.task_queue,
            );
            if let Some(policy) = &child.retry_policy {
                payload.insert("retry_policy".into(), child_retry_snapshot(policy));
            }
            extend(&mut payload, &child.tags);
            run.append(cx, EventType::ChildWorkflowScheduled, payload.clone(), wt, None);
            payload.insert("child_status".into(), json!(child_run.status.as_str()));
            payload.insert("child_run_number".into(), json!(child_run.run_number));
            payload.insert("execution_timeout_seconds".into(), json!(child_run.execution_timeout_seconds));
            payload.insert("run_timeout_seconds".into(), json!(child_run.run_timeout_seconds));
            run.append(cx, EventType::ChildRunStarted, payload, wt, None);
            run.children.insert(
                step,
                ChildLink {
                    workflow_id: child_run.workflow_id.clone(),
                    run_id: child_run.run_id.clone(),
                    workflow_type: child_run.workflow_type.clone(),
                    parent_close_policy: child.parent_close_policy,
                    cancellation_policy: child.cancellation_policy,
                    call_id: child_run.start_command_id.to_string(),
                    tags: child.tags,
                },
            );
            cx.effects.children_started.push((child_run, child_effects));
        }
        WorkflowCommand::CompleteUpdate { update_id, result } => {
            let record = accepted_update(run, &update_id)?;
            let wait_step = run.condition_waits.last().map(|w| w.step);
            let mut identity = obj!(
                "workflow_command_id" => record.command_id,
                "update_id" => update_id,
                "workflow_instance_id" => run.workflow_id,
                "workflow_run_id" => run.run_id,
                "update_name" => record.update_name,
            );
            if let Some(step) = wait_step {
                identity.insert("sequence".into(), json!(step));
            }
            let mut applied = identity.clone();
            applied.insert("arguments".into(), payload_json(&record.arguments));
            run.append(cx, EventType::UpdateApplied, applied, wt, Some(&record.command_id));
            let mut completed = identity;
            completed.insert("result".into(), json!(result.blob));
            completed.insert("payload_codec".into(), json!(result.codec));
            run.append(cx, EventType::UpdateCompleted, completed, wt, Some(&record.command_id));
            let stored = run.updates.get_mut(&update_id).expect("checked");
            stored.status = UpdateStatus::Completed;
            stored.closed_at = Some(cx.now);
            stored.result = Some(result);
            // A regular task follows, re-evaluating whatever the handler changed.
            run.pending_resumes.push_back(ResumeContext::AfterUpdate { update_id });
        }
        WorkflowCommand::FailUpdate { update_id, failure } => {
            let record = accepted_update(run, &update_id)?;
            let payload = obj!(
                "workflow_command_id" => record.command_id,
                "update_id" => update_id,
                "workflow_instance_id" => run.workflow_id,
                "workflow_run_id" => run.run_id,
                "update_name" => record.update_name,
                "failure_category" => "application",
                "non_retryable" => failure.non_retryable,
                "exception_type" => failure.exception_type,
                "exception_class" => failure.exception_class.clone().or_else(|| failure.exception_type.clone()),
                "message" => failure.message,
                "exception" => failure.exception,
            );
            run.append(cx, EventType::UpdateCompleted, payload, wt, Some(&record.command_id));
            let stored = run.updates.get_mut(&update_id).expect("checked");
            stored.status = UpdateStatus::Failed;
            stored.closed_at = Some(cx.now);
            stored.failure = Some(failure);
        }
        WorkflowCommand::UpsertMemo { entries, tags } => {
            let codec = cx.memo.ok_or_else(|| invalid("This server cannot merge memos."))?;
            let base = match &run.memo_merged {
                Some(merged) => crate::memo::MemoBase::Merged(merged),
                None => crate::memo::MemoBase::Start(&run.memo),
            };
            let merged = codec
                .merge(base, &entries)
                .map_err(|reason| invalid(format!("upsert_memo: {reason}")))?;
            let mut payload = obj!(
                "sequence" => step,
                "entries" => payload_json(&entries),
                "merged" => payload_json(&merged.merged),
            );
            extend(&mut payload, &tags);
            run.memo = merged.projection;
            run.memo_merged = Some(merged.merged);
            run.append(cx, EventType::MemoUpserted, payload, wt, None);
        }
        WorkflowCommand::ContinueAsNew {
            arguments,
            workflow_type,
            queue,
            tags,
        } => {
            close_run(run, cx, RunStatus::Completed, ClosedReason::Continued);
            // The successor is built with its own effects; its events belong to its own run.
            let (successor, successor_effects) = {
                let mut next = Cx::new(cx.now, &mut *cx.ids, cx.limits);
                let successor = continued_run(&mut next, run, arguments, workflow_type, queue);
                (successor, next.effects)
            };
            let mut payload = obj!(
                "sequence" => step,
                "continued_to_run_id" => successor.run_id,
                "continued_to_run_number" => successor.run_number,
                "workflow_link_id" => successor.start_command_id,
                "closed_reason" => "continued",
                "workflow_type" => successor.workflow_type,
                "task_queue" => successor.task_queue,
            );
            extend(&mut payload, &tags);
            run.append(cx, EventType::WorkflowContinuedAsNew, payload, wt, None);
            // Link the chains: the successor's first event follows this run's last.
            let mut successor = successor;
            let mut successor_effects = successor_effects;
            relink(&mut successor, &mut successor_effects, &run.last_hash);
            cx.effects.successor = Some(Box::new((successor, successor_effects)));
        }
        WorkflowCommand::FailWorkflow(failure) => {
            let failure_id: String = cx.ids.next_id();
            let payload = obj!(
                "failure_id" => failure_id,
                "source_kind" => "workflow_run",
                "source_id" => run.run_id,
                "failure_category" => "application",
                "non_retryable" => failure.non_retryable,
                "exception_type" => failure.exception_type,
                "exception_class" => failure.exception_class.clone().or_else(|| failure.exception_type.clone()),
                "message" => failure.message,
                "exception" => failure.exception,
            );
            run.failure = Some(failure);
            close_run(run, cx, RunStatus::Failed, ClosedReason::Failed);
            run.append(cx, EventType::WorkflowFailed, payload, wt, None);
            retry_failed_child(run, cx);
        }
    }
    Ok(())
}
