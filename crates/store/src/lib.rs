//! Capstan's storage. Every SQL statement of the project lives in this crate.
//!
//! [`Store`] is the contract the server programs against, ten traits declared and implemented
//! once in `contract/`; [`SqliteStore`] runs it on an embedded SQLite file, [`SharedStore`] on
//! a database server several nodes share (PostgreSQL, MySQL, MariaDB). A run's state changes
//! only by the engine's decisions: run transitions go through [`RunStore::mutate_run`], which
//! loads a run's state, hands it to an engine closure and — only when the closure returns `Ok`
//! — writes the new state, the appended history events and the changed task rows in one
//! transaction, before the returned future resolves. A refused transition writes nothing. Rows
//! that are not run state (namespaces, credentials, streams, workers, schedules) are decided
//! here, and refused with the engine's reasons.
//!
//! Crash contract: a future that resolved `Ok` means the change is durable (fsync'd); a crash
//! before that leaves no part of the change. Callers that lose the answer retry; the engine's
//! idempotency rules make the retry safe.

mod backend;
mod contract;
mod dispatch_shares;
mod durability;
mod limited_queues;
mod logic;
mod mysql;
mod observe;
pub mod parked_polls;
mod postgres;
pub mod pressure;
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

pub use contract::{
    AdminStore, CatalogStore, DutyStore, FleetStore, LedgerStore, PayloadStore, RunStore, ScheduleStore, StreamStore, TaskStore,
};
pub use durability::Durability;
pub use observe::{Commit, Fact, Observer};
pub use parked_polls::{HandedOff, Parked, Poller};
pub use shared::SharedStore;

/// The store traits, for code that calls a concrete store's methods (`use
/// capstan_store::prelude::*`); code generic over `S: Store` needs only `Store`.
pub mod prelude {
    pub use crate::{
        AdminStore, CatalogStore, DutyStore, FleetStore, LedgerStore, PayloadStore, RunStore, ScheduleStore, Store, StreamStore, TaskStore,
    };
}
pub use logic::fleet::DEREGISTRATION_RECEIPT_RETENTION_MS;
pub use logic::queries::{QueryAnswer, QueryClaim};
pub use logic::run_counts::{CountDrift, CountKey};
pub use logic::service_calls::propagates as cancellation_propagates;
pub use logic::sessions::{SessionAnswer, SessionStep};
pub use logic::streams::{StoredStreamItem, StreamAppend, StreamState, StreamTarget};
pub use schedules::{BACKFILL_MAX, FIRE_BATCH};
pub(crate) use sources::Env;
pub use sources::{Clock, IdMint, ManualClock, MintedIds, RandomIds, SeededIds, Sources, SystemClock};
pub use sqlite::{Replication as SqliteReplication, SqliteStore, WritesPaused};

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

