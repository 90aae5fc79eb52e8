//! Standalone activities (`Client.start_activity`): an activity a client starts by itself, on a
//! host run of its own (see `capstan_engine::standalone`).

use crate::control::valid_workflow_id;
use crate::{AppError, AppResult, Services};
use capstan_engine::*;
use capstan_store::prelude::*;

/// A client's start of a standalone activity.
#[derive(Clone, Debug)]
pub struct StartActivityRequest {
    pub namespace: String,
    /// `None`: the server picks one.
    pub activity_id: Option<String>,
    pub activity_type: String,
    /// `None`: the activity type.
    pub activity_class: Option<String>,
    pub task_queue: String,
    pub input: Payload,
    pub business_key: Option<String>,
    /// `None`: one attempt.
    pub retry_policy: Option<RetryPolicy>,
    pub timeouts: ActivityTimeouts,
    /// Who starts it, as the server authenticated them: recorded on the start's events.
    pub principal: Option<Principal>,
}

/// Starts the activity on a new host run: its task is ready at once on `task_queue`.
pub async fn start_activity<V: Services>(services: &V, request: StartActivityRequest) -> AppResult<RunState> {
    if request.activity_id.as_deref().is_some_and(|id| !valid_workflow_id(id)) {
        return Err(AppError::invalid(
            "activity_id",
            "The activity_id may only contain letters, digits, '.', '_', ':' and '-' (1 to 128).",
        ));
    }
    let activity_class = request
        .activity_class
        .filter(|c| !c.is_empty())
        .unwrap_or_else(|| request.activity_type.clone());
    let host = StartRun {
        scheduling: Default::default(),
        namespace: request.namespace,
        workflow_id: WorkflowId(request.activity_id.unwrap_or_else(|| services.new_id())),
        run_id: RunId(services.new_id()),
        workflow_type: STANDALONE_ACTIVITY_TYPE.to_string(),
        task_queue: request.task_queue,
        input: request.input,
        execution_timeout_seconds: None,
        run_timeout_seconds: None,
        business_key: request.business_key,
        memo: Default::default(),
        search_attributes: Default::default(),
        command_id: CommandId(services.new_id()),
        contract: None,
        compatibility: None,
        origin_trace: None,
        principal: request.principal,
    };
    let start = StartStandaloneActivity {
        run: host,
        activity_type: request.activity_type,
        activity_class,
        retry_policy: request.retry_policy,
        timeouts: request.timeouts,
    };
    Ok(services.store().start_standalone_activity(start, services.now()).await?)
}
