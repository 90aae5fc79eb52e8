//! Moving a run in from another runtime: DW's embedded-v2 import contract. A
//! `durable-workflow.v2.history-export` bundle is copied into the store in one transaction.
//!
//! The bundle's history is the authority. Its events keep their ids, types, payloads (with the
//! principal they recorded) and times; they are re-linked into Capstan's hash chain starting
//! from the bundle's own checksum, so the copy stays tied to the bundle it came from. The run is
//! stamped with where it came from ([`ImportStamp`]), and a second import of the same bundle is
//! known by run id and dedupe key. What cannot be honoured is refused by a named rule
//! ([`Finding`]) before anything is written.

use crate::history::HistoryEvent;
use crate::ids::{CommandId, EventId, RunId, TaskId, WorkflowId};
use crate::{ClosedReason, EventType, Millis, Payload, RunState, RunStatus, RUN_DOCUMENT_VERSION};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

pub const CONTRACT_SCHEMA: &str = "durable-workflow.v2.embedded-v2-import.contract";
pub const CONTRACT_VERSION: u32 = 1;
/// `import_source` on every imported run: the contract it came in by.
pub const IMPORT_SOURCE: &str = "embedded_v2";
/// The `engine_source` DW shows for an imported run.
pub const ENGINE_SOURCE: &str = "embedded_v2_import";
pub const REPORT_SCHEMA: &str = "durable-workflow.v2.embedded-v2-import.report";
pub const REPORT_SCHEMA_VERSION: u32 = 1;
pub const BUNDLE_SCHEMA: &str = "durable-workflow.v2.history-export";
/// DW's embedded (Laravel) runtime, and Capstan's own exports.
pub const SOURCE_RUNTIMES: [&str; 2] = ["embedded", "capstan"];

/// Where an imported run came from, kept on the run and shown wherever it is described.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ImportStamp {
    /// [`IMPORT_SOURCE`].
    pub source: String,
    pub import_id: String,
    /// The bundle's `dedupe_key`: with the run id, what makes a second import a repeat.
    pub dedupe_key: String,
    pub contract_version: u32,
    pub imported_at: Millis,
    /// `workflow.source_runtime` of the bundle.
    pub source_runtime: String,
    /// The bundle's verified SHA-256: the run's hash chain starts from it.
    pub bundle_checksum: String,
    /// The namespace the run had where it was exported from, when the bundle names one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_namespace: Option<String>,
    /// Who imported it (the principal as history records one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub imported_by: Option<Value>,
}

/// One history event as the bundle holds it.
#[derive(Clone, Debug, PartialEq)]
pub struct ImportedEvent {
    pub id: EventId,
    pub sequence: u64,
    pub event_type: EventType,
    pub payload: Map<String, Value>,
    pub workflow_task_id: Option<TaskId>,
    pub workflow_command_id: Option<CommandId>,
    pub recorded_at: Millis,
}

impl ImportedEvent {
    /// The event at `sequence` of a chain whose head is `prev_hash`, not yet sealed: whoever
    /// links it computes its hash (once).
    pub fn at(self, sequence: u64, prev_hash: String) -> HistoryEvent {
        HistoryEvent {
            id: self.id,
            sequence,
            event_type: self.event_type,
            payload: self.payload,
            workflow_task_id: self.workflow_task_id,
            workflow_command_id: self.workflow_command_id,
            recorded_at: self.recorded_at,
            prev_hash,
            hash: String::new(),
        }
    }
}

impl From<&HistoryEvent> for ImportedEvent {
    fn from(event: &HistoryEvent) -> Self {
        Self {
            id: event.id.clone(),
            sequence: event.sequence,
            event_type: event.event_type,
            payload: event.payload.clone(),
            workflow_task_id: event.workflow_task_id.clone(),
            workflow_command_id: event.workflow_command_id.clone(),
            recorded_at: event.recorded_at,
        }
    }
}

