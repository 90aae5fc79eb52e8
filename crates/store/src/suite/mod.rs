//! The store behaviour suite: one set of checks every [`Store`] implementation must pass.
//!
//! Each check takes a fresh, empty store. A backend runs the whole suite with
//! [`store_suite!`](crate::store_suite), which expands to one `#[tokio::test]` per check, so a
//! new backend gets every check by adding one line.

mod actions;
mod batches;
mod catalog;
mod credentials;
mod dispatch;
mod external_payloads;
mod flow;
mod handoff;
mod imports;
mod operators;
mod pause;
mod row_lease;
mod run_counts;
mod schedules;
mod service_calls;
mod standalone;
mod streams;
mod two_nodes;

pub use actions::*;
pub use batches::*;
pub use catalog::*;
pub use credentials::*;
pub use dispatch::*;
pub use external_payloads::*;
pub use flow::*;
pub use handoff::*;
pub use imports::*;
pub use operators::*;
pub use pause::*;
pub use row_lease::*;
pub use run_counts::*;
pub use schedules::*;
pub use service_calls::*;
pub use standalone::*;
pub use streams::*;
pub use two_nodes::*;

use crate::*;
use serde_json::json;

pub const NOW: Millis = 1_800_000_000_000;

pub fn start_request(workflow_id: &str, queue: &str) -> StartRun {
    StartRun {
        scheduling: Default::default(),
        namespace: "default".into(),
        workflow_id: WorkflowId(workflow_id.into()),
        run_id: RunId(format!("run-{workflow_id}")),
        workflow_type: "suite.workflow".into(),
        task_queue: queue.into(),
        input: Payload::avro("wwHioz3/VYAiNwwA"),
        execution_timeout_seconds: None,
        run_timeout_seconds: None,
        business_key: Some(format!("bk-{workflow_id}")),
        memo: Map::new(),
        search_attributes: Map::new(),
        command_id: CommandId(format!("cmd-{workflow_id}")),
        contract: None,
        compatibility: None,
        origin_trace: None,
        principal: None,
    }
}

fn worker(worker_id: &str, queue: &str) -> WorkerRecord {
    WorkerRecord {
        namespace: "default".into(),
        worker_id: worker_id.into(),
        task_queue: queue.into(),
        runtime: "python".into(),
        sdk_version: None,
        build_id: None,
        supported_workflow_types: vec![],
        supported_activity_types: vec![],
        workflow_definition_fingerprints: Map::new(),
        document: Map::new(),
        status: "active".into(),
        registered_at: NOW,
        last_heartbeat_at: NOW,
    }
}

