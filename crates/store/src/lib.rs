//! Capstan's storage. Every SQL statement of the project lives in this crate.
//!
//! [`Store`] is the contract the server programs against; [`SqliteStore`] implements it on an
//! embedded SQLite file, [`SharedStore`] on a database server several nodes share
//! (PostgreSQL). A store only persists: the decisions are the engine's. Run transitions go through [`Store::mutate_run`], which loads
//! a run's state, hands it to an engine closure and — only when the closure returns `Ok` —
//! writes the new state, the appended history events and the changed task rows in one
//! transaction, before the returned future resolves. A refused transition writes nothing.
//!
//! Crash contract: a future that resolved `Ok` means the change is durable (fsync'd); a crash
//! before that leaves no part of the change. Callers that lose the answer retry; the engine's
//! idempotency rules make the retry safe.

mod logic;
mod mysql;
mod observe;
mod postgres;
mod rows;
mod schedules;
pub mod schema_floor;
mod shared;
mod sources;
mod sqlite;
mod tx;
mod visibility_sql;

use capstan_engine::service_call::{RouteKey, ServiceCallRecord};
use capstan_engine::*;
use serde_json::{Map, Value};
use std::future::Future;

pub use observe::{Commit, Fact, Observer};
pub use shared::{Durability, SharedStore};

/// The store traits, for code that calls a concrete store's methods (`use
/// capstan_store::prelude::*`); code generic over `S: Store` needs only `Store`.
pub mod prelude {
    pub use crate::{
        AdminStore, CatalogStore, DutyStore, FleetStore, LedgerStore, PayloadStore, RunStore, ScheduleStore, Store, StreamStore, TaskStore,
    };
}
pub use logic::fleet::DEREGISTRATION_RECEIPT_RETENTION_MS;
pub use logic::service_calls::propagates as cancellation_propagates;
pub use logic::sessions::{SessionAnswer, SessionStep};
pub use logic::streams::{StoredStreamItem, StreamAppend, StreamState, StreamTarget};
pub use schedules::{BACKFILL_MAX, FIRE_BATCH};
pub(crate) use sources::Env;
pub use sources::{Clock, IdMint, ManualClock, MintedIds, RandomIds, SeededIds, Sources, SystemClock};
pub use sqlite::{intent_hash, SqliteStore};

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The engine (or a store-level rule such as duplicate start) said no; nothing was written.
    #[error("{0}")]
    Refused(Refusal),
    /// The database failed. The change was not applied.
    #[error("storage failure: {0}")]
    Storage(String),
    /// The connection to the database was lost after COMMIT was sent and before its answer
    /// came: the change may or may not have been applied (never reported as either).
    #[error("commit outcome unknown: {0}")]
    OutcomeUnknown(String),
    /// The database was written by a binary this one cannot run against (see
    /// [`schema_floor`]): refused at opening, nothing written.
    #[error("{0}")]
    Incompatible(String),
    /// A uniqueness constraint refused the change (`constraint` names it); nothing was written.
    #[error("conflict on {constraint}: {message}")]
    Conflict { constraint: String, message: String },
    /// A stored record does not parse (`record` says which kind): nothing was written, and a
    /// retry would find the same bytes.
    #[error("corrupt {record}: {detail}")]
    Corrupt { record: String, detail: String },
    /// A run document does not parse or comes from a newer build. Nothing was written; the
    /// store opens an integrity incident naming the run and blocks its tasks.
    #[error("unreadable run document: {0:?}")]
    CorruptRun(IntegrityBreach),
    /// A ledger chain the change extends failed verification; nothing was written (the store
    /// then opens an integrity incident and blocks the run).
    #[error("integrity breach: {0:?}")]
    Integrity(IntegrityBreach),
}

/// Where a chain broke.
#[derive(Clone, Debug, PartialEq)]
pub struct IntegrityBreach {
    pub namespace: String,
    pub workflow_id: WorkflowId,
    pub run_id: RunId,
    pub detail: String,
}

/// An integrity incident: opened when a commit found a broken chain; closed by an operator
/// once the chain verifies again.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct IntegrityIncident {
    pub incident_id: String,
    pub namespace: String,
    pub workflow_id: WorkflowId,
    pub run_id: RunId,
    pub state: String,
    pub detail: String,
    pub opened_at: Millis,
    pub closed_at: Option<Millis>,
    pub note: Option<String>,
}

/// Whether `previous` (the stored checkpoint `checkpoint` links to) exists and still hashes to
/// what it recorded.
pub(crate) fn extends_intact(checkpoint: &LedgerCheckpoint, previous: Option<LedgerCheckpoint>) -> bool {
    previous.is_some_and(|previous| previous.hash == checkpoint.prev_hash && previous.computed_hash() == previous.hash)
}

pub(crate) fn breach_at(run: &RunState, checkpoint: &LedgerCheckpoint) -> StoreError {
    StoreError::Integrity(IntegrityBreach {
        namespace: run.namespace.clone(),
        workflow_id: checkpoint.workflow_id.clone(),
        run_id: run.run_id.clone(),
        detail: format!(
            "the ledger checkpoint {} that this change extends is missing or no longer matches its hash",
            checkpoint.prev_hash
        ),
    })
}

impl From<Refusal> for StoreError {
    fn from(refusal: Refusal) -> Self {
        StoreError::Refused(refusal)
    }
}

impl From<rusqlite::Error> for StoreError {
    fn from(error: rusqlite::Error) -> Self {
        use rusqlite::ErrorCode::*;
        if matches!(
            error.sqlite_error_code(),
            Some(DiskFull | SystemIoFailure | CannotOpen | ReadOnly | DatabaseCorrupt | NotADatabase)
        ) {
            sqlite::note_io_failure();
        }
        if let rusqlite::Error::SqliteFailure(failure, message) = &error {
            // SQLite names the columns, not the constraint: "UNIQUE constraint failed: t.a, t.b".
            if matches!(
                failure.extended_code,
                rusqlite::ffi::SQLITE_CONSTRAINT_UNIQUE | rusqlite::ffi::SQLITE_CONSTRAINT_PRIMARYKEY
            ) {
                let columns = message.as_deref().and_then(|m| m.split(": ").nth(1)).unwrap_or_default();
                return StoreError::Conflict {
                    constraint: columns.to_string(),
                    message: error.to_string(),
                };
            }
        }
        StoreError::Storage(error.to_string())
    }
}

impl From<serde_json::Error> for StoreError {
    fn from(error: serde_json::Error) -> Self {
        StoreError::Corrupt {
            record: "stored document".into(),
            detail: error.to_string(),
        }
    }
}

pub type StoreResult<T> = Result<T, StoreError>;

