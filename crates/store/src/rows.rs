//! What both backends derive the same way from engine types: row values, refusals for missing
//! rows, and the store-level rules (definition fingerprints, status buckets).

use crate::*;

/// The refusal for a locator that names nothing.
pub(crate) fn not_found(locator: &RunLocator) -> Refusal {
    match locator {
        RunLocator::Task(task_id) => Refusal::new(Reason::TaskNotFound, "Task not found.").with("task_id", task_id.as_str()),
        RunLocator::Run(workflow_id, run_id) => Refusal::new(Reason::RunNotFound, "Workflow run not found.")
            .with("workflow_id", workflow_id.as_str())
            .with("run_id", run_id.as_str()),
        RunLocator::Current(workflow_id) => {
            Refusal::new(Reason::InstanceNotFound, "Workflow not found.").with("workflow_id", workflow_id.as_str())
        }
    }
}

/// `tasks.status` of an open task.
pub(crate) fn task_status(task: &Task) -> &'static str {
    match task.state {
        TaskState::Ready => "ready",
        TaskState::Leased(_) => "leased",
    }
}

/// The row status of an open task: a run blocked by an integrity incident offers nothing; a
/// paused run offers no workflow or activity task (its timers and deadlines still fire).
pub(crate) fn task_row_status(run: &RunState, task: &Task) -> &'static str {
    match (&run.integrity_incident, &task.state) {
        (Some(_), TaskState::Ready) => "blocked",
        (None, TaskState::Ready) if run.paused.is_some() && matches!(task.kind, TaskKind::Workflow | TaskKind::Activity) => "paused",
        _ => task_status(task),
    }
}

/// `tasks.type_name`: what a poller's supported-types filter matches against.
pub(crate) fn task_type_name(run: &RunState, task: &Task) -> String {
    match &task.detail {
        TaskDetail::Workflow { .. } => run.workflow_type.clone(),
        TaskDetail::Activity { activity_type, .. } => activity_type.clone(),
        _ => String::new(),
    }
}

pub(crate) fn summary_of(run: &RunState) -> RunSummary {
    RunSummary {
        namespace: run.namespace.clone(),
        workflow_id: run.workflow_id.clone(),
        run_id: run.run_id.clone(),
        run_number: run.run_number,
        workflow_type: run.workflow_type.clone(),
        task_queue: run.task_queue.clone(),
        status: run.status,
        business_key: run.business_key.clone(),
        started_at: run.started_at,
        closed_at: run.closed_at,
        search_attributes: run.search_attributes.clone(),
        memo: run.memo.clone(),
        history_budget: capstan_engine::HistoryBudget::of(run),
        workflow_task_failing: run
            .workflow_task_failure
            .as_ref()
            .filter(|_| !run.is_closed())
            .map(|f| (f.consecutive, f.message.clone())),
        paused: run.paused.clone(),
    }
}

/// An active registration may not change a workflow type's definition fingerprint (DW rule).
pub(crate) fn check_fingerprints(existing: &WorkerRecord, incoming: &WorkerRecord) -> Result<(), Refusal> {
    if existing.status != "active" {
        return Ok(());
    }
    for (workflow_type, fingerprint) in &incoming.workflow_definition_fingerprints {
        if existing
            .workflow_definition_fingerprints
            .get(workflow_type)
            .is_some_and(|old| old != fingerprint)
        {
            return Err(Refusal::new(
                Reason::WorkflowDefinitionChanged,
                format!(
                    "Worker {} re-registered workflow type {workflow_type} with a different definition.",
                    incoming.worker_id
                ),
            )
            .with("workflow_type", workflow_type.clone()));
        }
    }
    Ok(())
}

/// The run statuses of a list-filter bucket.
pub(crate) fn bucket_statuses(bucket: &str) -> &'static [&'static str] {
    match bucket {
        "running" | "paused" => &["pending", "running", "waiting"],
        "completed" => &["completed"],
        _ => &["failed", "cancelled", "terminated"],
    }
}

/// Adds `count` runs of `status` to its bucket.
/// Adds `count` runs of `class` (a status, or a kept count's class) to their bucket.
pub(crate) fn count_into(counts: &mut RunCounts, class: &str, count: u64) {
    match class {
        "pending" | "running" | "waiting" | "open" => counts.running += count,
        "paused" => {
            counts.running += count;
            counts.paused += count;
        }
        "completed" => counts.completed += count,
        _ => counts.failed += count,
    }
}

/// `%query%` with LIKE's wildcards escaped (escape character `\`).
pub(crate) fn like_pattern(query: &str) -> String {
    format!("%{}%", query.replace('\\', "\\\\").replace('%', "\\%").replace('_', "\\_"))
}

