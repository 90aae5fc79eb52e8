//! Prepared local activities: admission, supervision, outcomes, recovery and checkpoints, as
//! the transitions record them.

mod support;

use capstan_engine::*;
use serde_json::Map;
use support::*;

const OWNER: &str = "w1";

fn descriptor(retry: Option<RetryPolicy>, start_to_close: Option<i64>, heartbeat: Option<i64>) -> LocalDescriptor {
    LocalDescriptor {
        activity_type: "greet".into(),
        arguments: Payload::avro("args"),
        retry_policy: retry,
        cancellation_policy: None,
        start_to_close_seconds: start_to_close,
        schedule_to_close_seconds: None,
        heartbeat_seconds: heartbeat,
        cleanup: None,
        tags: Map::new(),
        fingerprint: format!("fp-{start_to_close:?}-{heartbeat:?}"),
    }
}

fn claim<'a>(task: &'a TaskId, attempt: u64) -> LocalClaim<'a> {
    LocalClaim {
        task_id: task,
        owner: OWNER,
        attempt,
    }
}

fn prepare(sim: &mut Sim, task: &TaskId, fence: u64, sequence: u32, nonce: &str, d: LocalDescriptor) -> Result<LocalAdmission, Refusal> {
    sim.apply(|run, cx| prepare_local_activity(run, cx, claim(task, fence), sequence, nonce, d))
}

fn fail(message: &str, non_retryable: bool) -> LocalReport {
    LocalReport::Failed {
        message: message.into(),
        exception_type: Some("Boom".into()),
        non_retryable,
    }
}

fn report(
    sim: &mut Sim,
    task: &TaskId,
    fence: u64,
    attempt: &ActivityAttemptId,
    r: LocalReport,
    fp: &str,
) -> Result<LocalRecordReceipt, Refusal> {
    sim.apply(|run, cx| report_local_outcome(run, cx, claim(task, fence), attempt, &r, fp))
}

fn leased(sim: &Sim, task: &TaskId) -> bool {
    sim.run.tasks.get(task).is_some_and(|t| t.lease().is_some())
}

#[test]
fn prepare_records_the_call_at_the_next_step_once_per_nonce() {
    let mut sim = Sim::start();
    let (task, fence) = sim.lease_workflow(OWNER);
    let first = prepare(&mut sim, &task, fence, 1, "n1", descriptor(None, Some(30), None)).unwrap();
    assert!(!first.duplicate);
    assert_eq!(first.attempt.number, 1);
    assert_eq!(first.deadlines.start_to_close, Some(sim.now + 30_000));
    assert_eq!(first.deadlines.heartbeat, None, "no heartbeat timeout: no heartbeat deadline");
    assert_eq!(sim.run.next_step, 2);
    let events = sim.history.len();
    // The same request again: the same attempt, nothing recorded.
    let again = prepare(&mut sim, &task, fence, 1, "n1", descriptor(None, Some(30), None)).unwrap();
    assert!(again.duplicate);
    assert_eq!(again.attempt.attempt_id, first.attempt.attempt_id);
    assert_eq!(sim.history.len(), events);
    // Another nonce while it runs, a changed call, a sequence ahead or behind: refused.
    let other = prepare(&mut sim, &task, fence, 1, "n2", descriptor(None, Some(30), None)).unwrap_err();
    assert_eq!(other.reason, Reason::LocalActivityPreviousAttemptUnresolved);
    let changed = prepare(&mut sim, &task, fence, 1, "n1", descriptor(None, Some(31), None)).unwrap_err();
    assert_eq!(changed.reason, Reason::LocalActivityPreparationMismatch);
    let ahead = prepare(&mut sim, &task, fence, 3, "n3", descriptor(None, None, None)).unwrap_err();
    assert_eq!(ahead.reason, Reason::LocalActivityCommandPrefixNotRecorded);
    assert_eq!(sim.history.len(), events);
    let types: Vec<&str> = sim.event_types().into_iter().rev().take(2).collect();
    assert_eq!(types, ["ActivityStarted", "ActivityScheduled"]);
    // Events recorded during the lease are in the worker's view of history.
    let TaskDetail::Workflow { history_snapshot, .. } = &sim.run.tasks[&task].detail else {
        panic!()
    };
    assert_eq!(*history_snapshot, sim.run.last_sequence);
}