/// Which run a transition is for.
#[derive(Clone, Debug)]
pub enum RunLocator {
    /// The run owning this task (workflow or activity task id).
    Task(TaskId),
    /// A specific run of an instance.
    Run(WorkflowId, RunId),
    /// The current run of an instance.
    Current(WorkflowId),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DuplicatePolicy {
    Fail,
    UseExisting,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StartOutcome {
    StartedNew,
    ReturnedExistingActive,
}

/// What a request did to an instance that its history does not record (a query): kept with
/// the instance, newest first on its audit surface.
#[derive(Clone, Debug, PartialEq)]
pub struct AuditEvent {
    pub audit_id: String,
    pub namespace: String,
    pub workflow_id: String,
    pub run_id: Option<String>,
    /// What was done, e.g. `workflow.query`.
    pub action: String,
    /// Who did it (`None`: the server).
    pub principal: Option<capstan_engine::Principal>,
    pub recorded_at: Millis,
    /// The action's particulars (a query's name and task id).
    pub detail: serde_json::Map<String, serde_json::Value>,
}

/// A named credential managed over the admin API (the credentials file holds the others): who
/// acts, with which roles, in which namespaces, and the digests of its secrets.
#[derive(Clone, Debug, PartialEq)]
pub struct CredentialRecord {
    pub principal: String,
    /// `worker`, `operator`, `admin`.
    pub roles: Vec<String>,
    /// The namespaces it may act in; `None` for every namespace.
    pub namespaces: Option<Vec<String>>,
    pub secrets: Vec<CredentialSecret>,
    pub created_at: Millis,
    pub created_by: Option<capstan_engine::Principal>,
    pub updated_at: Millis,
    pub updated_by: Option<capstan_engine::Principal>,
}

/// One secret of a credential: only its digest is kept (`sha256:<hex>`).
#[derive(Clone, Debug, PartialEq)]
pub struct CredentialSecret {
    pub secret_id: String,
    pub digest: String,
    pub created_at: Millis,
    pub created_by: Option<capstan_engine::Principal>,
}

/// The most secrets one credential holds: enough to rotate, few enough to review.
pub const MAX_CREDENTIAL_SECRETS: usize = 5;

/// What was done to a stored credential, as its audit trail names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CredentialAction {
    Created,
    Regranted,
    SecretAdded,
    SecretRemoved,
    Deleted,
}

impl CredentialAction {
    pub fn as_str(self) -> &'static str {
        match self {
            CredentialAction::Created => "credential.created",
            CredentialAction::Regranted => "credential.regranted",
            CredentialAction::SecretAdded => "credential.secret_added",
            CredentialAction::SecretRemoved => "credential.secret_removed",
            CredentialAction::Deleted => "credential.deleted",
        }
    }
}

/// One committed change to a stored credential: the audit trail keeps every one, in the
/// change's own transaction, for as long as the database (a deleted credential's too).
#[derive(Clone, Debug, PartialEq)]
pub struct CredentialEvent {
    /// Grows with each change (the trail's order and its page cursor).
    pub sequence: i64,
    pub principal: String,
    pub action: String,
    /// The secret added or removed (its id; never the secret or its digest).
    pub secret_id: Option<String>,
    /// The credential's roles and namespaces after the change (before it, for a deletion).
    pub roles: Vec<String>,
    pub namespaces: Option<Vec<String>>,
    /// Who changed it (`None`: the server).
    pub by: Option<capstan_engine::Principal>,
    pub recorded_at: Millis,
}

/// At most this many credential events a page.
pub const CREDENTIAL_EVENTS_PAGE_MAX: usize = 500;

/// A change to a stored credential.
#[derive(Clone, Debug)]
pub enum CredentialChange {
    /// Replaces its roles and namespaces.
    Grants {
        roles: Vec<String>,
        namespaces: Option<Vec<String>>,
    },
    /// Adds a secret (a rotation's first half); at most [`MAX_CREDENTIAL_SECRETS`].
    AddSecret(CredentialSecret),
    /// Removes a secret (a rotation's second half); the last one stays.
    RemoveSecret { secret_id: String },
}

/// A worker registration as stored.
#[derive(Clone, Debug, PartialEq)]
pub struct WorkerRecord {
    pub namespace: String,
    pub worker_id: String,
    pub task_queue: String,
    pub runtime: String,
    pub sdk_version: Option<String>,
    pub build_id: Option<String>,
    pub supported_workflow_types: Vec<String>,
    pub supported_activity_types: Vec<String>,
    pub workflow_definition_fingerprints: Map<String, Value>,
    /// Everything else the worker sent (capabilities, manifest, contracts), kept verbatim.
    pub document: Map<String, Value>,
    pub status: String,
    pub registered_at: Millis,
    pub last_heartbeat_at: Millis,
}

impl WorkerRecord {
    /// Whether the registration listed `capability` among its `capabilities`.
    pub fn has_capability(&self, capability: &str) -> bool {
        self.document
            .get("capabilities")
            .and_then(Value::as_array)
            .is_some_and(|caps| caps.iter().any(|c| c == capability))
    }
}

/// Puts checkpoints in chain order: from the one no other checkpoint precedes, following
/// `prev_hash` links (writes of one transaction share a timestamp, so time cannot order them).
/// Checkpoints off the chain (a fork) follow at the end in recorded order.
pub fn chain_order(mut checkpoints: Vec<LedgerCheckpoint>) -> Vec<LedgerCheckpoint> {
    checkpoints.sort_by_key(|c| c.recorded_at);
    let hashes: std::collections::HashSet<String> = checkpoints.iter().map(|c| c.hash.clone()).collect();
    let mut ordered = Vec::with_capacity(checkpoints.len());
    let mut remaining = checkpoints;
    let mut next = remaining.iter().position(|c| !hashes.contains(&c.prev_hash));
    while let Some(index) = next {
        let checkpoint = remaining.remove(index);
        next = remaining.iter().position(|c| c.prev_hash == checkpoint.hash);
        ordered.push(checkpoint);
    }
    ordered.extend(remaining);
    ordered
}

/// A consequential action Capstan runs itself (recovery mode `atomic`), registered by an
/// application that embeds Capstan: `run` executes inside the database transaction that records
/// the activity's completion, so the application's own writes and Capstan's record commit or
/// roll back together. An `Err` rolls the handler's writes back and the attempt fails (retried
/// under the activity's policy); no outcome can be unknown.
pub trait AtomicAction: Send + Sync + 'static {
    fn run(&self, tx: &mut dyn AtomicTransaction, arguments: &Value) -> Result<Value, String>;
}

/// The recording transaction, as an atomic action sees it. Parameters and columns are JSON
/// scalars; placeholders follow the database (`?1` on SQLite, `$1` on PostgreSQL, `$1` or `?`
/// on MySQL and MariaDB). On MySQL a statement that commits implicitly (DDL, `LOCK TABLES`,
/// transaction control) is refused: it would commit Capstan's transaction halfway.
pub trait AtomicTransaction {
    fn execute(&mut self, sql: &str, params: &[Value]) -> Result<u64, String>;
    fn query(&mut self, sql: &str, params: &[Value]) -> Result<Vec<Vec<Value>>, String>;
}

/// Registered atomic actions by activity type.
#[derive(Clone, Default)]
pub struct AtomicActions(pub std::sync::Arc<std::collections::HashMap<String, std::sync::Arc<dyn AtomicAction>>>);

impl std::fmt::Debug for AtomicActions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.0.keys()).finish()
    }
}

impl AtomicActions {
    pub fn new(actions: impl IntoIterator<Item = (String, std::sync::Arc<dyn AtomicAction>)>) -> Self {
        Self(std::sync::Arc::new(actions.into_iter().collect()))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// What running one atomic task did.
#[derive(Clone, Debug, PartialEq)]
pub enum AtomicOutcome {
    /// The handler succeeded: its writes and `ActivityCompleted` committed together.
    Completed { workflow_id: WorkflowId },
    /// The handler failed: its writes were rolled back and the attempt failed.
    Failed { workflow_id: WorkflowId, message: String },
    /// Refused before running (definition changed, no handler registered).
    Refused { workflow_id: WorkflowId },
}

/// The owner recorded on atomic attempts.
pub const ATOMIC_OWNER: &str = "capstan:atomic";

/// Stack size of the threads that run transitions (the SQLite writer, the server's runtime):
/// decoding a payload recurses once per nesting level, and a debug build's frames are large.
pub const STACK_BYTES: usize = 8 * 1024 * 1024;

/// The rollout intent of one build-id cohort on a task queue.
#[derive(Clone, Debug, PartialEq)]
pub struct BuildIdRollout {
    /// None: the unversioned cohort.
    pub build_id: Option<String>,
    /// `active` or `draining`.
    pub drain_intent: String,
    pub drained_at: Option<Millis>,
    pub updated_at: Millis,
    /// When this cohort was promoted: new starts on the queue that name no build are pinned
    /// to it.
    pub promoted_at: Option<Millis>,
}

/// Counts for the system metrics endpoints.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SystemCounts {
    pub runs_by_status: Vec<(String, i64)>,
    pub tasks: Vec<(String, String, i64)>,
    pub expired_leases: i64,
    /// Runs whose leased workflow task expired: what a repair pass would re-dispatch.
    pub expired_lease_runs: Vec<(String, String)>,
}

/// The work of one queue at one moment, for metrics: tasks a worker could take now and tasks
/// leased to workers.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct QueueLoad {
    pub namespace: String,
    /// `workflow` or `activity`.
    pub kind: String,
    pub queue: String,
    /// Ready tasks whose time has come (waiting for a worker).
    pub ready: i64,
    /// When the oldest of them became available.
    pub oldest_ready_at: Option<Millis>,
    pub leased: i64,
}

