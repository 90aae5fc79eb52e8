//! What a worker tells about itself on registration and on every heartbeat: its free task
//! slots, its process metrics and its own heartbeat cadence. Kept in the registration's
//! document as reported (slots are clamped to the registered maximum when shown).

use super::Fields;
use crate::error::{ApiError, ApiResult};
use serde_json::{Map, Value};

/// The slot families a worker reports free slots for.
pub const TASK_SLOT_FIELDS: &[&str] = &["workflow_available", "activity_available", "session_available"];
/// Most keys a `process_metrics` object may carry.
pub const PROCESS_METRICS_MAX_KEYS: usize = 32;
/// Most bytes a `process_metrics` object may take, encoded.
pub const PROCESS_METRICS_MAX_BYTES: usize = 4096;
/// The longest heartbeat cadence a worker may declare (a day).
pub const HEARTBEAT_INTERVAL_MAX_SECONDS: i64 = 86_400;

/// The reported fields of `f` (`task_slots`, `process_metrics`, `heartbeat_interval_seconds`),
/// checked, ready to be kept in the worker's document.
pub fn worker_report(f: &Fields) -> ApiResult<Map<String, Value>> {
    let mut report = Map::new();
    if let Some(slots) = f.opt_object("task_slots")? {
        super::refuse_unknown_fields(slots, &[TASK_SLOT_FIELDS], &f.name("task_slots."), "task slots")?;
        let slot_fields = Fields::nested(slots, f.name("task_slots."));
        let mut checked = Map::new();
        for key in TASK_SLOT_FIELDS {
            if let Some(free) = slot_fields.opt_int(key, 0, i64::from(u32::MAX))? {
                checked.insert(key.to_string(), Value::from(free));
            }
        }
        report.insert("task_slots".into(), Value::Object(checked));
    }
    if let Some(metrics) = f.opt_object("process_metrics")? {
        check_process_metrics(metrics, &f.name("process_metrics"))?;
        report.insert("process_metrics".into(), Value::Object(metrics.clone()));
    }
    if let Some(seconds) = f.opt_int("heartbeat_interval_seconds", 1, HEARTBEAT_INTERVAL_MAX_SECONDS)? {
        report.insert("heartbeat_interval_seconds".into(), Value::from(seconds));
    }
    Ok(report)
}

/// Metrics are recorded exactly as reported, so they are bounded: scalar values only, at most
/// [`PROCESS_METRICS_MAX_KEYS`] keys and [`PROCESS_METRICS_MAX_BYTES`] bytes.
fn check_process_metrics(metrics: &Map<String, Value>, at: &str) -> ApiResult<()> {
    if metrics.len() > PROCESS_METRICS_MAX_KEYS {
        return Err(ApiError::validation(
            at,
            format!("process_metrics may carry at most {PROCESS_METRICS_MAX_KEYS} keys."),
        ));
    }
    if let Some((key, _)) = metrics.iter().find(|(_, v)| v.is_object() || v.is_array()) {
        return Err(ApiError::validation(
            &format!("{at}.{key}"),
            "process_metrics values must be numbers, strings or booleans.",
        ));
    }
    let bytes = serde_json::to_vec(metrics).map(|b| b.len()).unwrap_or(usize::MAX);
    if bytes > PROCESS_METRICS_MAX_BYTES {
        return Err(ApiError::validation(
            at,
            format!("process_metrics may take at most {PROCESS_METRICS_MAX_BYTES} bytes."),
        ));
    }
    Ok(())
}

/// Free slots as shown: each family clamped into `[0, max_concurrent_*]` when the worker
/// registered a maximum for it.
pub fn shown_task_slots(document: &Map<String, Value>) -> Value {
    let Some(Value::Object(slots)) = document.get("task_slots") else {
        return Value::Null;
    };
    let maximum = |family: &str| match family {
        "workflow_available" => document.get("max_concurrent_workflow_tasks"),
        "activity_available" => document.get("max_concurrent_activity_tasks"),
        _ => document.get("max_concurrent_worker_sessions"),
    };
    let clamped = slots
        .iter()
        .map(|(family, free)| {
            let free = match (free.as_i64(), maximum(family).and_then(Value::as_i64)) {
                (Some(free), Some(max)) => Value::from(free.clamp(0, max.max(0))),
                _ => free.clone(),
            };
            (family.clone(), free)
        })
        .collect();
    Value::Object(clamped)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn report(body: Value) -> ApiResult<Map<String, Value>> {
        worker_report(&Fields::new(body.as_object().unwrap()))
    }

    #[test]
    fn slots_metrics_and_cadence_are_kept_and_bounded() {
        let kept = report(json!({"task_slots": {"workflow_available": 2, "activity_available": 0},
                                 "process_metrics": {"process_id": 9, "host": "h", "cpu_percent": 1.5},
                                 "heartbeat_interval_seconds": 30}))
        .unwrap();
        assert_eq!(kept["task_slots"], json!({"workflow_available": 2, "activity_available": 0}));
        assert_eq!(kept["process_metrics"], json!({"process_id": 9, "host": "h", "cpu_percent": 1.5}));
        assert_eq!(kept["heartbeat_interval_seconds"], json!(30));
        assert!(report(json!({})).unwrap().is_empty());
        for bad in [
            json!({"task_slots": {"gpu_available": 1}}),
            json!({"task_slots": {"workflow_available": -1}}),
            json!({"process_metrics": {"nested": {"a": 1}}}),
            json!({"process_metrics": {"host": "x".repeat(PROCESS_METRICS_MAX_BYTES)}}),
            json!({"heartbeat_interval_seconds": 0}),
        ] {
            assert_eq!(report(bad.clone()).unwrap_err().status.as_u16(), 422, "{bad}");
        }
    }

    #[test]
    fn shown_slots_are_clamped_to_the_registered_maximum() {
        let document = json!({"max_concurrent_workflow_tasks": 4,
                              "task_slots": {"workflow_available": 9, "activity_available": 3}});
        let shown = shown_task_slots(document.as_object().unwrap());
        assert_eq!(shown, json!({"workflow_available": 4, "activity_available": 3}));
        assert_eq!(shown_task_slots(&Map::new()), Value::Null);
    }
}
