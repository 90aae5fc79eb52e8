//! Every error the API returns, in the DW error shape: `reason`, `message` (and `error`), plus
//! the fields the SDKs read. The status code follows from the reason, in one table.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use capstan_engine::{Reason, Refusal};
use capstan_store::StoreError;
use serde_json::{json, Map, Value};

#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub reason: Reason,
    pub message: String,
    pub fields: Map<String, Value>,
}

impl ApiError {
    pub fn new(status: StatusCode, reason: Reason, message: impl Into<String>) -> Self {
        Self {
            status,
            reason,
            message: message.into(),
            fields: Map::new(),
        }
    }

    pub fn with(mut self, key: &str, value: impl Into<Value>) -> Self {
        self.fields.insert(key.to_string(), value.into());
        self
    }

    /// `422 validation_failed` naming the field at fault.
    pub fn validation(field: &str, message: impl Into<String>) -> Self {
        let message = message.into();
        let errors = json!({ field: [message.clone()] });
        Self::new(StatusCode::UNPROCESSABLE_ENTITY, Reason::ValidationFailed, message)
            .with("errors", errors.clone())
            .with("validation_errors", errors)
    }

    pub fn body(&self) -> Map<String, Value> {
        let mut body = self.fields.clone();
        body.insert("reason".into(), json!(self.reason.as_str()));
        body.insert("message".into(), json!(self.message));
        body.insert("error".into(), json!(self.message));
        body
    }
}

/// The HTTP status of each engine/store reason.
pub fn status_of(reason: Reason) -> StatusCode {
    match reason {
        Reason::TaskNotFound
        | Reason::AttemptNotFound
        | Reason::InstanceNotFound
        | Reason::ActivityNotFound
        | Reason::RunNotFound
        | Reason::MessageStreamNotFound
        | Reason::StreamNotFound
        | Reason::NamespaceNotFound
        | Reason::QueryTaskNotFound
        | Reason::UnknownSignal
        | Reason::LedgerEntryNotFound
        | Reason::IntegrityIncidentNotFound
        | Reason::ScheduleNotFound
        | Reason::NotFound
        | Reason::WorkerNotFound
        | Reason::UpdateNotFound
        | Reason::SearchAttributeNotFound
        | Reason::ActionDefinitionNotFound
        | Reason::UpdateValidationTaskNotFound
        | Reason::SessionNotFound
        | Reason::WorkerRegistrationTokenNotFound
        | Reason::RejectedUnknownQuery
        | Reason::ExternalPayloadNotFound
        | Reason::EndpointNotFound
        | Reason::ServiceNotFound
        | Reason::OperationNotFound
        | Reason::ServiceCallNotFound
        | Reason::CredentialNotFound
        | Reason::CredentialSecretNotFound
        | Reason::BatchOperationNotFound => StatusCode::NOT_FOUND,
        Reason::ValidationFailed
        | Reason::SearchAttributeReserved
        | Reason::UnknownSearchAttribute
        | Reason::InvalidSearchAttributeValue
        | Reason::MemoTooLarge
        | Reason::UpdateFailed
        | Reason::InvalidQueryArguments
        | Reason::InvalidVisibilityQuery
        | Reason::InvalidScheduleSpec
        | Reason::InvalidCronExpression
        | Reason::InvalidMessageStreamProgress
        | Reason::RuntimeReservedSignal
        | Reason::InvalidWorkflowStreamCommand
        | Reason::ImportRejected => StatusCode::UNPROCESSABLE_ENTITY,
        Reason::MessageStreamBacklogFull
        | Reason::StreamFull
        | Reason::TaskQueueThrottled
        | Reason::LongPollCapacityExhausted
        | Reason::BatchOperationsExhausted => StatusCode::TOO_MANY_REQUESTS,
        Reason::InvalidStreamName => StatusCode::BAD_REQUEST,
        Reason::InvalidJson
        | Reason::MissingProtocolVersion
        | Reason::UnsupportedProtocolVersion
        | Reason::MissingControlPlaneVersion
        | Reason::UnsupportedControlPlaneVersion => StatusCode::BAD_REQUEST,
        Reason::Unauthorized => StatusCode::UNAUTHORIZED,
        Reason::Forbidden => StatusCode::FORBIDDEN,
        Reason::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
        Reason::InternalError => StatusCode::INTERNAL_SERVER_ERROR,
        Reason::WorkerNotRegistered => StatusCode::PRECONDITION_FAILED,
        Reason::InvalidPageToken => StatusCode::BAD_REQUEST,
        Reason::StructuralLimitExceeded | Reason::UnsupportedPayloadCodec | Reason::AtomicHandlerMissing => {
            StatusCode::UNPROCESSABLE_ENTITY
        }
        Reason::PayloadTooLarge | Reason::ExternalPayloadOversized => StatusCode::PAYLOAD_TOO_LARGE,
        Reason::ExternalPayloadUnavailable => StatusCode::SERVICE_UNAVAILABLE,
        Reason::ExternalPayloadUnsupported
        | Reason::ExternalStorageNotConfigured
        | Reason::ExternalStorageDisabled
        | Reason::StorageDriverUnavailable => StatusCode::UNPROCESSABLE_ENTITY,
        Reason::StorageUnavailable | Reason::CommitOutcomeUnknown | Reason::ServerOverloaded => StatusCode::SERVICE_UNAVAILABLE,
        Reason::StoredRecordCorrupt | Reason::RunDocumentCorrupt => StatusCode::INTERNAL_SERVER_ERROR,
        _ => StatusCode::CONFLICT,
    }
}