/// A store's connections: PostgreSQL's pool, SQLite's readers (its one writer is not pooled).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PoolUse {
    pub max: usize,
    /// Connections open now.
    pub open: usize,
    /// Open and not lent out.
    pub idle: usize,
    /// Callers waiting for a connection.
    pub waiting: usize,
}

/// Open tasks of one queue, for task-queue describe.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct QueueSnapshot {
    /// (kind, status, count, oldest available_at) for ready and leased tasks.
    pub counts: Vec<(String, String, i64, Option<Millis>)>,
    pub leases: Vec<QueueLease>,
    /// Ready workflow tasks of runs pinned to a build: `(build id, count)`.
    pub pinned: Vec<(String, i64)>,
}

/// One leased task of a queue.
#[derive(Clone, Debug, PartialEq)]
pub struct QueueLease {
    pub task_id: String,
    pub kind: String,
    pub type_name: String,
    pub workflow_id: String,
    pub run_id: String,
    pub lease_owner: Option<String>,
    pub lease_expires_at: Option<Millis>,
}

/// What a schedule firing is asked to do.
#[derive(Clone, Debug)]
pub enum ScheduleFire {
    /// The scheduler's evaluation: buffered occurrences whose previous run closed, then every
    /// due occurrence (those older than the catch-up window are skipped and counted).
    Due { catchup_window_ms: i64 },
    /// An operator's trigger-now, with an optional one-off overlap policy.
    Manual {
        policy: Option<capstan_engine::schedule::OverlapPolicy>,
        /// Who triggered it: the schedule's event and the run it starts record it.
        principal: Option<capstan_engine::Principal>,
    },
    /// Every occurrence in `[start, end)`.
    Backfill {
        start: Millis,
        end: Millis,
        policy: Option<capstan_engine::schedule::OverlapPolicy>,
        principal: Option<capstan_engine::Principal>,
    },
}

/// What a firing did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FireReport {
    pub outcome: String,
    pub reason: Option<String>,
    pub workflow_id: Option<String>,
    pub run_id: Option<String>,
    pub buffer_depth: Option<usize>,
    /// Per occurrence, for a backfill.
    pub results: Vec<Value>,
    pub started: usize,
    /// For each workflow started on the schedule's own time (a due or buffered occurrence):
    /// how long after its nominal occurrence it started (jitter and buffering included).
    pub lateness_ms: Vec<Millis>,
}

/// One stored schedule audit event.
#[derive(Clone, Debug, PartialEq)]
pub struct ScheduleEventRecord {
    pub sequence: i64,
    pub event_id: String,
    pub event_type: String,
    pub recorded_at: Millis,
    pub workflow_id: Option<String>,
    pub run_id: Option<String>,
    pub payload: Map<String, Value>,
}

/// Which schedules to list: newest first, after a `(created_at, schedule_id)` cursor.
#[derive(Clone, Debug, Default)]
pub struct ScheduleFilter {
    pub status: Option<String>,
    pub workflow_type: Option<String>,
    pub after: Option<(Millis, String)>,
    pub limit: usize,
}

pub(crate) fn search_attribute_exists(name: &str) -> StoreError {
    Refusal::new(
        Reason::SearchAttributeAlreadyExists,
        format!("The search attribute {name:?} is already defined."),
    )
    .with("name", name)
    .into()
}

pub(crate) fn schedule_missing(schedule_id: &str, namespace: &str) -> StoreError {
    Refusal::new(
        Reason::ScheduleNotFound,
        format!("Schedule [{schedule_id}] not found in namespace [{namespace}]."),
    )
    .with("schedule_id", schedule_id)
    .into()
}

/// A namespace: the unit of isolation of workflows, queues and the ledger.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct NamespaceRecord {
    pub name: String,
    pub description: Option<String>,
    /// Closed runs older than this many days may be removed (none: kept).
    pub retention_days: Option<i64>,
    pub status: String,
    pub created_at: Millis,
    pub updated_at: Millis,
    /// Where payloads above its threshold go (`PUT /namespaces/{name}/external-storage`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub external_payload_storage: Option<ExternalStoragePolicy>,
}

/// A namespace's external payload storage policy, as an operator set it.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ExternalStoragePolicy {
    /// `local`, `s3`, `gcs` or `azure`.
    pub driver: String,
    pub enabled: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub threshold_bytes: Option<i64>,
    /// Driver settings (`uri`, `bucket`, `prefix`, `region`, `endpoint`, …), without empty values.
    #[serde(default, skip_serializing_if = "serde_json::Map::is_empty")]
    pub config: serde_json::Map<String, Value>,
}

/// Where a Nexus service catalog entry sits: an endpoint, a service of it, or an operation of
/// that service. Names are stored as given (the HTTP layer lower-cases them).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CatalogKey {
    pub namespace: String,
    pub endpoint: String,
    pub service: Option<String>,
    /// Only with a service.
    pub operation: Option<String>,
}

impl CatalogKey {
    /// The entry one level up (none for an endpoint).
    pub fn parent(&self) -> Option<CatalogKey> {
        match (&self.service, &self.operation) {
            (None, _) => None,
            (Some(_), None) => Some(CatalogKey {
                service: None,
                ..self.clone()
            }),
            (Some(_), Some(_)) => Some(CatalogKey {
                operation: None,
                ..self.clone()
            }),
        }
    }

    fn named(&self, refusal: Refusal) -> Refusal {
        let refusal = refusal
            .with("namespace", self.namespace.clone())
            .with("endpoint_name", self.endpoint.clone());
        let refusal = match &self.service {
            Some(service) => refusal.with("service_name", service.clone()),
            None => refusal,
        };
        match &self.operation {
            Some(operation) => refusal.with("operation_name", operation.clone()),
            None => refusal,
        }
    }

    /// The refusal for a key with no entry (its level's `…_not_found`).
    pub fn missing(&self) -> Refusal {
        let (reason, what) = match (&self.service, &self.operation) {
            (None, _) => (Reason::EndpointNotFound, "endpoint"),
            (Some(_), None) => (Reason::ServiceNotFound, "service"),
            (Some(_), Some(_)) => (Reason::OperationNotFound, "operation"),
        };
        self.named(Refusal::new(reason, format!("No such service {what} in the namespace.")))
    }

    pub(crate) fn taken(&self) -> Refusal {
        let (reason, what) = match (&self.service, &self.operation) {
            (None, _) => (Reason::EndpointAlreadyExists, "endpoint"),
            (Some(_), None) => (Reason::ServiceAlreadyExists, "service"),
            (Some(_), Some(_)) => (Reason::OperationAlreadyExists, "operation"),
        };
        self.named(Refusal::new(reason, format!("The service {what} already exists.")))
    }

