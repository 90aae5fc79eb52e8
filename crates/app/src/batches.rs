//! Batch operations (`docs/batch-operations.md`): one action applied to every current run a
//! query selects, a page at a time by whichever node claims the batch's next step.
//!
//! - **At most once per run.** Each run is acted on through its ordinary use case (close,
//!   signal, pause, resume, redrive, archive) with the request id `batch:{batch_id}`: a page visited again after
//!   a crash is answered from the receipts the first visit stored, and counted once, since the
//!   progress is saved only with the page. A delete leaves no receipt to answer from, so its
//!   page's instances go in the transaction that saves the page's progress.
//! - **The runs there were.** A batch visits the current runs started before it was created,
//!   newest first, by a keyset cursor that a run's status changes do not move.
//! - **Fenced.** A step's progress is saved only under the duty fence its claim took: a node
//!   that lost the batch to another (it paused past its hold) saves nothing.
//! - Every run acted on records the batch's principal, as a single request would.

use crate::control::{self, CloseRequest, SignalRequest, Target};
use crate::listing::{self, ListQuery};
use crate::pause::{self, PauseRequest};
use crate::redrive::{self, RedriveRequest};
use crate::{AppError, AppResult, Services};
use capstan_engine::*;
use capstan_store::prelude::*;
use capstan_store::{AuditEvent, BatchOperation, BatchStep, ListCursor, RunSummary, StoreError};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::collections::BTreeMap;

/// Batches one namespace may run at once.
pub const BATCH_RUNNING_MAX: usize = 10;
/// Runs one step visits at most.
pub const BATCH_PAGE_RUNS: usize = 100;
/// Failures a batch keeps the particulars of (every one is counted).
pub const BATCH_FAILURES_KEPT: usize = 100;
/// How long a node holds a batch's step before another may take it over.
pub const BATCH_STEP_HOLD_MS: i64 = 30_000;

/// What a batch does to each run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BatchAction {
    Cancel,
    Terminate,
    Signal,
    Pause,
    Resume,
    /// A failed run goes on from its failed step (`crate::redrive`).
    Redrive,
    /// A closed run becomes read-only.
    Archive,
    /// A closed run's instance is deleted with all its runs, as retention deletes it (admin only).
    Delete,
}

impl BatchAction {
    pub const ALL: [BatchAction; 8] = [
        BatchAction::Cancel,
        BatchAction::Terminate,
        BatchAction::Signal,
        BatchAction::Pause,
        BatchAction::Resume,
        BatchAction::Redrive,
        BatchAction::Archive,
        BatchAction::Delete,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            BatchAction::Cancel => "cancel",
            BatchAction::Terminate => "terminate",
            BatchAction::Signal => "signal",
            BatchAction::Pause => "pause",
            BatchAction::Resume => "resume",
            BatchAction::Redrive => "redrive",
            BatchAction::Archive => "archive",
            BatchAction::Delete => "delete",
        }
    }

    pub fn named(name: &str) -> AppResult<Self> {
        Self::ALL.into_iter().find(|a| a.as_str() == name).ok_or_else(|| {
            let names: Vec<&str> = Self::ALL.iter().map(|a| a.as_str()).collect();
            AppError::invalid("action", format!("action must be one of {}, not {name:?}.", names.join(", ")))
        })
    }
}

/// What was asked: which runs, what to do to each, how fast, how many.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BatchRequest {
    pub action: BatchAction,
    #[serde(flatten)]
    pub select: ListQuery,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<Payload>,
    /// Runs acted on per second, at most.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_per_second: Option<f64>,
    /// Runs visited, at most.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u64>,
}

/// One run the action failed on, and why.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BatchFailure {
    pub workflow_id: String,
    pub run_id: String,
    pub reason: String,
    pub message: String,
}

/// Where a batch got to, and what it did.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct BatchProgress {
    /// Runs visited.
    pub matched: u64,
    /// Runs the action changed.
    pub done: u64,
    /// Runs the action did not apply to (already closed, not paused, …), by the reason.
    pub skipped: BTreeMap<String, u64>,
    pub failed: u64,
    /// The first failures' particulars.
    pub failures: Vec<BatchFailure>,
    /// The last run visited: the next page starts after it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<(Millis, String)>,
}

