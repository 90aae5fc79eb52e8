//! An open run rebuilt from its history: how a run from DW's embedded runtime, whose bundle
//! carries no Capstan state, goes on here.
//!
//! The history is folded in order into what the run waits on — open activity executions,
//! timers, condition and signal waits, the steps taken, updates, selections — and the bundle's
//! sections add what history does not hold (an activity's arguments, a ready workflow task, the
//! signals not yet applied). Then the run's tasks are made as Capstan would have them: each open
//! activity's next attempt ready when its retry is due, each timer armed at its `fire_at`, the
//! workflow task carrying the first signal the workflow has not seen, the run deadline. An event
//! the fold cannot honour (a child, a service call, a message stream…) refuses the import by
//! name, so nothing is half rebuilt. A run Capstan exported is rebuilt to the state it carries
//! (the property tests hold it to that).

use super::super::{min_opt, next_attempt_task, set_ready_activity_deadline};
use crate::import::{Finding, ImportedEvent, OpenRunSections, PendingResume};
use crate::schedule::parse_instant;
use crate::selection::SelectionBook;
use crate::step_log::StepLog;
use crate::{
    step_tags_of, ActivityCancellationPolicy, ActivityExecution, ActivityExecutionId, ActivityTimeouts, CommandId, ConditionWait, Cx,
    EventType, Millis, Payload, ResumeContext, RetryPolicy, RunState, SignalWait, StepKind, TaskDetail, TaskKind, TimerId, TimerPurpose,
    TimerState, UpdateRecord, UpdateStatus, WaitId, WorkflowFailure, MESSAGE_STREAM_SIGNAL,
};
use serde_json::{Map, Value};
use std::collections::{BTreeMap, BTreeSet, VecDeque};

/// An open activity execution and when its current attempt's task became ready.
struct OpenActivity {
    execution: ActivityExecution,
    /// When the task of the attempt to come was made, and when it may first be leased.
    readied_at: Millis,
    available_at: Millis,
    /// An attempt started and not yet ended (the source still runs it).
    running: bool,
    /// Whether the bundle gave its arguments (history does not hold them).
    has_arguments: bool,
}

/// A signal in history, as its resume task would carry it.
struct Received {
    signal_id: String,
    resume: ResumeContext,
}

/// What the history says the run waits on.
#[derive(Default)]
struct Fold {
    started: Map<String, Value>,
    activities: BTreeMap<ActivityExecutionId, OpenActivity>,
    open_locals: BTreeSet<String>,
    timers: BTreeMap<TimerId, TimerState>,
    condition_waits: Vec<ConditionWait>,
    signal_waits: Vec<SignalWait>,
    steps: StepLog,
    next_step: u32,
    signals: Vec<Received>,
    updates: BTreeMap<String, UpdateRecord>,
    selections: SelectionBook,
    memo_merged: Option<Payload>,
    command_count: u32,
    findings: Vec<Finding>,
}

/// Rebuilds `run` (blank, its identity set) from `events` and `sections`, making its tasks.
/// Returns the rules the history breaks instead when it uses what cannot be rebuilt.
pub(super) fn rebuild(run: &mut RunState, cx: &mut Cx, events: &[ImportedEvent], sections: &OpenRunSections) -> Result<(), Vec<Finding>> {
    let mut fold = Fold {
        next_step: 1,
        ..Fold::default()
    };
    for event in events {
        fold.event(event, sections);
    }
    fold.finish(sections)?;
    fold.install(run, cx, sections);
    Ok(())
}

/// The updates a history records and how each ended (a closed run keeps them for their
/// callers, as one that closed here does).
pub(super) fn updates_of(events: &[ImportedEvent]) -> BTreeMap<String, UpdateRecord> {
    let mut fold = Fold::default();
    for event in events {
        match event.event_type {
            EventType::UpdateAccepted | EventType::UpdateRejected => fold.update_received(event),
            EventType::UpdateCompleted => fold.update_completed(event),
            _ => {}
        }
    }
    fold.updates
}

/// An application failure as an event records it (a run's `WorkflowFailed`, an update's
/// `UpdateCompleted` without a result).
pub(super) fn failure_of(payload: &Map<String, Value>) -> WorkflowFailure {
    WorkflowFailure {
        message: text(payload, "message").unwrap_or_default(),
        exception_type: text(payload, "exception_type"),
        exception_class: text(payload, "exception_class"),
        exception: payload.get("exception").filter(|v| !v.is_null()).cloned(),
        non_retryable: payload.get("non_retryable").and_then(Value::as_bool).unwrap_or(false),
        boundary: None,
    }
}

