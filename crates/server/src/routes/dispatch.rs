//! How a queue's ready tasks are shared out: DW's priority-fairness view of one queue, and the
//! flow-control limits an operator sets on it.

use crate::auth::Role;
use crate::body::JsonObject;
use crate::error::ApiResult;
use crate::planes::Namespace;
use crate::Shared;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::{Extension, Json};
use capstan_app::queue_limits;
use capstan_engine::flow::{self, Limit, QueueLimits};
use capstan_engine::TaskKind;
use capstan_store::{KindShares, Store};
use serde_json::{json, Value};

/// `GET /api/task-queues/{task_queue}/priority-fairness`: ready workflow and activity tasks
/// by priority tier and fairness class, with each class's recent dispatch on this node.
pub async fn priority_fairness<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    Path(queue): Path<String>,
    headers: HeaderMap,
) -> ApiResult<Json<Value>> {
    state.config.auth.require_in(&headers, &[Role::Operator, Role::Admin], &namespace)?;
    let shares = state.store.priority_fairness(&namespace, &queue, state.now()).await?;
    Ok(Json(json!({
        "namespace": namespace,
        "queue": queue,
        "workflow_task": surface(&shares.workflow),
        "activity_task": surface(&shares.activity),
    })))
}

fn surface(shares: &KindShares) -> Value {
    let tiers: Vec<Value> = shares
        .tiers
        .iter()
        .map(|tier| {
            let classes: Vec<Value> = tier
                .classes
                .iter()
                .map(|c| json!({"fairness_key": c.fairness_key, "count": c.count, "fairness_weight": c.fairness_weight}))
                .collect();
            json!({"priority": tier.priority, "count": tier.count, "classes": classes})
        })
        .collect();
    let recent: Vec<Value> = shares
        .recent_dispatch
        .iter()
        .map(|(key, score)| json!({"fairness_key": key, "score": score}))
        .collect();
    json!({"ready_tasks": shares.ready_tasks, "priority_tiers": tiers, "recent_dispatch": recent})
}

/// `GET /api/task-queues/{task_queue}/limits`: the flow-control limits per task kind (`null`:
/// none), with the leased tasks and the rate limit's tokens now.
pub async fn limits<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    Path(queue): Path<String>,
    headers: HeaderMap,
) -> ApiResult<Json<Value>> {
    state.config.auth.require_in(&headers, &[Role::Operator, Role::Admin], &namespace)?;
    Ok(Json(limits_json(&state, &namespace, &queue).await?))
}

/// `PUT /api/task-queues/{task_queue}/limits/{kind}` (`workflow` or `activity`): sets the
/// kind's limits (a field left out is no such limit; none at all clears them).
pub async fn set_limits<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    Path((queue, kind)): Path<(String, String)>,
    headers: HeaderMap,
    JsonObject(body): JsonObject,
) -> ApiResult<Json<Value>> {
    state.config.auth.require_in(&headers, &[Role::Operator, Role::Admin], &namespace)?;
    let limits = queue_limits::from_json(&body)?;
    set_and_show(&state, &namespace, &queue, &kind, limits).await
}

/// `DELETE /api/task-queues/{task_queue}/limits/{kind}`: no limits on the kind.
pub async fn clear_limits<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    Path((queue, kind)): Path<(String, String)>,
    headers: HeaderMap,
) -> ApiResult<Json<Value>> {
    state.config.auth.require_in(&headers, &[Role::Operator, Role::Admin], &namespace)?;
    set_and_show(&state, &namespace, &queue, &kind, QueueLimits::default()).await
}

/// Sets the limits of the kind named `kind`, and answers the queue's limits as they now are.
async fn set_and_show<S: Store>(
    state: &Shared<S>,
    namespace: &str,
    queue: &str,
    kind: &str,
    limits: QueueLimits,
) -> ApiResult<Json<Value>> {
    queue_limits::set(&**state, namespace, queue, queue_limits::kind_named(kind)?, limits).await?;
    Ok(Json(limits_json(state, namespace, queue).await?))
}

async fn limits_json<S: Store>(state: &Shared<S>, namespace: &str, queue: &str) -> ApiResult<Value> {
    let set = queue_limits::of_queue(&**state, namespace, queue).await?;
    let of_kind = |kind: TaskKind| {
        set.iter().find(|s| s.kind == kind).map(|s| {
            let tokens = s
                .limits
                .dispatch_rate_per_second
                .map(|_| flow::refill(&s.limits, s.bucket, state.now()).tokens);
            json!({
                "dispatch_rate_per_second": s.limits.dispatch_rate_per_second,
                "dispatch_burst": s.limits.dispatch_rate_per_second.map(|_| s.limits.burst() as u64),
                "max_leased_tasks": s.limits.max_leased_tasks,
                "leased_tasks": s.leased,
                "available_tokens": tokens,
                "fairness_key_limits": s.limits.fairness_key_limits,
                "fairness_key_overrides": s.limits.fairness_key_overrides,
                "fairness_weights": s.limits.fairness_weights,
                "paused": s.limits.paused.is_some(),
                "pause": crate::render::pause(s.limits.paused.as_ref()),
                "updated_at": crate::render::time(s.updated_at),
            })
        })
    };
    Ok(json!({
        "namespace": namespace,
        "queue": queue,
        "workflow_task": of_kind(TaskKind::Workflow),
        "activity_task": of_kind(TaskKind::Activity),
    }))
}