/// A new batch: checked, its selection parsed against the namespace's search attributes.
pub struct NewBatch {
    pub namespace: String,
    pub request: BatchRequest,
    pub request_id: Option<String>,
    pub principal: Option<Principal>,
}

/// How many current runs the selection matches now (a dry run: nothing is acted on).
pub async fn dry_run<V: Services>(services: &V, namespace: &str, request: &BatchRequest) -> AppResult<u64> {
    check(request)?;
    let filter = listing::filter(services, namespace, &request.select).await?;
    let counts = services.store().count_runs(namespace, filter).await?;
    let matched = match request.select.status.as_deref() {
        Some("running") => counts.running,
        Some("completed") => counts.completed,
        Some("failed") => counts.failed,
        Some("paused") => counts.paused,
        _ => counts.running + counts.completed + counts.failed,
    };
    Ok(request.limit.map_or(matched, |limit| matched.min(limit)))
}

/// Creates a batch (a repeat of its request id answers the first; `false`).
pub async fn create<V: Services>(services: &V, new: NewBatch) -> AppResult<(BatchOperation, bool)> {
    check(&new.request)?;
    // The selection is checked now: a query the grammar refuses is refused here, not later.
    listing::filter(services, &new.namespace, &new.request.select).await?;
    let now = services.now();
    let batch = BatchOperation {
        namespace: new.namespace,
        batch_id: services.new_id().to_lowercase(),
        action: new.request.action.as_str().to_string(),
        request: serde_json::to_value(&new.request).map_err(|e| AppError::invalid("request", e.to_string()))?,
        state: "running".into(),
        progress: serde_json::to_value(BatchProgress::default()).expect("progress serialises"),
        principal: new.principal,
        request_id: new.request_id,
        created_at: now,
        updated_at: now,
        finished_at: None,
        next_step_at: now,
    };
    let created = services.store().create_batch(batch, BATCH_RUNNING_MAX).await?;
    if created.1 {
        tracing::info!(namespace = %created.0.namespace, batch_id = %created.0.batch_id, action = %created.0.action, "batch operation created");
    }
    Ok(created)
}

fn check(request: &BatchRequest) -> AppResult<()> {
    if request.action == BatchAction::Signal && request.signal_name.as_deref().is_none_or(str::is_empty) {
        return Err(AppError::invalid("signal_name", "A signal batch names its signal."));
    }
    if request.action == BatchAction::Signal && request.input.is_none() {
        return Err(AppError::invalid(
            "input",
            "A signal batch carries the signal's input (the HTTP API fills in no arguments).",
        ));
    }
    if request.action != BatchAction::Signal && (request.signal_name.is_some() || request.input.is_some()) {
        return Err(AppError::invalid("signal_name", "Only a signal batch takes signal_name and input."));
    }
    if let Some(rate) = request.rate_per_second {
        if !(rate > 0.0 && rate <= 10_000.0) {
            return Err(AppError::invalid(
                "rate_per_second",
                "rate_per_second must be above 0 and at most 10,000.",
            ));
        }
    }
    if request.limit == Some(0) {
        return Err(AppError::invalid("limit", "limit must be at least 1."));
    }
    Ok(())
}

/// Claims the batch whose next step is due and runs that step; whether there was one.
pub async fn step<V: Services>(services: &V, node: &str) -> AppResult<bool> {
    let Some((batch, fence)) = services.store().claim_batch(node, services.now(), BATCH_STEP_HOLD_MS).await? else {
        return Ok(false);
    };
    let request: BatchRequest = decoded(&batch.request)?;
    // A delete step whose page changed under it (a new run of an id) did nothing: it reads the
    // page again, a few times, before leaving the batch to the claim's hold.
    let mut attempts = 0;
    loop {
        attempts += 1;
        match take_page(services, &batch, fence, &request).await {
            Err(AppError::Store(StoreError::Refused(refusal))) if refusal.reason == Reason::RunNotClosed && attempts < 3 => {}
            // Taken over, or cancelled meanwhile: what this step did is kept by the runs' receipts.
            Err(AppError::Store(StoreError::Refused(refusal))) if refusal.reason == Reason::StaleFence => return Ok(true),
            outcome => return outcome.map(|()| true),
        }
    }
}