#[test]
fn an_outcome_is_recorded_once_and_the_claim_carries_on() {
    let mut sim = Sim::start();
    let (task, fence) = sim.lease_workflow(OWNER);
    let admitted = prepare(&mut sim, &task, fence, 1, "n1", descriptor(None, None, None)).unwrap();
    let attempt = admitted.attempt.attempt_id.clone();
    let done = report(&mut sim, &task, fence, &attempt, LocalReport::Completed(Payload::avro("r")), "fp1").unwrap();
    assert!(!done.duplicate);
    assert_eq!(done.record.event_type, "ActivityCompleted");
    assert_eq!(done.record.retry_task_id, None);
    assert!(leased(&sim, &task), "a recorded result keeps the claim: the worker replays on");
    assert!(sim.run.prepared_locals.is_empty());
    let events = sim.history.len();
    let again = report(&mut sim, &task, fence, &attempt, LocalReport::Completed(Payload::avro("r")), "fp1").unwrap();
    assert!(again.duplicate);
    assert_eq!(again.record.event_id, done.record.event_id);
    let other = report(&mut sim, &task, fence, &attempt, fail("late", false), "fp2").unwrap_err();
    assert_eq!(other.reason, Reason::LocalActivityOutcomeMismatch);
    assert_eq!(sim.history.len(), events);
    assert_eq!(sim.count(EventType::ActivityCompleted), 1);
    // The workflow goes on from the next step.
    let complete = WorkflowCommand::CompleteWorkflow {
        result: Payload::avro("x"),
    };
    sim.apply(|run, cx| complete_workflow_task(run, cx, &task, OWNER, fence, vec![complete]))
        .unwrap();
    assert_eq!(sim.run.status, RunStatus::Completed);
}

#[test]
fn a_failed_attempt_is_retried_on_a_new_workflow_task_once_its_backoff_is_due() {
    let mut sim = Sim::start();
    let policy = RetryPolicy {
        max_attempts: Some(2),
        backoff_seconds: vec![5],
        non_retryable_error_types: vec![],
    };
    let (task, fence) = sim.lease_workflow(OWNER);
    let first = prepare(&mut sim, &task, fence, 1, "n1", descriptor(Some(policy.clone()), None, None)).unwrap();
    let retried = report(&mut sim, &task, fence, &first.attempt.attempt_id, fail("boom", false), "f1").unwrap();
    assert_eq!(retried.record.event_type, "ActivityRetryScheduled");
    let retry_task = retried.record.retry_task_id.clone().expect("a retry task");
    assert!(!sim.run.tasks.contains_key(&task), "the claim was released");
    assert_eq!(
        sim.run.tasks[&retry_task].available_at,
        sim.now + 5_000,
        "not offered before the retry is due"
    );
    // Early, the retry is refused; once due, it is attempt 2 of the same execution.
    sim.now += 5_000;
    let (task2, fence2) = sim.lease_workflow(OWNER);
    assert_eq!(task2, retry_task);
    let second = prepare(&mut sim, &task2, fence2, 1, "n2", descriptor(Some(policy), None, None)).unwrap();
    assert_eq!(second.attempt.number, 2);
    assert_eq!(second.execution_id, first.execution_id);
    // The policy is exhausted: the failure is the activity's end.
    let failed = report(&mut sim, &task2, fence2, &second.attempt.attempt_id, fail("boom", false), "f2").unwrap();
    assert_eq!(failed.record.event_type, "ActivityFailed");
    assert!(leased(&sim, &task2));
    assert_eq!(sim.count(EventType::ActivityStarted), 2);
}