/// A bundle's run, read and checked for shape by the caller (the wire layer).
#[derive(Clone, Debug, PartialEq)]
pub struct ImportedRun {
    pub namespace: String,
    pub workflow_id: WorkflowId,
    pub run_id: RunId,
    pub run_number: u32,
    pub workflow_type: String,
    pub task_queue: String,
    pub status: RunStatus,
    pub closed_reason: Option<ClosedReason>,
    pub input: Payload,
    pub output: Option<Payload>,
    pub business_key: Option<String>,
    pub memo: Map<String, Value>,
    pub search_attributes: Map<String, Value>,
    pub compatibility: Option<String>,
    pub started_at: Option<Millis>,
    pub is_current_run: bool,
    pub continued_from_run_id: Option<RunId>,
    pub events: Vec<ImportedEvent>,
    pub stamp: ImportStamp,
    /// An open run's state as Capstan kept it where it was exported (`capstan_run_state`):
    /// what it waits on, its timers, activities and tasks. Checked against the history before
    /// it is trusted ([`carried_state_findings`]).
    pub carried_state: Option<Box<RunState>>,
    /// What the bundle's sections say of an open run's work beyond its history; the run is
    /// rebuilt from both when it carries no Capstan state (DW's embedded runtime).
    pub sections: OpenRunSections,
}

/// The parts of an open run's bundle its history does not hold: a worker activity's arguments
/// and applied retry policy (`activities`), a ready workflow task (`tasks`), and which signals
/// still wait for the workflow to see them (`signals` with status `received`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct OpenRunSections {
    pub activities: std::collections::BTreeMap<String, SectionActivity>,
    /// The ready workflow task the bundle lists, if it lists one.
    pub workflow_task: Option<SectionWorkflowTask>,
    /// What the workflow is still to be woken for behind that task, in order: the signals
    /// received and not yet applied, and (Capstan's) the turns after updates.
    pub resumes: Vec<PendingResume>,
    /// Accepted updates waiting for their own task, in order (Capstan's).
    pub pending_updates: Vec<String>,
}

/// A ready workflow task: when it may be leased and what it wakes the workflow for.
#[derive(Clone, Debug, PartialEq)]
pub struct SectionWorkflowTask {
    pub available_at: Millis,
    pub resume: Option<PendingResume>,
}

/// One wake-up of the workflow still to come.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PendingResume {
    /// A received signal, by id.
    Signal(String),
    /// The regular turn after an update's handler ran, by update id.
    AfterUpdate(String),
    /// The task that runs an update's handler, by update id.
    Update(String),
}

impl PendingResume {
    fn of(resume: &crate::ResumeContext) -> Self {
        match resume {
            crate::ResumeContext::Signal { signal_id, .. } => Self::Signal(signal_id.as_str().to_string()),
            crate::ResumeContext::AfterUpdate { update_id } => Self::AfterUpdate(update_id.clone()),
            crate::ResumeContext::Update { update_id, .. } => Self::Update(update_id.clone()),
        }
    }
}

impl OpenRunSections {
    /// What an open run of this store's bundle says beyond its history (what the export writes
    /// in its sections, and a rebuild reads back).
    pub fn of(run: &RunState) -> Self {
        let activities = run
            .activities
            .values()
            .map(|execution| {
                let section = SectionActivity {
                    arguments: Some(execution.arguments.clone()),
                    retry_policy: Some(execution.retry_policy.to_json()),
                };
                (execution.id.as_str().to_string(), section)
            })
            .collect();
        let workflow_task = run
            .workflow_task
            .as_ref()
            .and_then(|id| run.tasks.get(id))
            .filter(|task| task.is_ready());
        let workflow_task = workflow_task.map(|task| SectionWorkflowTask {
            available_at: task.available_at,
            resume: match &task.detail {
                crate::TaskDetail::Workflow { resume, .. } => resume.as_ref().map(PendingResume::of),
                _ => None,
            },
        });
        let pending_updates = run
            .pending_updates
            .iter()
            .filter_map(|resume| match resume {
                crate::ResumeContext::Update { update_id, .. } => Some(update_id.clone()),
                _ => None,
            })
            .collect();
        Self {
            activities,
            workflow_task,
            resumes: run.pending_resumes.iter().map(PendingResume::of).collect(),
            pending_updates,
        }
    }
}