pub(crate) const WORKER_COLUMNS: &str =
    "namespace, worker_id, task_queue, runtime, sdk_version, build_id, workflow_types, activity_types, fingerprints, document, status, registered_at, last_heartbeat_at";

/// `query_tasks.status` and `lease_expires_at` of a query task.
pub(crate) fn query_columns(task: &QueryTask) -> (&'static str, Option<Millis>) {
    match &task.state {
        QueryState::Ready => ("ready", None),
        QueryState::Leased { expires_at, .. } => ("leased", Some(*expires_at)),
        QueryState::Answered(_) => ("answered", None),
    }
}

/// The duplicate-start rule, once an instance with the requested id exists: ids are reserved
/// across namespaces and unique within one forever; `use-existing` returns an open current run.
pub(crate) fn existing_instance(
    existing_namespace: &str,
    start: &StartRun,
    current: RunState,
    policy: DuplicatePolicy,
) -> Result<(StartOutcome, RunState), Refusal> {
    if existing_namespace != start.namespace {
        return Err(Refusal::new(
            Reason::WorkflowIdReservedInNamespace,
            "This workflow id is reserved in another namespace.",
        )
        .with("workflow_id", start.workflow_id.as_str()));
    }
    if policy == DuplicatePolicy::UseExisting && !current.is_closed() {
        return Ok((StartOutcome::ReturnedExistingActive, current));
    }
    Err(
        Refusal::new(Reason::InstanceAlreadyStarted, "A workflow with this id was already started.")
            .with("workflow_id", start.workflow_id.as_str())
            .with("run_id", current.run_id.as_str())
            .with("status", current.status.as_str()),
    )
}

/// The index rows of a run's search attributes: `(key, value as text)`; a list indexes each item.
pub(crate) fn search_attribute_rows(attributes: &Map<String, Value>) -> Vec<(String, String, Option<f64>)> {
    let row = |key: &String, value: &Value| {
        let text = match value {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        (key.clone(), text, capstan_engine::visibility::numeric_value(value))
    };
    let mut rows = Vec::new();
    for (key, value) in attributes {
        match value {
            Value::Null => {}
            Value::Array(items) => rows.extend(items.iter().map(|item| row(key, item))),
            other => rows.push(row(key, other)),
        }
    }
    rows
}

/// Whether a transition may have changed the run's search attributes (so its index is rewritten).
pub(crate) fn touches_search_attributes(effects: &Effects, insert_run: bool) -> bool {
    insert_run || effects.events.iter().any(|e| e.event_type == EventType::SearchAttributesUpserted)
}

/// The build a task is pinned to: a pinned run's workflow tasks (other tasks go to any worker).
pub(crate) fn task_compatibility(run: &RunState, task: &Task) -> Option<String> {
    (task.kind == TaskKind::Workflow).then(|| run.compatibility.clone()).flatten()
}

/// The claim condition of sticky execution: a ready task held for its run's sticky owner is
/// offered to that owner only, until the hold runs out or the owner deregisters. `task` is the
/// tasks table's name in the query; `owner` and `now` are the poller's and the time's
/// placeholders in its dialect.
pub(crate) fn sticky_free(task: &str, owner: &str, now: &str) -> String {
    format!(
        "({task}.sticky_owner IS NULL OR {task}.sticky_owner = {owner} OR {task}.sticky_until <= {now}
          OR NOT EXISTS (SELECT 1 FROM workers sw WHERE sw.namespace = {task}.namespace AND sw.worker_id = {task}.sticky_owner))"
    )
}

/// The claim condition of worker sessions: a session activity is not offered while its session
/// is closed, past its TTL, held by another registered worker inside its lease, or lapsed but
/// not to be taken over. Whether this poller may have it is decided by admission in the claim
/// transaction. Placeholders as in [`sticky_free`].
pub(crate) fn session_free(task: &str, owner: &str, now: &str) -> String {
    format!(
        "({task}.session_id IS NULL OR NOT EXISTS (SELECT 1 FROM worker_sessions ws
            WHERE ws.namespace = {task}.namespace AND ws.session_id = {task}.session_id
              AND (ws.status = 'closed' OR ws.ttl_expires_at <= {now}
                   OR (ws.status = 'active' AND ws.lease_owner <> {owner} AND ws.lease_expires_at > {now}
                       AND EXISTS (SELECT 1 FROM workers hw WHERE hw.namespace = ws.namespace AND hw.worker_id = ws.lease_owner))
                   OR (ws.allow_reacquire = 0 AND ws.lease_owner <> {owner}))))"
    )
}

/// The kind of task a wake-up announces, from its name (`TaskKind::as_str`).
pub(crate) fn wake_kind(kind: &str) -> Option<TaskKind> {
    match kind {
        "workflow" => Some(TaskKind::Workflow),
        "activity" => Some(TaskKind::Activity),
        "query" => Some(TaskKind::Query),
        _ => None,
    }
}
