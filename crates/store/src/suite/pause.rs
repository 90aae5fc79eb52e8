//! A paused run: none of its workflow or activity tasks is claimed; a task leased before the
//! pause finishes; timers fire and signals land; a continue-as-new stays paused; a resume
//! offers what waited. Listings and kept counts show the hold.

use super::*;

async fn claim<S: Store>(store: &S, kind: TaskKind, queue: &str, at: Millis) -> Option<(Task, RunState)> {
    store.claim_task("default", kind, queue, &[], "w", 60_000, at, None).await.unwrap()
}

async fn hold<S: Store>(store: &S, workflow_id: &str, pause_it: bool) -> bool {
    store
        .mutate_run(
            "default",
            RunLocator::Current(WorkflowId(workflow_id.into())),
            NOW,
            move |run, cx| match pause_it {
                true => pause(run, cx, Some("downstream is down".into())),
                false => resume(run, cx),
            },
        )
        .await
        .unwrap()
        .0
}

/// The lease handed to `parked`, if one is.
async fn handed(parked: &mut Parked) -> Option<HandedOff> {
    tokio::time::timeout(std::time::Duration::from_millis(200), parked.handed())
        .await
        .ok()
        .flatten()
}

async fn current<S: Store>(store: &S, workflow_id: &str) -> RunState {
    store
        .load_run("default", RunLocator::Current(WorkflowId(workflow_id.into())))
        .await
        .unwrap()
        .unwrap()
}

async fn paused_count<S: Store>(store: &S) -> (u64, u64) {
    let kept = store.count_runs("default", ListFilter::default()).await.unwrap().paused;
    let counted = ListFilter {
        query: Some(String::new()),
        ..ListFilter::default()
    };
    (kept, store.count_runs("default", counted).await.unwrap().paused)
}