fn text(payload: &Map<String, Value>, key: &str) -> Option<String> {
    payload.get(key).and_then(Value::as_str).map(str::to_string)
}

fn number(payload: &Map<String, Value>, key: &str) -> Option<i64> {
    payload.get(key).and_then(Value::as_i64)
}

fn step_of(payload: &Map<String, Value>) -> u32 {
    number(payload, "sequence").unwrap_or(0) as u32
}

fn instant(payload: &Map<String, Value>, key: &str) -> Option<Millis> {
    payload.get(key).and_then(Value::as_str).and_then(parse_instant)
}

/// A payload as history records it: a bare Avro blob (beside `payload_codec`) or a
/// `{codec, blob}` envelope. (External references were refused with the bundle.)
fn recorded_payload(value: Option<&Value>, codec: Option<&Value>) -> Option<Payload> {
    match value? {
        Value::String(blob) => Some(match codec.and_then(Value::as_str) {
            Some(codec) => Payload::inline(codec, blob.clone()),
            None => Payload::avro(blob.clone()),
        }),
        Value::Object(envelope) => {
            let blob = envelope.get("blob")?.as_str()?;
            let codec = envelope.get("codec").and_then(Value::as_str).unwrap_or(crate::payload::AVRO_CODEC);
            Some(Payload::inline(codec, blob))
        }
        _ => None,
    }
}

/// A retry policy as DW and Capstan write one (`max_attempts`, `backoff_seconds`,
/// `non_retryable_error_types`); fields it lacks take the server's default.
fn retry_policy_of(value: &Value) -> Option<RetryPolicy> {
    let policy = value.as_object()?;
    let default = RetryPolicy::server_default();
    let backoff = policy
        .get("backoff_seconds")
        .and_then(Value::as_array)
        .map(|steps| steps.iter().filter_map(Value::as_i64).collect());
    let non_retryable = policy
        .get("non_retryable_error_types")
        .and_then(Value::as_array)
        .map(|types| types.iter().filter_map(Value::as_str).map(str::to_string).collect());
    Some(RetryPolicy {
        max_attempts: policy.get("max_attempts").and_then(Value::as_u64).map(|n| n as u32),
        backoff_seconds: backoff.unwrap_or(default.backoff_seconds),
        non_retryable_error_types: non_retryable.unwrap_or_default(),
    })
}

fn is_local(payload: &Map<String, Value>) -> bool {
    payload.get("execution_mode").and_then(Value::as_str) == Some("local")
}

impl Fold {
    fn unsupported(&mut self, feature: &str) {
        let rule = "workflow.open_feature_unsupported";
        if !self.findings.iter().any(|f| f.rule == rule && f.message.contains(feature)) {
            self.findings.push(Finding::new(
                rule,
                format!(
                    "The open run has {feature}, which an import cannot rebuild from history: let it close on its source, then import it."
                ),
            ));
        }
    }

    /// A step the workflow took: recorded, and the next step follows the highest.
    fn take_step(&mut self, step: u32, kind: StepKind) {
        if step == 0 {
            return;
        }
        if self.steps.get(&step).is_none() {
            self.steps.insert(step, kind);
        }
        self.next_step = self.next_step.max(step + 1);
    }

    fn event(&mut self, event: &ImportedEvent, sections: &OpenRunSections) {
        use EventType::*;
        let payload = &event.payload;
        // The winners are in history already; only the book's memory is wanted.
        let _ = self.selections.observe(event.id.as_str(), event.event_type, payload);
        match event.event_type {
            StartAccepted | SelectionResolved | RepairRequested => {}
            WorkflowStarted => self.started = payload.clone(),
            ActivityScheduled | ActivityStarted | ActivityHeartbeatRecorded | ActivityRetryScheduled if is_local(payload) => {
                self.local_activity(event)
            }
            ActivityScheduled => self.schedule_activity(event, sections),
            ActivityStarted => self.attempt_started(payload),
            ActivityHeartbeatRecorded => self.heartbeat(payload),
            ActivityRetryScheduled => self.retry_scheduled(event),
            ActivityCompleted | ActivityFailed | ActivityTimedOut | ActivityCancelled => self.activity_ended(payload),
            TimerScheduled => self.timer_scheduled(payload),
            TimerFired | TimerCancelled => self.timer_ended(payload),
            ConditionWaitOpened => self.condition_wait_opened(payload),
            ConditionWaitSatisfied | ConditionWaitTimedOut => self.condition_wait_ended(text(payload, "condition_wait_id")),
            SignalWaitOpened => self.signal_wait_opened(payload),
            SignalApplied => self.signal_wait_ended(text(payload, "signal_wait_id")),
            SignalReceived => self.signal_received(event),
            SideEffectRecorded => self.take_step(step_of(payload), StepKind::SideEffect),
            VersionMarkerRecorded => self.take_step(step_of(payload), StepKind::VersionMarker),
            SearchAttributesUpserted => self.take_step(step_of(payload), StepKind::SearchAttributes),
            MemoUpserted => {
                self.take_step(step_of(payload), StepKind::Memo);
                self.memo_merged = recorded_payload(payload.get("merged"), None);
            }
            UpdateAccepted | UpdateRejected => self.update_received(event),
            UpdateApplied => {}
            UpdateCompleted => self.update_completed(event),
            other => self.unsupported(&format!("a {} event", other.as_str())),
        }
    }

