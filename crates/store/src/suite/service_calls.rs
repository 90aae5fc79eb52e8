//! Nexus service calls: a completion admits a call and starts its linked run in the target
//! namespace in one transaction; the call is found by id, by route and key, and by caller; a
//! second admission of a key is a conflict; the linked run's end settles the call and gives the
//! waiting caller step its terminal row, in the closing transaction.

use super::*;
use capstan_engine::service_call::*;
use std::collections::BTreeMap;
use std::sync::Arc;

fn operation(key: &str) -> ServiceOperation {
    ServiceOperation {
        endpoint_name: "Billing".into(),
        service_name: "invoicing".into(),
        operation_name: "create".into(),
        request_payload: json!("args"),
        input: Payload::avro("args"),
        payload_codec: Some("avro".into()),
        metadata: Map::new(),
        target_namespace: Some("other".into()),
        caller_namespace: None,
        idempotency_key: Some(key.into()),
        mode: Some(CallMode::Sync),
        wait_for: Some(WaitFor::Completed),
        wait_timeout_seconds: None,
        options: BTreeMap::new(),
        objects: BTreeMap::new(),
        tags: Map::new(),
        observability_context: None,
    }
}

fn directory(earlier: Option<ServiceCallRecord>) -> Arc<ServiceDirectory> {
    let route = RouteKey::new("other", "billing", "invoicing", "create");
    let binding = StartWorkflowBinding {
        workflow_type: "suite.handler".into(),
        queue: Some("hq".into()),
        ..Default::default()
    };
    let mut directory = ServiceDirectory::default();
    directory
        .routes
        .insert(route.clone(), ServiceRoute::StartWorkflow(Box::new(binding)));
    if let Some(call) = earlier {
        directory.calls.insert((route, call.idempotency_key.clone()), call);
    }
    Arc::new(directory)
}

/// Leases `queue`'s workflow task.
async fn lease<S: Store>(store: &S, queue: &str) -> (TaskId, u64) {
    let (task, _) = store
        .claim_task("default", TaskKind::Workflow, queue, &[], "w", 60_000, NOW, None)
        .await
        .unwrap()
        .expect("a workflow task");
    (task.id, task.fence)
}

/// Completes a leased workflow task with one service call.
async fn call<S: Store>(store: &S, (id, fence): (TaskId, u64), key: &str, earlier: Option<ServiceCallRecord>) -> StoreResult<RunState> {
    let command = WorkflowCommand::StartServiceOperation(operation(key));
    let directory = directory(earlier);
    store
        .mutate_run("default", RunLocator::Task(id.clone()), NOW, move |run, cx| {
            cx.services = Some(directory);
            complete_workflow_task(run, cx, &id, "w", fence, vec![command])
        })
        .await
        .map(|done| done.1)
}