fn reason<T: std::fmt::Debug>(result: StoreResult<T>) -> Reason {
    match result {
        Err(StoreError::Refused(refusal)) => refusal.reason,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

async fn started<S: Store>(store: &S, workflow_id: &str, queue: &str) -> RunState {
    store
        .start_workflow(start_request(workflow_id, queue), DuplicatePolicy::Fail, NOW)
        .await
        .expect("start")
        .1
}

async fn all_history<S: Store>(store: &S, run: &RunState) -> Vec<HistoryEvent> {
    store.history(&run.run_id, 0, u64::MAX / 2, 10_000).await.expect("history")
}

/// Leases the workflow task of `queue` and completes it with `commands`.
async fn complete_next<S: Store>(store: &S, queue: &str, commands: Vec<WorkflowCommand>) -> RunState {
    let (task, _) = store
        .claim_task("default", TaskKind::Workflow, queue, &[], "w", 60_000, NOW, None)
        .await
        .unwrap()
        .expect("a workflow task");
    let id = task.id.clone();
    let fence = task.fence;
    store
        .mutate_run("default", RunLocator::Task(id.clone()), NOW, move |run, cx| {
            complete_workflow_task(run, cx, &id, "w", fence, commands)
        })
        .await
        .expect("complete")
        .1
}

fn timer(delay_seconds: i64) -> WorkflowCommand {
    WorkflowCommand::StartTimer {
        delay_seconds,
        tags: Map::new(),
    }
}

pub(crate) fn activity() -> WorkflowCommand {
    WorkflowCommand::ScheduleActivity(ScheduleActivity {
        activity_type: "suite.activity".into(),
        arguments: Payload::avro("args"),
        queue: None,
        retry_policy: None,
        timeouts: ActivityTimeouts::default(),
        tags: Map::new(),
        cancellation_policy: None,
        worker_session: None,
    })
}

pub async fn start_then_load_by_every_locator<S: Store>(store: S) {
    let run = started(&store, "wf-1", "q").await;
    for locator in [
        RunLocator::Current(run.workflow_id.clone()),
        RunLocator::Run(run.workflow_id.clone(), run.run_id.clone()),
    ] {
        let loaded = store.load_run("default", locator).await.unwrap().expect("found");
        assert_eq!(loaded, run);
    }
    let task = run.workflow_task.clone().expect("a first workflow task");
    assert_eq!(
        store
            .load_run("default", RunLocator::Task(task.clone()))
            .await
            .unwrap()
            .unwrap()
            .run_id,
        run.run_id
    );
    assert!(
        store.load_run("other", RunLocator::Task(task)).await.unwrap().is_none(),
        "tasks are namespaced"
    );
    let history = all_history(&store, &run).await;
    assert_eq!(
        history.iter().map(|e| e.event_type.as_str()).collect::<Vec<_>>(),
        ["StartAccepted", "WorkflowStarted"]
    );
    verify_chain(&history).expect("a valid chain");
    assert!(store.namespace_exists("default").await.unwrap());
    assert!(!store.namespace_exists("nope").await.unwrap());
}

pub async fn duplicate_starts_follow_the_policy<S: Store>(store: S) {
    let run = started(&store, "dup", "q").await;
    assert_eq!(
        reason(store.start_workflow(start_request("dup", "q"), DuplicatePolicy::Fail, NOW).await),
        Reason::InstanceAlreadyStarted
    );
    let (outcome, existing) = store
        .start_workflow(start_request("dup", "q"), DuplicatePolicy::UseExisting, NOW)
        .await
        .unwrap();
    assert_eq!(outcome, StartOutcome::ReturnedExistingActive);
    assert_eq!(existing.run_id, run.run_id);
    store
        .mutate_run("default", RunLocator::Current(run.workflow_id.clone()), NOW, |run, cx| {
            close_by_command(run, cx, CloseCommand::Terminate, None, "c".into())
        })
        .await
        .unwrap();
    assert_eq!(
        reason(
            store
                .start_workflow(start_request("dup", "q"), DuplicatePolicy::UseExisting, NOW)
                .await
        ),
        Reason::InstanceAlreadyStarted
    );
}

pub async fn a_claim_goes_to_exactly_one_poller<S: Store + Clone>(store: S) {
    started(&store, "claim", "q").await;
    let claims = (0..8).map(|i| {
        let store = store.clone();
        async move {
            store
                .claim_task("default", TaskKind::Workflow, "q", &[], &format!("w{i}"), 60_000, NOW, None)
                .await
                .unwrap()
        }
    });
    let results = futures_join(claims.collect()).await;
    assert_eq!(results.iter().filter(|r| r.is_some()).count(), 1);
    let ready = store.has_ready_task("default", TaskKind::Workflow, "q", &[], NOW).await.unwrap();
    assert_eq!(
        ready,
        Readiness {
            any: false,
            matching: false,
            recalled: None,
            registration: None
        }
    );
}

async fn futures_join<T: Send + 'static>(futures: Vec<impl std::future::Future<Output = T> + Send + 'static>) -> Vec<T> {
    let handles: Vec<_> = futures.into_iter().map(tokio::spawn).collect();
    let mut out = Vec::new();
    for handle in handles {
        out.push(handle.await.expect("task"));
    }
    out
}

pub async fn claims_respect_queue_type_and_availability<S: Store>(store: S) {
    started(&store, "typed", "q").await;
    assert!(store
        .claim_task("default", TaskKind::Workflow, "other-q", &[], "w", 60_000, NOW, None)
        .await
        .unwrap()
        .is_none());
    assert!(store
        .claim_task("default", TaskKind::Activity, "q", &[], "w", 60_000, NOW, None)
        .await
        .unwrap()
        .is_none());
    let other_type = vec!["not.this.type".to_string()];
    // Not this poll's type, but ready for another: a poll woken for it hands the wake-up on.
    assert_eq!(
        store
            .has_ready_task("default", TaskKind::Workflow, "q", &other_type, NOW)
            .await
            .unwrap(),
        Readiness {
            any: true,
            matching: false,
            recalled: None,
            registration: None
        }
    );
    assert!(store
        .claim_task("default", TaskKind::Workflow, "q", &other_type, "w", 60_000, NOW, None)
        .await
        .unwrap()
        .is_none());
    let this_type = vec!["suite.workflow".to_string()];
    assert_eq!(
        store
            .has_ready_task("default", TaskKind::Workflow, "q", &this_type, NOW)
            .await
            .unwrap(),
        Readiness {
            any: true,
            matching: true,
            recalled: None,
            registration: None
        }
    );
    let (task, run) = store
        .claim_task("default", TaskKind::Workflow, "q", &this_type, "w", 60_000, NOW, None)
        .await
        .unwrap()
        .expect("claimed");
    assert_eq!(task.fence, 1);
    assert_eq!(task.lease().unwrap().owner, "w");
    assert_eq!(
        store.leased_tasks("default", "w", TaskKind::Workflow).await.unwrap(),
        vec![task.id.clone()]
    );
    assert!(store
        .leased_tasks("default", "someone-else", TaskKind::Workflow)
        .await
        .unwrap()
        .is_empty());
    assert_eq!(run.status, RunStatus::Running);
}

/// A ready workflow task of a claimed run is offered to its sticky owner only, until the
/// hold runs out; then to any worker, with a forced cold replay. (An owner that deregisters
/// releases it at once: the HTTP suite covers that on both backends.)
pub async fn claims_hold_a_sticky_task_for_its_owner<S: Store>(store: S) {
    store.register_worker(worker("owner", "q")).await.unwrap();
    store.register_worker(worker("other", "q")).await.unwrap();
    let run = started(&store, "sticky", "q").await;
    let first = run.workflow_task.clone().unwrap();
    let claim = StickyClaim {
        worker_id: "owner".into(),
        workflow_id: "sticky".into(),
        run_id: run.run_id.to_string(),
        build_id: "b".into(),
        ttl_seconds: 3600,
        metrics: Default::default(),
    };
    store
        .mutate_run("default", RunLocator::Task(first.clone()), NOW, move |run, cx| {
            lease_workflow_task(run, cx, &first, "owner", 60_000)?;
            let receipt = complete_workflow_task(run, cx, &first, "owner", 1, vec![timer(3600)])?;
            record_sticky_claim(run, cx.now, Some(claim));
            signal(run, cx, "s", Payload::avro("x"), "c".into())?;
            Ok(receipt)
        })
        .await
        .expect("claimed and signalled");
    let claim_as = |owner: &'static str, at: Millis| store.claim_task("default", TaskKind::Workflow, "q", &[], owner, 60_000, at, None);
    assert!(claim_as("other", NOW).await.unwrap().is_none(), "held for its owner");
    let held_until = NOW + capstan_engine::sticky::STICKY_HOLD_MS;
    assert!(
        claim_as("other", held_until - 1).await.unwrap().is_none(),
        "held until the hold runs out"
    );
    let (task, _) = claim_as("other", held_until).await.unwrap().expect("the hold ran out: anyone");
    assert!(matches!(
        task.detail,
        TaskDetail::Workflow {
            replay_mode: Some(ReplayMode::ForcedColdReplay),
            ..
        }
    ));
}

fn session_activity(session_id: &str, allow_reacquire: bool) -> WorkflowCommand {
    let mut options = SessionOptions::new(session_id);
    options.lease_seconds = 5;
    options.allow_reacquire_after_failure = allow_reacquire;
    let WorkflowCommand::ScheduleActivity(mut schedule) = activity() else {
        unreachable!("activity() schedules an activity")
    };
    schedule.worker_session = Some(SessionRequirement {
        options,
        as_sent: Map::new(),
    });
    WorkflowCommand::ScheduleActivity(schedule)
}

/// A session activity is offered only to a worker that may hold its session: not to a rival
/// while the holder's lease lasts, and after the lease lapsed only if the session may be
/// reacquired (`allow_reacquire_after_failure`).
pub async fn claims_offer_a_session_activity_only_to_who_may_hold_the_session<S: Store>(store: S) {
    for who in ["holder", "rival"] {
        let mut registered = worker(who, "q");
        registered.document.insert("capabilities".into(), json!(["worker_sessions"]));
        store.register_worker(registered).await.unwrap();
    }
    let claim_as = |owner: &'static str, at: Millis| store.claim_task("default", TaskKind::Activity, "q", &[], owner, 60_000, at, None);
    let lapsed = NOW + 5_000 + 1;
    for (session_id, allow_reacquire) in [("kept", false), ("open", true)] {
        started(&store, session_id, "q").await;
        complete_next(
            &store,
            "q",
            vec![
                session_activity(session_id, allow_reacquire),
                session_activity(session_id, allow_reacquire),
            ],
        )
        .await;
        let (first, _) = claim_as("holder", NOW).await.unwrap().expect("the holder creates the session");
        assert!(
            claim_as("rival", NOW + 1).await.unwrap().is_none(),
            "{session_id}: held by its holder"
        );
        let taken = claim_as("rival", lapsed).await.unwrap();
        match allow_reacquire {
            false => assert!(taken.is_none(), "a session that may not be reacquired stays its holder's"),
            true => assert_ne!(taken.expect("reacquired after the lease lapsed").0.id, first.id),
        }
        let session = store.get_session("default", session_id).await.unwrap().unwrap();
        let expected = if allow_reacquire { "rival" } else { "holder" };
        assert_eq!(session.lease_owner, expected, "{session_id}");
        // Leave nothing claimable behind for the next round.
        store
            .mutate_run("default", RunLocator::Current(WorkflowId(session_id.into())), lapsed, |run, cx| {
                close_by_command(run, cx, CloseCommand::Terminate, None, "t".into()).map(|_| ())
            })
            .await
            .unwrap();
    }
}

/// A worker session's steps each lock, decide and write the session once; a refused step
/// writes nothing; the stored session reads back.
pub async fn worker_sessions_are_acquired_renewed_and_closed<S: Store>(store: S) {
    let mut holder = worker("holder", "q");
    holder.document.insert("capabilities".into(), json!(["worker_sessions"]));
    store.register_worker(holder).await.unwrap();
    store.register_worker(worker("rival", "q")).await.unwrap();
    assert!(store.get_session("default", "s").await.unwrap().is_none());
    let acquire =
        |who: &'static str, at: Millis| store.session_step("default", "s", who, SessionStep::Acquire(SessionOptions::new("s")), at);
    let created = acquire("holder", NOW).await.unwrap();
    assert_eq!((created.outcome, created.session.fence), ("created", 1));
    assert_eq!(reason(acquire("rival", NOW + 1).await), Reason::SessionOwnedByAnotherWorker);
    assert_eq!(
        store.get_session("default", "s").await.unwrap().unwrap(),
        created.session,
        "a refusal wrote nothing"
    );
    let beat = store
        .session_step("default", "s", "holder", SessionStep::Heartbeat(Some(5)), NOW + 10)
        .await
        .unwrap();
    assert_eq!(beat.session.lease_expires_at, NOW + 10 + 5_000);
    // The lease lapses: the rival takes the session over, and the former holder is fenced off.
    let taken = acquire("rival", NOW + 10 + 5_000).await.unwrap();
    assert_eq!(
        (taken.outcome, taken.session.lease_owner.as_str(), taken.session.fence),
        ("reacquired", "rival", 2)
    );
    let late = store
        .session_step("default", "s", "holder", SessionStep::Heartbeat(None), NOW + 20_000)
        .await;
    assert_eq!(reason(late), Reason::SessionOwnerMismatch);
    let closed = store
        .session_step("default", "s", "rival", SessionStep::Close(Some("done".into())), NOW + 20_001)
        .await
        .unwrap();
    assert_eq!(closed.outcome, "closed");
    let stored = store.get_session("default", "s").await.unwrap().unwrap();
    assert_eq!(
        (stored.status, stored.close_reason.as_deref()),
        (SessionStatus::Closed, Some("done"))
    );
    let missing = store.session_step("default", "nope", "rival", SessionStep::Close(None), NOW).await;
    assert_eq!(reason(missing), Reason::SessionNotFound);
}

/// A fenced deregistration removes the registration only for its current token, in the same
/// transaction as its receipt, which a retry gets back.
pub async fn fenced_deregistrations_keep_their_receipt<S: Store>(store: S) {
    let mut registered = worker("w", "q");
    registered.document.insert("registration_token".into(), json!("t-current"));
    store.register_worker(registered).await.unwrap();
    assert_eq!(
        reason(store.deregister_fenced("default", "w", "t-old", NOW).await),
        Reason::WorkerRegistrationLostAuthority
    );
    assert!(
        store.get_worker("default", "w").await.unwrap().is_some(),
        "a refused token removes nothing"
    );
    let (receipt, replayed) = store.deregister_fenced("default", "w", "t-current", NOW).await.unwrap();
    assert!(!replayed);
    assert_eq!(receipt["outcome"], "deregistered");
    assert!(store.get_worker("default", "w").await.unwrap().is_none());
    let (again, replayed) = store.deregister_fenced("default", "w", "t-current", NOW + 1_000).await.unwrap();
    assert!(replayed);
    assert_eq!(again, receipt);
    let expired = store
        .deregister_fenced("default", "w", "t-current", NOW + DEREGISTRATION_RECEIPT_RETENTION_MS + 1)
        .await;
    assert_eq!(
        reason(expired),
        Reason::WorkerRegistrationTokenNotFound,
        "receipts are kept for a while only"
    );
}

pub async fn a_refused_transition_writes_nothing<S: Store>(store: S) {
    let run = started(&store, "refused", "q").await;
    let before_history = all_history(&store, &run).await;
    let task = run.workflow_task.clone().unwrap();
    let result = store
        .mutate_run("default", RunLocator::Task(task.clone()), NOW, move |run, cx| {
            // Change things, then refuse: none of it may persist.
            signal(run, cx, "s", Payload::avro("x"), "c".into())?;
            complete_workflow_task(run, cx, &task, "nobody", 7, vec![timer(1)])
        })
        .await;
    assert_eq!(reason(result), Reason::TaskNotLeased);
    let after = store
        .load_run("default", RunLocator::Current(run.workflow_id.clone()))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(after, run);
    assert_eq!(all_history(&store, &run).await, before_history);
    assert!(matches!(
        store.mutate_run("default", RunLocator::Current(WorkflowId("missing".into())), NOW, |_, _| Ok(())).await,
        Err(StoreError::Refused(r)) if r.reason == Reason::InstanceNotFound
    ));
}

pub async fn transitions_persist_events_and_tasks<S: Store>(store: S) {
    started(&store, "persist", "q").await;
    let run = complete_next(&store, "q", vec![activity()]).await;
    assert!(
        store
            .has_ready_task("default", TaskKind::Activity, "q", &[], NOW)
            .await
            .unwrap()
            .matching
    );
    let (task, _) = store
        .claim_task("default", TaskKind::Activity, "q", &[], "w", 60_000, NOW, None)
        .await
        .unwrap()
        .expect("activity task");
    let TaskDetail::Activity {
        attempt_id: Some(attempt), ..
    } = task.detail.clone()
    else {
        panic!("no attempt")
    };
    let id = task.id.clone();
    let (_, run_after) = store
        .mutate_run("default", RunLocator::Task(id.clone()), NOW, move |run, cx| {
            complete_activity(run, cx, &id, &attempt, "w", Payload::avro("r"))
        })
        .await
        .unwrap();
    assert!(
        store
            .has_ready_task("default", TaskKind::Workflow, "q", &[], NOW)
            .await
            .unwrap()
            .matching,
        "the result woke the workflow"
    );
    let history = all_history(&store, &run_after).await;
    assert_eq!(history.len() as u64, run_after.last_sequence);
    assert_eq!(history.last().unwrap().event_type, EventType::ActivityCompleted);
    verify_chain(&history).unwrap();
    // Paging reads contiguous slices.
    let page = store.history(&run.run_id, 2, run_after.last_sequence, 2).await.unwrap();
    assert_eq!(page.iter().map(|e| e.sequence).collect::<Vec<_>>(), [3, 4]);
    // The stored form is the same events, each payload the JSON text of its map.
    let stored = store.stored_history(&run.run_id, 0, run_after.last_sequence, 100).await.unwrap();
    assert_eq!(stored.len(), history.len());
    for (raw, event) in stored.iter().zip(&history) {
        assert_eq!(
            (raw.sequence, raw.id.as_str(), raw.event_type.as_str(), raw.hash.as_str()),
            (event.sequence, event.id.as_str(), event.event_type.as_str(), event.hash.as_str())
        );
        assert_eq!(raw.payload, serde_json::to_string(&event.payload).unwrap());
        assert_eq!(raw.workflow_task_id.as_deref(), event.workflow_task_id.as_ref().map(|t| t.as_str()));
        assert_eq!(
            (raw.recorded_at, raw.prev_hash.as_str()),
            (event.recorded_at, event.prev_hash.as_str())
        );
    }
    let stored_page = store.stored_history(&run.run_id, 2, run_after.last_sequence, 2).await.unwrap();
    assert_eq!(stored_page.iter().map(|e| e.sequence).collect::<Vec<_>>(), [3, 4]);
}

/// A report's receipt is kept on its task's row, not in the run document: a retried report is
/// answered from it (retained, nothing written) after other transitions rewrote the run, and
/// a different report on the closed task is refused.
pub async fn a_retried_report_is_answered_from_its_tasks_receipt<S: Store>(store: S) {
    let run = started(&store, "receipt", "q").await;
    let task = run.workflow_task.clone().unwrap();
    let complete = |owner: &'static str| {
        let task = task.clone();
        move |run: &mut RunState, cx: &mut Cx| complete_workflow_task(run, cx, &task, owner, 1, vec![timer(60)])
    };
    store
        .claim_task("default", TaskKind::Workflow, "q", &[], "w", 60_000, NOW, None)
        .await
        .unwrap()
        .expect("a workflow task");
    let (first, after_first) = store
        .mutate_run("default", RunLocator::Task(task.clone()), NOW, complete("w"))
        .await
        .unwrap();
    assert!(!first.retained);
    // Later transitions rewrite the document; none of them carries the receipt along.
    for n in 0..3 {
        store
            .mutate_run("default", RunLocator::Current(run.workflow_id.clone()), NOW, move |run, cx| {
                signal(run, cx, "s", Payload::avro("x"), format!("c{n}").into())
            })
            .await
            .unwrap();
    }
    let by_run = store
        .load_run("default", RunLocator::Current(run.workflow_id.clone()))
        .await
        .unwrap()
        .unwrap();
    assert!(by_run.closed_receipts.is_empty(), "the document carries no receipts");
    let history_before = all_history(&store, &by_run).await;
    let (again, _) = store
        .mutate_run("default", RunLocator::Task(task.clone()), NOW, complete("w"))
        .await
        .unwrap();
    assert!(again.retained);
    assert_eq!(again.created_task_ids, first.created_task_ids);
    assert_eq!(again.run_status, first.run_status);
    assert_eq!(
        all_history(&store, &by_run).await,
        history_before,
        "a retained answer writes nothing"
    );
    let other = store
        .mutate_run("default", RunLocator::Task(task.clone()), NOW, complete("someone-else"))
        .await;
    assert!(matches!(other, Err(StoreError::Refused(_))), "another owner's report is refused");
    assert_eq!(after_first.last_sequence + 3, by_run.last_sequence);
}