/// One open activity as the `activities` section lists it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SectionActivity {
    pub arguments: Option<Payload>,
    pub retry_policy: Option<Value>,
}

impl ImportedRun {
    /// A closed run of this store as another server's bundle brings it, under `workflow_id`
    /// and `run_id`: its fields and history as they are, its stamp as given.
    pub fn copy_of(source: &RunState, events: &[HistoryEvent], workflow_id: WorkflowId, run_id: RunId, stamp: ImportStamp) -> Self {
        Self {
            namespace: source.namespace.clone(),
            workflow_id,
            run_id,
            run_number: source.run_number,
            workflow_type: source.workflow_type.clone(),
            task_queue: source.task_queue.clone(),
            status: source.status,
            closed_reason: source.closed_reason,
            input: source.input.clone(),
            output: source.output.clone(),
            business_key: source.business_key.clone(),
            memo: source.memo.clone(),
            search_attributes: source.search_attributes.clone(),
            compatibility: source.compatibility.clone(),
            started_at: Some(source.started_at),
            is_current_run: true,
            continued_from_run_id: None,
            events: events.iter().map(ImportedEvent::from).collect(),
            stamp,
            carried_state: None,
            sections: OpenRunSections::default(),
        }
    }
}

/// What the bundle says of the work that was under way when it was exported.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct InFlight {
    pub history_complete: bool,
    /// Tasks the bundle lists as leased.
    pub leased_tasks: usize,
    /// Activity attempts the bundle lists as running.
    pub running_attempts: usize,
    /// `redaction.paths`: payloads the exporter replaced.
    pub redacted_paths: Vec<String>,
}

/// One rule a bundle breaks (an error refuses the import), in DW's `{rule, message}` shape.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Finding {
    pub rule: String,
    pub message: String,
}

impl Finding {
    pub fn new(rule: &str, message: impl Into<String>) -> Self {
        Self {
            rule: rule.to_string(),
            message: message.into(),
        }
    }
}

/// What an open run's future depends on, the ids of its tasks left out (each task by what it
/// is): a run rebuilt from its history must equal its source here (the import's property tests
/// and the simulator hold it to that).
pub fn continuation_of(run: &RunState) -> Value {
    let mut activities = to_json(&run.activities);
    for execution in activities.as_object_mut().expect("a map").values_mut() {
        execution["task_id"] = Value::Null;
    }
    let mut timers = to_json(&run.timers);
    for timer in timers.as_object_mut().expect("a map").values_mut() {
        timer["task_id"] = Value::Null;
    }
    let mut tasks: Vec<Value> = run
        .tasks
        .values()
        .map(|task| {
            let detail = match &task.detail {
                crate::TaskDetail::Workflow { resume, .. } => serde_json::json!({"workflow": to_json(resume)}),
                other => to_json(other),
            };
            serde_json::json!({
                "kind": task.kind.as_str(),
                "queue": task.queue,
                // A timer or deadline is due at its deadline, whenever its task was made.
                "available_at": matches!(task.kind, crate::TaskKind::Workflow | crate::TaskKind::Activity).then_some(task.available_at),
                "deadline_at": task.deadline_at,
                "detail": detail,
            })
        })
        .collect();
    tasks.sort_by_key(|t| t.to_string());
    serde_json::json!({
        "status": run.status.as_str(),
        "activities": activities,
        "timers": timers,
        "tasks": tasks,
        "workflow_task": run.workflow_task.is_some(),
        "pending_resumes": to_json(&run.pending_resumes),
        "condition_waits": to_json(&run.condition_waits),
        "signal_waits": to_json(&run.signal_waits),
        "next_step": run.next_step,
        "steps": to_json(&run.steps),
        "selections": to_json(&run.selections),
        "updates": to_json(&run.updates),
        "command_count": run.command_count,
        "memo_merged": to_json(&run.memo_merged),
        "deadlines": [run.execution_timeout_seconds, run.run_timeout_seconds, run.execution_deadline_at, run.run_deadline_at],
        "search_attributes": run.search_attributes,
    })
}

