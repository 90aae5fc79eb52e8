//! An open run's bundle sections (`activities`, `tasks`, `signals`) in the engine's terms
//! ([`OpenRunSections`]): what an import needs beyond history to rebuild a run from DW's
//! embedded runtime. The writing half is `history_export.rs`.

use crate::wire::Fields;
use capstan_engine::import::{Finding, OpenRunSections, PendingResume, SectionActivity, SectionWorkflowTask};
use capstan_engine::{Limits, Millis};
use serde_json::{json, Map, Value};

/// The key of a workflow task's `payload` under which Capstan lists what the workflow is still
/// to be woken for behind it, in order (DW's bundles say it with the statuses of their
/// `signals` and `updates`).
pub const RESUMES: &str = "resumes";
/// The payload's key for what the listed task itself is for.
const RESUME: &str = "resume";
/// The payload's key for the updates waiting for their own tasks.
const PENDING_UPDATES: &str = "pending_updates";

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
    let task = list(bundle.get("tasks")).find(|task| text(task, "type") == Some("workflow") && text(task, "status") == Some("ready"));
    let available_at = task
        .and_then(|task| text(task, "available_at"))
        .and_then(capstan_engine::schedule::parse_instant);
    let payload = task.and_then(|task| task.get("payload")).and_then(Value::as_object);
    match payload.filter(|payload| payload.contains_key(RESUMES)) {
        Some(payload) => capstan_sections(activities, available_at, payload),
        None => dw_sections(bundle, activities, available_at),
    }
}

type Activities = std::collections::BTreeMap<String, SectionActivity>;

/// Capstan's own bundle: its workflow task's payload says what it and the tasks behind it are for.
fn capstan_sections(activities: Activities, available_at: Option<Millis>, payload: &Map<String, Value>) -> OpenRunSections {
    let listed = |key: &str| payload.get(key).and_then(Value::as_array).into_iter().flatten();
    OpenRunSections {
        activities,
        workflow_task: available_at.map(|available_at| SectionWorkflowTask {
            available_at,
            resume: payload.get(RESUME).and_then(resume_of),
        }),
        resumes: listed(RESUMES).filter_map(resume_of).collect(),
        pending_updates: listed(PENDING_UPDATES).filter_map(Value::as_str).map(str::to_string).collect(),
    }
}

/// DW's bundle: the signals it has received and not applied, the updates it has accepted and
/// not handled, in the order listed; the workflow task wakes it for the first of them.
fn dw_sections(bundle: &Map<String, Value>, activities: Activities, available_at: Option<Millis>) -> OpenRunSections {
    let ids_with = |section: &str, status: &str| -> Vec<String> {
        list(bundle.get(section))
            .filter(|entry| text(entry, "status") == Some(status))
            .filter_map(|entry| text(entry, "id"))
            .map(str::to_string)
            .collect()
    };
    let mut pending_updates = ids_with("updates", "accepted");
    let mut resumes: Vec<PendingResume> = ids_with("signals", "received").into_iter().map(PendingResume::Signal).collect();
    let workflow_task = available_at.map(|available_at| {
        let resume = if pending_updates.is_empty() {
            (!resumes.is_empty()).then(|| resumes.remove(0))
        } else {
            Some(PendingResume::Update(pending_updates.remove(0)))
        };
        SectionWorkflowTask { available_at, resume }
    });
    OpenRunSections {
        activities,
        workflow_task,
        resumes,
        pending_updates,
    }
}

fn resume_of(value: &Value) -> Option<PendingResume> {
    let id = value.get("id")?.as_str()?.to_string();
    match value.get("kind")?.as_str()? {
        "signal" => Some(PendingResume::Signal(id)),
        "after_update" => Some(PendingResume::AfterUpdate(id)),
        "update" => Some(PendingResume::Update(id)),
        _ => None,
    }
}

fn resume_json(resume: &PendingResume) -> Value {
    match resume {
        PendingResume::Signal(id) => json!({"kind": "signal", "id": id}),
        PendingResume::AfterUpdate(id) => json!({"kind": "after_update", "id": id}),
        PendingResume::Update(id) => json!({"kind": "update", "id": id}),
    }
}

/// The payload of an open run's workflow task in Capstan's bundle: what it and the tasks
/// behind it wake the workflow for.
pub fn workflow_task_payload(sections: &OpenRunSections) -> Value {
    let resume = sections.workflow_task.as_ref().and_then(|task| task.resume.as_ref());
    json!({
        RESUME: resume.map(resume_json),
        RESUMES: sections.resumes.iter().map(resume_json).collect::<Vec<_>>(),
        PENDING_UPDATES: sections.pending_updates,
    })
}