/// A parent's cancellation delivered at a child call (policy `try_cancel`) asks the child's
/// current run in the same transaction; a parent closed with the `terminate` policy ends it.
pub async fn children_follow_a_parents_delivery_and_close_in_its_transaction<S: Store>(store: S) {
    started(&store, "parent", "pq").await;
    let child = |id: &str| {
        WorkflowCommand::StartChildWorkflow(StartChild {
            workflow_type: "suite.child".into(),
            arguments: Payload::avro("args"),
            queue: Some("cq".into()),
            workflow_id: Some(id.into()),
            parent_close_policy: "terminate".into(),
            cancellation_policy: "try_cancel".into(),
            execution_timeout_seconds: None,
            run_timeout_seconds: None,
            retry_policy: None,
            tags: Map::new(),
            observability_context: None,
        })
    };
    complete_next(&store, "pq", vec![child("child-1"), child("child-2")]).await;
    let current = |id: &'static str| RunLocator::Current(WorkflowId(id.into()));
    store
        .mutate_run("default", current("parent"), NOW, |run, cx| {
            request_cancellation(run, cx, Some("stop".into()), 60, "cmd-cancel".into())
        })
        .await
        .unwrap();
    let (task, _) = store
        .claim_task("default", TaskKind::Workflow, "pq", &[], "w", 60_000, NOW, None)
        .await
        .unwrap()
        .expect("the parent's task");
    let (id, fence) = (task.id.clone(), task.fence);
    store
        .mutate_run("default", RunLocator::Task(id.clone()), NOW, move |run, cx| {
            let delivery = DeliveryRequest {
                request_id: "cmd-cancel".into(),
                sequence: 1,
                call_kind: "child".into(),
                sequence_span: 1,
                operation_sequence: None,
                operation_sequence_span: 1,
            };
            deliver_cancellation(run, cx, &id, "w", fence, delivery)
        })
        .await
        .unwrap();
    let asked = store.load_run("default", current("child-1")).await.unwrap().unwrap();
    let request = asked.cancellation.clone().expect("the child was asked in the parent's transaction");
    let history = all_history(&store, &asked).await;
    assert!(history.iter().any(|e| e.event_type == EventType::CooperativeCancellationRequested));
    assert_eq!(request.cleanup_deadline_at, NOW + 60_000);
    let untouched = store.load_run("default", current("child-2")).await.unwrap().unwrap();
    assert!(untouched.cancellation.is_none(), "only the call the delivery reached");
    store
        .mutate_run("default", current("parent"), NOW, |run, cx| {
            close_by_command(run, cx, CloseCommand::Terminate, None, "cmd-t".into())
        })
        .await
        .unwrap();
    for id in ["child-1", "child-2"] {
        let closed = store.load_run("default", current(id)).await.unwrap().unwrap();
        assert_eq!(closed.status, RunStatus::Terminated, "{id} follows its parent-close policy");
    }
}

