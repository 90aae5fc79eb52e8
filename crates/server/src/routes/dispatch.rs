//! How a queue's ready tasks are shared out: DW's priority-fairness view of one queue.

use crate::auth::Role;
use crate::error::ApiResult;
use crate::planes::Namespace;
use crate::Shared;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::{Extension, Json};
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