    pub(crate) fn has_children(&self, count: usize) -> Refusal {
        let refusal = match self.service {
            None => Refusal::new(Reason::EndpointHasServices, "Delete the endpoint's services first."),
            Some(_) => Refusal::new(Reason::ServiceHasOperations, "Delete the service's operations first."),
        };
        self.named(refusal).with("count", count)
    }
}

/// A Nexus service catalog entry: its key, id, and document (description, metadata, and for an
/// operation its mode, handler binding and policies).
#[derive(Clone, Debug, PartialEq)]
pub struct CatalogEntry {
    pub key: CatalogKey,
    pub id: String,
    pub doc: Map<String, Value>,
    pub created_at: Millis,
    pub updated_at: Millis,
}

/// A payload uploaded to the runtime transport: its identity and where its bytes are.
#[derive(Clone, Debug, PartialEq)]
pub struct ExternalPayloadRecord {
    /// `ep_` and a ULID.
    pub reference_id: String,
    pub namespace: String,
    pub codec: String,
    pub size_bytes: i64,
    /// Lower-case hex SHA-256 of the bytes.
    pub sha256: String,
    /// The object store's URI of the bytes (`file:///…`, `s3://bucket/key`).
    pub location: String,
    pub created_at: Millis,
}

/// Ledger figures for metrics.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LedgerStats {
    /// `(namespace, state, entries, oldest dispatched_at)`.
    pub entries: Vec<(String, String, i64, Millis)>,
    /// `(namespace, open incidents)`.
    pub open_incidents: Vec<(String, i64)>,
}

/// A namespace row as stored: `name`, `description`, `created_at`, and the document (absent on
/// rows written before it existed).
pub(crate) fn namespace_from_row(name: String, description: Option<String>, created_at: Millis, doc: Option<String>) -> NamespaceRecord {
    doc.and_then(|d| serde_json::from_str(&d).ok()).unwrap_or(NamespaceRecord {
        name,
        description,
        retention_days: None,
        status: "active".into(),
        created_at,
        updated_at: created_at,
        external_payload_storage: None,
    })
}

pub(crate) fn namespace_missing(name: &str) -> StoreError {
    Refusal::new(Reason::NamespaceNotFound, format!("Namespace {name:?} does not exist."))
        .with("namespace", name)
        .into()
}

/// A write over a settled entry, or a resolution over one no longer `outcome_unknown`.
pub(crate) fn already_settled(entry: &LedgerEntry) -> StoreError {
    Refusal::new(
        Reason::LedgerEntryNotUnknown,
        "Only an entry whose outcome is unknown can be resolved.",
    )
    .with("ledger_key", entry.ledger_key.as_str())
    .into()
}

/// A JSON scalar as text for a database parameter or column that is not a number or boolean.
pub(crate) fn json_text(value: &Value) -> Option<String> {
    match value {
        Value::Null => None,
        Value::String(s) => Some(s.clone()),
        other => Some(other.to_string()),
    }
}

/// Which ledger entries to list.
#[derive(Clone, Debug, Default)]
pub struct LedgerFilter {
    pub state: Option<LedgerState>,
    pub workflow_id: Option<String>,
    pub activity_type: Option<String>,
}

/// One row of a workflow list.
/// A history event as it is stored: its payload is the JSON text written with it (the same
/// bytes `serde_json` gives for the event's payload map), so history can be served without
/// parsing and rendering it again.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredEvent {
    pub id: String,
    pub sequence: u64,
    pub event_type: String,
    pub payload: String,
    pub workflow_task_id: Option<String>,
    pub workflow_command_id: Option<String>,
    pub recorded_at: Millis,
    pub prev_hash: String,
    pub hash: String,
}

#[derive(Clone, Debug, PartialEq)]
pub struct RunSummary {
    pub namespace: String,
    pub workflow_id: WorkflowId,
    pub run_id: RunId,
    pub run_number: u32,
    pub workflow_type: String,
    pub task_queue: String,
    pub status: RunStatus,
    pub business_key: Option<String>,
    pub started_at: Millis,
    pub closed_at: Option<Millis>,
    pub search_attributes: Map<String, Value>,
    pub memo: Map<String, Value>,
}

#[derive(Clone, Debug, Default)]
pub struct ListFilter {
    pub workflow_type: Option<String>,
    pub task_queue: Option<String>,
    /// Keyset paging: only rows after this one in the listing order (newest first), so a deep
    /// page costs what the first one does.
    pub after: Option<ListCursor>,
    /// A status bucket: `running`, `completed` or `failed`.
    pub status_bucket: Option<String>,
    /// Substring of the workflow id or business key.
    pub query: Option<String>,
    /// Exact matches: `(key, value)` on a search attribute (its value rendered as text: strings
    /// as they are, other JSON values as JSON, each element of a list on its own).
    pub attributes: Vec<(String, String)>,
    pub workflow_id: Option<String>,
    pub business_key: Option<String>,
    /// A parsed, type-checked visibility filter (`capstan_engine::visibility`).
    pub filter: Option<capstan_engine::visibility::Filter>,
}

/// The last row of a listing page: the next page starts after `(started_at, run_id)`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListCursor {
    pub started_at: Millis,
    pub run_id: String,
}

/// Current runs matching a filter, per status bucket (the filter's own bucket and cursor are
/// ignored).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RunCounts {
    pub running: u64,
    pub completed: u64,
    pub failed: u64,
}

/// A task whose deadline has passed, claimed by one node's background clock under a duty fence.
#[derive(Clone, Debug, PartialEq)]
pub struct DueTask {
    pub namespace: String,
    pub task_id: TaskId,
    /// Grows each time the duty changes hands; [`Store::run_duty`] refuses an older one.
    pub duty_fence: u64,
}

/// Cross-node "a task became ready on this queue" notifications: `(namespace, kind, queue)`.
/// `(namespace, kind, queue)` of a task made ready.
pub type WakeKey = (String, TaskKind, String);
pub type WakeReceiver = tokio::sync::mpsc::UnboundedReceiver<WakeKey>;

/// A control-plane command keyed by a caller's `request_id`.
#[derive(Clone, Debug)]
pub struct CommandKey {
    pub command_type: String,
    pub request_id: String,
    /// Hash of what the command asks (name, arguments, target); a reuse with another intent
    /// is a `request_id_conflict`.
    pub intent_hash: String,
}

/// The receipt of a keyed command: fresh, or replayed from the first time.
#[derive(Clone, Debug)]
pub enum KeyedReceipt<T> {
    Fresh(T),
    Retained(Value),
}

/// The contract between the server and a storage backend. Every method is cancel-safe in the
/// sense that dropping the future never leaves a partial change; a dropped write may still
/// commit, exactly like a lost HTTP response, and callers rely on idempotency for that.
pub trait Store:
    RunStore + TaskStore + DutyStore + FleetStore + LedgerStore + ScheduleStore + AdminStore + StreamStore + PayloadStore + CatalogStore
{
}

impl<T> Store for T where
    T: RunStore + TaskStore + DutyStore + FleetStore + LedgerStore + ScheduleStore + AdminStore + StreamStore + PayloadStore + CatalogStore
{
}

