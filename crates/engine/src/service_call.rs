//! Nexus service calls: a workflow's `start_service_operation` command, the catalog route it
//! resolves to, the call the store keeps, and the rows the caller's history records
//! (`ServiceCallStarted`, and for a `sync` call waiting for completion one terminal row at the
//! same sequence when the linked run closes). The contract is `docs/sdk-notes/nexus.md`.
//!
//! The catalog and the calls already made under a key are read before the transition (the
//! engine does no IO) into a [`ServiceDirectory`]; the store's unique key on calls catches a
//! concurrent admission of the same key, and the completion is then applied again.

use crate::ids::{RunId, WorkflowId};
use crate::payload::Payload;
use crate::status::{ClosedReason, RunStatus};
use crate::{Millis, StepTags, TraceContext, WorkflowFailure};
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;

/// How long the caller waits: `sync` calls may wait for the operation's completion.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CallMode {
    Sync,
    Async,
}

impl CallMode {
    pub fn parse(text: &str) -> Option<Self> {
        match text.trim().to_ascii_lowercase().as_str() {
            "sync" => Some(Self::Sync),
            "async" => Some(Self::Async),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Sync => "sync",
            Self::Async => "async",
        }
    }
}

/// What the caller waits for: the operation's admission or its completion.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WaitFor {
    Accepted,
    Completed,
}

impl WaitFor {
    pub fn parse(text: &str) -> Option<Self> {
        match text.trim().to_ascii_lowercase().as_str() {
            "accepted" => Some(Self::Accepted),
            "completed" => Some(Self::Completed),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Accepted => "accepted",
            Self::Completed => "completed",
        }
    }
}

/// `start_service_operation` as a workflow sent it. Every field is honoured or recorded on the
/// call (its `service_call` surface); `request_payload` is kept exactly as sent (the Rust SDK
/// compares it on replay), `input` is the same payload as the linked run's arguments.
#[derive(Clone, Debug, PartialEq)]
pub struct ServiceOperation {
    pub endpoint_name: String,
    pub service_name: String,
    pub operation_name: String,
    pub request_payload: Value,
    pub input: Payload,
    pub payload_codec: Option<String>,
    pub metadata: Map<String, Value>,
    pub target_namespace: Option<String>,
    pub caller_namespace: Option<String>,
    pub idempotency_key: Option<String>,
    pub mode: Option<CallMode>,
    pub wait_for: Option<WaitFor>,
    pub wait_timeout_seconds: Option<i64>,
    /// The optional string fields (`target_workflow_instance_id`, `target_workflow_run_id`,
    /// `connection`, `queue`, `business_key`, `duplicate_start_policy`), by name.
    pub options: BTreeMap<String, String>,
    /// `labels`, `memo`, `search_attributes`, by name.
    pub objects: BTreeMap<String, Map<String, Value>>,
    pub tags: StepTags,
    /// The caller task's trace context: the linked run's origin.
    pub observability_context: Option<TraceContext>,
}

impl ServiceOperation {
    pub fn option(&self, name: &str) -> Option<&str> {
        self.options.get(name).map(String::as_str)
    }

    pub fn object(&self, name: &str) -> Option<&Map<String, Value>> {
        self.objects.get(name)
    }
}

/// Who makes a call: a workflow run (its step's command), or a client of the execute route
/// (no run; its ids, if it gives them, are recorded).
#[derive(Clone, Debug, PartialEq)]
pub struct Caller {
    pub namespace: String,
    pub workflow_id: Option<WorkflowId>,
    pub run_id: Option<RunId>,
    /// The linked run's origin trace context.
    pub origin_trace: Option<TraceContext>,
}

/// A catalog address: the target namespace and the three names, lower-cased as the catalog
/// stores them.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RouteKey {
    pub namespace: String,
    pub endpoint: String,
    pub service: String,
    pub operation: String,
}

impl RouteKey {
    pub fn new(namespace: &str, endpoint: &str, service: &str, operation: &str) -> Self {
        Self {
            namespace: namespace.to_string(),
            endpoint: endpoint.to_ascii_lowercase(),
            service: service.to_ascii_lowercase(),
            operation: operation.to_ascii_lowercase(),
        }
    }
}

/// The catalog level a lookup missed at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CatalogLevel {
    Endpoint,
    Service,
    Operation,
}

impl CatalogLevel {
    /// The reason DW gives for the miss.
    pub fn reason(self) -> &'static str {
        match self {
            Self::Endpoint => "endpoint_not_found",
            Self::Service => "service_not_found",
            Self::Operation => "operation_not_found",
        }
    }
}

/// What a catalog operation's handler binding resolves to.
#[derive(Clone, Debug, PartialEq)]
pub enum ServiceRoute {
    /// No such endpoint, service or operation in the target namespace.
    Missing(CatalogLevel),
    /// A `start_workflow` binding: the call starts a run in the target namespace.
    StartWorkflow(Box<StartWorkflowBinding>),
    /// A binding kind this server records but does not dispatch: the call fails as
    /// `handler_unavailable`, never silently accepted.
    Unserved {
        binding_kind: String,
        operation_mode: Option<CallMode>,
    },
}

/// A `start_workflow` binding, read from the operation's catalog row.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StartWorkflowBinding {
    pub workflow_type: String,
    pub workflow_instance_id: Option<String>,
    pub queue: Option<String>,
    pub operation_mode: Option<CallMode>,
    pub target_reference: Option<String>,
    pub duplicate_start_policy: Option<String>,
    pub business_key: Option<String>,
    pub execution_timeout_seconds: Option<i64>,
    pub run_timeout_seconds: Option<i64>,
    pub memo: Option<Map<String, Value>>,
    pub search_attributes: Option<Map<String, Value>>,
}