    /// A local activity's events are its whole story, recorded by one workflow task; one whose
    /// attempt is still open (a prepared call) is not.
    fn local_activity(&mut self, event: &ImportedEvent) {
        let payload = &event.payload;
        let id = text(payload, "activity_execution_id").unwrap_or_default();
        if event.event_type == EventType::ActivityScheduled {
            let activity_type = text(payload, "activity_type").unwrap_or_default();
            self.take_step(step_of(payload), StepKind::Activity(activity_type));
            self.open_locals.insert(id);
        }
    }

    fn schedule_activity(&mut self, event: &ImportedEvent, sections: &OpenRunSections) {
        let payload = &event.payload;
        let id = text(payload, "activity_execution_id").unwrap_or_default();
        let activity_type = text(payload, "activity_type").unwrap_or_default();
        let step = step_of(payload);
        self.take_step(step, StepKind::Activity(activity_type.clone()));
        if payload.get("worker_session").is_some_and(|s| !s.is_null()) {
            return self.unsupported("an activity in a worker session");
        }
        // Only open activities are in the section: one that ended needs no arguments.
        let section = sections.activities.get(&id).cloned().unwrap_or_default();
        let given = payload.get("retry_policy").filter(|p| p.is_object());
        let retry_policy = given
            .or(section.retry_policy.as_ref())
            .and_then(retry_policy_of)
            .unwrap_or_else(RetryPolicy::server_default);
        let timeouts = ActivityTimeouts {
            start_to_close_seconds: number(payload, "start_to_close_timeout"),
            schedule_to_start_seconds: number(payload, "schedule_to_start_timeout"),
            schedule_to_close_seconds: number(payload, "schedule_to_close_timeout"),
            heartbeat_seconds: number(payload, "heartbeat_timeout"),
        };
        let scheduled_at = event.recorded_at;
        let execution = ActivityExecution {
            id: ActivityExecutionId::from(id.clone()),
            step,
            activity_type,
            queue: text(payload, "queue").unwrap_or_default(),
            arguments: section.arguments.clone().unwrap_or_else(|| Payload::avro("")),
            retry_policy,
            retry_policy_given: given.is_some(),
            schedule_to_close_deadline: timeouts.schedule_to_close_seconds.map(|s| scheduled_at + s * 1000),
            timeouts,
            scheduled_at,
            attempt_count: 0,
            attempt_ids: Vec::new(),
            task_id: crate::TaskId(String::new()),
            last_heartbeat_details: None,
            tags: step_tags_of(payload),
            action: None,
            ledger_key: None,
            blocked_by: None,
            cancellation_policy: text(payload, "cancellation_policy").and_then(|p| ActivityCancellationPolicy::parse(&p)),
            worker_session: None,
            probe_retries: 0,
        };
        self.activities.insert(
            execution.id.clone(),
            OpenActivity {
                execution,
                readied_at: scheduled_at,
                available_at: scheduled_at,
                running: false,
                has_arguments: section.arguments.is_some(),
            },
        );
    }

    fn open_activity(&mut self, payload: &Map<String, Value>) -> Option<&mut OpenActivity> {
        let id = ActivityExecutionId::from(text(payload, "activity_execution_id")?);
        self.activities.get_mut(&id)
    }

    fn attempt_started(&mut self, payload: &Map<String, Value>) {
        let attempt_id = text(payload, "activity_attempt_id");
        let number = number(payload, "attempt_number");
        if let Some(open) = self.open_activity(payload) {
            let execution = &mut open.execution;
            execution.attempt_count = number.map_or(execution.attempt_count + 1, |n| n as u32);
            execution.attempt_ids.extend(attempt_id.map(Into::into));
            open.running = true;
        }
    }