/// The Nexus service catalog (endpoints → services → operations, per namespace).
pub trait CatalogStore: Send + Sync + 'static {
    /// Creates an entry; its parent must exist (`endpoint_not_found`, `service_not_found`), its
    /// key must be free (`…_already_exists`).
    fn create_catalog_entry(&self, entry: CatalogEntry) -> impl Future<Output = StoreResult<CatalogEntry>> + Send;

    /// Replaces an entry's document (`…_not_found`).
    fn update_catalog_entry(
        &self,
        key: CatalogKey,
        doc: Map<String, Value>,
        now: Millis,
    ) -> impl Future<Output = StoreResult<CatalogEntry>> + Send;

    fn catalog_entry(&self, key: CatalogKey) -> impl Future<Output = StoreResult<Option<CatalogEntry>>> + Send;

    /// The entries directly below `parent` (`None`: the namespace's endpoints), by name.
    fn catalog_children(&self, namespace: &str, parent: Option<CatalogKey>) -> impl Future<Output = StoreResult<Vec<CatalogEntry>>> + Send;

    /// Deletes an entry with nothing below it (`endpoint_has_services`, `service_has_operations`).
    fn delete_catalog_entry(&self, key: CatalogKey) -> impl Future<Output = StoreResult<CatalogEntry>> + Send;

    /// Admits service calls made outside any run (a client's execute request): `admit` decides
    /// with a `Cx` at `now`; the calls and linked runs it admitted are written atomically. A
    /// concurrent admission of the same route and key is a `Conflict`.
    fn admit_service_calls<T, F>(&self, now: Millis, admit: F) -> impl Future<Output = StoreResult<T>> + Send
    where
        T: Send + 'static,
        F: FnOnce(&mut Cx) -> T + Send + 'static;

    /// Cancels an open service call (its waiting callers get their cancelled rows; with
    /// `propagate` its linked instance is cancelled too), atomically; `service_call_terminal`
    /// if it already ended.
    fn cancel_service_call(
        &self,
        service_call_id: &str,
        reason: Option<String>,
        now: Millis,
        propagate: bool,
    ) -> impl Future<Output = StoreResult<ServiceCallRecord>> + Send;

    /// A Nexus service call by id.
    fn service_call(&self, service_call_id: &str) -> impl Future<Output = StoreResult<Option<ServiceCallRecord>>> + Send;

    /// The call admitted under a route and idempotency key, if any.
    fn service_call_by_key(
        &self,
        route: RouteKey,
        idempotency_key: &str,
    ) -> impl Future<Output = StoreResult<Option<ServiceCallRecord>>> + Send;

    /// The calls a caller instance made (one run of it, or all), oldest first, at most `limit`.
    fn service_calls_of_caller(
        &self,
        caller_namespace: &str,
        workflow_id: &str,
        run_id: Option<&str>,
        limit: usize,
    ) -> impl Future<Output = StoreResult<Vec<ServiceCallRecord>>> + Send;
}

/// External payloads uploaded to the runtime transport, and namespaces' storage policies. Uses
/// are recorded by the transactions that store state naming a reference; removing an instance
/// (retention) drops its uses.
pub trait PayloadStore: Send + Sync + 'static {
    /// Records an uploaded payload (its bytes are already in the object store).
    fn record_external_payload(&self, record: ExternalPayloadRecord) -> impl Future<Output = StoreResult<()>> + Send;

    /// A payload of the namespace by reference id.
    fn external_payload(
        &self,
        namespace: &str,
        reference_id: &str,
    ) -> impl Future<Output = StoreResult<Option<ExternalPayloadRecord>>> + Send;

    /// Payloads created before `created_before` that no stored instance uses, oldest first.
    fn unused_external_payloads(
        &self,
        created_before: Millis,
        limit: i64,
    ) -> impl Future<Output = StoreResult<Vec<ExternalPayloadRecord>>> + Send;

    /// Deletes a payload's row if nothing uses it still; whether it did (then its bytes may go).
    fn forget_unused_external_payload(&self, namespace: &str, reference_id: &str) -> impl Future<Output = StoreResult<bool>> + Send;

    /// Sets (or, with `None`, clears) a namespace's external storage policy.
    fn set_namespace_external_storage(
        &self,
        name: &str,
        policy: Option<ExternalStoragePolicy>,
        now: Millis,
    ) -> impl Future<Output = StoreResult<NamespaceRecord>> + Send;
}

/// Workflow output streams through the control plane (a worker's directives are applied by
/// its completion's transaction). Every call names a run that must exist (`instance_not_found`).
pub trait StreamStore: Send + Sync + 'static {
    /// Appends items (a known idempotency key reuses its offset); stops at the pending-item cap
    /// and keeps what came before it (`StreamAppend::full`). Opens the stream if new; refuses a
    /// closed (`stream_closed`) or errored (`stream_errored`) one.
    fn append_stream_items(
        &self,
        target: StreamTarget,
        items: Vec<capstan_engine::workflow_stream::StreamItemInput>,
        max_pending_items: Option<u64>,
        now: Millis,
    ) -> impl Future<Output = StoreResult<StreamAppend>> + Send;

    /// Closes or errors a stream (`stream_not_found` if it never opened); a terminal stream is
    /// answered as it stands.
    fn finish_stream(
        &self,
        target: StreamTarget,
        error_reason: Option<String>,
        retention_seconds: Option<i64>,
        now: Millis,
    ) -> impl Future<Output = StoreResult<StreamState>> + Send;

    /// The run's streams, by name.
    fn list_streams(&self, namespace: &str, workflow_id: &str, run_id: &str) -> impl Future<Output = StoreResult<Vec<StreamState>>> + Send;

    /// Items from offset `from`, at most `max`, with the stream (`stream_not_found`).
    fn read_stream(
        &self,
        target: StreamTarget,
        from: u64,
        max: u64,
    ) -> impl Future<Output = StoreResult<(StreamState, Vec<StoredStreamItem>)>> + Send;

    /// A reader reached `next_offset`; at the head, the stream's pending count drops to 0.
    fn stream_caught_up(&self, target: StreamTarget, next_offset: u64) -> impl Future<Output = StoreResult<()>> + Send;

    /// Deletes closed streams past their retention, with their items.
    fn expire_streams(&self, now: Millis) -> impl Future<Output = StoreResult<u64>> + Send;
}

