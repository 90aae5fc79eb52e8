//! Flow control an operator sets on a queue's workflow or activity tasks: a dispatch rate with
//! a burst, and a cap on tasks leased at once, for the queue and per fairness key, and weights
//! per fairness key (`docs/dispatch.md`). In force on this node at
//! once and on every node within a second; the limits row in the database is the authority.

use crate::{AppError, AppResult, Services};
use capstan_engine::flow::{KeyLimits, QueueLimits};
use capstan_engine::scheduling::{self, DEFAULT_CLASS};
use capstan_engine::{PauseRecord, Principal, TaskKind};
use capstan_store::prelude::*;
use capstan_store::QueueLimitState;
use serde_json::{Map, Value};
use std::collections::BTreeMap;

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

/// Pauses a queue's tasks of each of `kinds` (`docs/pause.md`): none is leased until it is
/// resumed; its backlog stays where it is, visible. Per kind, whether it was running free.
pub async fn pause<V: Services>(
    services: &V,
    namespace: &str,
    queue: &str,
    kinds: &[TaskKind],
    reason: Option<String>,
    principal: Option<Principal>,
) -> AppResult<Vec<(TaskKind, bool)>> {
    let now = services.now();
    let record = PauseRecord {
        paused_at: now,
        reason,
        principal,
    };
    let mut changed = Vec::new();
    for kind in kinds {
        let done = services
            .store()
            .set_queue_pause(namespace, queue, *kind, Some(record.clone()), now)
            .await?;
        changed.push((*kind, done));
    }
    tracing::info!(namespace, queue, ?changed, principal = ?record.principal, reason = ?record.reason, "task queue paused");
    Ok(changed)
}

/// Lets a paused queue's tasks of each of `kinds` go to workers again (its parked polls are
/// woken); per kind, whether it was paused.
pub async fn resume<V: Services>(
    services: &V,
    namespace: &str,
    queue: &str,
    kinds: &[TaskKind],
    principal: Option<Principal>,
) -> AppResult<Vec<(TaskKind, bool)>> {
    let mut changed = Vec::new();
    for kind in kinds {
        let done = services
            .store()
            .set_queue_pause(namespace, queue, *kind, None, services.now())
            .await?;
        changed.push((*kind, done));
    }
    tracing::info!(namespace, queue, ?changed, ?principal, "task queue resumed");
    Ok(changed)
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

const RATE_AND_CAP: [&str; 3] = ["dispatch_rate_per_second", "dispatch_burst", "max_leased_tasks"];
const FAIRNESS_KEY_FIELDS: [&str; 3] = ["fairness_key_limits", "fairness_key_overrides", "fairness_weights"];

/// Limits from their JSON (the body of `PUT /api/task-queues/{queue}/limits/{kind}`, an entry of
/// the config file's `task_queue_limits`): a field of the wrong type, or one no limit has, is
/// refused by its path (`fairness_key_limits.max_leased`), never passed over. Bounds are
/// [`checked`]'s.
pub fn from_json(object: &Map<String, Value>) -> AppResult<QueueLimits> {
    refuse_unknown(object, "", &[&RATE_AND_CAP, &FAIRNESS_KEY_FIELDS])?;
    let own = key_limits(object, "")?;
    let fairness_key_limits = match object.get("fairness_key_limits").filter(|v| !v.is_null()) {
        Some(value) => Some(key_limits(as_object(value, "fairness_key_limits")?, "fairness_key_limits.")?),
        None => None,
    };
    let mut fairness_key_overrides = BTreeMap::new();
    for (key, value) in entries(object, "fairness_key_overrides")? {
        let field = format!("fairness_key_overrides.{key}");
        fairness_key_overrides.insert(key.clone(), key_limits(as_object(value, &field)?, &format!("{field}."))?);
    }
    let mut fairness_weights = BTreeMap::new();
    for (key, value) in entries(object, "fairness_weights")? {
        let field = format!("fairness_weights.{key}");
        let weight = value
            .as_u64()
            .and_then(|w| u16::try_from(w).ok())
            .ok_or_else(|| AppError::invalid(&field, format!("{field} must be a whole number.")))?;
        fairness_weights.insert(key.clone(), weight);
    }
    Ok(QueueLimits {
        dispatch_rate_per_second: own.dispatch_rate_per_second,
        dispatch_burst: own.dispatch_burst,
        max_leased_tasks: own.max_leased_tasks,
        fairness_key_limits,
        fairness_key_overrides,
        fairness_weights,
        // A pause is set on its own route, never with limits.
        paused: None,
    })
}

/// A rate, burst and cap from `object` (`prefix` names where it sits in the request).
fn key_limits(object: &Map<String, Value>, prefix: &str) -> AppResult<KeyLimits> {
    if !prefix.is_empty() {
        refuse_unknown(object, prefix, &[&RATE_AND_CAP])?;
    }
    let rate = match object.get("dispatch_rate_per_second").filter(|v| !v.is_null()) {
        Some(value) => Some(value.as_f64().ok_or_else(|| {
            let field = format!("{prefix}dispatch_rate_per_second");
            AppError::invalid(&field, format!("{field} must be a number."))
        })?),
        None => None,
    };
    let whole = |name: &str| -> AppResult<Option<u32>> {
        match object.get(name).filter(|v| !v.is_null()) {
            None => Ok(None),
            Some(value) => value.as_u64().and_then(|n| u32::try_from(n).ok()).map(Some).ok_or_else(|| {
                let field = format!("{prefix}{name}");
                AppError::invalid(&field, format!("{field} must be a whole number."))
            }),
        }
    };
    Ok(KeyLimits {
        dispatch_rate_per_second: rate,
        dispatch_burst: whole("dispatch_burst")?,
        max_leased_tasks: whole("max_leased_tasks")?,
    })
}

fn refuse_unknown(object: &Map<String, Value>, prefix: &str, known: &[&[&str]]) -> AppResult<()> {
    match object.keys().find(|k| !known.iter().any(|names| names.contains(&k.as_str()))) {
        Some(unknown) => Err(AppError::invalid(
            format!("{prefix}{unknown}"),
            format!("unknown field `{prefix}{unknown}`: it is not a flow-control limit."),
        )),
        None => Ok(()),
    }
}

fn as_object<'a>(value: &'a Value, field: &str) -> AppResult<&'a Map<String, Value>> {
    value
        .as_object()
        .ok_or_else(|| AppError::invalid(field, format!("{field} must be an object of limits.")))
}

