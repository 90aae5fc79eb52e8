//! Flow control an operator sets on a queue's workflow or activity tasks: a dispatch rate with
//! a burst, and a cap on tasks leased at once (`docs/dispatch.md`). In force on this node at
//! once and on every node within a second; the limits row in the database is the authority.

use crate::{AppError, AppResult, Services};
use capstan_engine::flow::QueueLimits;
use capstan_engine::TaskKind;
use capstan_store::prelude::*;
use capstan_store::QueueLimitState;

/// The task kinds a limit can be set on, by the name the API uses.
pub fn kind_named(name: &str) -> AppResult<TaskKind> {
    match name {
        "workflow" | "workflow_tasks" => Ok(TaskKind::Workflow),
        "activity" | "activity_tasks" => Ok(TaskKind::Activity),
        other => Err(AppError::invalid(
            "kind",
            format!("kind must be \"workflow\" or \"activity\", not {other:?}."),
        )),
    }
}

/// Sets one queue and kind's limits, each checked; limits with neither a rate nor a cap clear
/// them.
pub async fn set<V: Services>(services: &V, namespace: &str, queue: &str, kind: TaskKind, limits: QueueLimits) -> AppResult<()> {
    limits.check().map_err(|(field, message)| AppError::invalid(field, message))?;
    services
        .store()
        .set_queue_limits(namespace, queue, kind, limits, services.now())
        .await?;
    Ok(())
}

/// The limits set on one queue, per kind.
pub async fn of_queue<V: Services>(services: &V, namespace: &str, queue: &str) -> AppResult<Vec<QueueLimitState>> {
    Ok(services.store().queue_limits(namespace, queue).await?)
}
