//! The control plane's commands: start, signal, cancel/terminate, repair and archive.
//!
//! A command may carry a client `request_id`: it is then idempotent per (workflow, command
//! type, request id). A retry with the same intent is answered from the receipt stored with
//! the first application (`retained`); another intent under the same id is refused.

use crate::contracts;
use crate::search_attributes;
use crate::{AppError, AppResult, Services};
use capstan_engine::*;
use capstan_store::prelude::*;
use capstan_store::{intent_hash, CommandKey, DuplicatePolicy, KeyedReceipt, RunLocator, StartOutcome};
use serde_json::{json, Map, Value};

pub const MEMO_BYTES_MAX: usize = 262_144;

/// A client's start of a workflow.
#[derive(Clone, Debug)]
pub struct StartRequest {
    pub namespace: String,
    /// `None`: the server picks one.
    pub workflow_id: Option<String>,
    pub workflow_type: String,
    pub task_queue: String,
    pub input: Payload,
    pub execution_timeout_seconds: Option<i64>,
    pub run_timeout_seconds: Option<i64>,
    pub business_key: Option<String>,
    pub memo: Map<String, Value>,
    pub search_attributes: Map<String, Value>,
    /// The build the run is pinned to; `None`: the queue's promoted build, if any.
    pub build_id: Option<String>,
    pub duplicate_policy: DuplicatePolicy,
    /// The caller's trace context (the run's origin).
    pub origin_trace: Option<TraceContext>,
    /// Who starts it, as the server authenticated them: recorded on the start's events.
    pub principal: Option<Principal>,
    /// Its tasks' priority and fairness class, as asked (checked by [`scheduling`]).
    pub priority: Option<i64>,
    pub fairness_key: Option<String>,
    pub fairness_weight: Option<i64>,
}

pub struct Started {
    pub outcome: StartOutcome,
    pub run: RunState,
}

/// A workflow id a client may choose: 1 to 128 letters, digits, `.`, `_`, `:` and `-`.
pub fn valid_workflow_id(id: &str) -> bool {
    capstan_engine::ids::valid_client_name(id, 128)
}

/// Starts a run: the request's bounds, its search attributes against the namespace's schema,
/// the command contract the newest worker registration declares, and the queue's promoted
/// build when the request names none.
pub async fn start<V: Services>(services: &V, request: StartRequest) -> AppResult<Started> {
    if request.workflow_id.as_deref().is_some_and(|id| !valid_workflow_id(id)) {
        return Err(AppError::invalid(
            "workflow_id",
            "The workflow_id may only contain letters, digits, '.', '_', ':' and '-'.",
        ));
    }
    if let (Some(run), Some(execution)) = (request.run_timeout_seconds, request.execution_timeout_seconds) {
        if run > execution {
            return Err(AppError::invalid(
                "run_timeout_seconds",
                "run_timeout_seconds must not exceed execution_timeout_seconds.",
            ));
        }
    }
    if serde_json::to_string(&request.memo).map(|s| s.len()).unwrap_or(0) > MEMO_BYTES_MAX {
        return Err(AppError::invalid(
            "memo",
            format!("The memo must be at most {MEMO_BYTES_MAX} bytes of JSON."),
        ));
    }
    search_attributes::check_bounds("search_attributes", &request.search_attributes)?;
    let scheduling = scheduling(request.priority, request.fairness_key.as_deref(), request.fairness_weight)?;
    let namespace = request.namespace;
    search_attributes::check_defined(services, &namespace, "search_attributes", &request.search_attributes).await?;
    let contract = contracts::registered(services.store(), &namespace, &request.task_queue, &request.workflow_type).await?;
    let compatibility = match request.build_id.filter(|b| !b.is_empty()) {
        Some(build) => Some(build),
        None => promoted_build(services, &namespace, &request.task_queue).await?,
    };
    let start = StartRun {
        scheduling,
        workflow_id: WorkflowId(request.workflow_id.unwrap_or_else(|| services.new_id())),
        run_id: RunId(services.new_id()),
        command_id: CommandId(services.new_id()),
        namespace,
        workflow_type: request.workflow_type,
        task_queue: request.task_queue,
        input: request.input,
        execution_timeout_seconds: request.execution_timeout_seconds,
        run_timeout_seconds: request.run_timeout_seconds,
        business_key: request.business_key,
        memo: request.memo,
        search_attributes: request.search_attributes,
        contract,
        compatibility,
        origin_trace: request.origin_trace,
        principal: request.principal,
    };
    let (outcome, run) = services
        .store()
        .start_workflow(start, request.duplicate_policy, services.now())
        .await?;
    Ok(Started { outcome, run })
}