pub async fn deadlines_are_reported_when_due<S: Store>(store: S) {
    started(&store, "timers", "q").await;
    complete_next(&store, "q", vec![timer(5)]).await;
    assert_eq!(store.next_deadline().await.unwrap(), Some(NOW + 5_000));
    assert!(store.claim_due_tasks("node-a", NOW + 4_999, 10, 30_000).await.unwrap().is_empty());
    let due = store.claim_due_tasks("node-a", NOW + 5_000, 10, 30_000).await.unwrap();
    assert_eq!(due.len(), 1);
    assert!(
        store.claim_due_tasks("node-b", NOW + 5_000, 10, 30_000).await.unwrap().is_empty(),
        "a live duty claim is exclusive"
    );
    assert_eq!(
        store.next_deadline().await.unwrap(),
        Some(NOW + 35_000),
        "a claimed duty is next due when its claim expires (no clock spins on it meanwhile)"
    );
    let id = due[0].task_id.clone();
    let (fired, _) = store
        .run_duty(&due[0], NOW + 5_000, move |run, cx| Ok(on_deadline(run, cx, &id)))
        .await
        .unwrap();
    assert!(fired);
    assert!(
        store.claim_due_tasks("node-a", NOW + 10_000, 10, 30_000).await.unwrap().is_empty(),
        "a fired timer is not due again"
    );
    assert_eq!(store.next_deadline().await.unwrap(), None);
}

pub async fn an_expired_duty_claim_passes_on_with_a_higher_fence<S: Store>(store: S) {
    let run = started(&store, "duty", "q").await;
    complete_next(&store, "q", vec![timer(1)]).await;
    let first = store.claim_due_tasks("node-a", NOW + 1_000, 10, 500).await.unwrap();
    assert_eq!(first.len(), 1);
    // node-a dies holding the claim; after it expires node-b takes over with fence + 1.
    let second = store.claim_due_tasks("node-b", NOW + 1_600, 10, 500).await.unwrap();
    assert_eq!(second.len(), 1);
    assert_eq!(second[0].duty_fence, first[0].duty_fence + 1);
    let id = first[0].task_id.clone();
    let stale = store
        .run_duty(&first[0], NOW + 1_600, move |run, cx| Ok(on_deadline(run, cx, &id)))
        .await;
    assert_eq!(reason(stale), Reason::StaleFence);
    let id = second[0].task_id.clone();
    store
        .run_duty(&second[0], NOW + 1_600, move |run, cx| Ok(on_deadline(run, cx, &id)))
        .await
        .unwrap();
    let history = all_history(&store, &run).await;
    assert_eq!(
        history.iter().filter(|e| e.event_type == EventType::TimerFired).count(),
        1,
        "exactly one node fired the timer"
    );
}

pub async fn keyed_commands_are_idempotent<S: Store>(store: S) {
    let run = started(&store, "keyed", "q").await;
    let key = |intent: &str| CommandKey {
        command_type: "signal".into(),
        request_id: "req-1".into(),
        intent_hash: intent.into(),
    };
    let apply = |intent: &'static str| {
        store.mutate_run_keyed(
            "default",
            RunLocator::Current(run.workflow_id.clone()),
            key(intent),
            NOW,
            |run, cx| signal(run, cx, "s", Payload::avro("x"), "c".into()),
            |receipt, run| json!({"command_sequence": receipt.command_sequence, "run_id": run.run_id}),
        )
    };
    assert!(matches!(apply("A").await.unwrap().0, KeyedReceipt::Fresh(_)));
    let KeyedReceipt::Retained(stored) = apply("A").await.unwrap().0 else {
        panic!("expected the retained receipt")
    };
    assert_eq!(stored["run_id"], json!(run.run_id));
    assert_eq!(reason(apply("B").await), Reason::RequestIdConflict);
    let signals = all_history(&store, &run)
        .await
        .iter()
        .filter(|e| e.event_type == EventType::SignalReceived)
        .count();
    assert_eq!(signals, 1);
}

/// The task a poll with `key` was answered with, as a poll's first look reads it.
pub(crate) async fn recall<S: Store>(store: &S, key: PollKey) -> Option<(TaskId, u64)> {
    let ask = LookAsk {
        namespace: key.namespace.clone(),
        kind: key.kind,
        queue: key.task_queue.clone(),
        types: Vec::new(),
        now: NOW,
        recall: Some(key),
        worker_id: None,
    };
    store.look(ask).await.unwrap().recalled
}

pub async fn poll_memos_round_trip<S: Store>(store: S) {
    started(&store, "memo", "q").await;
    let key = PollKey {
        namespace: "default".into(),
        task_queue: "q".into(),
        worker_id: "w".into(),
        kind: TaskKind::Workflow,
        poll_request_id: "p1".into(),
    };
    assert!(recall(&store, key.clone()).await.is_none());
    let (task, _) = store
        .claim_task("default", TaskKind::Workflow, "q", &[], "w", 60_000, NOW, Some(key.clone()))
        .await
        .unwrap()
        .expect("claimed");
    assert_eq!(recall(&store, key.clone()).await, Some((task.id.clone(), task.fence)));
    let other = PollKey {
        kind: TaskKind::Activity,
        ..key.clone()
    };
    assert!(recall(&store, other).await.is_none());
    let someone_else = PollKey {
        worker_id: "w2".into(),
        ..key.clone()
    };
    assert!(recall(&store, someone_else).await.is_none());
    // A transition that rewrites the task's row while its lease stands keeps the poll.
    let id = task.id.clone();
    store
        .mutate_run("default", RunLocator::Task(id.clone()), NOW, move |run, cx| {
            heartbeat_workflow_task(run, cx, &id, "w", task.fence, 60_000)
        })
        .await
        .expect("a heartbeat");
    assert_eq!(recall(&store, key.clone()).await, Some((task.id.clone(), task.fence)));
    // Once the task is done, a retry of its poll gets nothing back.
    let id = task.id.clone();
    store
        .mutate_run("default", RunLocator::Task(id.clone()), NOW, move |run, cx| {
            complete_workflow_task(run, cx, &id, "w", task.fence, vec![timer(60)])
        })
        .await
        .expect("complete");
    assert!(recall(&store, key).await.is_none());
}

fn query_task(id: &str) -> QueryTask {
    QueryTask {
        id: id.into(),
        kind: QueryKind::Query,
        namespace: "default".into(),
        task_queue: "q".into(),
        workflow_id: "wf".into(),
        run_id: "run".into(),
        workflow_type: "t".into(),
        query_name: "status".into(),
        arguments: None,
        state: QueryState::Ready,
        attempt: 0,
        created_at: NOW,
        deadline_at: NOW + 30_000,
    }
}

pub async fn namespaces_are_created_updated_and_deleted_when_empty<S: Store>(store: S) {
    let record = |name: &str| NamespaceRecord {
        name: name.into(),
        description: Some("team a".into()),
        retention_days: Some(30),
        status: "active".into(),
        created_at: NOW,
        updated_at: NOW,
        external_payload_storage: None,
    };
    let names = |list: Vec<NamespaceRecord>| list.into_iter().map(|n| n.name).collect::<Vec<_>>();
    assert_eq!(names(store.namespaces().await.unwrap()), ["default"]);
    store.create_namespace(record("team-a")).await.unwrap();
    assert_eq!(
        reason(store.create_namespace(record("team-a")).await),
        Reason::NamespaceAlreadyExists
    );
    assert!(store.namespace_exists("team-a").await.unwrap());
    let updated = store.update_namespace("team-a", None, Some(7), NOW + 1).await.unwrap();
    assert_eq!(
        (updated.description.as_deref(), updated.retention_days, updated.updated_at),
        (Some("team a"), Some(7), NOW + 1)
    );
    assert_eq!(
        reason(store.update_namespace("nope", None, None, NOW).await),
        Reason::NamespaceNotFound
    );
    assert_eq!(reason(store.delete_namespace("default").await), Reason::NamespaceNotEmpty);
    let mut start = start_request("in-team-a", "q");
    start.namespace = "team-a".into();
    store.start_workflow(start, DuplicatePolicy::Fail, NOW).await.unwrap();
    assert_eq!(reason(store.delete_namespace("team-a").await), Reason::NamespaceNotEmpty);
    store.create_namespace(record("team-b")).await.unwrap();
    assert_eq!(store.delete_namespace("team-b").await.unwrap().name, "team-b");
    assert!(!store.namespace_exists("team-b").await.unwrap());
    assert_eq!(names(store.namespaces().await.unwrap()), ["default", "team-a"]);
}