pub async fn a_paused_run_dispatches_nothing_until_resumed<S: Store>(store: S) {
    // A run whose first workflow task waits: paused, nothing is claimed; a repeat needs nothing.
    started(&store, "held", "pq").await;
    assert!(hold(&store, "held", true).await);
    assert!(!hold(&store, "held", true).await, "pausing a paused run needs nothing");
    let held = current(&store, "held").await;
    let pause_record = held.paused.clone().expect("the hold is on the run");
    assert_eq!(
        (pause_record.paused_at, pause_record.reason.as_deref()),
        (NOW, Some("downstream is down"))
    );
    assert!(
        claim(&store, TaskKind::Workflow, "pq", NOW).await.is_none(),
        "a paused run's task is not claimed"
    );
    assert_eq!(paused_count(&store).await, (1, 1));
    let paused_only = ListFilter {
        status_bucket: Some("paused".into()),
        ..ListFilter::default()
    };
    let (rows, _) = store.list_runs("default", paused_only.clone(), 0, 10).await.unwrap();
    assert_eq!(rows.iter().map(|r| r.workflow_id.as_str()).collect::<Vec<_>>(), ["held"]);
    assert!(rows[0].paused.is_some());

    // Signals are accepted into history meanwhile; the task they wake waits too.
    store
        .mutate_run("default", RunLocator::Current(WorkflowId("held".into())), NOW, |run, cx| {
            signal(run, cx, "go", Payload::avro("x"), CommandId("sig-held".into()))
        })
        .await
        .unwrap();
    let history = all_history(&store, &current(&store, "held").await).await;
    assert_eq!(history.iter().filter(|e| e.event_type == EventType::SignalReceived).count(), 1);
    assert!(claim(&store, TaskKind::Workflow, "pq", NOW).await.is_none());

    // A workflow task leased before the pause completes; the activity it schedules waits.
    started(&store, "leased", "lq").await;
    let (task, _) = claim(&store, TaskKind::Workflow, "lq", NOW).await.expect("leased before the pause");
    assert!(hold(&store, "leased", true).await);
    let mut parked = store.park_poll(Poller {
        namespace: "default".into(),
        kind: TaskKind::Activity,
        queue: "lq".into(),
        worker_id: "parked".into(),
        build_id: None,
        types: Vec::new(),
        lease_ms: 60_000,
        poll: None,
    });
    let (id, fence) = (task.id.clone(), task.fence);
    store
        .mutate_run("default", RunLocator::Task(id.clone()), NOW, move |run, cx| {
            complete_workflow_task(run, cx, &id, "w", fence, vec![activity(), timer(5)])
        })
        .await
        .expect("a leased task's report is kept");
    assert!(handed(&mut parked).await.is_none(), "nothing is handed to a parked poll");
    assert!(claim(&store, TaskKind::Activity, "lq", NOW).await.is_none(), "its activity waits");

    // Its timer fires on time.
    let due = store.claim_due_tasks("node-a", NOW + 5_000, 10, 30_000).await.unwrap();
    assert_eq!(due.len(), 1, "a paused run's timer is due: {due:?}");
    let timer_id = due[0].task_id.clone();
    let (fired, _) = store
        .run_duty(&due[0], NOW + 5_000, move |run, cx| Ok(on_deadline(run, cx, &timer_id)))
        .await
        .unwrap();
    assert!(fired);
    assert!(
        claim(&store, TaskKind::Workflow, "lq", NOW + 5_000).await.is_none(),
        "the task the timer woke waits"
    );

    // Resume: everything that waited is offered.
    assert!(hold(&store, "held", false).await);
    assert!(!hold(&store, "held", false).await, "resuming a running run needs nothing");
    assert!(hold(&store, "leased", false).await);
    assert!(current(&store, "leased").await.paused.is_none());
    drop(parked);
    let (task, run) = claim(&store, TaskKind::Workflow, "pq", NOW + 5_000).await.expect("offered again");
    assert_eq!(run.workflow_id.as_str(), "held");
    assert_eq!(
        claim(&store, TaskKind::Activity, "lq", NOW + 5_000)
            .await
            .unwrap()
            .1
            .workflow_id
            .as_str(),
        "leased"
    );
    assert!(claim(&store, TaskKind::Workflow, "lq", NOW + 5_000).await.is_some());
    assert_eq!(paused_count(&store).await, (0, 0));

    // A continue-as-new of a paused run starts paused.
    assert!(hold(&store, "held", true).await);
    let (id, fence) = (task.id.clone(), task.fence);
    let continued = WorkflowCommand::ContinueAsNew {
        arguments: Payload::avro("wwHioz3/VYAiNwwA"),
        workflow_type: None,
        queue: None,
        tags: Default::default(),
        observability_context: None,
    };
    store
        .mutate_run("default", RunLocator::Task(id.clone()), NOW + 5_000, move |run, cx| {
            complete_workflow_task(run, cx, &id, "w", fence, vec![continued])
        })
        .await
        .unwrap();
    let next = current(&store, "held").await;
    assert_eq!(next.run_number, 2);
    assert!(next.paused.is_some(), "the next run keeps the hold");
    assert!(claim(&store, TaskKind::Workflow, "pq", NOW + 5_000).await.is_none());
    assert_eq!(paused_count(&store).await, (1, 1));

    // A paused run can still be closed; the hold goes with it, and a closed run cannot be held.
    store
        .mutate_run("default", RunLocator::Current(WorkflowId("held".into())), NOW + 5_000, |run, cx| {
            close_by_command(run, cx, CloseCommand::Terminate, None, "t".into())
        })
        .await
        .unwrap();
    assert!(current(&store, "held").await.paused.is_none());
    assert_eq!(paused_count(&store).await, (0, 0));
    let refused = store
        .mutate_run("default", RunLocator::Current(WorkflowId("held".into())), NOW, |run, cx| {
            pause(run, cx, None)
        })
        .await;
    assert_eq!(reason(refused), Reason::RunNotActive);
}