/// Runs: start, transitions (plain and keyed), reads, listings.
pub trait RunStore: Send + Sync + 'static {
    /// This store (and every clone of it) reporting committed facts and commit times to
    /// `observer` from now on.
    fn with_observer(self, observer: std::sync::Arc<dyn Observer>) -> Self
    where
        Self: Sized;

    /// This store with `codec` for the payloads its transitions read and write on their own
    /// (a reconciliation probe's question and answer). Call it before the store is used.
    fn with_payload_codec(self, codec: &'static dyn MemoCodec) -> Self
    where
        Self: Sized;

    /// Starts run 1 of a new instance, honouring the duplicate policy and the global reservation
    /// of workflow ids.
    fn start_workflow(
        &self,
        start: StartRun,
        policy: DuplicatePolicy,
        now: Millis,
    ) -> impl Future<Output = StoreResult<(StartOutcome, RunState)>> + Send;

    /// Starts a standalone activity's host run: run 1 of a new id, or the next run of an id
    /// whose last activity has ended.
    fn start_standalone_activity(&self, start: StartStandaloneActivity, now: Millis) -> impl Future<Output = StoreResult<RunState>> + Send;

    /// Runs one engine transition on one run, atomically and durably.
    fn mutate_run<T, F>(
        &self,
        namespace: &str,
        locator: RunLocator,
        now: Millis,
        transition: F,
    ) -> impl Future<Output = StoreResult<(T, RunState)>> + Send
    where
        T: Send + 'static,
        F: FnOnce(&mut RunState, &mut Cx) -> Result<T, Refusal> + Send + 'static;

    /// Every run, in run-id order, a page at a time (for offline verification):
    /// `(namespace, workflow id, run id)` after `after`.
    fn runs_page(&self, after: Option<RunId>, limit: usize) -> impl Future<Output = StoreResult<Vec<(String, WorkflowId, RunId)>>> + Send;

    /// The receipt stored for a keyed command, if any: `(intent_hash, receipt)`. Lets a handler
    /// skip work a retry must not repeat (an update's validation) before `mutate_run_keyed`.
    fn retained_command(
        &self,
        namespace: &str,
        workflow_id: &WorkflowId,
        command_type: &str,
        request_id: &str,
    ) -> impl Future<Output = StoreResult<Option<(String, Value)>>> + Send;

    /// Like `mutate_run` for a control-plane command with a caller `request_id`: the first call
    /// applies and stores `render(result)`; a repeat with the same intent returns that stored
    /// receipt; a repeat with another intent is a `request_id_conflict`.
    fn mutate_run_keyed<T, F, R>(
        &self,
        namespace: &str,
        locator: RunLocator,
        key: CommandKey,
        now: Millis,
        transition: F,
        render: R,
    ) -> impl Future<Output = StoreResult<(KeyedReceipt<T>, Option<RunState>)>> + Send
    where
        T: Send + 'static,
        F: FnOnce(&mut RunState, &mut Cx) -> Result<T, Refusal> + Send + 'static,
        R: FnOnce(&T, &RunState) -> Value + Send + 'static;

    fn load_run(&self, namespace: &str, locator: RunLocator) -> impl Future<Output = StoreResult<Option<RunState>>> + Send;

    /// Appends an event to its instance's audit trail.
    fn record_audit(&self, event: AuditEvent) -> impl Future<Output = StoreResult<()>> + Send;

    /// An instance's audit events, newest first, strictly older than `before` (`(recorded_at,
    /// audit_id)` of the last one seen), at most `limit`.
    fn audit_events(
        &self,
        namespace: &str,
        workflow_id: &str,
        before: Option<(Millis, String)>,
        limit: usize,
    ) -> impl Future<Output = StoreResult<Vec<AuditEvent>>> + Send;

    /// Events with `after < sequence <= upto`, at most `limit`, in order.
    fn history(&self, run_id: &RunId, after: u64, upto: u64, limit: usize) -> impl Future<Output = StoreResult<Vec<HistoryEvent>>> + Send;

    /// The same events as stored ([`StoredEvent`]): served without being parsed and rendered
    /// again.
    fn stored_history(
        &self,
        run_id: &RunId,
        after: u64,
        upto: u64,
        limit: usize,
    ) -> impl Future<Output = StoreResult<Vec<StoredEvent>>> + Send;

    /// Runs newest first; returns the page and whether more follow.
    fn list_runs(
        &self,
        namespace: &str,
        filter: ListFilter,
        offset: usize,
        limit: usize,
    ) -> impl Future<Output = StoreResult<(Vec<RunSummary>, bool)>> + Send;

    /// How many current runs match `filter`, per status bucket.
    fn count_runs(&self, namespace: &str, filter: ListFilter) -> impl Future<Output = StoreResult<RunCounts>> + Send;

    /// All runs of an instance, oldest first.
    fn runs_of(&self, namespace: &str, workflow_id: &WorkflowId) -> impl Future<Output = StoreResult<Vec<RunSummary>>> + Send;
}

/// What is ready on a queue for a poll: a task of one of its types (`matching`), or of any type
/// (`any`; a poll that cannot take what is ready passes its wake-up on to another poller).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Readiness {
    pub any: bool,
    pub matching: bool,
}

/// Tasks: claims and ready-queue wake-ups, query and validation tasks, remembered polls.
pub trait TaskStore: Send + Sync + 'static {
    /// Open tasks of `kind` currently leased to `owner`.
    fn leased_tasks(&self, namespace: &str, owner: &str, kind: TaskKind) -> impl Future<Output = StoreResult<Vec<TaskId>>> + Send;

    /// Whether a poll of this shape could lease something right now, and whether anything at
    /// all is ready on the queue (a read, no writer trip).
    fn has_ready_task(
        &self,
        namespace: &str,
        kind: TaskKind,
        queue: &str,
        types: &[String],
        now: Millis,
    ) -> impl Future<Output = StoreResult<Readiness>> + Send;

    /// Leases the oldest ready task of `kind` on `queue` whose type the worker supports, and in
    /// the same transaction remembers it under the poll's `poll_request_id`, if any.
    #[allow(clippy::too_many_arguments)]
    fn claim_task(
        &self,
        namespace: &str,
        kind: TaskKind,
        queue: &str,
        types: &[String],
        owner: &str,
        lease_ms: i64,
        now: Millis,
        poll: Option<PollKey>,
    ) -> impl Future<Output = StoreResult<Option<(Task, RunState)>>> + Send;

    /// Wake-ups published by other nodes sharing the database; `None` for single-node stores
    /// (the in-process hub already sees every change).
    fn wakeups(&self) -> impl Future<Output = StoreResult<Option<WakeReceiver>>> + Send;

    /// Stores a new query task, ready for a query poller of its queue.
    fn create_query_task(&self, task: QueryTask) -> impl Future<Output = StoreResult<()>> + Send;

    /// Leases the oldest leasable query task of `kind` on `queue` (ready, or its lease ran out
    /// unanswered).
    fn claim_query_task(
        &self,
        namespace: &str,
        queue: &str,
        kind: QueryKind,
        owner: &str,
        lease_ms: i64,
        now: Millis,
    ) -> impl Future<Output = StoreResult<Option<QueryTask>>> + Send;

    /// Records a worker's answer under the engine's fencing rules (`QueryTask::answer`).
    fn answer_query_task(
        &self,
        namespace: &str,
        id: &str,
        owner: &str,
        attempt: u32,
        outcome: QueryOutcome,
        now: Millis,
    ) -> impl Future<Output = StoreResult<QueryTask>> + Send;

    fn get_query_task(&self, namespace: &str, id: &str) -> impl Future<Output = StoreResult<Option<QueryTask>>> + Send;

    fn delete_query_task(&self, namespace: &str, id: &str) -> impl Future<Output = StoreResult<()>> + Send;

    fn recall_poll(&self, key: PollKey) -> impl Future<Output = StoreResult<Option<(TaskId, u64)>>> + Send;
}

/// The background duties: due deadlines under a duty fence, retention and pruning.
pub trait DutyStore: Send + Sync + 'static {
    /// Claims up to `limit` tasks whose deadline is at or before `now` for `node`, for `hold_ms`:
    /// tasks whose duty is held by a live claim of another node are skipped; an expired claim is
    /// taken over with a higher duty fence.
    fn claim_due_tasks(
        &self,
        node: &str,
        now: Millis,
        limit: usize,
        hold_ms: i64,
    ) -> impl Future<Output = StoreResult<Vec<DueTask>>> + Send;

    /// Runs a deadline transition for a claimed duty: refused with `stale_fence` (and nothing
    /// written) unless the task's duty fence still equals `due.duty_fence`; releases the duty.
    fn run_duty<T, F>(&self, due: &DueTask, now: Millis, transition: F) -> impl Future<Output = StoreResult<(T, RunState)>> + Send
    where
        T: Send + 'static,
        F: FnOnce(&mut RunState, &mut Cx) -> Result<T, Refusal> + Send + 'static;

    /// The earliest pending deadline, so the clock can sleep until then.
    fn next_deadline(&self) -> impl Future<Output = StoreResult<Option<Millis>>> + Send;

    /// Instances whose current run closed before `cutoff` (retention), oldest first:
    /// `(workflow_id, current run id, closed_at)`.
    fn expired_instances(
        &self,
        namespace: &str,
        cutoff: Millis,
        limit: usize,
    ) -> impl Future<Output = StoreResult<Vec<(String, String, Millis)>>> + Send;

    /// Deletes expired instances with every run, history event, task and index row, and frees
    /// their workflow ids. Each is checked again in the transaction (still closed before
    /// `cutoff`); returns how many were deleted. Ledger entries and checkpoints are kept: they
    /// are evidence and outlive history.
    fn prune_instances(
        &self,
        namespace: &str,
        workflow_ids: Vec<String>,
        cutoff: Millis,
    ) -> impl Future<Output = StoreResult<usize>> + Send;

    /// Forgets poll memos and query tasks older than `older_than`.
    fn prune(&self, older_than: Millis) -> impl Future<Output = StoreResult<()>> + Send;
}