fn to_json(value: &impl Serialize) -> Value {
    serde_json::to_value(value).expect("a run's parts serialize")
}

/// The status and closed reason the event that closed a run stands for.
pub fn closing_of(event_type: EventType) -> Option<(RunStatus, ClosedReason)> {
    Some(match event_type {
        EventType::WorkflowCompleted => (RunStatus::Completed, ClosedReason::Completed),
        EventType::WorkflowContinuedAsNew => (RunStatus::Completed, ClosedReason::Continued),
        EventType::WorkflowFailed => (RunStatus::Failed, ClosedReason::Failed),
        EventType::WorkflowTimedOut => (RunStatus::Failed, ClosedReason::TimedOut),
        EventType::WorkflowCancelled => (RunStatus::Cancelled, ClosedReason::Cancelled),
        EventType::WorkflowTerminated => (RunStatus::Terminated, ClosedReason::Terminated),
        _ => return None,
    })
}

/// The event that closed a run's history, if it is closed: the last one before any archive
/// bookkeeping (an archived run's `ArchiveRequested` and `WorkflowArchived` follow its close).
pub fn closing_event(events: &[ImportedEvent]) -> Option<&ImportedEvent> {
    events
        .iter()
        .rev()
        .find(|e| !matches!(e.event_type, EventType::ArchiveRequested | EventType::WorkflowArchived))
        .or(events.last())
}

/// Whether a history records its run's archiving.
pub fn is_archived(events: &[ImportedEvent]) -> bool {
    events.iter().any(|e| e.event_type == EventType::WorkflowArchived)
}

/// Whether a bundle's closed reason agrees with the one its closing event stands for: a
/// `WorkflowFailed` also closes a run that timed out (a standalone activity's host run).
fn reason_agrees(given: ClosedReason, closing: ClosedReason) -> bool {
    given == closing || (closing == ClosedReason::Failed && given == ClosedReason::TimedOut)
}

/// The closed reason an imported run keeps: the bundle's when it agrees with the closing event.
pub fn closed_reason_of(given: Option<ClosedReason>, closing: ClosedReason) -> ClosedReason {
    given.filter(|g| reason_agrees(*g, closing)).unwrap_or(closing)
}

/// The rules of DW's contract (and Capstan's own) a bundle's run breaks; none means importable.
/// `history_events_max` is the store's history limit.
pub fn eligibility(run: &ImportedRun, in_flight: &InFlight, history_events_max: usize) -> Vec<Finding> {
    let mut errors = Vec::new();
    if !SOURCE_RUNTIMES.contains(&run.stamp.source_runtime.as_str()) {
        errors.push(Finding::new(
            "workflow.source_runtime_unsupported",
            format!(
                "Bundle workflow.source_runtime must be one of {SOURCE_RUNTIMES:?}; found {:?}.",
                run.stamp.source_runtime
            ),
        ));
    }
    if !in_flight.redacted_paths.is_empty() {
        errors.push(Finding::new(
            "bundle.redacted_payloads",
            format!(
                "Redacted history bundles cannot be imported as server-managed state (redacted: {}).",
                in_flight.redacted_paths.join(", ")
            ),
        ));
    }
    if in_flight.leased_tasks > 0 {
        errors.push(Finding::new(
            "tasks.leased_task_present",
            "Leased workflow or activity tasks must be completed, failed, or released before import.",
        ));
    }
    if in_flight.running_attempts > 0 {
        errors.push(Finding::new(
            "activities.running_attempt_present",
            "Running activity attempts must be released before import.",
        ));
    }
    if run.status.is_terminal() {
        if !in_flight.history_complete {
            errors.push(Finding::new(
                "workflow.terminal_history_incomplete",
                "Terminal run imports require history_complete=true.",
            ));
        }
    } else if !run.is_current_run {
        errors.push(Finding::new(
            "workflow.non_terminal_not_current",
            "Non-terminal embedded v2 imports must be the current run.",
        ));
    } else {
        // A run without carried state is rebuilt from its history; what that cannot honour is
        // found while it is rebuilt (`transitions::import::rebuild`).
        errors.extend(carried_state_findings(run));
    }
    errors.extend(history_findings(run, history_events_max));
    // The bundle's sections and a carried state may both say so: each rule is named once.
    let mut named = std::collections::BTreeSet::new();
    errors.retain(|finding| named.insert(finding.rule.clone()));
    errors
}

