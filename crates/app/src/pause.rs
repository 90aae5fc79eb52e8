//! Pausing and resuming a run (see `capstan_engine::pause`): the hold is written on the run in
//! the transition's transaction, with who and why; each request that changed something is
//! then written to the instance's audit trail (`workflow.pause`, `workflow.resume`).

use crate::control::{apply, check_target, keyed, Receipt, Target};
use crate::{AppResult, Services};
use capstan_engine::*;
use capstan_store::prelude::*;
use capstan_store::AuditEvent;
use serde_json::{Map, Value};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

pub const PAUSE_AUDIT_ACTION: &str = "workflow.pause";
pub const RESUME_AUDIT_ACTION: &str = "workflow.resume";

/// An operator's pause or resume of a run.
pub struct PauseRequest {
    pub target: Target,
    /// Why (kept on the hold and in the audit trail); for a resume, only in the audit trail.
    pub reason: Option<String>,
    pub request_id: Option<String>,
    pub principal: Option<Principal>,
}

/// Holds the run's dispatch; the receipt's `changed` (rendered by `render`) is whether it was
/// running free.
pub async fn pause<V, R>(services: &V, request: PauseRequest, render: R) -> AppResult<Receipt>
where
    V: Services,
    R: Fn(&bool, &RunState) -> Value + Clone + Send + 'static,
{
    let reason = request.reason.clone();
    hold_or_release(services, request, PAUSE_AUDIT_ACTION, render, move |run, cx| {
        capstan_engine::pause(run, cx, reason)
    })
    .await
}

/// Lets a paused run go on; `changed` is whether it was paused.
pub async fn resume<V, R>(services: &V, request: PauseRequest, render: R) -> AppResult<Receipt>
where
    V: Services,
    R: Fn(&bool, &RunState) -> Value + Clone + Send + 'static,
{
    hold_or_release(services, request, RESUME_AUDIT_ACTION, render, capstan_engine::resume).await
}

async fn hold_or_release<V, R, F>(services: &V, request: PauseRequest, action: &str, render: R, transition: F) -> AppResult<Receipt>
where
    V: Services,
    R: Fn(&bool, &RunState) -> Value + Clone + Send + 'static,
    F: FnOnce(&mut RunState, &mut Cx) -> Result<bool, Refusal> + Send + 'static,
{
    let PauseRequest {
        target,
        reason,
        request_id,
        principal,
    } = request;
    let key = keyed(action, request_id, &[reason.as_deref().unwrap_or("")]);
    // Set by the transition when it changed the run (not when a retry was answered from its
    // receipt, nor when there was nothing to do).
    let changed = Arc::new(AtomicBool::new(false));
    let wanted = target.run_id.clone();
    let (acting_for, seen) = (principal.clone(), changed.clone());
    let applied = move |run: &mut RunState, cx: &mut Cx| {
        cx.serve(RequestContext::acting_for(acting_for));
        check_target(run, wanted.as_deref())?;
        let done = transition(run, cx)?;
        seen.store(done, Ordering::SeqCst);
        Ok(done)
    };
    let receipt = apply(services, &target.namespace, target.locator(), key, applied, render).await?;
    if changed.load(Ordering::SeqCst) {
        let run_id = receipt.run.as_ref().map(|run| run.run_id.to_string());
        let mut detail = Map::new();
        detail.insert("reason".into(), reason.map_or(Value::Null, Value::String));
        services
            .store()
            .record_audit(AuditEvent {
                audit_id: services.new_id().to_lowercase(),
                namespace: target.namespace.clone(),
                workflow_id: target.workflow_id.clone(),
                run_id,
                action: action.into(),
                principal,
                recorded_at: services.now(),
                detail,
            })
            .await?;
    }
    Ok(receipt)
}