/// Workers, task queues and build-id rollouts.
pub trait FleetStore: Send + Sync + 'static {
    /// Creates or updates `(namespace, worker_id)`. A changed workflow definition fingerprint
    /// on an active registration is refused with `workflow_definition_changed`.
    fn register_worker(&self, worker: WorkerRecord) -> impl Future<Output = StoreResult<WorkerRecord>> + Send;

    fn heartbeat_worker(
        &self,
        namespace: &str,
        worker_id: &str,
        now: Millis,
    ) -> impl Future<Output = StoreResult<Option<WorkerRecord>>> + Send;

    fn get_worker(&self, namespace: &str, worker_id: &str) -> impl Future<Output = StoreResult<Option<WorkerRecord>>> + Send;

    /// Removes a registration; `false` when there was none.
    fn deregister_worker(&self, namespace: &str, worker_id: &str) -> impl Future<Output = StoreResult<bool>> + Send;

    /// One step on a worker session by `worker_id` (acquire, heartbeat, close), atomically:
    /// the session row is locked, refreshed (lease, TTL, holder still registered), decided by
    /// the engine and written back; a refusal writes nothing.
    fn session_step(
        &self,
        namespace: &str,
        session_id: &str,
        worker_id: &str,
        step: SessionStep,
        now: Millis,
    ) -> impl Future<Output = StoreResult<SessionAnswer>> + Send;

    /// A fenced deregistration: removes `worker_id`'s registration if `token` is its current
    /// `registration_token` and keeps the receipt (`DEREGISTRATION_RECEIPT_RETENTION_MS`), so a
    /// retry with the same token gets it again; answers `(receipt, replayed)`. Another token is
    /// `worker_registration_lost_authority`; no registration and no receipt is
    /// `worker_registration_token_not_found`.
    fn deregister_fenced(
        &self,
        namespace: &str,
        worker_id: &str,
        token: &str,
        now: Millis,
    ) -> impl Future<Output = StoreResult<(Value, bool)>> + Send;

    /// A worker session as stored (not refreshed).
    fn get_session(&self, namespace: &str, session_id: &str) -> impl Future<Output = StoreResult<Option<WorkerSession>>> + Send;

    /// The rollout intents recorded for a task queue's build-id cohorts.
    fn build_id_rollouts(&self, namespace: &str, queue: &str) -> impl Future<Output = StoreResult<Vec<BuildIdRollout>>> + Send;

    /// Drains (`draining: true`) or resumes a cohort. Draining again keeps the first
    /// `drained_at`; resuming clears it.
    fn set_build_id_drain(
        &self,
        namespace: &str,
        queue: &str,
        build_id: Option<String>,
        draining: bool,
        now: Millis,
    ) -> impl Future<Output = StoreResult<BuildIdRollout>> + Send;

    /// Promotes a cohort for new starts on a queue (un-promoting any other).
    fn promote_build_id(
        &self,
        namespace: &str,
        queue: &str,
        build_id: Option<String>,
        now: Millis,
    ) -> impl Future<Output = StoreResult<BuildIdRollout>> + Send;

    /// Every registration of a namespace, by worker id.
    fn workers(&self, namespace: &str) -> impl Future<Output = StoreResult<Vec<WorkerRecord>>> + Send;

    /// Task queues a namespace has used: with open tasks, or with registered workers.
    fn task_queue_names(&self, namespace: &str) -> impl Future<Output = StoreResult<Vec<String>>> + Send;

    /// Open tasks of one queue: counts by kind and status, and the current leases (at most
    /// `lease_limit`).
    fn task_queue_snapshot(
        &self,
        namespace: &str,
        queue: &str,
        lease_limit: usize,
    ) -> impl Future<Output = StoreResult<QueueSnapshot>> + Send;

    /// Registrations on one task queue (for query routing: who can answer).
    fn queue_workers(&self, namespace: &str, queue: &str) -> impl Future<Output = StoreResult<Vec<WorkerRecord>>> + Send;
}

/// The recovery ledger: action definitions, entries and checkpoints, atomic actions, integrity incidents.
pub trait LedgerStore: Send + Sync + 'static {
    /// Declares an activity type a consequential action. The same content again changes
    /// nothing; new content is the next version with a new hash.
    fn put_action_definition(
        &self,
        namespace: &str,
        activity_type: &str,
        recovery_mode: RecoveryMode,
        document: Map<String, Value>,
        now: Millis,
    ) -> impl Future<Output = StoreResult<ActionDefinition>> + Send;

    /// Every action definition of a namespace, by activity type.
    fn action_definitions(&self, namespace: &str) -> impl Future<Output = StoreResult<Vec<ActionDefinition>>> + Send;

    /// Ledger entries matching `filter`, oldest dispatch first.
    fn ledger_entries(
        &self,
        namespace: &str,
        filter: LedgerFilter,
        limit: usize,
    ) -> impl Future<Output = StoreResult<Vec<LedgerEntry>>> + Send;

    fn ledger_entry(&self, namespace: &str, ledger_key: &str) -> impl Future<Output = StoreResult<Option<LedgerEntry>>> + Send;

    /// An instance's ledger checkpoints in the order they were written.
    fn ledger_checkpoints(
        &self,
        namespace: &str,
        workflow_id: &WorkflowId,
    ) -> impl Future<Output = StoreResult<Vec<LedgerCheckpoint>>> + Send;

    /// Runs the oldest ready atomic-action task of `namespace` (if any) in one transaction:
    /// lease, handler, and its completion or failure.
    fn run_atomic_task(
        &self,
        namespace: &str,
        actions: AtomicActions,
        codec: &'static dyn MemoCodec,
        now: Millis,
    ) -> impl Future<Output = StoreResult<Option<AtomicOutcome>>> + Send;

    /// Ledger figures for metrics, per namespace: entries by state (with the oldest dispatch
    /// time in each state) and open integrity incidents.
    fn ledger_stats(&self) -> impl Future<Output = StoreResult<LedgerStats>> + Send;

    /// Integrity incidents of a namespace (`state`: `open` or `closed`; all without).
    fn integrity_incidents(
        &self,
        namespace: &str,
        state: Option<String>,
    ) -> impl Future<Output = StoreResult<Vec<IntegrityIncident>>> + Send;

    /// Closes an incident once its instance's ledger chain verifies again, and lets the run
    /// continue; a chain that is still broken is refused (`integrity_chain_broken`).
    fn close_integrity_incident(
        &self,
        namespace: &str,
        incident_id: &str,
        note: String,
        now: Millis,
    ) -> impl Future<Output = StoreResult<IntegrityIncident>> + Send;

    /// Every workflow instance that has ledger checkpoints: `(namespace, workflow id)`.
    fn ledger_instances(&self) -> impl Future<Output = StoreResult<Vec<(String, WorkflowId)>>> + Send;
}

