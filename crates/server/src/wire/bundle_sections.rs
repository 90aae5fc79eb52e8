//! An open run's bundle sections (`activities`, `tasks`, `signals`) in the engine's terms
//! ([`OpenRunSections`]): what an import needs beyond history to rebuild a run from DW's
//! embedded runtime. The writing half is `history_export.rs`.

use crate::wire::Fields;
use capstan_engine::import::{Finding, OpenRunSections, PendingResume, SectionActivity};
use capstan_engine::Limits;
use serde_json::{json, Map, Value};

/// The key of a workflow task's `payload` under which Capstan lists what the workflow is still
/// to be woken for, in order (DW's bundles list only received signals, under `signals`).
pub const RESUMES: &str = "resumes";

fn list(value: Option<&Value>) -> impl Iterator<Item = &Map<String, Value>> {
    value.and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_object)
}

fn text<'a>(map: &'a Map<String, Value>, key: &str) -> Option<&'a str> {
    map.get(key).and_then(Value::as_str)
}

pub fn read(bundle: &Map<String, Value>, limits: &Limits, errors: &mut Vec<Finding>) -> OpenRunSections {
    let mut activities = std::collections::BTreeMap::new();
    for (index, activity) in list(bundle.get("activities")).enumerate() {
        let Some(id) = text(activity, "id") else { continue };
        let fields = Fields::nested(activity, format!("activities.{index}."));
        let arguments = match fields.opt_payload("arguments", limits) {
            Ok(arguments) => arguments,
            Err(error) => {
                errors.push(Finding::new("activities.arguments_invalid", error.message));
                None
            }
        };
        let retry_policy = activity.get("retry_policy").filter(|p| p.is_object()).cloned();
        activities.insert(id.to_string(), SectionActivity { arguments, retry_policy });
    }
    let workflow_task =
        list(bundle.get("tasks")).find(|task| text(task, "type") == Some("workflow") && text(task, "status") == Some("ready"));
    let workflow_task_available_at = workflow_task
        .and_then(|task| text(task, "available_at"))
        .and_then(capstan_engine::schedule::parse_instant);
    let listed = workflow_task
        .and_then(|task| task.get("payload"))
        .and_then(|payload| payload.get(RESUMES))
        .and_then(Value::as_array);
    let resumes = match listed {
        Some(listed) => listed.iter().filter_map(resume_of).collect(),
        None => list(bundle.get("signals"))
            .filter(|signal| text(signal, "status") == Some("received"))
            .filter_map(|signal| text(signal, "id"))
            .map(|id| PendingResume::Signal(id.to_string()))
            .collect(),
    };
    OpenRunSections {
        activities,
        workflow_task_available_at,
        resumes,
    }
}

fn resume_of(value: &Value) -> Option<PendingResume> {
    let id = value.get("id")?.as_str()?.to_string();
    match value.get("kind")?.as_str()? {
        "signal" => Some(PendingResume::Signal(id)),
        "after_update" => Some(PendingResume::AfterUpdate(id)),
        _ => None,
    }
}

/// The resumes as a workflow task's payload lists them.
pub fn resumes_payload(resumes: &[PendingResume]) -> Value {
    let listed: Vec<Value> = resumes
        .iter()
        .map(|resume| match resume {
            PendingResume::Signal(id) => json!({"kind": "signal", "id": id}),
            PendingResume::AfterUpdate(id) => json!({"kind": "after_update", "id": id}),
        })
        .collect();
    json!({ RESUMES: listed })
}