/// An instance a binding names, as it stood when the completion arrived.
#[derive(Clone, Debug, PartialEq)]
pub struct KnownInstance {
    pub run_id: RunId,
    pub open: bool,
}

/// Everything a completion's service calls need read first.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ServiceDirectory {
    pub routes: BTreeMap<RouteKey, ServiceRoute>,
    /// Calls already admitted, by route and idempotency key.
    pub calls: BTreeMap<(RouteKey, String), ServiceCallRecord>,
    /// Instances named by bindings (`workflow_instance_id`), if they exist.
    pub instances: BTreeMap<String, KnownInstance>,
    /// Per route: why the caller's search attributes cannot be applied in the target namespace.
    pub attribute_problems: BTreeMap<RouteKey, String>,
}

/// Terminal and open call statuses (DW's `status`).
pub const STATUS_STARTED: &str = "started";
pub const STATUS_COMPLETED: &str = "completed";
pub const STATUS_FAILED: &str = "failed";
pub const STATUS_CANCELLED: &str = "cancelled";

/// One admitted call, as the store keeps it (`service_calls`): its identity and the `surface`
/// (the `service_call` object history and the client routes show).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ServiceCallRecord {
    pub service_call_id: String,
    pub route: (String, String, String, String),
    pub idempotency_key: String,
    pub caller_namespace: String,
    pub caller_workflow_id: Option<WorkflowId>,
    pub caller_run_id: Option<RunId>,
    pub linked_workflow_id: Option<WorkflowId>,
    pub linked_run_id: Option<RunId>,
    pub status: String,
    pub created_at: Millis,
    pub updated_at: Millis,
    pub surface: Map<String, Value>,
    /// The linked run's result once it completed (kept for callers that ask later).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response: Option<Payload>,
}

impl ServiceCallRecord {
    pub fn route_key(&self) -> RouteKey {
        let (namespace, endpoint, service, operation) = self.route.clone();
        RouteKey {
            namespace,
            endpoint,
            service,
            operation,
        }
    }

    pub fn is_terminal(&self) -> bool {
        matches!(self.status.as_str(), STATUS_COMPLETED | STATUS_FAILED | STATUS_CANCELLED)
    }
}

/// A caller step waiting for a call's completion (a `sync` call with `wait_for: completed`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceWaiter {
    pub service_call_id: String,
    pub caller_run_id: RunId,
    pub sequence: u32,
}

/// A caller's open wait, kept in its run document: the Started row's payload, from which the
/// terminal row is built (same ids, names, mode and wait policy).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CallWait {
    pub service_call_id: String,
    pub started: Map<String, Value>,
}

/// A run linked to service calls closed (not continued): the calls settle, in the same
/// transaction.
#[derive(Clone, Debug, PartialEq)]
pub struct LinkedRunClosed {
    pub service_call_ids: Vec<String>,
    pub workflow_id: WorkflowId,
    pub run_id: RunId,
    pub status: RunStatus,
    pub closed_reason: Option<ClosedReason>,
    pub output: Option<Payload>,
    pub failure: Option<WorkflowFailure>,
    pub closed_at: Millis,
}

impl LinkedRunClosed {
    /// The call's terminal status and outcome for the run's end.
    pub fn call_status(&self) -> (&'static str, &'static str) {
        match self.closed_reason {
            Some(ClosedReason::Completed) => (STATUS_COMPLETED, "completed"),
            Some(ClosedReason::Cancelled) => (STATUS_CANCELLED, "cancelled"),
            Some(ClosedReason::TimedOut) => (STATUS_FAILED, "timed_out"),
            _ => (STATUS_FAILED, "handler_failed"),
        }
    }

    /// The error a caller observes for a run that did not complete: its failure's type, else
    /// what ended it.
    pub fn error(&self) -> (String, String) {
        let failure = self.failure.clone().unwrap_or_default();
        let fallback = match self.closed_reason {
            Some(ClosedReason::Cancelled) => "service_call_cancelled",
            Some(ClosedReason::Terminated) => "linked_workflow_terminated",
            Some(ClosedReason::TimedOut) => "linked_workflow_timed_out",
            _ => "service_operation_failed",
        };
        let error_type = failure
            .exception_type
            .clone()
            .filter(|t| !t.is_empty())
            .unwrap_or_else(|| fallback.to_string());
        let message = Some(failure.message)
            .filter(|m| !m.is_empty())
            .unwrap_or_else(|| format!("The linked workflow run {} {}.", self.run_id, closed_words(self.closed_reason)));
        (error_type, message)
    }
}

fn closed_words(reason: Option<ClosedReason>) -> &'static str {
    match reason {
        Some(ClosedReason::Cancelled) => "was cancelled",
        Some(ClosedReason::Terminated) => "was terminated",
        Some(ClosedReason::TimedOut) => "timed out",
        _ => "failed",
    }
}

/// The error fields of a failed or cancelled row, where both SDKs read them: top-level
/// `exception_type`/`message` (and DW's `exception` object), the surface's error types.
pub fn error_fields(row: &mut Map<String, Value>, status: &str, error_type: &str, message: &str) {
    row.insert("exception_type".into(), json!(error_type));
    row.insert("exception_class".into(), json!(error_type));
    row.insert("message".into(), json!(message));
    row.insert(
        "exception".into(),
        json!({"class": error_type, "type": error_type, "message": message}),
    );
    if let Some(Value::Object(surface)) = row.get_mut("service_call") {
        surface.insert("status".into(), json!(status));
        surface.insert("failure_message".into(), json!(message));
        surface.insert("caller_observed_error_type".into(), json!(error_type));
        if status == STATUS_FAILED {
            surface.insert("service_error_type".into(), json!(error_type));
            surface.insert("error_type".into(), json!(error_type));
        }
    }
}