#[test]
fn a_retry_is_refused_before_it_is_due_and_non_retryable_failures_end_at_once() {
    let mut sim = Sim::start();
    let policy = RetryPolicy {
        max_attempts: Some(5),
        backoff_seconds: vec![5],
        non_retryable_error_types: vec!["Fatal".into()],
    };
    let (task, fence) = sim.lease_workflow(OWNER);
    let first = prepare(&mut sim, &task, fence, 1, "n1", descriptor(Some(policy.clone()), None, None)).unwrap();
    report(&mut sim, &task, fence, &first.attempt.attempt_id, fail("boom", false), "f1").unwrap();
    // The released claim can prepare nothing.
    let released = prepare(&mut sim, &task, fence, 1, "n2", descriptor(Some(policy.clone()), None, None)).unwrap_err();
    assert_eq!(released.reason, Reason::TaskNotLeased);
    // A claim on the run before the retry is due (no task is offered then; forced here) is
    // refused the retry.
    let retry_task = sim.run.workflow_task.clone().unwrap();
    sim.run.tasks.get_mut(&retry_task).unwrap().available_at = sim.now;
    let (early, early_fence) = sim.lease_workflow(OWNER);
    let not_due = prepare(
        &mut sim,
        &early,
        early_fence,
        1,
        "n-early",
        descriptor(Some(policy.clone()), None, None),
    )
    .unwrap_err();
    assert_eq!(not_due.reason, Reason::LocalActivityRetryNotDue);
    sim.advance(LEASE_MS + 1);
    sim.now += 5_000;
    let (task2, fence2) = sim.lease_workflow(OWNER);
    let second = prepare(&mut sim, &task2, fence2, 1, "n2", descriptor(Some(policy), None, None)).unwrap();
    let fatal = LocalReport::Failed {
        message: "no".into(),
        exception_type: Some("Fatal".into()),
        non_retryable: false,
    };
    let end = report(&mut sim, &task2, fence2, &second.attempt.attempt_id, fatal, "f2").unwrap();
    assert_eq!(end.record.event_type, "ActivityFailed");
}

#[test]
fn a_lost_claims_attempt_is_recovered_by_the_next_claim() {
    let mut sim = Sim::start();
    let (task, fence) = sim.lease_workflow(OWNER);
    let d = || {
        descriptor(
            Some(RetryPolicy {
                max_attempts: Some(3),
                backoff_seconds: vec![1],
                non_retryable_error_types: vec![],
            }),
            None,
            None,
        )
    };
    let first = prepare(&mut sim, &task, fence, 1, "n1", d()).unwrap();
    // The claim cannot recover its own attempt.
    let own = sim
        .apply(|run, cx| recover_local_activity(run, cx, claim(&task, fence), 1, &d()))
        .unwrap_err();
    assert_eq!(own.reason, Reason::LocalActivityOriginalClaimLive);
    // The worker dies; its lease runs out and the task is offered again.
    sim.advance(LEASE_MS + 1);
    let (task2, fence2) = sim.lease_workflow("w2");
    assert_eq!(task2, task);
    assert!(fence2 > fence);
    let second_claim = LocalClaim {
        task_id: &task2,
        owner: "w2",
        attempt: fence2,
    };
    let recovered = sim.apply(|run, cx| recover_local_activity(run, cx, second_claim, 1, &d())).unwrap();
    assert_eq!(recovered.record.event_type, "ActivityRetryScheduled");
    assert_eq!(recovered.record.attempt_id, first.attempt.attempt_id);
    let event = sim.history.iter().find(|e| e.id == recovered.record.event_id).unwrap();
    assert_eq!(event.payload["local_recovery"]["callback_stop_state"], "unknown");
    assert_eq!(event.payload["local_recovery"]["original_lease_owner"], OWNER);
    // The old worker's late report is refused without a trace.
    let events = sim.history.len();
    let late = report(
        &mut sim,
        &task,
        fence,
        &first.attempt.attempt_id,
        LocalReport::Completed(Payload::avro("r")),
        "x",
    )
    .unwrap_err();
    assert!(
        matches!(
            late.reason,
            Reason::StaleActivityAttempt | Reason::TaskNotLeased | Reason::WorkflowTaskAttemptMismatch
        ),
        "{late:?}"
    );
    assert_eq!(sim.history.len(), events);
    // Nothing left to recover.
    sim.now += 1_000;
    let (task3, fence3) = sim.lease_workflow("w2");
    let third_claim = LocalClaim {
        task_id: &task3,
        owner: "w2",
        attempt: fence3,
    };
    let nothing = sim
        .apply(|run, cx| recover_local_activity(run, cx, third_claim, 1, &d()))
        .unwrap_err();
    assert_eq!(nothing.reason, Reason::LocalActivityNothingToRecover);
}