    fn heartbeat(&mut self, payload: &Map<String, Value>) {
        let progress = payload.get("progress").cloned();
        if let Some(open) = self.open_activity(payload) {
            open.execution.last_heartbeat_details = progress;
        }
    }

    fn retry_scheduled(&mut self, event: &ImportedEvent) {
        let payload = &event.payload;
        let due = instant(payload, "retry_available_at").unwrap_or(event.recorded_at);
        if let Some(open) = self.open_activity(payload) {
            open.running = false;
            open.readied_at = event.recorded_at;
            open.available_at = due;
        }
    }

    fn activity_ended(&mut self, payload: &Map<String, Value>) {
        if let Some(id) = text(payload, "activity_execution_id") {
            self.open_locals.remove(&id);
            self.activities.remove(&ActivityExecutionId::from(id));
        }
    }

    fn timer_scheduled(&mut self, payload: &Map<String, Value>) {
        let step = step_of(payload);
        let id = TimerId::from(text(payload, "timer_id").unwrap_or_default());
        let condition = text(payload, "condition_wait_id");
        let signal = text(payload, "signal_wait_id");
        let purpose = match (&condition, &signal) {
            (Some(wait), _) => TimerPurpose::ConditionTimeout(WaitId::from(wait.clone())),
            (None, Some(wait)) => TimerPurpose::SignalTimeout(WaitId::from(wait.clone())),
            (None, None) => {
                self.take_step(step, StepKind::Timer);
                TimerPurpose::User
            }
        };
        if let Some(wait) = self
            .condition_waits
            .iter_mut()
            .find(|w| Some(w.id.as_str()) == condition.as_deref())
        {
            wait.timer_id = Some(id.clone());
        }
        if let Some(wait) = self.signal_waits.iter_mut().find(|w| Some(w.id.as_str()) == signal.as_deref()) {
            wait.timer_id = Some(id.clone());
        }
        let Some(fire_at) = instant(payload, "fire_at") else {
            return self.findings.push(Finding::new(
                "timers.fire_at_missing",
                format!("Timer {} has no fire_at in its TimerScheduled event.", id.as_str()),
            ));
        };
        let timer = TimerState {
            id: id.clone(),
            step,
            delay_seconds: number(payload, "delay_seconds").unwrap_or(0),
            fire_at,
            task_id: crate::TaskId(String::new()),
            purpose,
            tags: step_tags_of(payload),
        };
        self.timers.insert(id, timer);
    }

    /// A timer's end; a wait's timeout ends its wait with it.
    fn timer_ended(&mut self, payload: &Map<String, Value>) {
        if let Some(id) = text(payload, "timer_id") {
            self.timers.remove(&TimerId::from(id));
        }
        self.signal_wait_ended(text(payload, "signal_wait_id"));
        self.condition_wait_ended(text(payload, "condition_wait_id"));
    }

    /// A wait's end closes its timeout timer too (without an event of its own).
    fn condition_wait_ended(&mut self, id: Option<String>) {
        let Some(index) = self.condition_waits.iter().position(|w| Some(w.id.as_str()) == id.as_deref()) else {
            return;
        };
        let wait = self.condition_waits.remove(index);
        if let Some(timer) = wait.timer_id {
            self.timers.remove(&timer);
        }
    }

    fn signal_wait_ended(&mut self, id: Option<String>) {
        let Some(index) = self.signal_waits.iter().position(|w| Some(w.id.as_str()) == id.as_deref()) else {
            return;
        };
        let wait = self.signal_waits.remove(index);
        if let Some(timer) = wait.timer_id {
            self.timers.remove(&timer);
        }
    }

    /// A condition wait; one that re-opens the newest open wait (same key and definition, as
    /// an SDK does when a receiver woke it and the condition still fails) supersedes it with no
    /// event of its own, as it did on the source.
    fn condition_wait_opened(&mut self, payload: &Map<String, Value>) {
        let step = step_of(payload);
        self.take_step(step, StepKind::ConditionWait);
        let wait = ConditionWait {
            id: WaitId::from(text(payload, "condition_wait_id").unwrap_or_default()),
            step,
            condition_key: text(payload, "condition_key"),
            fingerprint: text(payload, "condition_definition_fingerprint"),
            timeout_seconds: number(payload, "timeout_seconds"),
            timer_id: None,
            occurrence_id: text(payload, "condition_wait_occurrence_id"),
        };
        if let Some(newest) = self.condition_waits.last() {
            if newest.condition_key == wait.condition_key && newest.fingerprint == wait.fingerprint {
                self.condition_wait_ended(Some(newest.id.as_str().to_string()));
            }
        }
        self.condition_waits.push(wait);
    }