/// The rules an open run's carried state must meet before it is trusted: written by a build
/// this one reads, of this very run, agreeing with the history (its head hash is the bundle's
/// events chained from its origin), with no lease still held on the source, and using no
/// feature whose other half lives outside the run (children, a parent, service calls, a ledger).
pub fn carried_state_findings(run: &ImportedRun) -> Vec<Finding> {
    let Some(state) = run.carried_state.as_deref() else {
        return Vec::new();
    };
    let mismatch = |what: &str| {
        Finding::new(
            "capstan_run_state.mismatch",
            format!("The carried run state disagrees with the bundle: {what}."),
        )
    };
    let mut errors = Vec::new();
    if state.document_version > RUN_DOCUMENT_VERSION {
        errors.push(Finding::new(
            "capstan_run_state.version_unsupported",
            format!(
                "The run state was written by a newer Capstan (document version {}; this build reads up to {RUN_DOCUMENT_VERSION}).",
                state.document_version
            ),
        ));
        return errors;
    }
    if let Err(problem) = state.invariants_hold() {
        errors.push(Finding::new(
            "capstan_run_state.invalid",
            format!("The carried run state breaks an invariant of a run: {problem}."),
        ));
    }
    if state.workflow_id != run.workflow_id || state.run_id != run.run_id || state.run_number != run.run_number {
        errors.push(mismatch("another workflow, run or run number"));
    }
    if state.status != run.status || state.is_closed() {
        errors.push(mismatch("another status"));
    }
    if state.last_sequence != run.events.len() as u64 || state.last_hash != source_head(&state.chain_origin, &run.events) {
        errors.push(Finding::new(
            "capstan_run_state.history_mismatch",
            "The carried run state's history head is not the bundle's history: export the run again.",
        ));
    }
    if state.tasks.values().any(|task| !task.is_ready()) {
        errors.push(Finding::new(
            "tasks.leased_task_present",
            "A workflow or activity task of the run is still leased on the source: stop its workers and let the lease lapse, then export again.",
        ));
    }
    let outside = [
        (!state.children.is_empty(), "open child workflows"),
        (state.parent.is_some(), "a parent workflow"),
        (
            !state.service_call_ids.is_empty() || !state.service_waits.is_empty(),
            "Nexus service calls",
        ),
        (
            state.probe_of.is_some() || state.standalone.is_some(),
            "a standalone activity or ledger probe",
        ),
        (!state.ledger.is_empty(), "recovery-ledger entries"),
        (!state.prepared_locals.is_empty(), "prepared local activities"),
        (state.integrity_incident.is_some(), "an open integrity incident"),
    ];
    for (_, feature) in outside.iter().filter(|(uses, _)| *uses) {
        errors.push(Finding::new(
            "workflow.open_feature_unsupported",
            format!("The open run has {feature}, whose other half is not in its bundle: let it close on its source, then import it."),
        ));
    }
    errors
}

/// The head of the source's hash chain over `events`, from `origin`.
fn source_head(origin: &str, events: &[ImportedEvent]) -> String {
    events.iter().fold(origin.to_string(), |head, copied| {
        copied.clone().at(copied.sequence, head).computed_hash()
    })
}