#[test]
fn control_renews_the_claim_and_ends_an_attempt_past_its_deadline() {
    let mut sim = Sim::start();
    let (task, fence) = sim.lease_workflow(OWNER);
    let none = RetryPolicy {
        max_attempts: Some(1),
        backoff_seconds: vec![],
        non_retryable_error_types: vec![],
    };
    let admitted = prepare(&mut sim, &task, fence, 1, "n1", descriptor(Some(none), Some(90), None)).unwrap();
    let attempt = admitted.attempt.attempt_id.clone();
    sim.now += 50_000;
    let Supervised::Active(view) = sim
        .apply(|run, cx| control_local_activity(run, cx, claim(&task, fence), &attempt, LEASE_MS))
        .unwrap()
    else {
        panic!("still active")
    };
    assert!(view.renewed);
    assert_eq!(view.lease_expires_at, sim.now + LEASE_MS);
    assert_eq!(
        view.deadlines.start_to_close, admitted.deadlines.start_to_close,
        "renewal moves no deadline"
    );
    sim.now += 40_001;
    let ended = sim
        .apply(|run, cx| control_local_activity(run, cx, claim(&task, fence), &attempt, LEASE_MS))
        .unwrap();
    let Supervised::Ended { timeout_kind, record } = ended else {
        panic!("past start-to-close")
    };
    assert_eq!(timeout_kind, "start_to_close");
    assert_eq!(record.event_type, "ActivityTimedOut");
    assert!(
        !sim.run.tasks.contains_key(&task),
        "the server released the claim its worker abandons"
    );
    assert!(sim.run.workflow_task.is_some(), "and the run has a new workflow task");
    assert_eq!(sim.count(EventType::ActivityTimedOut), 1);
}

#[test]
fn heartbeats_record_progress_and_move_only_the_heartbeat_deadline() {
    let mut sim = Sim::start();
    let (task, fence) = sim.lease_workflow(OWNER);
    let none = RetryPolicy {
        max_attempts: Some(1),
        backoff_seconds: vec![],
        non_retryable_error_types: vec![],
    };
    let admitted = prepare(&mut sim, &task, fence, 1, "n1", descriptor(Some(none), None, Some(10))).unwrap();
    assert_eq!(admitted.deadlines.heartbeat, Some(sim.now + 10_000));
    let attempt = admitted.attempt.attempt_id.clone();
    sim.now += 8_000;
    let mut progress = Map::new();
    progress.insert("details".into(), serde_json::json!({"n": 1}));
    let Supervised::Active(view) = sim
        .apply(|run, cx| heartbeat_local_activity(run, cx, claim(&task, fence), &attempt, Some(&progress)))
        .unwrap()
    else {
        panic!()
    };
    assert_eq!(view.deadlines.heartbeat, Some(sim.now + 10_000));
    assert!(!view.renewed);
    assert_eq!(view.lease_expires_at, admitted.lease_expires_at, "a heartbeat renews no lease");
    let beat = sim
        .history
        .iter()
        .find(|e| Some(&e.id) == view.heartbeat_event_id.as_ref())
        .unwrap();
    assert_eq!(beat.payload["progress"]["details"]["n"], 1);
    // The same progress again moves the deadline and records nothing new.
    sim.now += 5_000;
    let Supervised::Active(again) = sim
        .apply(|run, cx| heartbeat_local_activity(run, cx, claim(&task, fence), &attempt, Some(&progress)))
        .unwrap()
    else {
        panic!()
    };
    assert_eq!(again.heartbeat_event_id, view.heartbeat_event_id);
    assert_eq!(again.deadlines.heartbeat, Some(sim.now + 10_000));
    assert_eq!(sim.count(EventType::ActivityHeartbeatRecorded), 1);
    sim.now += 10_000;
    let ended = sim
        .apply(|run, cx| heartbeat_local_activity(run, cx, claim(&task, fence), &attempt, None))
        .unwrap();
    assert!(
        matches!(
            ended,
            Supervised::Ended {
                timeout_kind: "heartbeat",
                ..
            }
        ),
        "{ended:?}"
    );
}

