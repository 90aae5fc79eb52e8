//! Queries: a question to a worker about a run, answered from replay. A query never touches
//! history: it is a query task a query-capable worker of the run's queue leases and answers.
//! Waiting for the answer is the caller's (the server long-polls its hub).

use crate::{AppError, AppResult, Services};
use capstan_engine::*;
use capstan_store::prelude::*;
use capstan_store::{AuditEvent, QueryAnswer, QueryClaim, RunLocator, WorkerRecord};

/// How long a query task's lease lasts: the worker replays the run and answers within it.
pub const QUERY_LEASE_MS: i64 = 10_000;

/// A worker that has not heartbeated for this long is not counted on to answer.
pub const WORKER_FRESH_MS: i64 = 180_000;

pub struct QueryRequest {
    pub namespace: String,
    pub workflow_id: String,
    /// `None`: the current run.
    pub run_id: Option<String>,
    pub query_name: String,
    pub arguments: Option<Payload>,
    /// How long the task stays open for a worker's answer.
    pub wait_ms: i64,
    /// Who asks: recorded on the instance's audit trail, as a query writes no history.
    pub principal: Option<Principal>,
}

/// The audit trail's name for a query.
pub const QUERY_AUDIT_ACTION: &str = "workflow.query";

/// Whether a registration answers queries and is alive at `now`.
pub fn answers_queries(worker: &WorkerRecord, now: Millis) -> bool {
    worker.has_capability("query_tasks") && now - worker.last_heartbeat_at <= WORKER_FRESH_MS
}

/// Puts a query to the run's queue: the run must exist and a live worker there must answer
/// queries. Returns the task (and the run it reads).
pub async fn put_query<V: Services>(services: &V, request: QueryRequest) -> AppResult<(QueryTask, RunState)> {
    if request.query_name.is_empty() || request.query_name.len() > 255 {
        return Err(AppError::invalid("query_name", "The query name must be 1 to 255 characters."));
    }
    let store = services.store();
    let workflow_id = WorkflowId(request.workflow_id.clone());
    let locator = match &request.run_id {
        Some(run_id) => RunLocator::Run(workflow_id, RunId(run_id.clone())),
        None => RunLocator::Current(workflow_id),
    };
    let run = store
        .load_run(&request.namespace, locator)
        .await?
        .ok_or_else(|| match &request.run_id {
            Some(run_id) => Refusal::new(Reason::RunNotFound, "Workflow run not found.").with("run_id", run_id.clone()),
            None => Refusal::new(Reason::InstanceNotFound, "Workflow not found."),
        })?;
    require_workflow_code(&run)?;
    let now = services.now();
    let workers = store.queue_workers(&request.namespace, &run.task_queue).await?;
    if !workers.iter().any(|w| answers_queries(w, now)) {
        return Err(Refusal::new(
            Reason::QueryWorkerUnavailable,
            format!("No live worker on task queue {:?} answers queries.", run.task_queue),
        )
        .into());
    }
    let task_id = services.new_id();
    let mut detail = serde_json::Map::new();
    detail.insert("query_name".into(), request.query_name.clone().into());
    detail.insert("query_task_id".into(), task_id.clone().into());
    detail.insert(
        "target_scope".into(),
        if request.run_id.is_some() { "run" } else { "instance" }.into(),
    );
    // Before the task exists: no worker answers a query the trail does not show.
    store
        .record_audit(AuditEvent {
            audit_id: services.new_id().to_lowercase(),
            namespace: request.namespace.clone(),
            workflow_id: request.workflow_id.clone(),
            run_id: Some(run.run_id.to_string()),
            action: QUERY_AUDIT_ACTION.into(),
            principal: request.principal,
            recorded_at: now,
            detail,
        })
        .await?;
    let task = QueryTask {
        id: task_id,
        kind: QueryKind::Query,
        namespace: request.namespace,
        task_queue: run.task_queue.clone(),
        workflow_id: request.workflow_id,
        run_id: run.run_id.to_string(),
        workflow_type: run.workflow_type.clone(),
        query_name: request.query_name,
        arguments: request.arguments,
        state: QueryState::Ready,
        attempt: 0,
        created_at: now,
        deadline_at: now + request.wait_ms,
    };
    store.create_query_task(task.clone()).await?;
    Ok((task, run))
}

/// Removes a query task once its caller stopped waiting (answered or not).
pub async fn forget_query<V: Services>(services: &V, namespace: &str, task_id: &str) -> AppResult<()> {
    Ok(services.store().delete_query_task(namespace, task_id).await?)
}

/// Leases the oldest leasable task of the claim's kind (a query, or an update validation) on
/// its queue to the poller: a ready one, or one whose lease ran out unanswered.
pub async fn claim_task<V: Services>(services: &V, claim: QueryClaim) -> AppResult<Option<QueryTask>> {
    Ok(services.store().claim_query_task(claim, services.now()).await?)
}

/// Records a worker's answer (or verdict) once, fenced by lease owner and attempt; a late,
/// stale or second answer is refused and changes nothing.
pub async fn answer_task<V: Services>(services: &V, answer: QueryAnswer) -> AppResult<QueryTask> {
    Ok(services.store().answer_query_task(answer, services.now()).await?)
}

/// The run a query or validation task asks about and its committed history up to the run's
/// last event (at most `max_events`), which the worker replays before it answers.
pub async fn replay_snapshot<V: Services>(services: &V, task: &QueryTask, max_events: usize) -> AppResult<(RunState, Vec<HistoryEvent>)> {
    let store = services.store();
    let locator = RunLocator::Run(WorkflowId(task.workflow_id.clone()), RunId(task.run_id.clone()));
    let run = store
        .load_run(&task.namespace, locator)
        .await?
        .ok_or_else(|| Refusal::new(Reason::RunNotFound, "The run is gone."))?;
    let events = store.history(&run.run_id, 0, run.last_sequence, max_events).await?;
    Ok((run, events))
}
