//! Refusals: the engine's "no", each with a stable DW reason code.
//!
//! A refused transition changes nothing: the store rolls back and the HTTP layer maps the
//! reason to a status code and an error body. `docs/errors.md` explains every reason.

use serde_json::{Map, Value};
use std::fmt;

/// Stable machine reasons (the DW `reason` field): the one catalogue of every reason Capstan
/// answers. `docs/errors.md` explains each (a test holds the two together).
macro_rules! reasons {
    ($($(#[$doc:meta])* $name:ident => $code:literal,)*) => {
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum Reason {
            $($(#[$doc])* $name,)*
        }

        impl Reason {
            /// Every reason, in catalogue order.
            pub const ALL: &'static [Reason] = &[$(Reason::$name,)*];

            pub fn as_str(self) -> &'static str {
                match self {
                    $(Reason::$name => $code,)*
                }
            }

            /// The reason a code names, if it is in the catalogue.
            pub fn parse(code: &str) -> Option<Reason> {
                Reason::ALL.iter().copied().find(|r| r.as_str() == code)
            }
        }
    };
}

reasons! {
    // Worker and run rules (the engine's refusals).
    TaskNotFound => "task_not_found",
    TaskNotLeased => "task_not_leased",
    LeaseOwnerMismatch => "lease_owner_mismatch",
    WorkflowTaskAttemptMismatch => "workflow_task_attempt_mismatch",
    LeaseExpired => "lease_expired",
    RunClosed => "run_closed",
    AttemptNotFound => "attempt_not_found",
    AttemptClosed => "attempt_closed",
    TaskMismatch => "task_mismatch",
    ActivityNotRunning => "activity_not_running",
    RunCancelled => "run_cancelled",
    RunTerminated => "run_terminated",
    RunNotActive => "run_not_active",
    RunNotCurrent => "run_not_current",
    InvalidCommands => "invalid_commands",
    StructuralLimitExceeded => "structural_limit_exceeded",
    RequestIdConflict => "request_id_conflict",
    UnsupportedPayloadCodec => "unsupported_payload_codec",
    PayloadTooLarge => "payload_too_large",
    InstanceNotFound => "instance_not_found",
    RunNotFound => "run_not_found",
    InstanceAlreadyStarted => "instance_already_started",
    WorkflowIdReservedInNamespace => "workflow_id_reserved_in_namespace",
    /// A standalone activity id is taken in another namespace.
    ActivityIdReservedInNamespace => "activity_id_reserved_in_namespace",
    /// No standalone activity has this id (or the id names a workflow).
    ActivityNotFound => "activity_not_found",
    /// An update, query or cooperative cancellation sent to a standalone activity's host run.
    ActivityHostRun => "activity_host_run",
    // Message streams (DW's reasons).
    /// A message id reused on a stream for another payload.
    MessageIdentityConflict => "message_identity_conflict",
    /// A stream's delivered, unconsumed messages reached `MAX_UNCONSUMED`.
    MessageStreamBacklogFull => "message_stream_backlog_full",
    /// A completion's `message_stream_cursors`/`message_stream_waits` break the cursor rules.
    InvalidMessageStreamProgress => "invalid_message_stream_progress",
    /// The reserved message-stream signal sent through a signal route.
    RuntimeReservedSignal => "runtime_reserved_signal",
    /// No message stream of this name on the instance.
    MessageStreamNotFound => "message_stream_not_found",
    // Workflow output streams (DW's reasons).
    /// A worker's stream directive breaks its identity or key rules.
    InvalidWorkflowStreamCommand => "invalid_workflow_stream_command",
    /// An append met the stream's pending-item cap (items before it were kept).
    StreamFull => "stream_full",
    StreamClosed => "stream_closed",
    StreamErrored => "stream_errored",
    StreamNotFound => "stream_not_found",
    InvalidStreamName => "invalid_stream_name",
    // External payload storage (the SDKs' reasons).
    /// No uploaded payload of this reference id in the namespace, or its bytes are gone.
    ExternalPayloadNotFound => "external_payload_not_found",
    /// The namespace's object store cannot be reached, or the namespace has no usable storage.
    ExternalPayloadUnavailable => "external_payload_unavailable",
    /// The bytes do not match their declared or recorded size, SHA-256 or codec.
    ExternalPayloadIntegrityMismatch => "external_payload_integrity_mismatch",
    /// An upload above the transport's byte limit.
    ExternalPayloadOversized => "external_payload_oversized",
    /// An upload's codec, or a storage setting, that the server does not serve.
    ExternalPayloadUnsupported => "external_payload_unsupported",
    /// `POST /storage/test` on a namespace without a storage policy.
    ExternalStorageNotConfigured => "external_storage_not_configured",
    /// `POST /storage/test` on a namespace whose policy is disabled.
    ExternalStorageDisabled => "external_storage_disabled",
    /// The policy's (or the requested) driver cannot be served.
    StorageDriverUnavailable => "storage_driver_unavailable",
    // The Nexus service catalog (DW's reasons).
    EndpointNotFound => "endpoint_not_found",
    ServiceNotFound => "service_not_found",
    OperationNotFound => "operation_not_found",
    /// No service call of that id under the operation (DW's describe route).
    ServiceCallNotFound => "service_call_not_found",
    /// A duty found its run held by another transaction (a node paused mid-transaction): its
    /// node retries it while the claim lasts; other runs' duties go on.
    RunLocked => "run_locked",
    /// A cancellation of a service call that has already ended.
    ServiceCallTerminal => "service_call_terminal",
    EndpointAlreadyExists => "endpoint_already_exists",
    ServiceAlreadyExists => "service_already_exists",
    OperationAlreadyExists => "operation_already_exists",
    /// An endpoint is deleted only once it has no services.
    EndpointHasServices => "endpoint_has_services",
    /// A service is deleted only once it has no operations.
    ServiceHasOperations => "service_has_operations",
    // Redrive (DW's reasons).
    RunNotFailed => "run_not_failed",
    SourceRunNotCurrent => "source_run_not_current",
    UnsupportedHistory => "unsupported_history",
    UnsupportedLocalActivity => "unsupported_local_activity",
    UnrecordedFailureBoundary => "unrecorded_failure_boundary",
    InvalidFailedStep => "invalid_failed_step",
    UnsupportedSourceLink => "unsupported_source_link_or_payload",
    ExecutionDeadlineElapsed => "execution_deadline_elapsed",
    WorkflowDefinitionChanged => "workflow_definition_changed",
    WorkerNotRegistered => "worker_not_registered",
    TaskQueueMismatch => "task_queue_mismatch",
    TaskQueueThrottled => "task_queue_throttled",
    BuildIdMismatch => "build_id_mismatch",
    NamespaceNotFound => "namespace_not_found",
    InvalidPageToken => "invalid_page_token",
    StaleFence => "stale_fence",
    QueryTaskNotFound => "query_task_not_found",
    QueryTaskNotLeased => "query_task_not_leased",
    QueryTaskAttemptMismatch => "query_task_attempt_mismatch",
    RunNotClosed => "run_not_closed",
    RunTimedOut => "run_timed_out",
    UnknownSignal => "unknown_signal",
    UpdateRejected => "update_rejected",
    StaleValidation => "stale_update_validation_completion",
    CancellationRequestMismatch => "cancellation_request_mismatch",
    ActivityNotCancelled => "activity_not_cancelled",
    ActivityCancelled => "activity_cancelled",
    CancellationWaitBoundaryMismatch => "cancellation_wait_boundary_mismatch",
    CancellationWaitingForActivity => "cancellation_waiting_for_activity",
    CancellationWaitingForChild => "cancellation_waiting_for_child",
    CancellationDeliveryMismatch => "cancellation_delivery_mismatch",
    PreparedLocalActivityNotSupported => "prepared_local_activity_not_supported",
    LocalActivityCommandPrefixNotRecorded => "local_activity_command_prefix_not_recorded",
    LocalActivityPreparationMismatch => "local_activity_preparation_mismatch",
    LocalActivityPreviousAttemptUnresolved => "local_activity_previous_attempt_unresolved",
    LocalActivityRetryNotDue => "local_activity_retry_not_due",
    LocalActivityDeadlineExpired => "local_activity_deadline_expired",
    LocalActivityOriginalClaimLive => "local_activity_original_claim_live",
    LocalActivityNothingToRecover => "local_activity_nothing_to_recover",
    LocalActivityCleanupAuthorityMismatch => "local_activity_cleanup_authority_mismatch",
    LocalActivityOutcomeMismatch => "local_activity_outcome_mismatch",
    LocalActivityCheckpointMismatch => "local_activity_checkpoint_mismatch",
    StaleActivityAttempt => "stale_activity_attempt",
    CancellationDeliverySequenceMismatch => "cancellation_delivery_sequence_mismatch",
    CancellationDeliveryShapeMismatch => "cancellation_delivery_shape_mismatch",
    CancellationDeliveryNotEligible => "cancellation_delivery_not_eligible",
    InvalidCancellationDelivery => "invalid_cancellation_delivery",
    OutcomeUnknownRequiresResolution => "outcome_unknown_requires_resolution",
    LedgerEntryNotFound => "ledger_entry_not_found",
    LedgerEntryNotUnknown => "ledger_entry_not_unknown",
    IntegrityIncidentOpen => "integrity_incident_open",
    IntegrityChainBroken => "integrity_chain_broken",
    IntegrityIncidentNotFound => "integrity_incident_not_found",
    BatchOperationNotFound => "batch_operation_not_found",
    BatchOperationsExhausted => "batch_operations_exhausted",
    NamespaceAlreadyExists => "namespace_already_exists",
    NamespaceNotEmpty => "namespace_not_empty",
    ScheduleNotFound => "schedule_not_found",
    ScheduleAlreadyExists => "schedule_already_exists",
    SearchAttributeAlreadyExists => "search_attribute_already_exists",
    // Named credentials managed over the admin API.
    CredentialNotFound => "credential_not_found",
    CredentialAlreadyExists => "credential_already_exists",
    CredentialSecretNotFound => "credential_secret_not_found",
    /// Adding a secret beyond the most a credential holds.
    CredentialSecretLimitReached => "credential_secret_limit_reached",
    /// Removing a credential's last secret (delete the credential instead).
    CredentialNeedsASecret => "credential_needs_a_secret",
    /// A principal the credentials file (or a command-line token) defines: the API manages
    /// only its own.
    CredentialManagedByFile => "credential_managed_by_file",
    /// The database failed and the change was not applied: the one retryable storage answer.
    StorageUnavailable => "storage_unavailable",
    /// Writes stand in line longer than the server's admission target: the request was refused
    /// before it did anything (`retryable`, `retry_after_seconds`).
    ServerOverloaded => "server_overloaded",
    /// A long poll refused before it parked: the node holds its most, or sheds polls first
    /// under load (`retry_after_seconds`; the SDKs sleep that long and poll again).
    LongPollCapacityExhausted => "long_poll_capacity_exhausted",
    /// The database connection was lost after COMMIT was sent: the change may or may not have
    /// been applied. Retryable with the same idempotency key, which finds a committed change.
    CommitOutcomeUnknown => "commit_outcome_unknown",
    /// A uniqueness constraint refused a write no rule turned into a refusal of its own.
    StorageConflict => "storage_conflict",
    /// A stored record (not a run document) does not parse: retrying cannot help.
    StoredRecordCorrupt => "stored_record_corrupt",
    /// A run document does not parse, or was written by a newer build.
    RunDocumentCorrupt => "run_document_corrupt",
    // Importing history bundles (DW's embedded-v2 import contract; the rules are in `errors`).
    /// The bundle breaks a rule of the contract (422): nothing was written.
    ImportRejected => "import_rejected",
    /// The run id (or its instance's run number) is taken by a run this bundle did not write (409).
    ImportRunConflict => "import_run_conflict",
    // Request and server-level answers.
    /// A request field is missing, malformed or out of bounds (`errors` names it).
    ValidationFailed => "validation_failed",
    InvalidJson => "invalid_json",
    MissingProtocolVersion => "missing_protocol_version",
    UnsupportedProtocolVersion => "unsupported_protocol_version",
    MissingControlPlaneVersion => "missing_control_plane_version",
    UnsupportedControlPlaneVersion => "unsupported_control_plane_version",
    Unauthorized => "unauthorized",
    Forbidden => "forbidden",
    /// No such route.
    NotFound => "not_found",
    MethodNotAllowed => "method_not_allowed",
    InternalError => "internal_error",
    WorkerNotFound => "worker_not_found",
    UpdateNotFound => "update_not_found",
    UpdateValidationTaskNotLeased => "update_validation_task_not_leased",
    UpdateValidationCapabilityNotAdvertised => "update_validation_capability_not_advertised",
    UpdateValidationWorkerFailed => "update_validation_worker_failed",
    QueryRejected => "query_rejected",
    QueryTaskNotClaimed => "query_task_not_claimed",
    QueryWorkerTimeout => "query_worker_timeout",
    QueryWorkerUnavailable => "query_worker_unavailable",
    SearchAttributeReserved => "search_attribute_reserved",
    SearchAttributeNotFound => "search_attribute_not_found",
    UnknownSearchAttribute => "unknown_search_attribute",
    InvalidSearchAttributeValue => "invalid_search_attribute_value",
    MemoTooLarge => "memo_too_large",
    ScheduleListFilterUnsupported => "unsupported_schedule_list_filter",
    SchedulePageTokenMalformed => "malformed_schedule_page_token",
    SchedulePageTokenNamespaceMismatch => "schedule_page_token_namespace_mismatch",
    SchedulePageTokenFilterMismatch => "schedule_page_token_filter_mismatch",
    BackfillTooLarge => "backfill_too_large",
    RetentionNotConfigured => "retention_not_configured",
    InvalidTimeRange => "invalid_time_range",
    InvalidAfterSequence => "invalid_after_sequence",
    ActionDefinitionNotFound => "action_definition_not_found",
    AtomicHandlerMissing => "atomic_handler_missing",
    ActiveClaimCancellationNotSupported => "active_claim_cancellation_not_supported",
    UpdateValidatorWorkerUnavailable => "update_validator_worker_unavailable",
    UpdateValidationCapabilityUnsupported => "update_validation_capability_unsupported",
    UpdateValidationExecutionTimeout => "update_validation_execution_timeout",
    UpdateValidationTaskNotClaimed => "update_validation_task_not_claimed",
    InvalidVisibilityQuery => "invalid_visibility_query",
    InvalidScheduleSpec => "invalid_schedule_spec",
    InvalidCronExpression => "invalid_cron_expression",
    RejectedUnknownQuery => "rejected_unknown_query",
    InvalidQueryArguments => "invalid_query_arguments",
    UpdateValidationTaskNotFound => "update_validation_task_not_found",
    UpdateValidationLeaseOwnerMismatch => "update_validation_lease_owner_mismatch",
    UpdateValidationLeaseExpired => "update_validation_lease_expired",
    UpdateValidatorRejected => "update_validator_rejected",
    /// The update's handler failed (`failure_message` says how); answered to the waiting client.
    UpdateFailed => "update_failed",
    /// A `sticky_cache` claim names another worker, run or build than the lease it came with.
    StickyCacheIdentityMismatch => "sticky_cache_identity_mismatch",
    /// The worker asks for something its registration did not declare (e.g. `sticky_execution`).
    WorkerCapabilityNotSupported => "worker_capability_not_supported",
    // Worker sessions.
    SessionNotFound => "session_not_found",
    SessionQueueMismatch => "session_queue_mismatch",
    SessionRequirementsNotMet => "session_requirements_not_met",
    SessionMissing => "session_missing",
    WorkerSessionLimitExceeded => "worker_session_limit_exceeded",
    SessionOwnedByAnotherWorker => "session_owned_by_another_worker",
    SessionClosed => "session_closed",
    SessionReacquireDisallowed => "session_reacquire_disallowed",
    SessionActivityLimitExceeded => "session_activity_limit_exceeded",
    SessionNotActive => "session_not_active",
    SessionOwnerMismatch => "session_owner_mismatch",
    // Fenced worker deregistration.
    WorkerRegistrationLostAuthority => "worker_registration_lost_authority",
    WorkerRegistrationTokenNotFound => "worker_registration_token_not_found",
}

/// A reason equals its wire code (what tests and clients compare against).
impl PartialEq<&str> for Reason {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
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