#[test]
fn a_checkpoint_commits_the_prefix_on_the_claim_once() {
    let mut sim = Sim::start();
    let (task, fence) = sim.lease_workflow(OWNER);
    let side_effect = || WorkflowCommand::RecordSideEffect {
        result: Payload::avro("se"),
        tags: Map::new(),
        stream: None,
    };
    let first = sim
        .apply(|run, cx| checkpoint_local_prefix(run, cx, claim(&task, fence), "cp1", 1, vec![side_effect()]))
        .unwrap();
    assert!(!first.duplicate);
    assert_eq!((first.checkpoint.start_sequence, first.checkpoint.next_sequence), (1, 2));
    assert!(leased(&sim, &task));
    let again = sim
        .apply(|run, cx| checkpoint_local_prefix(run, cx, claim(&task, fence), "cp1", 1, vec![side_effect()]))
        .unwrap();
    assert!(again.duplicate);
    assert_eq!(sim.count(EventType::SideEffectRecorded), 1);
    let stale = sim
        .apply(|run, cx| checkpoint_local_prefix(run, cx, claim(&task, fence), "cp2", 1, vec![side_effect()]))
        .unwrap_err();
    assert_eq!(stale.reason, Reason::LocalActivityCheckpointMismatch);
    let timer = WorkflowCommand::StartTimer {
        delay_seconds: 5,
        tags: Map::new(),
    };
    let waits = sim
        .apply(|run, cx| checkpoint_local_prefix(run, cx, claim(&task, fence), "cp3", 2, vec![timer]))
        .unwrap_err();
    assert_eq!(waits.reason, Reason::InvalidCommands);
    // The prepared call follows at the next step.
    prepare(&mut sim, &task, fence, 2, "n1", descriptor(None, None, None)).unwrap();
}

#[test]
fn a_closing_run_drops_its_pending_local_retry() {
    let mut sim = Sim::start();
    let (task, fence) = sim.lease_workflow(OWNER);
    let admitted = prepare(&mut sim, &task, fence, 1, "n1", descriptor(None, None, None)).unwrap();
    report(&mut sim, &task, fence, &admitted.attempt.attempt_id, fail("boom", false), "f1").unwrap();
    assert_eq!(sim.run.prepared_locals.len(), 1);
    sim.apply(|run, cx| close_by_command(run, cx, CloseCommand::Terminate, None, "t".into()))
        .unwrap();
    assert!(sim.run.prepared_locals.is_empty());
}

fn request_cancellation_now(sim: &mut Sim) -> CancellationRequest {
    sim.apply(|run, cx| request_cancellation(run, cx, Some("stop".into()), 60, "cmd-cancel".into()))
        .unwrap()
        .request
}

fn deliver_local(sim: &mut Sim, task: &TaskId, fence: u64, owner: &str) -> Result<DeliveryOutcome, Refusal> {
    let delivery = DeliveryRequest {
        request_id: "cmd-cancel".into(),
        sequence: 1,
        call_kind: "local_activity".into(),
        sequence_span: 1,
        operation_sequence: None,
        operation_sequence_span: 1,
    };
    sim.apply(|run, cx| deliver_cancellation(run, cx, task, owner, fence, delivery))
}