/// The history must be whole (sequences 1..=n), within the store's limit, and a closed run's
/// must end with the one event that closed it, agreeing with the bundle's status.
fn history_findings(run: &ImportedRun, history_events_max: usize) -> Vec<Finding> {
    let mut errors = Vec::new();
    if run.events.is_empty() {
        errors.push(Finding::new("history_events.empty", "The bundle carries no history events."));
        return errors;
    }
    if run.events.len() > history_events_max {
        errors.push(Finding::new(
            "history_events.limit_exceeded",
            format!(
                "The history has {} events; this server keeps at most {history_events_max} per run.",
                run.events.len()
            ),
        ));
    }
    if let Some((index, event)) = run.events.iter().enumerate().find(|(i, e)| e.sequence != *i as u64 + 1) {
        errors.push(Finding::new(
            "history_events.sequence_gap",
            format!(
                "History event {index} has sequence {}; an importable history is contiguous from 1.",
                event.sequence
            ),
        ));
    }
    let terminal_events = run.events.iter().filter(|e| e.event_type.is_run_terminal()).count();
    let last = closing_event(&run.events).expect("not empty");
    if run.status.is_terminal() {
        match closing_of(last.event_type) {
            None => errors.push(Finding::new(
                "workflow.terminal_event_missing",
                format!(
                    "The run is {} but its history ends with {}, not the event that closed it.",
                    run.status.as_str(),
                    last.event_type.as_str()
                ),
            )),
            Some((status, reason)) if status != run.status || run.closed_reason.is_some_and(|r| !reason_agrees(r, reason)) => {
                errors.push(Finding::new(
                    "workflow.status_mismatch",
                    format!(
                        "The bundle says {} ({}) but its history closes the run with {}.",
                        run.status.as_str(),
                        run.closed_reason.map_or("no closed_reason", ClosedReason::as_str),
                        last.event_type.as_str()
                    ),
                ))
            }
            Some(_) if terminal_events > 1 => errors.push(Finding::new(
                "history_events.terminal_event_repeated",
                "The history closes the run more than once.",
            )),
            Some(_) => {}
        }
    } else if terminal_events > 0 {
        errors.push(Finding::new(
            "workflow.status_mismatch",
            format!("The bundle says {} but its history closes the run.", run.status.as_str()),
        ));
    }
    errors
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(sequence: u64, event_type: EventType) -> ImportedEvent {
        ImportedEvent {
            id: EventId(format!("e{sequence}")),
            sequence,
            event_type,
            payload: Map::new(),
            workflow_task_id: None,
            workflow_command_id: None,
            recorded_at: 1_000 + sequence as i64,
        }
    }

    pub(crate) fn completed_run() -> ImportedRun {
        ImportedRun {
            namespace: "default".into(),
            workflow_id: WorkflowId("moved".into()),
            run_id: RunId("run-1".into()),
            run_number: 1,
            workflow_type: "Greeter".into(),
            task_queue: "q".into(),
            status: RunStatus::Completed,
            closed_reason: Some(ClosedReason::Completed),
            input: Payload::avro("AA=="),
            output: None,
            business_key: None,
            memo: Map::new(),
            search_attributes: Map::new(),
            compatibility: None,
            started_at: None,
            is_current_run: true,
            continued_from_run_id: None,
            events: vec![
                event(1, EventType::StartAccepted),
                event(2, EventType::WorkflowStarted),
                event(3, EventType::WorkflowCompleted),
            ],
            stamp: ImportStamp {
                source: IMPORT_SOURCE.into(),
                import_id: "imp".into(),
                dedupe_key: "run-1:3:x".into(),
                contract_version: CONTRACT_VERSION,
                imported_at: 5_000,
                source_runtime: "embedded".into(),
                bundle_checksum: "ab".repeat(32),
                source_namespace: None,
                imported_by: None,
            },
            carried_state: None,
            sections: OpenRunSections::default(),
        }
    }

    fn complete() -> InFlight {
        InFlight {
            history_complete: true,
            ..InFlight::default()
        }
    }

    fn rules(findings: Vec<Finding>) -> Vec<String> {
        findings.into_iter().map(|f| f.rule).collect()
    }

    #[test]
    fn a_whole_closed_history_is_eligible() {
        assert_eq!(eligibility(&completed_run(), &complete(), 100), vec![]);
    }

    #[test]
    fn each_contract_rule_is_named() {
        let run = completed_run();
        let in_flight = InFlight {
            history_complete: false,
            leased_tasks: 1,
            running_attempts: 2,
            redacted_paths: vec!["payloads.arguments".into()],
        };
        assert_eq!(
            rules(eligibility(&run, &in_flight, 100)),
            [
                "bundle.redacted_payloads",
                "tasks.leased_task_present",
                "activities.running_attempt_present",
                "workflow.terminal_history_incomplete"
            ]
        );
        let mut foreign = completed_run();
        foreign.stamp.source_runtime = "v1".into();
        assert_eq!(
            rules(eligibility(&foreign, &complete(), 100)),
            ["workflow.source_runtime_unsupported"]
        );
        assert_eq!(rules(eligibility(&run, &complete(), 2)), ["history_events.limit_exceeded"]);
    }

    #[test]
    fn an_archived_closed_history_is_eligible_and_imports_archived() {
        let mut archived = completed_run();
        archived.events.push(event(4, EventType::ArchiveRequested));
        archived.events.push(event(5, EventType::WorkflowArchived));
        assert_eq!(eligibility(&archived, &complete(), 100), vec![]);
        let limits = crate::Limits::default();
        let mut ids = crate::SequentialIds::new("id");
        let mut cx = crate::Cx::new(6_000, &mut ids, &limits);
        let run = crate::import_run(&mut cx, archived, &complete()).expect("imports");
        assert_eq!((run.status, run.archived, run.closed_at), (RunStatus::Completed, true, Some(1_003)));
        // Archive bookkeeping does not stand in for the closing event.
        let mut unclosed = completed_run();
        unclosed.events[2] = event(3, EventType::WorkflowArchived);
        assert_eq!(rules(eligibility(&unclosed, &complete(), 100)), ["workflow.terminal_event_missing"]);
    }

    #[test]
    fn an_open_run_must_be_current() {
        let mut open = completed_run();
        open.status = RunStatus::Waiting;
        open.closed_reason = None;
        open.events.pop();
        assert!(eligibility(&open, &complete(), 100).is_empty());
        open.is_current_run = false;
        assert_eq!(rules(eligibility(&open, &complete(), 100)), ["workflow.non_terminal_not_current"]);
    }

    #[test]
    fn the_history_must_agree_with_the_status_and_be_whole() {
        let mut gap = completed_run();
        gap.events[1].sequence = 7;
        assert_eq!(rules(eligibility(&gap, &complete(), 100)), ["history_events.sequence_gap"]);
        let mut unclosed = completed_run();
        unclosed.events.pop();
        assert_eq!(rules(eligibility(&unclosed, &complete(), 100)), ["workflow.terminal_event_missing"]);
        let mut wrong = completed_run();
        wrong.status = RunStatus::Failed;
        wrong.closed_reason = None;
        assert_eq!(rules(eligibility(&wrong, &complete(), 100)), ["workflow.status_mismatch"]);
        let mut twice = completed_run();
        twice.events.insert(2, event(3, EventType::WorkflowFailed));
        twice.events[3].sequence = 4;
        assert_eq!(
            rules(eligibility(&twice, &complete(), 100)),
            ["history_events.terminal_event_repeated"]
        );
        let mut host_timed_out = completed_run();
        host_timed_out.status = RunStatus::Failed;
        host_timed_out.closed_reason = Some(ClosedReason::TimedOut);
        host_timed_out.events[2].event_type = EventType::WorkflowFailed;
        assert_eq!(
            eligibility(&host_timed_out, &complete(), 100),
            vec![],
            "a host run's timeout closes with WorkflowFailed"
        );
        let mut empty = completed_run();
        empty.events.clear();
        assert_eq!(rules(eligibility(&empty, &complete(), 100)), ["history_events.empty"]);
    }
}
