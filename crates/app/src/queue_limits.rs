//! Flow control an operator sets on a queue's workflow or activity tasks: a dispatch rate with
//! a burst, and a cap on tasks leased at once, for the queue and per fairness key, and weights
//! per fairness key (`docs/dispatch.md`). In force on this node at
//! once and on every node within a second; the limits row in the database is the authority.

use crate::{AppError, AppResult, Services};
use capstan_engine::flow::QueueLimits;
use capstan_engine::scheduling::{self, DEFAULT_CLASS};
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

/// Sets one queue and kind's limits, each checked, fairness keys named as runs keep them
/// (trimmed, lowercased; `__default__` is the runs started without a key); limits with nothing
/// in them clear them.
pub async fn set<V: Services>(services: &V, namespace: &str, queue: &str, kind: TaskKind, limits: QueueLimits) -> AppResult<()> {
    let limits = checked(limits)?;
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

/// The limits with every fairness key as a run keeps it; a key no run could have is refused.
fn keys_normalised(mut limits: QueueLimits) -> AppResult<QueueLimits> {
    fn class(key: &str, field: &str) -> AppResult<String> {
        if key == DEFAULT_CLASS {
            return Ok(key.to_string());
        }
        match scheduling::fairness_key(key) {
            Ok(Some(class)) => Ok(class),
            Ok(None) => Err(AppError::invalid(
                format!("{field}.{key}"),
                format!("{field} names a blank fairness key."),
            )),
            Err(message) => Err(AppError::invalid(format!("{field}.{key}"), message)),
        }
    }
    let overrides = std::mem::take(&mut limits.fairness_key_overrides);
    for (key, own) in overrides {
        limits.fairness_key_overrides.insert(class(&key, "fairness_key_overrides")?, own);
    }
    let weights = std::mem::take(&mut limits.fairness_weights);
    for (key, weight) in weights {
        limits.fairness_weights.insert(class(&key, "fairness_weights")?, weight);
    }
    Ok(limits)
}

/// Limits as they are kept: fairness keys normalised, every field in bounds.
pub fn checked(limits: QueueLimits) -> AppResult<QueueLimits> {
    let limits = keys_normalised(limits)?;
    limits.check().map_err(|(field, message)| AppError::invalid(field, message))?;
    Ok(limits)
}

/// Limits set by the server's configuration (`--task-queue-limit`, the config file's
/// `task_queue_limits`), applied when it starts.
#[derive(Clone, Debug, PartialEq)]
pub struct ConfiguredLimit {
    pub namespace: String,
    pub task_queue: String,
    pub kind: TaskKind,
    pub limits: QueueLimits,
}

/// The fields of a configured limit besides the limits' own.
const PLACE_FIELDS: [&str; 3] = ["namespace", "task_queue", "kind"];
const LIMITS_FIELDS: [&str; 6] = [
    "dispatch_rate_per_second",
    "dispatch_burst",
    "max_leased_tasks",
    "fairness_key_limits",
    "fairness_key_overrides",
    "fairness_weights",
];

/// One configured limit from its JSON text: `task_queue` and `kind` (`namespace` defaults to
/// `default`) and the limits as the API's `PUT …/limits/{kind}` takes them. Refused with the
/// field at fault named.
pub fn configured(text: &str) -> Result<ConfiguredLimit, String> {
    let value: serde_json::Value = serde_json::from_str(text).map_err(|e| format!("{text}: not JSON: {e}"))?;
    let mut object = match value {
        serde_json::Value::Object(object) => object,
        _ => return Err(format!("{text}: must be an object")),
    };
    if let Some(unknown) = object
        .keys()
        .find(|k| !PLACE_FIELDS.contains(&k.as_str()) && !LIMITS_FIELDS.contains(&k.as_str()))
    {
        return Err(format!("{text}: unknown field `{unknown}`"));
    }
    let mut text_field = |name: &str| match object.remove(name) {
        Some(serde_json::Value::String(value)) if !value.is_empty() => Ok(Some(value)),
        None => Ok(None),
        Some(_) => Err(format!("{text}: `{name}` must be a non-empty string")),
    };
    let namespace = text_field("namespace")?.unwrap_or_else(|| "default".to_string());
    let task_queue = text_field("task_queue")?.ok_or_else(|| format!("{text}: `task_queue` is required"))?;
    let kind = text_field("kind")?.ok_or_else(|| format!("{text}: `kind` is required (workflow or activity)"))?;
    let kind = kind_named(&kind).map_err(|e| format!("{text}: {e}"))?;
    let limits: QueueLimits = serde_json::from_value(serde_json::Value::Object(object)).map_err(|e| format!("{text}: {e}"))?;
    let limits = checked(limits).map_err(|e| format!("{text}: {e}"))?;
    Ok(ConfiguredLimit {
        namespace,
        task_queue,
        kind,
        limits,
    })
}

/// Applies the configured limits (the server's start): each replaces what its queue and kind
/// had, so the file is what holds after a start; a change over the API lasts until the next.
pub async fn apply_configured<V: Services>(services: &V, configured: &[ConfiguredLimit]) -> AppResult<()> {
    for limit in configured {
        set(services, &limit.namespace, &limit.task_queue, limit.kind, limit.limits.clone()).await?;
        tracing::info!(namespace = %limit.namespace, task_queue = %limit.task_queue, kind = limit.kind.as_str(),
            "task queue limits set from the configuration");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_configured_limit_is_read_and_checked() {
        let limit = configured(
            r#"{"task_queue": "orders", "kind": "activity", "max_leased_tasks": 10,
                "fairness_key_limits": {"max_leased_tasks": 2}, "fairness_weights": {"Tenant-A": 3}}"#,
        )
        .unwrap();
        assert_eq!(
            (limit.namespace.as_str(), limit.task_queue.as_str(), limit.kind),
            ("default", "orders", TaskKind::Activity)
        );
        assert_eq!(limit.limits.max_leased_tasks, Some(10));
        assert_eq!(limit.limits.weight_of("tenant-a"), Some(3), "keys as runs keep them");
        for (text, named) in [
            (r#"{"kind": "activity", "max_leased_tasks": 1}"#, "`task_queue` is required"),
            (r#"{"task_queue": "q", "kind": "timer", "max_leased_tasks": 1}"#, "kind must be"),
            (
                r#"{"task_queue": "q", "kind": "activity", "max_leased": 1}"#,
                "unknown field `max_leased`",
            ),
            (
                r#"{"task_queue": "q", "kind": "activity", "max_leased_tasks": 0}"#,
                "max_leased_tasks",
            ),
            (
                r#"{"task_queue": "q", "kind": "activity", "fairness_weights": {"a b": 2}}"#,
                "fairness_weights.a b",
            ),
        ] {
            let error = configured(text).unwrap_err();
            assert!(error.contains(named), "{text}: {error}");
        }
    }
}