#[test]
fn a_cancellation_stops_the_running_attempt_at_its_next_supervision() {
    let mut sim = Sim::start();
    let (task, fence) = sim.lease_workflow(OWNER);
    let admitted = prepare(&mut sim, &task, fence, 1, "n1", descriptor(None, None, None)).unwrap();
    let attempt = admitted.attempt.attempt_id.clone();
    let request = request_cancellation_now(&mut sim);
    let Supervised::Stopped(stop) = sim
        .apply(|run, cx| control_local_activity(run, cx, claim(&task, fence), &attempt, LEASE_MS))
        .unwrap()
    else {
        panic!("stopped")
    };
    assert_eq!(stop.request.request_id, request.request_id);
    let cancelled = sim.history.iter().find(|e| e.id == stop.cancellation_event_id).unwrap();
    assert_eq!(cancelled.event_type, EventType::ActivityCancelled);
    assert_eq!(cancelled.workflow_command_id.as_ref(), Some(&request.request_id));
    // The request event carries the context the stop repeats.
    let requested = sim
        .history
        .iter()
        .find(|e| e.event_type == EventType::CooperativeCancellationRequested)
        .unwrap();
    assert_eq!(
        requested.payload["cancellation"],
        stop.request.context(&sim.run.workflow_id, &sim.run.run_id)
    );
    // Asked again, the same stop, nothing recorded; its outcome is refused.
    let events = sim.history.len();
    let again = sim
        .apply(|run, cx| control_local_activity(run, cx, claim(&task, fence), &attempt, LEASE_MS))
        .unwrap();
    assert!(matches!(again, Supervised::Stopped(ref s) if s.cancellation_event_id == stop.cancellation_event_id));
    let late = report(&mut sim, &task, fence, &attempt, LocalReport::Completed(Payload::avro("r")), "x").unwrap_err();
    assert_eq!(late.reason, Reason::ActivityCancelled);
    assert_eq!(sim.history.len(), events);
    // try_cancel: delivered at the call at once.
    assert!(matches!(
        deliver_local(&mut sim, &task, fence, OWNER).unwrap(),
        DeliveryOutcome::Delivered(_)
    ));
    assert!(sim.run.prepared_locals.is_empty());
}

#[test]
fn a_wait_cancellation_completed_call_is_delivered_after_the_stop_is_acknowledged() {
    let mut sim = Sim::start();
    let (task, fence) = sim.lease_workflow(OWNER);
    let mut d = descriptor(None, None, None);
    d.cancellation_policy = Some(ActivityCancellationPolicy::WaitCancellationCompleted);
    let admitted = prepare(&mut sim, &task, fence, 1, "n1", d).unwrap();
    let attempt = admitted.attempt.attempt_id.clone();
    request_cancellation_now(&mut sim);
    sim.apply(|run, cx| control_local_activity(run, cx, claim(&task, fence), &attempt, LEASE_MS))
        .unwrap();
    // Delivered before the worker acknowledged: deferred, the claim released.
    let waiting = deliver_local(&mut sim, &task, fence, OWNER).unwrap();
    assert_eq!(waiting, DeliveryOutcome::Waiting(Reason::CancellationWaitingForActivity));
    assert!(sim.run.workflow_task.is_none());
    // An acknowledgement names the claim the attempt ran under, attempt included.
    let wrong = LocalClaim {
        task_id: &task,
        owner: OWNER,
        attempt: fence + 1,
    };
    let refused = sim
        .apply(|run, cx| acknowledge_local_stop(run, cx, wrong, &attempt, "cmd-cancel"))
        .unwrap_err();
    assert_eq!(refused.reason, Reason::WorkflowTaskAttemptMismatch);
    // The acknowledgement (on the released claim's task) wakes the run.
    let receipt = sim
        .apply(|run, cx| acknowledge_activity_cancellation(run, cx, &task, &attempt, OWNER, "cmd-cancel"))
        .unwrap();
    assert!(!receipt.duplicate);
    assert_eq!(sim.count(EventType::ActivityCancellationAcknowledged), 1);
    let (task2, fence2) = sim.lease_workflow(OWNER);
    assert!(matches!(
        deliver_local(&mut sim, &task2, fence2, OWNER).unwrap(),
        DeliveryOutcome::Delivered(_)
    ));
}

fn grouped(index: u64, mut d: LocalDescriptor) -> LocalDescriptor {
    for (key, value) in [
        ("parallel_group_id", serde_json::json!("parallel-calls:1:3")),
        ("parallel_group_base_sequence", serde_json::json!(1)),
        ("parallel_group_size", serde_json::json!(3)),
        ("parallel_group_index", serde_json::json!(index)),
        ("parallel_group_path", serde_json::json!([{"base": 1, "size": 3, "index": index}])),
    ] {
        d.tags.insert(key.into(), value);
    }
    d.fingerprint = format!("group-{index}");
    d
}