/// Schedules: their rows, firings and audit history.
pub trait ScheduleStore: Send + Sync + 'static {
    /// Stores a new schedule and its first events. A live schedule with the id is refused
    /// (`schedule_already_exists`); a deleted one is replaced and its history continues.
    fn create_schedule(&self, schedule: capstan_engine::schedule::Schedule) -> impl Future<Output = StoreResult<()>> + Send;

    /// A live (not deleted) schedule.
    fn schedule(
        &self,
        namespace: &str,
        schedule_id: &str,
    ) -> impl Future<Output = StoreResult<Option<capstan_engine::schedule::Schedule>>> + Send;

    /// Live schedules of a namespace, newest first.
    fn list_schedules(
        &self,
        namespace: &str,
        filter: ScheduleFilter,
    ) -> impl Future<Output = StoreResult<Vec<capstan_engine::schedule::Schedule>>> + Send;

    /// Applies an engine change to a live schedule (update, pause, resume, delete) and appends
    /// the events it recorded, in one transaction. Missing → `schedule_not_found`.
    fn change_schedule<T: Send + 'static>(
        &self,
        namespace: &str,
        schedule_id: &str,
        change: impl FnOnce(&mut capstan_engine::schedule::Schedule) -> Result<T, Refusal> + Send + 'static,
    ) -> impl Future<Output = StoreResult<T>> + Send;

    /// Fires a schedule in one transaction with the workflows it starts (see `ScheduleFire`).
    /// `empty_input` is the payload of a start without input.
    fn fire_schedule(
        &self,
        namespace: &str,
        schedule_id: &str,
        fire: ScheduleFire,
        empty_input: Payload,
        now: Millis,
    ) -> impl Future<Output = StoreResult<FireReport>> + Send;

    /// Schedules with something to do at `now` (a due occurrence or a waiting buffer).
    fn due_schedules(&self, now: Millis, limit: usize) -> impl Future<Output = StoreResult<Vec<(String, String)>>> + Send;

    /// The earliest future fire time over all schedules.
    fn next_schedule_wake(&self) -> impl Future<Output = StoreResult<Option<Millis>>> + Send;

    /// A schedule's audit events after `after_sequence`, oldest first (at most `limit`); None if
    /// the id never existed in the namespace. Deleted schedules keep their history.
    fn schedule_history(
        &self,
        namespace: &str,
        schedule_id: &str,
        after_sequence: i64,
        limit: usize,
    ) -> impl Future<Output = StoreResult<Option<Vec<ScheduleEventRecord>>>> + Send;
}

/// Readiness, namespaces, system counts, bridge deliveries, search-attribute definitions.
pub trait AdminStore: Send + Sync + 'static {
    /// Whether the database takes a write now: a read, and a small probe write (always on
    /// PostgreSQL; on SQLite after a failed commit, until one commits again).
    fn ping(&self) -> impl Future<Output = StoreResult<()>> + Send;

    fn namespace_exists(&self, namespace: &str) -> impl Future<Output = StoreResult<bool>> + Send;

    /// Every namespace, by name.
    fn namespaces(&self) -> impl Future<Output = StoreResult<Vec<NamespaceRecord>>> + Send;

    /// Creates a namespace; an existing name is `namespace_already_exists`.
    fn create_namespace(&self, record: NamespaceRecord) -> impl Future<Output = StoreResult<NamespaceRecord>> + Send;

    /// Replaces a namespace's description and retention (`None` leaves a field as it is).
    fn update_namespace(
        &self,
        name: &str,
        description: Option<String>,
        retention_days: Option<i64>,
        now: Millis,
    ) -> impl Future<Output = StoreResult<NamespaceRecord>> + Send;

    /// Deletes an empty namespace (`default` never): one that still holds workflows is
    /// `namespace_not_empty`.
    fn delete_namespace(&self, name: &str) -> impl Future<Output = StoreResult<NamespaceRecord>> + Send;

    /// Runs per status and open tasks per (kind, status) of a namespace, and how many leases
    /// have expired at `now` without being reclaimed yet.
    fn system_counts(&self, namespace: &str, now: Millis) -> impl Future<Output = StoreResult<SystemCounts>> + Send;

    /// Every queue with workflow or activity work waiting or leased at `now` (at most `limit`
    /// queues, the busiest first).
    fn queue_loads(&self, now: Millis, limit: usize) -> impl Future<Output = StoreResult<Vec<QueueLoad>>> + Send;

    /// How the store's connections are used now.
    fn pool_use(&self) -> PoolUse;

    /// The outcome recorded for a bridge delivery, if it was accepted before.
    fn bridge_delivery(&self, namespace: &str, adapter: &str, key: &str) -> impl Future<Output = StoreResult<Option<Value>>> + Send;

    /// Records an accepted delivery; when one was recorded first (a concurrent repeat), returns
    /// that one instead and records nothing.
    fn record_bridge_delivery(
        &self,
        namespace: &str,
        adapter: &str,
        key: &str,
        outcome: Value,
        now: Millis,
    ) -> impl Future<Output = StoreResult<Option<Value>>> + Send;

    /// The custom search attributes defined in a namespace, by name.
    fn search_attribute_definitions(
        &self,
        namespace: &str,
    ) -> impl Future<Output = StoreResult<std::collections::BTreeMap<String, capstan_engine::visibility::AttributeType>>> + Send;

    /// Defines a custom search attribute; an existing name is refused
    /// (`search_attribute_already_exists`).
    fn define_search_attribute(
        &self,
        namespace: &str,
        name: &str,
        kind: capstan_engine::visibility::AttributeType,
        now: Millis,
    ) -> impl Future<Output = StoreResult<()>> + Send;

    /// Removes a definition (values already stored stay on their runs); `false` if none.
    fn delete_search_attribute(&self, namespace: &str, name: &str) -> impl Future<Output = StoreResult<bool>> + Send;

    /// Every credential managed over the admin API, by principal.
    fn credentials(&self) -> impl Future<Output = StoreResult<Vec<CredentialRecord>>> + Send;

    /// Stores a new credential; a principal already stored is `credential_already_exists`.
    /// Each change below is recorded on the audit trail ([`CredentialEvent`]) in its own
    /// transaction.
    fn create_credential(&self, record: CredentialRecord) -> impl Future<Output = StoreResult<CredentialRecord>> + Send;

    /// Applies `change` to a stored credential (`credential_not_found`), stamping who and when.
    fn change_credential(
        &self,
        principal: &str,
        change: CredentialChange,
        by: Option<capstan_engine::Principal>,
        now: Millis,
    ) -> impl Future<Output = StoreResult<CredentialRecord>> + Send;

    /// Removes a stored credential (`credential_not_found`); the removed one.
    fn delete_credential(
        &self,
        principal: &str,
        by: Option<capstan_engine::Principal>,
        now: Millis,
    ) -> impl Future<Output = StoreResult<CredentialRecord>> + Send;

    /// The credentials' audit trail, newest first: up to `limit` events older than `before`
    /// (a sequence), of `principal` alone if named.
    fn credential_events(
        &self,
        principal: Option<&str>,
        before: Option<i64>,
        limit: usize,
    ) -> impl Future<Output = StoreResult<Vec<CredentialEvent>>> + Send;
}

/// `(namespace, queue, worker, kind, poll_request_id)`: the scope of poll idempotency.
#[derive(Clone, Debug)]
pub struct PollKey {
    pub namespace: String,
    pub task_queue: String,
    pub worker_id: String,
    pub kind: TaskKind,
    pub poll_request_id: String,
}

/// The behaviour suite, for backends' tests only (feature `suite`; not in the production build).
#[cfg(feature = "suite")]
pub mod suite;