/// Payload blobs as JSON text: the suite's stand-in for the Avro codec.
struct JsonCodec;

impl MemoCodec for JsonCodec {
    fn merge(&self, _: MemoBase<'_>, _: &Payload) -> Result<MergedMemo, String> {
        Err("not used".into())
    }

    fn to_json(&self, payload: &Payload) -> Result<Value, String> {
        serde_json::from_str(&payload.blob).map_err(|e| e.to_string())
    }

    fn json_to_payload(&self, value: &Value) -> Result<Payload, String> {
        if value.get("unencodable").is_some() {
            return Err("this codec cannot encode the answer".into());
        }
        Ok(Payload::avro(value.to_string()))
    }
}

static JSON_CODEC: JsonCodec = JsonCodec;

/// Credits an account in the application's own table, in Capstan's transaction; fails after
/// writing when asked to, so the rollback can be seen.
struct Credit;

/// The application's table, made inside the handler where DDL is transactional; MySQL refuses
/// DDL in a handler (it would commit the transaction), so its test file makes the table first.
fn ensure_balances(tx: &mut dyn AtomicTransaction) {
    let _ = tx.execute(
        "CREATE TABLE IF NOT EXISTS suite_balances (account TEXT PRIMARY KEY, amount BIGINT NOT NULL)",
        &[],
    );
}

impl AtomicAction for Credit {
    fn run(&self, tx: &mut dyn AtomicTransaction, arguments: &Value) -> Result<Value, String> {
        ensure_balances(tx);
        let account = arguments[0]["account"].clone();
        tx.execute(
            "INSERT INTO suite_balances (account, amount) VALUES ($1, $2)",
            &[account.clone(), arguments[0]["amount"].clone()],
        )?;
        if arguments[0]["fail"] == json!(true) {
            return Err("the ledger of the bank said no".into());
        }
        if arguments[0]["unencodable"] == json!(true) {
            return Ok(json!({"unencodable": account}));
        }
        let rows = tx.query("SELECT amount FROM suite_balances WHERE account = $1", &[account])?;
        Ok(json!({"credited": rows[0][0]}))
    }
}

pub async fn retention_removes_closed_instances_and_frees_their_ids<S: Store>(store: S) {
    const DAY: Millis = 86_400_000;
    for id in ["old-closed", "old-open", "recent-closed"] {
        started(&store, id, "q").await;
    }
    for (id, closed_at) in [("old-closed", NOW), ("recent-closed", NOW + 5 * DAY)] {
        store
            .mutate_run("default", RunLocator::Current(WorkflowId(id.into())), closed_at, |run, cx| {
                close_by_command(run, cx, CloseCommand::Terminate, None, "c".into())
            })
            .await
            .unwrap();
    }
    let cutoff = NOW + 2 * DAY;
    let expired = store.expired_instances("default", cutoff, 10).await.unwrap();
    assert_eq!(
        expired.iter().map(|e| e.0.as_str()).collect::<Vec<_>>(),
        ["old-closed"],
        "open and recent runs stay"
    );
    assert!(
        store.expired_instances("other", cutoff, 10).await.unwrap().is_empty(),
        "per namespace"
    );
    // An id that is not expired (any more) is skipped even when asked for.
    let pruned = store
        .prune_instances("default", vec!["old-closed".into(), "old-open".into()], cutoff)
        .await
        .unwrap();
    assert_eq!(pruned, 1);
    assert!(store
        .load_run("default", RunLocator::Current(WorkflowId("old-closed".into())))
        .await
        .unwrap()
        .is_none());
    assert!(store
        .load_run("default", RunLocator::Current(WorkflowId("old-open".into())))
        .await
        .unwrap()
        .is_some());
    assert!(store
        .history(&RunId("run-old-closed".into()), 0, 100, 100)
        .await
        .unwrap()
        .is_empty());
    // The id is free again.
    started(&store, "old-closed", "q").await;
    assert_eq!(
        store.prune_instances("default", vec!["old-closed".into()], cutoff).await.unwrap(),
        0
    );
}

pub async fn audit_events_are_paged_newest_first_and_pruned_with_their_instance<S: Store>(store: S) {
    const DAY: Millis = 86_400_000;
    for id in ["audited", "other"] {
        started(&store, id, "q").await;
    }
    let event = |workflow_id: &str, n: i64, principal: Option<Principal>| AuditEvent {
        audit_id: format!("audit-{workflow_id}-{n:02}"),
        namespace: "default".into(),
        workflow_id: workflow_id.into(),
        run_id: Some(format!("run-{workflow_id}")),
        action: "workflow.query".into(),
        principal,
        recorded_at: NOW + n,
        detail: json!({"query_name": format!("q{n}")}).as_object().unwrap().clone(),
    };
    for n in 0..5 {
        store
            .record_audit(event("audited", n, Some(Principal::token("bob"))))
            .await
            .unwrap();
    }
    // Two in one millisecond: ordered by id within it.
    let same_millisecond = AuditEvent {
        audit_id: "audit-audited-04b".into(),
        ..event("audited", 4, None)
    };
    store.record_audit(same_millisecond).await.unwrap();
    store.record_audit(event("other", 0, Some(Principal::anonymous()))).await.unwrap();

    let first = store.audit_events("default", "audited", None, 3).await.unwrap();
    let ids = |events: &[AuditEvent]| events.iter().map(|e| e.audit_id.clone()).collect::<Vec<_>>();
    assert_eq!(ids(&first), ["audit-audited-04b", "audit-audited-04", "audit-audited-03"]);
    assert_eq!(first[0].principal, None);
    assert_eq!(first[1], event("audited", 4, Some(Principal::token("bob"))), "read back as written");
    let last = &first[2];
    let rest = store
        .audit_events("default", "audited", Some((last.recorded_at, last.audit_id.clone())), 10)
        .await
        .unwrap();
    assert_eq!(ids(&rest), ["audit-audited-02", "audit-audited-01", "audit-audited-00"]);
    assert!(
        store.audit_events("elsewhere", "audited", None, 10).await.unwrap().is_empty(),
        "per namespace"
    );

    // The trail goes with its instance, and only with it.
    store
        .mutate_run("default", RunLocator::Current(WorkflowId("audited".into())), NOW, |run, cx| {
            close_by_command(run, cx, CloseCommand::Terminate, None, "c".into())
        })
        .await
        .unwrap();
    let pruned = store.prune_instances("default", vec!["audited".into()], NOW + DAY).await.unwrap();
    assert_eq!(pruned, 1);
    assert!(store.audit_events("default", "audited", None, 10).await.unwrap().is_empty());
    assert_eq!(store.audit_events("default", "other", None, 10).await.unwrap().len(), 1);
}