#[test]
fn a_group_checkpoint_admits_every_leaf_at_once_and_members_are_prepared_after() {
    let mut sim = Sim::start();
    let (task, fence) = sim.lease_workflow(OWNER);
    let mut timer_tags = Map::new();
    for (key, value) in [
        ("parallel_group_id", serde_json::json!("parallel-calls:1:3")),
        ("parallel_group_base_sequence", serde_json::json!(1)),
        ("parallel_group_size", serde_json::json!(3)),
        ("parallel_group_index", serde_json::json!(2)),
    ] {
        timer_tags.insert(key.into(), value);
    }
    let members = || {
        vec![
            GroupMember::Local(grouped(0, descriptor(None, None, None))),
            GroupMember::Local(grouped(1, descriptor(None, None, None))),
            GroupMember::Command(WorkflowCommand::StartTimer {
                delay_seconds: 5,
                tags: timer_tags.clone(),
            }),
        ]
    };
    let receipt = sim
        .apply(|run, cx| checkpoint_local_group(run, cx, claim(&task, fence), "g1", 1, members()))
        .unwrap();
    assert_eq!(receipt.checkpoint.next_sequence, 4);
    assert_eq!(receipt.checkpoint.locals.iter().map(|(s, _)| *s).collect::<Vec<_>>(), [1, 2]);
    assert_eq!(sim.count(EventType::ActivityScheduled), 2);
    assert_eq!(sim.count(EventType::TimerScheduled), 1);
    assert_eq!(sim.count(EventType::ActivityStarted), 0, "no attempt before its own prepare");
    let again = sim
        .apply(|run, cx| checkpoint_local_group(run, cx, claim(&task, fence), "g1", 1, members()))
        .unwrap();
    assert!(again.duplicate);
    assert_eq!(again.checkpoint.locals, receipt.checkpoint.locals);
    // Each member is prepared with its own descriptor, under the execution id the receipt named.
    let first = prepare(&mut sim, &task, fence, 1, "n1", grouped(0, descriptor(None, None, None))).unwrap();
    assert_eq!(first.execution_id, receipt.checkpoint.locals[0].1);
    assert_eq!(first.attempt.number, 1);
    let wrong = prepare(&mut sim, &task, fence, 2, "n2", grouped(0, descriptor(None, None, None))).unwrap_err();
    assert_eq!(wrong.reason, Reason::LocalActivityPreparationMismatch);
    // A group without a local member is a completion's business, not a checkpoint's.
    let (task2, fence2) = (task.clone(), fence);
    let timers_only = vec![GroupMember::Command(WorkflowCommand::StartTimer {
        delay_seconds: 5,
        tags: Map::new(),
    })];
    let refused = sim
        .apply(|run, cx| checkpoint_local_group(run, cx, claim(&task2, fence2), "g2", 4, timers_only))
        .unwrap_err();
    assert_eq!(refused.reason, Reason::InvalidCommands);
}

#[test]
fn a_stop_never_acknowledged_leaves_the_run_to_its_cleanup_deadline() {
    let mut sim = Sim::start();
    let (task, fence) = sim.lease_workflow(OWNER);
    let mut d = descriptor(None, None, None);
    d.cancellation_policy = Some(ActivityCancellationPolicy::WaitCancellationCompleted);
    let admitted = prepare(&mut sim, &task, fence, 1, "n1", d).unwrap();
    request_cancellation_now(&mut sim);
    sim.apply(|run, cx| control_local_activity(run, cx, claim(&task, fence), &admitted.attempt.attempt_id, LEASE_MS))
        .unwrap();
    assert_eq!(
        deliver_local(&mut sim, &task, fence, OWNER).unwrap(),
        DeliveryOutcome::Waiting(Reason::CancellationWaitingForActivity)
    );
    // The worker never acknowledges: no workflow task comes, and the cleanup deadline (60 s)
    // closes the run as cancelled.
    sim.advance(30_000);
    assert!(sim.run.workflow_task.is_none() && !sim.run.is_closed());
    sim.advance(30_001);
    assert_eq!(sim.run.status, RunStatus::Cancelled);
    assert!(sim.run.prepared_locals.is_empty());
    // A late acknowledgement is still taken, in the run document (nothing follows the close).
    let events = sim.history.len();
    let late = sim
        .apply(|run, cx| acknowledge_activity_cancellation(run, cx, &task, &admitted.attempt.attempt_id, OWNER, "cmd-cancel"))
        .unwrap();
    assert!(late.acknowledgement.received_after_deadline && !late.acknowledgement.in_history);
    assert_eq!(sim.history.len(), events);
}