    fn signal_wait_opened(&mut self, payload: &Map<String, Value>) {
        let step = step_of(payload);
        let signal_name = text(payload, "signal_name").unwrap_or_default();
        self.take_step(step, StepKind::SignalWait(signal_name.clone()));
        self.signal_waits.push(SignalWait {
            id: WaitId::from(text(payload, "signal_wait_id").unwrap_or_default()),
            step,
            signal_name,
            timeout_seconds: number(payload, "timeout_seconds"),
            timer_id: None,
        });
    }

    fn signal_received(&mut self, event: &ImportedEvent) {
        let payload = &event.payload;
        self.command_count += 1;
        let signal_id = text(payload, "signal_id").unwrap_or_default();
        let command_id = text(payload, "workflow_command_id")
            .or_else(|| event.workflow_command_id.as_ref().map(|c| c.as_str().to_string()))
            .unwrap_or_default();
        let arguments = recorded_payload(payload.get("arguments"), payload.get("payload_codec")).unwrap_or_else(|| Payload::avro(""));
        self.signals.push(Received {
            signal_id: signal_id.clone(),
            resume: ResumeContext::Signal {
                signal_id: signal_id.into(),
                signal_name: text(payload, "signal_name").unwrap_or_default(),
                arguments,
                command_id: CommandId::from(command_id),
            },
        });
    }

    fn update_received(&mut self, event: &ImportedEvent) {
        let payload = &event.payload;
        self.command_count += 1;
        let rejected = event.event_type == EventType::UpdateRejected;
        let record = UpdateRecord {
            update_name: text(payload, "update_name").unwrap_or_default(),
            arguments: recorded_payload(payload.get("arguments"), payload.get("payload_codec")).unwrap_or_else(|| Payload::avro("")),
            command_id: CommandId::from(text(payload, "workflow_command_id").unwrap_or_default()),
            status: if rejected { UpdateStatus::Rejected } else { UpdateStatus::Accepted },
            result: None,
            failure: None,
            accepted_at: event.recorded_at,
            closed_at: rejected.then_some(event.recorded_at),
            validation_errors: payload.get("validation_errors").filter(|v| !v.is_null()).cloned(),
        };
        self.updates.insert(text(payload, "update_id").unwrap_or_default(), record);
    }

    fn update_completed(&mut self, event: &ImportedEvent) {
        let payload = &event.payload;
        let Some(record) = text(payload, "update_id").and_then(|id| self.updates.get_mut(&id)) else {
            return;
        };
        record.closed_at = Some(event.recorded_at);
        if payload.contains_key("result") {
            record.status = UpdateStatus::Completed;
            record.result = recorded_payload(payload.get("result"), payload.get("payload_codec"));
        } else {
            record.status = UpdateStatus::Failed;
            record.failure = Some(failure_of(payload));
        }
    }

    /// What is left open that the import cannot carry on.
    fn finish(&mut self, sections: &OpenRunSections) -> Result<(), Vec<Finding>> {
        if !self.open_locals.is_empty() {
            self.unsupported("a prepared local activity");
        }
        if self.activities.values().any(|a| a.running) {
            self.findings.push(Finding::new(
                "activities.running_attempt_present",
                "An activity attempt started on the source has not ended: stop its workers and let its lease lapse, then export again.",
            ));
        }
        for open in self.activities.values().filter(|a| !a.has_arguments) {
            self.findings.push(Finding::new(
                "activities.arguments_missing",
                format!(
                    "Open activity {} has no arguments in the bundle's activities section.",
                    open.execution.id.as_str()
                ),
            ));
        }
        let listed = sections.workflow_task.iter().filter_map(|task| task.resume.as_ref());
        for resume in listed.chain(&sections.resumes) {
            let PendingResume::Signal(id) = resume else { continue };
            match self.signals.iter().find(|s| &s.signal_id == id).map(|s| &s.resume) {
                None => self.findings.push(Finding::new(
                    "signals.unknown",
                    format!("Signal {id} is listed as received, but history has no SignalReceived for it."),
                )),
                Some(ResumeContext::Signal { signal_name, .. }) if signal_name == MESSAGE_STREAM_SIGNAL => {
                    self.unsupported("an undelivered message-stream message")
                }
                Some(_) => {}
            }
        }
        if self.findings.is_empty() {
            Ok(())
        } else {
            Err(std::mem::take(&mut self.findings))
        }
    }