/// A start's priority and fairness class: each field as DW's contract bounds it, the key
/// trimmed and lowercased; what is not asked for takes the contract's default.
pub fn scheduling(priority: Option<i64>, fairness_key: Option<&str>, fairness_weight: Option<i64>) -> AppResult<TaskScheduling> {
    use capstan_engine::scheduling as contract;
    let defaults = TaskScheduling::default();
    Ok(TaskScheduling {
        priority: match priority {
            Some(asked) => contract::priority(asked).map_err(|message| AppError::invalid("priority", message))?,
            None => defaults.priority,
        },
        fairness_key: match fairness_key {
            Some(asked) => contract::fairness_key(asked).map_err(|message| AppError::invalid("fairness_key", message))?,
            None => None,
        },
        fairness_weight: match fairness_weight {
            Some(asked) => contract::fairness_weight(asked).map_err(|message| AppError::invalid("fairness_weight", message))?,
            None => defaults.fairness_weight,
        },
    })
}

/// The build a queue's newest promotion named, if any.
pub async fn promoted_build<V: Services>(services: &V, namespace: &str, queue: &str) -> AppResult<Option<String>> {
    Ok(services
        .rollouts(namespace, queue)
        .await?
        .into_iter()
        .filter(|r| r.promoted_at.is_some())
        .max_by_key(|r| r.promoted_at)
        .and_then(|r| r.build_id))
}

/// Which run a command is for: the current run, or a named run that must still be current.
#[derive(Clone, Debug)]
pub struct Target {
    pub namespace: String,
    pub workflow_id: String,
    pub run_id: Option<String>,
}

impl Target {
    pub(crate) fn locator(&self) -> RunLocator {
        RunLocator::Current(WorkflowId(self.workflow_id.clone()))
    }
}

/// Refuses a command on a run that is not the one it names.
pub fn check_target(run: &RunState, wanted: Option<&str>) -> Result<(), Refusal> {
    match wanted {
        Some(run_id) if run_id != run.run_id.as_str() => Err(Refusal::new(
            Reason::RunNotCurrent,
            "The targeted run is not the current run of this workflow.",
        )
        .with("run_id", run_id)
        .with("current_run_id", run.run_id.as_str())),
        _ => Ok(()),
    }
}

/// An applied command: its rendered receipt, and whether it came from a stored receipt
/// (`retained`: an earlier request with the same id applied it; `run` is then `None`).
pub struct Receipt {
    pub body: Value,
    pub retained: bool,
    pub run: Option<RunState>,
}

/// Applies a command's transition to the run at `locator`; with a `key` it is idempotent (see
/// the module docs). `render` makes the receipt body, which a keyed command stores.
pub async fn apply<V, T, F, R>(
    services: &V,
    namespace: &str,
    locator: RunLocator,
    key: Option<CommandKey>,
    transition: F,
    render: R,
) -> AppResult<Receipt>
where
    V: Services,
    T: Send + 'static,
    F: FnOnce(&mut RunState, &mut Cx) -> Result<T, Refusal> + Send + 'static,
    R: Fn(&T, &RunState) -> Value + Clone + Send + 'static,
{
    let now = services.now();
    let store = services.store();
    match key {
        Some(key) => match store
            .mutate_run_keyed(namespace, locator, key, now, transition, render.clone())
            .await?
        {
            (KeyedReceipt::Retained(mut body), _) => {
                // An object body says so itself; another (a batch's `true`) is told by `retained`.
                if let Some(fields) = body.as_object_mut() {
                    fields.insert("retained".into(), json!(true));
                }
                Ok(Receipt {
                    body,
                    retained: true,
                    run: None,
                })
            }
            (KeyedReceipt::Fresh(value), run) => {
                let run = run.expect("fresh receipts come with the run");
                Ok(Receipt {
                    body: render(&value, &run),
                    retained: false,
                    run: Some(run),
                })
            }
        },
        None => {
            let (value, run) = store.mutate_run(namespace, locator, now, transition).await?;
            Ok(Receipt {
                body: render(&value, &run),
                retained: false,
                run: Some(run),
            })
        }
    }
}

pub(crate) fn keyed(command_type: &str, request_id: Option<String>, intent: &[&str]) -> Option<CommandKey> {
    request_id.filter(|r| !r.is_empty()).map(|request_id| CommandKey {
        command_type: command_type.into(),
        intent_hash: intent_hash(intent),
        request_id,
    })
}

pub struct SignalRequest {
    pub target: Target,
    pub signal_name: String,
    pub input: Payload,
    pub request_id: Option<String>,
    /// The caller's trace context, recorded on `SignalReceived` (not part of the intent: a
    /// retry from another span is the same signal).
    pub trace: Option<TraceContext>,
    /// Who signals, as the server authenticated them: recorded on `SignalReceived`.
    pub principal: Option<Principal>,
}