pub async fn service_calls_start_their_linked_run_and_settle_with_it<S: Store>(store: S) {
    started(&store, "caller", "cq").await;
    let caller = call(&store, lease(&store, "cq").await, "key-1", None).await.expect("admitted");
    let call_id = caller.service_waits.get(&1).expect("the sync call waits").service_call_id.clone();
    let admitted = store.service_call(&call_id).await.unwrap().expect("by id");
    assert_eq!(admitted.status, STATUS_STARTED);
    assert_eq!(admitted.route.1, "billing", "routes are lower-cased");
    let route = RouteKey::new("other", "billing", "invoicing", "create");
    let by_key = store.service_call_by_key(route, "key-1").await.unwrap().expect("by key");
    assert_eq!(by_key.service_call_id, call_id);
    let mine = store.service_calls_of_caller("default", "caller", None, 10).await.unwrap();
    assert_eq!(mine.len(), 1);
    let this_run = store
        .service_calls_of_caller("default", "caller", Some(caller.run_id.as_str()), 10)
        .await
        .unwrap();
    assert_eq!(this_run.len(), 1);
    let linked_id = admitted.linked_workflow_id.clone().expect("a linked run");
    let linked = store
        .load_run("other", RunLocator::Current(linked_id.clone()))
        .await
        .unwrap()
        .expect("the linked run is in the target namespace");
    assert_eq!(linked.service_call_ids, vec![call_id.clone()]);

    // A second caller admitting the same key without having read the first: a conflict, and
    // nothing of its completion is written.
    started(&store, "caller-2", "cq2").await;
    let task = lease(&store, "cq2").await;
    let refused = call(&store, task.clone(), "key-1", None).await;
    assert!(matches!(refused, Err(StoreError::Conflict { .. })), "{refused:?}");
    // Read first, it joins the call: no second linked run.
    let joined = call(&store, task, "key-1", Some(by_key)).await.expect("joined");
    assert_eq!(joined.service_waits.get(&1).unwrap().service_call_id, call_id);
    assert_eq!(
        store.service_calls_of_caller("default", "caller-2", None, 10).await.unwrap().len(),
        0
    );

    // The linked run completes: the call settles and both waiting callers get one terminal row.
    let (task, _) = store
        .claim_task("other", TaskKind::Workflow, "hq", &[], "w", 60_000, NOW, None)
        .await
        .unwrap()
        .expect("the linked run's task");
    let (id, fence) = (task.id.clone(), task.fence);
    let done = WorkflowCommand::CompleteWorkflow {
        result: Payload::avro("out"),
    };
    store
        .mutate_run("other", RunLocator::Task(id.clone()), NOW, move |run, cx| {
            complete_workflow_task(run, cx, &id, "w", fence, vec![done])
        })
        .await
        .unwrap();
    let settled = store.service_call(&call_id).await.unwrap().unwrap();
    assert_eq!(settled.status, STATUS_COMPLETED);
    assert_eq!(settled.response, Some(Payload::avro("out")));
    for caller in ["caller", "caller-2"] {
        let run = store
            .load_run("default", RunLocator::Current(WorkflowId(caller.into())))
            .await
            .unwrap()
            .unwrap();
        assert!(run.service_waits.is_empty(), "{caller} no longer waits");
        let history = all_history(&store, &run).await;
        let rows: Vec<_> = history.iter().filter(|e| e.event_type == EventType::ServiceCallCompleted).collect();
        assert_eq!(rows.len(), 1, "{caller}: one terminal row");
        assert_eq!(rows[0].payload["response_payload"], json!({"codec": "avro", "blob": "out"}));
        assert_eq!(rows[0].payload["service_call_id"], json!(call_id));
        assert!(run.workflow_task.is_some(), "{caller} is woken");
    }
}

pub async fn direct_service_calls_are_admitted_with_their_linked_run<S: Store>(store: S) {
    let caller = Caller {
        namespace: "default".into(),
        workflow_id: None,
        run_id: None,
        origin_trace: None,
    };
    let admit = |key: &'static str, earlier: Option<ServiceCallRecord>| {
        let caller = caller.clone();
        move |cx: &mut Cx| {
            cx.services = Some(directory(earlier));
            admit_service_call(cx, &caller, 0, &operation(key))
        }
    };
    let first = store.admit_service_calls(NOW, admit("direct-1", None)).await.expect("admitted");
    assert!(first.running);
    let call = store.service_call(&first.service_call_id).await.unwrap().expect("stored");
    assert_eq!(
        (call.caller_workflow_id.as_ref(), call.caller_namespace.as_str()),
        (None, "default")
    );
    let linked = call.linked_workflow_id.clone().expect("a linked run");
    assert!(store.load_run("other", RunLocator::Current(linked)).await.unwrap().is_some());
    let refused = store.admit_service_calls(NOW, admit("direct-1", None)).await;
    assert!(matches!(refused, Err(StoreError::Conflict { .. })), "the key is taken");
    let joined = store.admit_service_calls(NOW, admit("direct-1", Some(call))).await.unwrap();
    assert_eq!(joined.service_call_id, first.service_call_id);

    // Cancelled once: it ends cancelled; a second cancellation is refused.
    let cancelled = store
        .cancel_service_call(&first.service_call_id, Some("stop".into()), NOW, false)
        .await
        .unwrap();
    assert_eq!(cancelled.status, STATUS_CANCELLED);
    assert_eq!(cancelled.surface["failure_message"], json!("stop"));
    assert_eq!(
        reason(store.cancel_service_call(&first.service_call_id, None, NOW, false).await),
        Reason::ServiceCallTerminal
    );
    assert_eq!(
        reason(store.cancel_service_call("no-such-call", None, NOW, false).await),
        Reason::ServiceCallNotFound
    );
}