impl From<Refusal> for ApiError {
    fn from(refusal: Refusal) -> Self {
        Self {
            status: status_of(refusal.reason),
            reason: refusal.reason,
            message: refusal.message,
            fields: refusal.details,
        }
    }
}

impl From<StoreError> for ApiError {
    fn from(error: StoreError) -> Self {
        let refused = |reason: Reason, message: String| ApiError::from(Refusal::new(reason, message));
        match error {
            StoreError::Refused(refusal) => refusal.into(),
            // The one retryable storage answer: the change was not applied.
            StoreError::Storage(message) => {
                tracing::error!(%message, "storage failure");
                refused(
                    Reason::StorageUnavailable,
                    "The database could not complete the request; retry.".into(),
                )
                .with("retryable", true)
            }
            // A lost COMMIT answer: the client must not be told either way. Its retry, with the
            // same idempotency key (request id, lease, attempt), finds a committed change.
            StoreError::OutcomeUnknown(message) => {
                tracing::error!(%message, "commit outcome unknown");
                refused(
                    Reason::CommitOutcomeUnknown,
                    "The database connection was lost while the change was being committed; it may or may not have been applied. Retry with the same request: a committed change is found, not made twice.".into(),
                )
                .with("retryable", true)
            }
            // Refused when the store opens; a request never sees it.
            StoreError::Incompatible(message) => {
                tracing::error!(%message, "incompatible database");
                refused(Reason::StorageUnavailable, message).with("retryable", false)
            }
            // A uniqueness rule the store did not turn into a refusal of its own.
            StoreError::Conflict { constraint, message } => {
                tracing::warn!(%constraint, %message, "write refused by a uniqueness constraint");
                refused(Reason::StorageConflict, "The change conflicts with a stored record.".into())
                    .with("constraint", constraint)
                    .with("retryable", false)
            }
            // Stored bytes that do not parse: a retry reads the same bytes.
            StoreError::Corrupt { record, detail } => {
                tracing::error!(%record, %detail, "corrupt stored record");
                refused(
                    Reason::StoredRecordCorrupt,
                    format!("A stored {record} cannot be read; an operator must repair it."),
                )
                .with("record", record)
                .with("retryable", false)
            }
            // The stores turn an unreadable run into an incident and a refusal; one that reaches
            // here (a read) names the run.
            StoreError::CorruptRun(breach) => {
                tracing::error!(run_id = %breach.run_id, detail = %breach.detail, "unreadable run document");
                refused(
                    Reason::RunDocumentCorrupt,
                    format!("The run's stored document cannot be read: {}", breach.detail),
                )
                .with("workflow_id", breach.workflow_id.as_str())
                .with("run_id", breach.run_id.as_str())
                .with("retryable", false)
            }
            // The stores turn a breach into an incident and a refusal; one that reaches here
            // (a path without that guard) is still a refusal, never a 5xx.
            StoreError::Integrity(breach) => refused(
                Reason::IntegrityIncidentOpen,
                format!("A ledger chain failed verification: {}", breach.detail),
            )
            .with("workflow_id", breach.workflow_id.as_str()),
        }
    }
}

impl From<capstan_app::AppError> for ApiError {
    fn from(error: capstan_app::AppError) -> Self {
        match error {
            capstan_app::AppError::Invalid { field, message } => ApiError::validation(&field, message),
            capstan_app::AppError::Store(error) => error.into(),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let reason = self.reason;
        let body = self.body();
        // A refusal that says when to come back says it in HTTP's words too.
        let retry_after = body.get("retry_after_seconds").and_then(Value::as_u64);
        let mut response = (self.status, axum::Json(Value::Object(body))).into_response();
        if let Some(seconds) = retry_after {
            response
                .headers_mut()
                .insert(axum::http::header::RETRY_AFTER, axum::http::HeaderValue::from(seconds));
        }
        // For the request metrics: refusals are counted by reason.
        response.extensions_mut().insert(crate::metrics::http::Refused(reason));
        response
    }
}

pub type ApiResult<T> = Result<T, ApiError>;

#[cfg(test)]
mod catalogue {
    use capstan_engine::Reason;
    use std::collections::BTreeSet;

    /// The reasons `docs/errors.md` explains: the backticked codes of its tables' reason column.
    fn documented() -> BTreeSet<String> {
        include_str!("../../../docs/errors.md")
            .lines()
            .filter_map(|line| line.strip_prefix('|'))
            // Rows of the tables, not their headers: the first column is a status code.
            .filter(|row| row.trim_start().starts_with(|c: char| c.is_ascii_digit()))
            .filter_map(|row| row.split('|').nth(1))
            .flat_map(|cell| cell.split('`').skip(1).step_by(2).map(str::to_string).collect::<Vec<_>>())
            .collect()
    }

    #[test]
    fn every_reason_in_the_catalogue_is_documented_and_every_documented_reason_exists() {
        let documented = documented();
        let catalogue: BTreeSet<String> = Reason::ALL.iter().map(|r| r.as_str().to_string()).collect();
        let undocumented: Vec<_> = catalogue.difference(&documented).collect();
        let unknown: Vec<_> = documented.difference(&catalogue).collect();
        assert!(undocumented.is_empty(), "reasons missing from docs/errors.md: {undocumented:?}");
        assert!(
            unknown.is_empty(),
            "docs/errors.md explains reasons Capstan never answers: {unknown:?}"
        );
    }

    #[test]
    fn codes_are_unique_and_parse_back() {
        let mut seen = BTreeSet::new();
        for reason in Reason::ALL {
            assert!(seen.insert(reason.as_str()), "{} twice", reason.as_str());
            assert_eq!(Reason::parse(reason.as_str()), Some(*reason));
        }
    }
}