/// The entries of the object field `name` (none when absent or null).
fn entries<'a>(object: &'a Map<String, Value>, name: &str) -> AppResult<impl Iterator<Item = (&'a String, &'a Value)>> {
    let map = match object.get(name).filter(|v| !v.is_null()) {
        Some(value) => Some(
            value
                .as_object()
                .ok_or_else(|| AppError::invalid(name, format!("{name} must be an object.")))?,
        ),
        None => None,
    };
    Ok(map.into_iter().flatten())
}

/// One configured limit from its JSON text: `task_queue` and `kind` (`namespace` defaults to
/// `default`) and the limits as the API's `PUT …/limits/{kind}` takes them. Refused with the
/// field at fault named.
pub fn configured(text: &str) -> Result<ConfiguredLimit, String> {
    let value: serde_json::Value = serde_json::from_str(text).map_err(|e| format!("{text}: not JSON: {e}"))?;
    let mut object = match value {
        serde_json::Value::Object(object) => object,
        _ => return Err(format!("{text}: must be an object")),
    };
    let mut text_field = |name: &str| match object.remove(name) {
        Some(serde_json::Value::String(value)) if !value.is_empty() => Ok(Some(value)),
        None => Ok(None),
        Some(_) => Err(format!("{text}: `{name}` must be a non-empty string")),
    };
    let namespace = text_field("namespace")?.unwrap_or_else(|| "default".to_string());
    let task_queue = text_field("task_queue")?.ok_or_else(|| format!("{text}: `task_queue` is required"))?;
    let kind = text_field("kind")?.ok_or_else(|| format!("{text}: `kind` is required (workflow or activity)"))?;
    let kind = kind_named(&kind).map_err(|e| format!("{text}: {e}"))?;
    let limits = from_json(&object).map_err(|e| format!("{text}: {e}"))?;
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
            (
                r#"{"task_queue": "q", "kind": "activity", "fairness_key_limits": {"max_leased": 1}}"#,
                "fairness_key_limits.max_leased",
            ),
        ] {
            let error = configured(text).unwrap_err();
            assert!(error.contains(named), "{text}: {error}");
        }
    }
}