/// Delivers a signal, if the run's contract declares it (or declares nothing).
pub async fn signal<V, R>(services: &V, request: SignalRequest, render: R) -> AppResult<Receipt>
where
    V: Services,
    R: Fn(&CommandReceipt, &RunState) -> Value + Clone + Send + 'static,
{
    let SignalRequest {
        target,
        signal_name,
        input,
        request_id,
        trace,
        principal,
    } = request;
    if signal_name.is_empty() || signal_name.len() > 255 {
        return Err(AppError::invalid("signal_name", "The signal name must be 1 to 255 characters."));
    }
    if signal_name == MESSAGE_STREAM_SIGNAL {
        return Err(Refusal::new(
            Reason::RuntimeReservedSignal,
            "This signal name is reserved for message-stream deliveries; append to the stream instead.",
        )
        .with("signal_name", signal_name)
        .into());
    }
    let locator = target.locator();
    let key = keyed(
        "signal",
        request_id,
        &[&signal_name, &input.codec, input.identity(), target.run_id.as_deref().unwrap_or("")],
    );
    let fallback = contracts::fallback_for(services.store(), &target.namespace, &locator).await?;
    let command_id = CommandId(services.new_id());
    let wanted = target.run_id.clone();
    let transition = move |run: &mut RunState, cx: &mut Cx| {
        cx.serve(RequestContext::traced(principal, trace));
        check_target(run, wanted.as_deref())?;
        admit_signal(run, &signal_name, fallback.for_run(run))?;
        capstan_engine::signal(run, cx, &signal_name, input, command_id)
    };
    apply(services, &target.namespace, locator, key, transition, render).await
}

pub struct CloseRequest {
    pub target: Target,
    pub kind: CloseCommand,
    pub reason: Option<String>,
    pub request_id: Option<String>,
    /// The caller's trace context, recorded on the request event.
    pub trace: Option<TraceContext>,
    /// Who asks, as the server authenticated them: recorded on the events the close causes.
    pub principal: Option<Principal>,
}

impl CloseRequest {
    pub fn operation(&self) -> &'static str {
        match self.kind {
            CloseCommand::Cancel => "cancel",
            CloseCommand::Terminate => "terminate",
        }
    }
}

/// Cancels or terminates a run: its children follow their parent-close policy, its open calls
/// end, a dispatched declared action becomes `outcome_unknown`.
pub async fn close<V, R>(services: &V, request: CloseRequest, render: R) -> AppResult<Receipt>
where
    V: Services,
    R: Fn(&CommandReceipt, &RunState) -> Value + Clone + Send + 'static,
{
    let locator = request.target.locator();
    let key = keyed(
        request.operation(),
        request.request_id.clone(),
        &[
            request.reason.as_deref().unwrap_or(""),
            request.target.run_id.as_deref().unwrap_or(""),
        ],
    );
    let command_id = CommandId(services.new_id());
    let CloseRequest {
        target,
        kind,
        reason,
        trace,
        principal,
        ..
    } = request;
    let wanted = target.run_id.clone();
    let transition = move |run: &mut RunState, cx: &mut Cx| {
        cx.serve(RequestContext::traced(principal, trace));
        check_target(run, wanted.as_deref())?;
        close_by_command(run, cx, kind, reason, command_id)
    };
    apply(services, &target.namespace, locator, key, transition, render).await
}

/// Offers a stuck run's workflow task again (see `capstan_engine::repair`).
pub async fn repair<V, R>(
    services: &V,
    target: Target,
    request_id: Option<String>,
    principal: Option<Principal>,
    render: R,
) -> AppResult<Receipt>
where
    V: Services,
    R: Fn(&RepairOutcome, &RunState) -> Value + Clone + Send + 'static,
{
    let key = keyed("repair", request_id, &["repair"]);
    let command_id = CommandId(services.new_id());
    let transition = move |run: &mut RunState, cx: &mut Cx| {
        cx.serve(RequestContext::acting_for(principal));
        capstan_engine::repair(run, cx, command_id)
    };
    apply(services, &target.namespace, target.locator(), key, transition, render).await
}

/// Archives the closed current run (read-only from then on); `(archived, receipt)`.
pub async fn archive<V, R>(
    services: &V,
    target: Target,
    reason: Option<String>,
    request_id: Option<String>,
    principal: Option<Principal>,
    render: R,
) -> AppResult<Receipt>
where
    V: Services,
    R: Fn(&(bool, CommandReceipt), &RunState) -> Value + Clone + Send + 'static,
{
    let key = keyed("archive", request_id, &[reason.as_deref().unwrap_or("")]);
    let command_id = CommandId(services.new_id());
    let transition = move |run: &mut RunState, cx: &mut Cx| {
        cx.serve(RequestContext::acting_for(principal));
        capstan_engine::archive(run, cx, reason, command_id)
    };
    apply(services, &target.namespace, target.locator(), key, transition, render).await
}