/// What importing a run from a history bundle did (`RunStore::import_run`).
#[derive(Clone, Debug, PartialEq)]
pub enum ImportOutcome {
    /// Written, with its instance when it was new.
    Imported(RunState),
    /// This bundle's run (run id and dedupe key) was imported before: nothing changed.
    AlreadyImported(RunState),
    /// A dry run: the run the import would write; nothing was.
    WouldImport(RunState),
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
    /// Whether `other` is the same registration, heartbeats apart.
    pub fn same_registration(&self, other: &WorkerRecord) -> bool {
        let WorkerRecord {
            namespace,
            worker_id,
            task_queue,
            runtime,
            sdk_version,
            build_id,
            supported_workflow_types,
            supported_activity_types,
            workflow_definition_fingerprints,
            document,
            status,
            registered_at,
            last_heartbeat_at: _,
        } = self;
        *namespace == other.namespace
            && *worker_id == other.worker_id
            && *task_queue == other.task_queue
            && *runtime == other.runtime
            && *sdk_version == other.sdk_version
            && *build_id == other.build_id
            && *supported_workflow_types == other.supported_workflow_types
            && *supported_activity_types == other.supported_activity_types
            && *workflow_definition_fingerprints == other.workflow_definition_fingerprints
            && *document == other.document
            && *status == other.status
            && *registered_at == other.registered_at
    }

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

/// A batch operation (`docs/batch-operations.md`): an action applied to every current run a
/// query selects, a step at a time. `request` (the query and the action's parameters) and
/// `progress` (where it got to, and what it did) are the app's JSON.
#[derive(Clone, Debug, PartialEq)]
pub struct BatchOperation {
    pub namespace: String,
    pub batch_id: String,
    pub action: String,
    pub request: serde_json::Value,
    /// `running`, `completed` or `cancelled`.
    pub state: String,
    pub progress: serde_json::Value,
    /// Who asked: every run the batch acts on records them.
    pub principal: Option<capstan_engine::Principal>,
    pub request_id: Option<String>,
    pub created_at: Millis,
    pub updated_at: Millis,
    pub finished_at: Option<Millis>,
    /// When the next step may run (the batch's rate holds it back).
    pub next_step_at: Millis,
}

/// What one step of a batch saves, under the fence its claim took.
#[derive(Clone, Debug, PartialEq)]
pub struct BatchStep {
    pub batch_id: String,
    pub fence: u64,
    pub progress: serde_json::Value,
    pub next_step_at: Millis,
    /// The state the batch ended in with this step (`completed`), if it did.
    pub finished: Option<String>,
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

/// A queue's ready tasks by priority and fairness class, per kind (DW's priority-fairness
/// surface).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct QueueShares {
    pub workflow: KindShares,
    pub activity: KindShares,
}

/// One kind of a queue's ready tasks, by priority and class, with the classes' recent dispatch.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct KindShares {
    pub ready_tasks: i64,
    /// Most urgent first.
    pub tiers: Vec<PriorityTier>,
    /// Each class with ready tasks and its recent dispatch score (`None`: the default class).
    pub recent_dispatch: Vec<(Option<String>, f64)>,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct PriorityTier {
    pub priority: u8,
    pub count: i64,
    /// By class label (the default class as `__default__`).
    pub classes: Vec<ClassCount>,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct ClassCount {
    pub fairness_key: Option<String>,
    pub count: i64,
    pub fairness_weight: u16,
}

/// The flow-control limits set on one queue and task kind, with its bucket and its leased
/// tasks now.
#[derive(Clone, Debug, PartialEq)]
pub struct QueueLimitState {
    pub kind: TaskKind,
    pub limits: capstan_engine::flow::QueueLimits,
    pub bucket: capstan_engine::flow::Bucket,
    pub updated_at: Millis,
    pub leased: u64,
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
/// Hash of a command's intent, for `request_id` idempotency.
pub fn intent_hash(parts: &[&str]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(parts.join("\u{1f}").as_bytes()))
}

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
    /// DW's history budget of the run (its events, bytes and largest parallel group).
    pub history_budget: capstan_engine::HistoryBudget,
    /// The workflow task's failures in a row and the last one's message, while it keeps failing.
    pub workflow_task_failing: Option<(u32, String)>,
    /// An operator's hold on the run, while it lasts.
    pub paused: Option<capstan_engine::PauseRecord>,
}

#[derive(Clone, Debug, Default)]
pub struct ListFilter {
    pub workflow_type: Option<String>,
    pub task_queue: Option<String>,
    /// Keyset paging: only rows after this one in the listing order (newest first), so a deep
    /// page costs what the first one does.
    pub after: Option<ListCursor>,
    /// A status bucket: `running`, `completed` or `failed`; or `paused` (open runs an operator
    /// holds, within `running`).
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
    /// Only runs started at or before this time (a batch operation visits the runs there were
    /// when it was created).
    pub started_at_most: Option<Millis>,
    /// A count the kept counts cannot answer stops after this many matching runs (`None`:
    /// [`COUNT_SCAN_MAX`]); its figures are then lower bounds (`RunCounts::at_least`).
    pub count_at_most: Option<u64>,
}

/// Runs a count under a filter the kept counts cannot answer goes through at most.
pub const COUNT_SCAN_MAX: u64 = 10_000;

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
    /// Open runs an operator holds (counted in `running` too).
    pub paused: u64,
    /// More runs matched than a count goes through: each figure is a lower bound.
    pub at_least: bool,
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

/// What is ready on a queue for a poll: a task of one of its types (`matching`), or of any type
/// (`any`; a poll that cannot take what is ready passes its wake-up on to another poller); the
/// task (with its fence) an earlier poll with the same `poll_request_id` was answered with; and,
/// when asked, the poller's registration as it stands (`None` inside: not registered).
#[derive(Clone, Debug, PartialEq)]
pub struct Readiness {
    pub any: bool,
    pub matching: bool,
    pub recalled: Option<(TaskId, u64)>,
    pub registration: Option<Option<WorkerRecord>>,
}

/// One look of a poll at its queue, read in one statement (`TaskStore::look`).
#[derive(Clone, Debug)]
pub struct LookAsk {
    pub namespace: String,
    pub kind: TaskKind,
    pub queue: String,
    /// The types the poller runs (any when empty).
    pub types: Vec<String>,
    pub now: Millis,
    /// The poll's idempotency key: the lease an earlier poll with it took is read too.
    pub recall: Option<PollKey>,
    /// The poller, whose registration is read too (its types, queue and build may have changed).
    pub worker_id: Option<String>,
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