pub async fn typed_visibility_filters_select_exactly_the_matching_runs<S: Store>(store: S) {
    use capstan_engine::visibility::{parse_filter, AttributeType};
    let schema: std::collections::BTreeMap<String, AttributeType> = [
        ("Tier", AttributeType::Keyword),
        ("Amount", AttributeType::Int),
        ("Vip", AttributeType::Bool),
        ("DueAt", AttributeType::Datetime),
        ("Tags", AttributeType::KeywordList),
    ]
    .into_iter()
    .map(|(n, t)| (n.to_string(), t))
    .collect();
    for (id, attributes) in [
        (
            "tv-1",
            json!({"Tier": "gold", "Amount": 5, "Vip": true, "DueAt": "2026-01-01T00:00:00Z", "Tags": ["a", "b"]}),
        ),
        (
            "tv-2",
            json!({"Tier": "silver", "Amount": 50, "Vip": false, "DueAt": "2026-06-01T00:00:00Z", "Tags": ["b"]}),
        ),
        ("tv-3", json!({"Tier": "bronze", "Amount": 500, "Tags": ["c"]})),
    ] {
        let mut start = start_request(id, "q");
        start.search_attributes = attributes.as_object().unwrap().clone();
        store.start_workflow(start, DuplicatePolicy::Fail, NOW).await.unwrap();
    }
    // One instance continues as new: its first run keeps its index rows but is no longer
    // current, so no listing or count may name it (its successor is current).
    let continued = WorkflowCommand::ContinueAsNew {
        arguments: Payload::avro("wwHioz3/VYAiNwwA"),
        workflow_type: None,
        queue: None,
        tags: Default::default(),
        observability_context: None,
    };
    assert!(complete_next(&store, "q", vec![continued]).await.is_closed());
    for (query, expected) in [
        ("Amount > 10", vec!["tv-2", "tv-3"]),
        ("Amount >= 5 AND Amount < 500", vec!["tv-1", "tv-2"]),
        ("NOT Vip = true", vec!["tv-2", "tv-3"]),
        (r#"Tier = "gold" OR Tags = "c""#, vec!["tv-1", "tv-3"]),
        (r#"Tags = "b" AND NOT Tier IN ("gold")"#, vec!["tv-2"]),
        (r#"DueAt < "2026-03-01T00:00:00Z""#, vec!["tv-1"]),
        (r#"WorkflowId = "tv-3" OR BusinessKey = "bk-tv-1""#, vec!["tv-1", "tv-3"]),
        (r#"StartTime >= "2020-01-01T00:00:00Z" AND Tier != "gold""#, vec!["tv-2", "tv-3"]),
    ] {
        let filter = ListFilter {
            filter: Some(parse_filter(query, &schema).unwrap()),
            ..Default::default()
        };
        let (rows, _) = store.list_runs("default", filter.clone(), 0, 50).await.unwrap();
        let mut ids: Vec<String> = rows.iter().map(|r| r.workflow_id.as_str().to_string()).collect();
        ids.sort();
        assert_eq!(ids, expected, "{query}");
        let counted = store.count_runs("default", filter).await.unwrap();
        assert_eq!(
            (counted.running + counted.completed, counted.at_least),
            (rows.len() as u64, false),
            "the count under {query} is of current runs"
        );
    }
    // Another namespace sees none of them.
    let filter = ListFilter {
        filter: Some(parse_filter("Amount > 0", &schema).unwrap()),
        ..Default::default()
    };
    assert!(store.list_runs("other", filter, 0, 50).await.unwrap().0.is_empty());
}

pub async fn validation_tasks_are_claimed_only_by_their_kind<S: Store>(store: S) {
    let validation = QueryTask {
        kind: QueryKind::UpdateValidation,
        query_name: "add".into(),
        ..query_task("v1")
    };
    store.create_query_task(validation).await.unwrap();
    store.create_query_task(query_task("q1")).await.unwrap();
    let query = store
        .claim_query_task(query_claim("default", QueryKind::Query, "a", 5_000), NOW)
        .await
        .unwrap()
        .expect("the query");
    assert_eq!(query.id, "q1");
    assert!(
        store
            .claim_query_task(query_claim("default", QueryKind::Query, "a", 5_000), NOW)
            .await
            .unwrap()
            .is_none(),
        "a query poller never sees a validation"
    );
    let leased = store
        .claim_query_task(query_claim("default", QueryKind::UpdateValidation, "b", 5_000), NOW)
        .await
        .unwrap()
        .expect("the validation");
    assert_eq!(
        (leased.id.as_str(), leased.kind, leased.attempt),
        ("v1", QueryKind::UpdateValidation, 1)
    );
    let verdict = QueryOutcome::Rejected {
        message: "no".into(),
        failure_type: Some("ValueError".into()),
        validation_errors: Some(serde_json::json!({"item": ["bad"]})),
    };
    store
        .answer_query_task(query_answer("default", "v1", "b", 1, verdict.clone()), NOW)
        .await
        .unwrap();
    let answered = store.get_query_task("default", "v1").await.unwrap().unwrap();
    assert_eq!(answered.state, QueryState::Answered(verdict));
}

pub async fn keyed_receipts_can_be_read_back<S: Store>(store: S) {
    store
        .start_workflow(start_request("keyed-read", "q"), DuplicatePolicy::Fail, NOW)
        .await
        .unwrap();
    let workflow = WorkflowId("keyed-read".into());
    assert!(store
        .retained_command("default", &workflow, "update", "r-1")
        .await
        .unwrap()
        .is_none());
    let key = CommandKey {
        command_type: "update".into(),
        request_id: "r-1".into(),
        intent_hash: "h".into(),
    };
    store
        .mutate_run_keyed(
            "default",
            RunLocator::Current(workflow.clone()),
            key,
            NOW,
            |run, cx| signal(run, cx, "s", Payload::avro("x"), "c".into()),
            |_, _| serde_json::json!({"receipt": 1}),
        )
        .await
        .unwrap();
    let (hash, receipt) = store
        .retained_command("default", &workflow, "update", "r-1")
        .await
        .unwrap()
        .expect("stored");
    assert_eq!((hash.as_str(), receipt), ("h", serde_json::json!({"receipt": 1})));
    assert!(store.retained_command("other", &workflow, "update", "r-1").await.unwrap().is_none());
    assert!(store
        .retained_command("default", &workflow, "signal", "r-1")
        .await
        .unwrap()
        .is_none());
}

fn query_claim(namespace: &str, kind: QueryKind, owner: &str, lease_ms: i64) -> QueryClaim {
    QueryClaim {
        namespace: namespace.into(),
        queue: "q".into(),
        kind,
        owner: owner.into(),
        lease_ms,
    }
}

fn query_answer(namespace: &str, task_id: &str, owner: &str, attempt: u32, outcome: QueryOutcome) -> QueryAnswer {
    QueryAnswer {
        namespace: namespace.into(),
        task_id: task_id.into(),
        owner: owner.into(),
        attempt,
        outcome,
    }
}

pub async fn query_tasks_are_leased_and_answered_once<S: Store>(store: S) {
    store.create_query_task(query_task("q1")).await.unwrap();
    let leased = store
        .claim_query_task(query_claim("default", QueryKind::Query, "a", 5_000), NOW)
        .await
        .unwrap()
        .expect("leased");
    assert_eq!((leased.id.as_str(), leased.attempt), ("q1", 1));
    assert!(
        store
            .claim_query_task(query_claim("default", QueryKind::Query, "b", 5_000), NOW)
            .await
            .unwrap()
            .is_none(),
        "a live lease is exclusive"
    );
    assert!(
        store
            .claim_query_task(query_claim("other", QueryKind::Query, "b", 5_000), NOW)
            .await
            .unwrap()
            .is_none(),
        "queries are namespaced"
    );
    let answer = || QueryOutcome::Result(Payload::avro("x"));
    assert_eq!(
        reason(store.answer_query_task(query_answer("default", "q1", "b", 1, answer()), NOW).await),
        Reason::LeaseOwnerMismatch
    );
    assert_eq!(
        reason(
            store
                .answer_query_task(query_answer("default", "nope", "a", 1, answer()), NOW)
                .await
        ),
        Reason::QueryTaskNotFound
    );
    store
        .answer_query_task(query_answer("default", "q1", "a", 1, answer()), NOW)
        .await
        .unwrap();
    assert!(store.get_query_task("default", "q1").await.unwrap().unwrap().is_answered());
    assert_eq!(
        reason(store.answer_query_task(query_answer("default", "q1", "a", 1, answer()), NOW).await),
        Reason::QueryTaskNotLeased
    );
    store.delete_query_task("default", "q1").await.unwrap();
    assert!(store.get_query_task("default", "q1").await.unwrap().is_none());

    // An expired lease passes to another worker with a higher attempt; the first answer is stale.
    store.create_query_task(query_task("q2")).await.unwrap();
    store
        .claim_query_task(query_claim("default", QueryKind::Query, "a", 1_000), NOW)
        .await
        .unwrap()
        .expect("leased");
    let again = store
        .claim_query_task(query_claim("default", QueryKind::Query, "b", 1_000), NOW + 1_500)
        .await
        .unwrap()
        .expect("re-leased");
    assert_eq!(again.attempt, 2);
    assert_eq!(
        reason(
            store
                .answer_query_task(query_answer("default", "q2", "a", 1, answer()), NOW + 1_600)
                .await
        ),
        Reason::LeaseOwnerMismatch
    );
    assert!(
        store
            .claim_query_task(query_claim("default", QueryKind::Query, "c", 1_000), NOW + 31_000)
            .await
            .unwrap()
            .is_none(),
        "past its deadline"
    );

    store.register_worker(worker("qw", "q")).await.unwrap();
    let workers = store.queue_workers("default", "q").await.unwrap();
    assert_eq!(workers.iter().map(|w| w.worker_id.as_str()).collect::<Vec<_>>(), ["qw"]);
}

pub async fn worker_registrations<S: Store>(store: S) {
    let mut w = worker("w1", "q");
    w.workflow_definition_fingerprints.insert("t".into(), json!("fp-1"));
    w.document.insert("capabilities".into(), json!(["sticky"]));
    store.register_worker(w.clone()).await.unwrap();
    store.register_worker(w.clone()).await.expect("re-registration is idempotent");
    let mut changed = w.clone();
    changed.workflow_definition_fingerprints.insert("t".into(), json!("fp-2"));
    assert_eq!(reason(store.register_worker(changed).await), Reason::WorkflowDefinitionChanged);
    assert_eq!(
        store
            .heartbeat_worker("default", "w1", NOW + 5, Map::new())
            .await
            .unwrap()
            .unwrap()
            .last_heartbeat_at,
        NOW + 5
    );
    // What a heartbeat reports replaces those fields of the document and keeps the others.
    let reported = json!({"task_slots": {"workflow_available": 3}, "process_metrics": {"process_id": 7}});
    let beat = store
        .heartbeat_worker("default", "w1", NOW + 6, reported.as_object().unwrap().clone())
        .await
        .unwrap()
        .unwrap();
    let stored = store.get_worker("default", "w1").await.unwrap().unwrap();
    assert_eq!(stored.document, beat.document);
    assert_eq!(
        (stored.last_heartbeat_at, &stored.document["task_slots"]),
        (NOW + 6, &json!({"workflow_available": 3}))
    );
    assert_eq!(stored.document["process_metrics"], json!({"process_id": 7}));
    assert_eq!(
        stored.document["capabilities"],
        json!(["sticky"]),
        "the registration's fields are kept"
    );
    assert!(store.heartbeat_worker("default", "ghost", NOW, Map::new()).await.unwrap().is_none());
    assert!(store
        .heartbeat_worker("default", "ghost", NOW, reported.as_object().unwrap().clone())
        .await
        .unwrap()
        .is_none());
    assert_eq!(store.get_worker("default", "w1").await.unwrap().unwrap().task_queue, "q");
    // A poll's look reads the registration as it stands, with the queue's readiness.
    let look = |worker_id: &str| LookAsk {
        namespace: "default".into(),
        kind: TaskKind::Workflow,
        queue: "q".into(),
        types: vec!["t".into()],
        now: NOW,
        recall: None,
        worker_id: Some(worker_id.into()),
    };
    let stored = store.get_worker("default", "w1").await.unwrap();
    let seen = store.look(look("w1")).await.unwrap();
    assert_eq!(seen.registration, Some(stored));
    assert!(!seen.any && !seen.matching);
    assert_eq!(store.look(look("ghost")).await.unwrap().registration, Some(None));
    assert!(store.deregister_worker("default", "w1").await.unwrap());
    assert!(!store.deregister_worker("default", "w1").await.unwrap());
    assert!(store.get_worker("default", "w1").await.unwrap().is_none());
    assert_eq!(store.look(look("w1")).await.unwrap().registration, Some(None));
}

pub async fn listing_filters_and_pages<S: Store>(store: S) {
    for i in 0..5 {
        started(&store, &format!("list-{i}"), if i == 4 { "q-other" } else { "q" }).await;
    }
    store
        .mutate_run("default", RunLocator::Current(WorkflowId("list-0".into())), NOW, |run, cx| {
            close_by_command(run, cx, CloseCommand::Cancel, None, "c".into())
        })
        .await
        .unwrap();
    let (page, more) = store.list_runs("default", ListFilter::default(), 0, 3).await.unwrap();
    assert_eq!((page.len(), more), (3, true));
    let (rest, more) = store.list_runs("default", ListFilter::default(), 3, 3).await.unwrap();
    assert_eq!((rest.len(), more), (2, false));
    let failed = ListFilter {
        status_bucket: Some("failed".into()),
        ..Default::default()
    };
    let (rows, _) = store.list_runs("default", failed, 0, 10).await.unwrap();
    assert_eq!(rows.iter().map(|r| r.workflow_id.as_str()).collect::<Vec<_>>(), ["list-0"]);
    let query = ListFilter {
        query: Some("list-3".into()),
        ..Default::default()
    };
    assert_eq!(store.list_runs("default", query, 0, 10).await.unwrap().0.len(), 1);
    let by_business_key = ListFilter {
        query: Some("bk-list-4".into()),
        ..Default::default()
    };
    assert_eq!(store.list_runs("default", by_business_key, 0, 10).await.unwrap().0.len(), 1);
    assert_eq!(store.runs_of("default", &WorkflowId("list-2".into())).await.unwrap().len(), 1);
    assert!(store.list_runs("other", ListFilter::default(), 0, 10).await.unwrap().0.is_empty());

    // Keyset pages (all five started in the same millisecond: the run id breaks the tie) cover
    // every run once, in the order of the offset pages.
    let (everything, _) = store.list_runs("default", ListFilter::default(), 0, 10).await.unwrap();
    let mut walked = Vec::new();
    let mut after = None;
    loop {
        let filter = ListFilter {
            after: after.clone(),
            ..Default::default()
        };
        let (page, more) = store.list_runs("default", filter, 0, 2).await.unwrap();
        after = page.last().map(|row| ListCursor {
            started_at: row.started_at,
            run_id: row.run_id.as_str().to_string(),
        });
        walked.extend(page);
        if !more {
            break;
        }
    }
    assert_eq!(walked, everything);
    let by_queue = ListFilter {
        task_queue: Some("q-other".into()),
        ..Default::default()
    };
    let (rows, _) = store.list_runs("default", by_queue.clone(), 0, 10).await.unwrap();
    assert_eq!(rows.iter().map(|r| r.workflow_id.as_str()).collect::<Vec<_>>(), ["list-4"]);
    assert_eq!(
        store.count_runs("default", ListFilter::default()).await.unwrap(),
        RunCounts {
            running: 4,
            completed: 0,
            failed: 1,
            paused: 0,
            at_least: false,
        }
    );
    assert_eq!(store.count_runs("default", by_queue).await.unwrap().running, 1);
    // A count the kept counts cannot answer stops after so many runs, and says so.
    let up_to = |at_most: u64| ListFilter {
        query: Some("list-".into()),
        count_at_most: Some(at_most),
        ..Default::default()
    };
    let bounded = store.count_runs("default", up_to(2)).await.unwrap();
    assert!(bounded.at_least, "{bounded:?}");
    assert_eq!(bounded.running + bounded.failed, 3, "the bound and one more, to know it was passed");
    let whole = store.count_runs("default", up_to(5)).await.unwrap();
    assert_eq!((whole.running + whole.failed, whole.at_least), (5, false));
    let failed_only = ListFilter {
        status_bucket: Some("failed".into()),
        ..Default::default()
    };
    // Counts ignore the bucket filter: they are what the bucket tabs show.
    assert_eq!(store.count_runs("default", failed_only).await.unwrap().running, 4);
    assert_eq!(
        store.count_runs("other", ListFilter::default()).await.unwrap(),
        RunCounts::default()
    );

    // `%`, `_` and `\` in a query are the characters themselves, never wildcards or escapes.
    started(&store, "under_score", "q").await;
    let matching = |query: &str| ListFilter {
        query: Some(query.into()),
        ..Default::default()
    };
    assert_eq!(store.list_runs("default", matching("under_s"), 0, 10).await.unwrap().0.len(), 1);
    for literal in ["list_3", "%", "under%score", "under\\_score", "_"] {
        let expected = usize::from(literal == "_");
        let (rows, _) = store.list_runs("default", matching(literal), 0, 10).await.unwrap();
        assert_eq!(rows.len(), expected, "query {literal:?} is literal");
        assert_eq!(
            store.count_runs("default", matching(literal)).await.unwrap().running as usize,
            expected
        );
    }
}

pub async fn search_attributes_filter_listings_and_follow_upserts<S: Store>(store: S) {
    let with = |id: &str, attributes: serde_json::Value| {
        let mut start = start_request(id, &format!("q-{id}"));
        start.search_attributes = attributes.as_object().cloned().unwrap_or_default();
        start
    };
    store
        .start_workflow(
            with("sa-1", json!({"Tier": "gold", "Tags": ["a", "b"], "Count": 3})),
            DuplicatePolicy::Fail,
            NOW,
        )
        .await
        .unwrap();
    store
        .start_workflow(with("sa-2", json!({"Tier": "silver"})), DuplicatePolicy::Fail, NOW)
        .await
        .unwrap();
    let ids = |filter: ListFilter| {
        let store = &store;
        async move {
            let (rows, _) = store.list_runs("default", filter, 0, 10).await.unwrap();
            let mut ids: Vec<String> = rows.into_iter().map(|r| r.workflow_id.0).collect();
            ids.sort();
            ids
        }
    };
    let by = |pairs: &[(&str, &str)]| ListFilter {
        attributes: pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        ..Default::default()
    };
    assert_eq!(ids(by(&[("Tier", "gold")])).await, ["sa-1"]);
    assert_eq!(ids(by(&[("Tags", "b")])).await, ["sa-1"], "each list item is indexed");
    assert_eq!(ids(by(&[("Count", "3")])).await, ["sa-1"]);
    assert_eq!(ids(by(&[("Tier", "gold"), ("Count", "3")])).await, ["sa-1"]);
    assert!(ids(by(&[("Tier", "bronze")])).await.is_empty());
    assert_eq!(
        ids(ListFilter {
            workflow_id: Some("sa-2".into()),
            ..Default::default()
        })
        .await,
        ["sa-2"]
    );
    assert_eq!(
        ids(ListFilter {
            business_key: Some("bk-sa-1".into()),
            ..Default::default()
        })
        .await,
        ["sa-1"]
    );
    // An upsert moves the run to its new value.
    let mut attributes = Map::new();
    attributes.insert("Tier".into(), json!("silver"));
    complete_next(
        &store,
        "q-sa-1",
        vec![WorkflowCommand::UpsertSearchAttributes {
            attributes,
            tags: Map::new(),
            attribute_types: None,
        }],
    )
    .await;
    assert!(ids(by(&[("Tier", "gold")])).await.is_empty());
    assert_eq!(ids(by(&[("Tier", "silver")])).await, ["sa-1", "sa-2"]);
    assert_eq!(ids(by(&[("Tags", "a")])).await, ["sa-1"], "untouched attributes stay indexed");
}

pub async fn concurrent_transitions_all_commit<S: Store + Clone>(store: S) {
    for i in 0..20 {
        started(&store, &format!("conc-{i}"), "q").await;
    }
    let signals = (0..20).flat_map(|i| (0..5).map(move |j| (i, j))).map(|(i, j)| {
        let store = store.clone();
        async move {
            store
                .mutate_run(
                    "default",
                    RunLocator::Current(WorkflowId(format!("conc-{i}"))),
                    NOW,
                    move |run, cx| signal(run, cx, &format!("s{j}"), Payload::avro("x"), CommandId(format!("c{j}"))),
                )
                .await
                .map(|_| ())
        }
    });
    for result in futures_join(signals.collect()).await {
        result.expect("every concurrent transition commits");
    }
    for i in 0..20 {
        let run = store
            .load_run("default", RunLocator::Current(WorkflowId(format!("conc-{i}"))))
            .await
            .unwrap()
            .unwrap();
        let history = all_history(&store, &run).await;
        assert_eq!(history.iter().filter(|e| e.event_type == EventType::SignalReceived).count(), 5);
        verify_chain(&history).unwrap();
    }
}

/// After every check: the run counts kept in its transactions equal a full count, whatever
/// the check did to its runs.
pub async fn run_counts_are_exact<S: Store>(store: &S) {
    let drift = store.run_count_drift(None).await.unwrap();
    assert!(drift.is_empty(), "kept run counts differ from a full count: {drift:#?}");
}

/// Expands to one `#[tokio::test]` per suite check, each on a fresh store from `$make`, an
/// expression giving `(store, guard)`; the guard (a temp dir, a scratch schema) lives as long
/// as the test.
#[macro_export]
macro_rules! store_suite {
    ($make:expr) => {
        $crate::store_suite!(@tests $make;
            start_then_load_by_every_locator,
            duplicate_starts_follow_the_policy,
            imported_closed_runs_are_written_once_and_conflicts_refused,
            an_open_run_is_imported_from_its_carried_state_as_the_current_run,
            standalone_activities_hold_their_id_until_they_end,
            workflow_streams_append_read_close_and_expire,
            external_payloads_are_kept_while_an_instance_names_them,
            the_service_catalog_nests_endpoints_services_and_operations,
            service_calls_start_their_linked_run_and_settle_with_it,
            direct_service_calls_are_admitted_with_their_linked_run,
            namespace_storage_policies_are_set_and_cleared,
            concurrent_starts_of_one_activity_id_start_it_once,
            a_claim_goes_to_exactly_one_poller,
            claims_respect_queue_type_and_availability,
            claims_hold_a_sticky_task_for_its_owner,
            claims_take_the_most_urgent_task_first,
            fairness_classes_share_a_priority_by_weight,
            a_class_behind_a_deep_backlog_still_gets_its_share,
            many_classes_behind_a_deep_backlog_each_get_a_turn,
            a_queue_shows_its_ready_tasks_by_priority_and_class,
            a_leased_task_cap_holds_claims_back,
            a_fairness_keys_cap_holds_only_that_keys_tasks,
            a_fairness_keys_rate_holds_its_rate,
            operator_weights_replace_the_started_ones,
            a_ready_task_goes_to_a_parked_poll_in_the_transaction_that_makes_it,
            a_parked_poll_is_handed_only_what_it_may_take,
            a_parked_poll_whose_client_went_takes_nothing,
            a_hand_off_whose_answer_was_not_read_is_kept_to_give_back,
            a_lease_on_its_row_is_seen_by_every_reader_and_writer,
            a_dispatch_rate_lets_its_burst_through_then_holds_the_rate,
            worker_sessions_are_acquired_renewed_and_closed,
            claims_offer_a_session_activity_only_to_who_may_hold_the_session,
            fenced_deregistrations_keep_their_receipt,
            a_refused_transition_writes_nothing,
            transitions_persist_events_and_tasks,
            a_transition_with_many_events_writes_them_all,
            a_retried_report_is_answered_from_its_tasks_receipt,
            children_follow_a_parents_delivery_and_close_in_its_transaction,
            deadlines_are_reported_when_due,
            an_expired_duty_claim_passes_on_with_a_higher_fence,
            keyed_commands_are_idempotent,
            poll_memos_round_trip,
            query_tasks_are_leased_and_answered_once,
            validation_tasks_are_claimed_only_by_their_kind,
            atomic_actions_commit_or_roll_back_with_their_completion,
            an_atomic_answer_that_cannot_be_recorded_rolls_back_the_handler_writes,
            schedules_fire_each_occurrence_once_with_their_workflows,
            retention_removes_closed_instances_and_frees_their_ids,
            audit_events_are_paged_newest_first_and_pruned_with_their_instance,
            credentials_are_created_rotated_and_deleted,
            typed_visibility_filters_select_exactly_the_matching_runs,
            namespaces_are_created_updated_and_deleted_when_empty,
            declared_actions_are_ledgered_in_the_claim_transaction,
            a_probe_answer_resolves_its_entry_where_the_probe_closes,
            keyed_receipts_can_be_read_back,
            worker_registrations,
            listing_filters_and_pages,
            concurrent_transitions_all_commit,
            search_attributes_filter_listings_and_follow_upserts,
            a_healthy_store_is_ready,
            integrity_figures_start_empty_and_unknown_incidents_are_refused,
            runs_are_paged_in_id_order,
            a_committed_ready_task_wakes_its_queue,
            system_counts_count_runs_tasks_and_expired_leases,
            the_observer_hears_each_committed_fact_once_and_queues_are_measured,
            a_bridge_delivery_is_recorded_once,
            build_id_cohorts_drain_resume_and_promote,
            search_attribute_definitions_are_defined_once_and_deleted,
            the_roster_and_queue_snapshots_show_workers_and_tasks,
            run_counts_follow_every_change_and_can_be_rebuilt,
            a_paused_run_dispatches_nothing_until_resumed,
            a_paused_queue_kind_leases_nothing_until_resumed,
            batch_operations_are_claimed_under_a_fence_advanced_and_cancelled,
            a_delete_step_removes_its_closed_instances_with_its_progress,
        );
    };
    (@tests $make:expr; $($name:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                let (store, _guard) = $make.await;
                let counted = store.clone();
                $crate::suite::$name(store).await;
                $crate::suite::run_counts_are_exact(&counted).await;
            }
        )*
    };
}

/// A transition's events go in multi-row inserts of a bounded size: one with more events than
/// fit in one statement keeps them all, in order, on the chain.
pub async fn a_transition_with_many_events_writes_them_all<S: Store>(store: S) {
    let run = started(&store, "many-events", "q").await;
    let timers: Vec<WorkflowCommand> = (0..70).map(|i| timer(60 + i)).collect();
    let after = complete_next(&store, "q", timers).await;
    assert!(after.last_sequence >= run.last_sequence + 70);
    let history = all_history(&store, &after).await;
    assert_eq!(history.len() as u64, after.last_sequence);
    assert_eq!(
        history.iter().map(|e| e.sequence).collect::<Vec<_>>(),
        (1..=after.last_sequence).collect::<Vec<_>>()
    );
    assert_eq!(history.iter().filter(|e| e.event_type == EventType::TimerScheduled).count(), 70);
    verify_chain(&history).unwrap();
}