/// Visits the batch's next page, acts on its runs and saves where it got to.
async fn take_page<V: Services>(services: &V, batch: &BatchOperation, fence: u64, request: &BatchRequest) -> AppResult<()> {
    let store = services.store();
    let mut progress: BatchProgress = decoded(&batch.progress)?;
    let left = request.limit.map_or(u64::MAX, |limit| limit.saturating_sub(progress.matched));
    let by_rate = request
        .rate_per_second
        .map_or(BATCH_PAGE_RUNS, |rate| rate.ceil().max(1.0) as usize);
    let page = BATCH_PAGE_RUNS.min(by_rate).min(left.min(BATCH_PAGE_RUNS as u64) as usize);
    let mut filter = listing::filter(services, &batch.namespace, &request.select).await?;
    filter.started_at_most = Some(batch.created_at);
    filter.after = progress.after.clone().map(|(started_at, run_id)| ListCursor { started_at, run_id });
    let (runs, more) = match page {
        0 => (Vec::new(), false),
        _ => store.list_runs(&batch.namespace, filter, 0, page).await?,
    };
    let mut deletions = Vec::new();
    for run in &runs {
        match request.action {
            BatchAction::Delete => deletions.extend(doom(services, batch, run, &mut progress)),
            _ => act_on(services, batch, request, run, &mut progress).await?,
        }
        progress.after = Some((run.started_at, run.run_id.as_str().to_string()));
    }
    let finished = !more || request.limit.is_some_and(|limit| progress.matched >= limit);
    let now = services.now();
    let next_step_at = match request.rate_per_second {
        Some(rate) if !runs.is_empty() => now + (runs.len() as f64 * 1000.0 / rate).ceil() as i64,
        _ => now,
    };
    let step = BatchStep {
        batch_id: batch.batch_id.clone(),
        fence,
        progress: serde_json::to_value(&progress).expect("progress serialises"),
        next_step_at,
        finished: finished.then(|| "completed".to_string()),
    };
    match request.action {
        BatchAction::Delete => store.advance_batch_deleting(step, now, deletions).await?,
        _ => store.advance_batch(step, now).await?,
    }
    if finished {
        tracing::info!(namespace = %batch.namespace, batch_id = %batch.batch_id, matched = progress.matched,
            done = progress.done, failed = progress.failed, "batch operation completed");
    }
    Ok(())
}

/// Counts a run a delete batch visits: a closed one's instance is to go (the audit event kept
/// of it is returned), an open one is skipped.
fn doom<V: Services>(services: &V, batch: &BatchOperation, run: &RunSummary, progress: &mut BatchProgress) -> Option<AuditEvent> {
    progress.matched += 1;
    if !run.status.is_terminal() {
        *progress.skipped.entry(Reason::RunNotClosed.as_str().into()).or_default() += 1;
        return None;
    }
    progress.done += 1;
    let mut detail = serde_json::Map::new();
    detail.insert("batch_id".into(), json!(batch.batch_id));
    detail.insert("status".into(), json!(run.status.as_str()));
    Some(AuditEvent {
        audit_id: services.new_id().to_lowercase(),
        namespace: batch.namespace.clone(),
        workflow_id: run.workflow_id.as_str().to_string(),
        run_id: Some(run.run_id.as_str().to_string()),
        action: "workflow.delete".into(),
        principal: batch.principal.clone(),
        recorded_at: services.now(),
        detail,
    })
}

fn decoded<T: for<'de> Deserialize<'de>>(value: &Value) -> AppResult<T> {
    serde_json::from_value(value.clone()).map_err(|e| AppError::Store(StoreError::Storage(format!("a stored batch operation: {e}"))))
}

