//! Refusals: the engine's "no", each with a stable DW reason code.
//!
//! A refused transition changes nothing: the store rolls back and the HTTP layer maps the
//! reason to a status code and an error body. `docs/errors.md` explains every reason.

use serde_json::{Map, Value};
use std::fmt;

/// Stable machine reasons (the DW `reason` field).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    TaskNotFound,
    TaskNotLeased,
    LeaseOwnerMismatch,
    WorkflowTaskAttemptMismatch,
    LeaseExpired,
    RunClosed,
    AttemptNotFound,
    AttemptClosed,
    TaskMismatch,
    ActivityNotRunning,
    RunCancelled,
    RunTerminated,
    RunNotActive,
    RunNotCurrent,
    InvalidCommands,
    StructuralLimitExceeded,
    RequestIdConflict,
    UnsupportedPayloadCodec,
    PayloadTooLarge,
    InstanceNotFound,
    RunNotFound,
    InstanceAlreadyStarted,
    WorkflowIdReservedInNamespace,
    WorkflowDefinitionChanged,
    WorkerNotRegistered,
    TaskQueueMismatch,
    BuildIdMismatch,
    NamespaceNotFound,
    InvalidPageToken,
    HistoryNotAvailable,
    StaleFence,
    QueryTaskNotFound,
    QueryTaskNotLeased,
    QueryTaskAttemptMismatch,
    RunNotClosed,
    RunTimedOut,
    UnknownSignal,
    UpdateRejected,
    StaleValidation,
    CancellationRequestMismatch,
    CancellationDeliveryMismatch,
    CancellationDeliverySequenceMismatch,
    CancellationDeliveryShapeMismatch,
    CancellationDeliveryNotEligible,
    InvalidCancellationDelivery,
    OutcomeUnknownRequiresResolution,
    LedgerEntryNotFound,
    LedgerEntryNotUnknown,
    IntegrityIncidentOpen,
    IntegrityChainBroken,
    IntegrityIncidentNotFound,
    NamespaceAlreadyExists,
    NamespaceNotEmpty,
    ScheduleNotFound,
    ScheduleAlreadyExists,
    SearchAttributeAlreadyExists,
    /// The database failed and the change was not applied: the one retryable storage answer.
    StorageUnavailable,
    /// A uniqueness constraint refused a write no rule turned into a refusal of its own.
    StorageConflict,
    /// A stored record (not a run document) does not parse: retrying cannot help.
    StoredRecordCorrupt,
    /// A run document does not parse, or was written by a newer build.
    RunDocumentCorrupt,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::TaskNotFound => "task_not_found",
            Reason::TaskNotLeased => "task_not_leased",
            Reason::LeaseOwnerMismatch => "lease_owner_mismatch",
            Reason::WorkflowTaskAttemptMismatch => "workflow_task_attempt_mismatch",
            Reason::LeaseExpired => "lease_expired",
            Reason::RunClosed => "run_closed",
            Reason::AttemptNotFound => "attempt_not_found",
            Reason::AttemptClosed => "attempt_closed",
            Reason::TaskMismatch => "task_mismatch",
            Reason::ActivityNotRunning => "activity_not_running",
            Reason::RunCancelled => "run_cancelled",
            Reason::RunTerminated => "run_terminated",
            Reason::RunNotActive => "run_not_active",
            Reason::RunNotCurrent => "run_not_current",
            Reason::InvalidCommands => "invalid_commands",
            Reason::StructuralLimitExceeded => "structural_limit_exceeded",
            Reason::RequestIdConflict => "request_id_conflict",
            Reason::UnsupportedPayloadCodec => "unsupported_payload_codec",
            Reason::PayloadTooLarge => "payload_too_large",
            Reason::InstanceNotFound => "instance_not_found",
            Reason::RunNotFound => "run_not_found",
            Reason::InstanceAlreadyStarted => "instance_already_started",
            Reason::WorkflowIdReservedInNamespace => "workflow_id_reserved_in_namespace",
            Reason::WorkflowDefinitionChanged => "workflow_definition_changed",
            Reason::WorkerNotRegistered => "worker_not_registered",
            Reason::TaskQueueMismatch => "task_queue_mismatch",
            Reason::BuildIdMismatch => "build_id_mismatch",
            Reason::NamespaceNotFound => "namespace_not_found",
            Reason::InvalidPageToken => "invalid_page_token",
            Reason::HistoryNotAvailable => "history_not_available",
            Reason::StaleFence => "stale_fence",
            Reason::QueryTaskNotFound => "query_task_not_found",
            Reason::QueryTaskNotLeased => "query_task_not_leased",
            Reason::QueryTaskAttemptMismatch => "query_task_attempt_mismatch",
            Reason::RunNotClosed => "run_not_closed",
            Reason::RunTimedOut => "run_timed_out",
            Reason::UnknownSignal => "unknown_signal",
            Reason::UpdateRejected => "update_rejected",
            Reason::StaleValidation => "stale_update_validation_completion",
            Reason::CancellationRequestMismatch => "cancellation_request_mismatch",
            Reason::CancellationDeliveryMismatch => "cancellation_delivery_mismatch",
            Reason::CancellationDeliverySequenceMismatch => "cancellation_delivery_sequence_mismatch",
            Reason::CancellationDeliveryShapeMismatch => "cancellation_delivery_shape_mismatch",
            Reason::CancellationDeliveryNotEligible => "cancellation_delivery_not_eligible",
            Reason::InvalidCancellationDelivery => "invalid_cancellation_delivery",
            Reason::OutcomeUnknownRequiresResolution => "outcome_unknown_requires_resolution",
            Reason::LedgerEntryNotFound => "ledger_entry_not_found",
            Reason::LedgerEntryNotUnknown => "ledger_entry_not_unknown",
            Reason::IntegrityIncidentOpen => "integrity_incident_open",
            Reason::IntegrityChainBroken => "integrity_chain_broken",
            Reason::IntegrityIncidentNotFound => "integrity_incident_not_found",
            Reason::NamespaceAlreadyExists => "namespace_already_exists",
            Reason::ScheduleNotFound => "schedule_not_found",
            Reason::ScheduleAlreadyExists => "schedule_already_exists",
            Reason::SearchAttributeAlreadyExists => "search_attribute_already_exists",
            Reason::StorageUnavailable => "storage_unavailable",
            Reason::StorageConflict => "storage_conflict",
            Reason::StoredRecordCorrupt => "stored_record_corrupt",
            Reason::RunDocumentCorrupt => "run_document_corrupt",
            Reason::NamespaceNotEmpty => "namespace_not_empty",
        }
    }
}

/// A refused transition: the reason, a human message, and extra body fields the SDKs read.
#[derive(Clone, Debug, PartialEq)]
pub struct Refusal {
    pub reason: Reason,
    pub message: String,
    pub details: Map<String, Value>,
}

impl Refusal {
    pub fn new(reason: Reason, message: impl Into<String>) -> Self {
        Self {
            reason,
            message: message.into(),
            details: Map::new(),
        }
    }

    pub fn with(mut self, key: &str, value: impl Into<Value>) -> Self {
        self.details.insert(key.to_string(), value.into());
        self
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.reason.as_str(), self.message)
    }
}

impl std::error::Error for Refusal {}