    /// The resume a workflow task carries for `resume`, from what history recorded of it.
    fn resume_context(&self, resume: &PendingResume) -> Option<ResumeContext> {
        match resume {
            PendingResume::Signal(id) => self.signals.iter().find(|s| &s.signal_id == id).map(|s| s.resume.clone()),
            PendingResume::AfterUpdate(update_id) => Some(ResumeContext::AfterUpdate {
                update_id: update_id.clone(),
            }),
            PendingResume::Update(update_id) => self.updates.get(update_id).map(|update| ResumeContext::Update {
                update_id: update_id.clone(),
                update_name: update.update_name.clone(),
                command_id: update.command_id.clone(),
            }),
        }
    }

    /// Writes the folded state into `run` and makes its tasks.
    fn install(self, run: &mut RunState, cx: &mut Cx, sections: &OpenRunSections) {
        let started = &self.started;
        run.execution_timeout_seconds = number(started, "execution_timeout_seconds");
        run.run_timeout_seconds = number(started, "run_timeout_seconds");
        run.execution_deadline_at = instant(started, "execution_deadline_at");
        run.run_deadline_at = instant(started, "run_deadline_at");
        let context = |resume: &PendingResume| self.resume_context(resume);
        let mut pending: VecDeque<ResumeContext> = sections.resumes.iter().filter_map(context).collect();
        let mut updates: VecDeque<ResumeContext> = sections
            .pending_updates
            .iter()
            .filter_map(|id| context(&PendingResume::Update(id.clone())))
            .collect();
        // The task the bundle lists, as it stood; else one for the first wake-up still due (an
        // update's handler before a signal, as Capstan orders them).
        let task = match &sections.workflow_task {
            Some(listed) => Some((listed.resume.as_ref().and_then(context), Some(listed.available_at))),
            None if !updates.is_empty() => Some((updates.pop_front(), None)),
            None if !pending.is_empty() => Some((pending.pop_front(), None)),
            None => None,
        };
        run.steps = self.steps;
        run.next_step = self.next_step;
        run.condition_waits = self.condition_waits;
        run.signal_waits = self.signal_waits;
        run.updates = self.updates;
        run.selections = self.selections;
        run.command_count += self.command_count;
        if self.memo_merged.is_some() {
            run.memo_merged = self.memo_merged;
        }
        for (_, open) in self.activities {
            arm_activity(run, cx, open);
        }
        for (_, timer) in self.timers {
            arm_timer(run, cx, timer);
        }
        if let Some((resume, available_at)) = task {
            let id = run.want_workflow_task(cx, resume).expect("an open run takes a workflow task");
            if let Some(at) = available_at {
                run.task_mut(cx, &id).expect("just made").available_at = at;
            }
        }
        run.pending_resumes = pending;
        run.pending_updates = updates;
        if let Some(deadline) = min_opt(run.execution_deadline_at, run.run_deadline_at) {
            let id = run.new_task(cx, TaskKind::RunDeadline, "", TaskDetail::RunDeadline);
            run.task_mut(cx, &id).expect("just created").deadline_at = Some(deadline);
        }
    }
}

/// The task of an open activity's next attempt, ready when its retry is due, with the
/// schedule-to-start and schedule-to-close deadlines it had.
fn arm_activity(run: &mut RunState, cx: &mut Cx, open: OpenActivity) {
    let OpenActivity {
        mut execution,
        readied_at,
        available_at,
        ..
    } = open;
    let task_id = next_attempt_task(run, cx, &execution, available_at);
    set_ready_activity_deadline(run, cx, &task_id, &execution, readied_at);
    execution.task_id = task_id;
    run.activities.insert(execution.id.clone(), execution);
}

/// A pending timer's task, due at the timer's `fire_at`.
fn arm_timer(run: &mut RunState, cx: &mut Cx, mut timer: TimerState) {
    let task_id = run.new_task(
        cx,
        TaskKind::Timer,
        "",
        TaskDetail::Timer {
            timer_id: timer.id.clone(),
        },
    );
    run.task_mut(cx, &task_id).expect("just created").deadline_at = Some(timer.fire_at);
    timer.task_id = task_id;
    run.timers.insert(timer.id.clone(), timer);
}