/// Applies the batch's action to one run and counts what came of it. A refusal is the run's
/// (skipped, by its reason); a failure of the store stops the step, to be taken again.
async fn act_on<V: Services>(
    services: &V,
    batch: &BatchOperation,
    request: &BatchRequest,
    run: &RunSummary,
    progress: &mut BatchProgress,
) -> AppResult<()> {
    progress.matched += 1;
    let target = Target {
        namespace: batch.namespace.clone(),
        workflow_id: run.workflow_id.as_str().to_string(),
        run_id: Some(run.run_id.as_str().to_string()),
    };
    let request_id = Some(format!("batch:{}", batch.batch_id));
    let principal = batch.principal.clone();
    let applied = match request.action {
        BatchAction::Cancel | BatchAction::Terminate => {
            let kind = match request.action {
                BatchAction::Cancel => CloseCommand::Cancel,
                _ => CloseCommand::Terminate,
            };
            let close = CloseRequest {
                target,
                kind,
                reason: request.reason.clone(),
                request_id,
                trace: None,
                principal,
            };
            control::close(services, close, |_: &CommandReceipt, _: &RunState| json!(true)).await
        }
        BatchAction::Signal => {
            let signal = SignalRequest {
                target,
                signal_name: request.signal_name.clone().unwrap_or_default(),
                input: request
                    .input
                    .clone()
                    .ok_or_else(|| AppError::invalid("input", "A signal batch carries its input."))?,
                request_id,
                trace: None,
                principal,
            };
            control::signal(services, signal, |_: &CommandReceipt, _: &RunState| json!(true)).await
        }
        BatchAction::Pause | BatchAction::Resume => {
            let hold = PauseRequest {
                target,
                reason: request.reason.clone(),
                request_id,
                principal,
            };
            let render = |changed: &bool, _: &RunState| json!(changed);
            match request.action {
                BatchAction::Pause => pause::pause(services, hold, render).await,
                _ => pause::resume(services, hold, render).await,
            }
        }
        BatchAction::Redrive => {
            let asked = RedriveRequest {
                namespace: batch.namespace.clone(),
                workflow_id: target.workflow_id,
                run_id: run.run_id.as_str().to_string(),
                request_id,
                principal,
            };
            // One successor per failed run, whoever asks: a repeat is `not_needed`.
            redrive::redrive(services, asked).await.map(|outcome| control::Receipt {
                body: json!(outcome.fresh),
                retained: false,
                run: None,
            })
        }
        BatchAction::Archive => {
            let render = |(changed, _): &(bool, CommandReceipt), _: &RunState| json!(changed);
            control::archive(services, target, request.reason.clone(), request_id, principal, render).await
        }
        // A delete batch's runs go with its step's progress (`doom`), never one at a time.
        BatchAction::Delete => return Err(StoreError::Storage("a delete batch acts on a page, not a run".into()).into()),
    };
    match applied {
        Ok(receipt) if receipt.body == json!(false) => *progress.skipped.entry("not_needed".into()).or_default() += 1,
        Ok(_) => progress.done += 1,
        Err(AppError::Store(StoreError::Refused(refusal))) => {
            *progress.skipped.entry(refusal.reason.as_str().into()).or_default() += 1;
        }
        Err(AppError::Invalid { field, message }) => {
            progress.failed += 1;
            if progress.failures.len() < BATCH_FAILURES_KEPT {
                progress.failures.push(BatchFailure {
                    workflow_id: run.workflow_id.as_str().to_string(),
                    run_id: run.run_id.as_str().to_string(),
                    reason: Reason::ValidationFailed.as_str().into(),
                    message: format!("{field}: {message}"),
                });
            }
        }
        Err(other) => return Err(other),
    }
    Ok(())
}

/// Cancels a running batch: no step starts after this (one under way saves nothing).
pub async fn cancel<V: Services>(services: &V, namespace: &str, batch_id: &str) -> AppResult<BatchOperation> {
    services
        .store()
        .cancel_batch(namespace, batch_id, services.now())
        .await?
        .ok_or_else(|| not_found(batch_id))
}

/// A batch, or `batch_operation_not_found`.
pub async fn get<V: Services>(services: &V, namespace: &str, batch_id: &str) -> AppResult<BatchOperation> {
    services
        .store()
        .batch(namespace, batch_id)
        .await?
        .ok_or_else(|| not_found(batch_id))
}

fn not_found(batch_id: &str) -> AppError {
    AppError::Store(
        Refusal::new(Reason::BatchOperationNotFound, "No batch operation with that id in this namespace.")
            .with("batch_id", batch_id)
            .into(),
    )
}
