//! The worker fleet: a worker registers (and is given a fresh registration token), heartbeats,
//! and deregisters, plainly or fenced by its token; a departing worker's leased workflow tasks
//! are given back at once. An operator drains, resumes and promotes a queue's build ids.

use crate::{AppResult, Services};
use capstan_engine::{release_workflow_task, Millis, RunState, TaskKind};
use capstan_store::prelude::*;
use capstan_store::{BuildIdRollout, RunLocator, StoreError, WorkerRecord};
use serde_json::{Map, Value};

/// How often workers are asked to heartbeat (answered on register and heartbeat).
pub const HEARTBEAT_INTERVAL_SECONDS: i64 = 60;
/// A worker silent for longer than this is reported `stale`.
pub const STALE_AFTER_SECONDS: i64 = 120;

/// A worker's registration as it asked for it.
#[derive(Clone, Debug)]
pub struct Registration {
    pub namespace: String,
    /// `None`: the server names the worker (a fresh id).
    pub worker_id: Option<String>,
    pub task_queue: String,
    pub runtime: String,
    pub sdk_version: Option<String>,
    pub build_id: Option<String>,
    pub workflow_types: Vec<String>,
    pub activity_types: Vec<String>,
    pub fingerprints: Map<String, Value>,
    /// What the worker told about itself that is kept as it came (capabilities, slots…).
    pub document: Map<String, Value>,
}

/// A registration as stored, and the token a fenced deregistration must name.
#[derive(Clone, Debug)]
pub struct Registered {
    pub record: WorkerRecord,
    pub registration_token: String,
}

/// Registers (or re-registers) a worker. Every registration gets a new token, so only the
/// latest registration's holder can deregister it fenced.
pub async fn register<S: Services>(services: &S, registration: Registration) -> AppResult<Registered> {
    let now = services.now();
    let worker_id = registration.worker_id.unwrap_or_else(|| services.new_id());
    let registration_token = registration_token(&services.new_id(), &worker_id);
    let mut document = registration.document;
    document.insert("registration_token".into(), Value::from(registration_token.clone()));
    let record = WorkerRecord {
        namespace: registration.namespace,
        worker_id,
        task_queue: registration.task_queue,
        runtime: registration.runtime,
        sdk_version: registration.sdk_version,
        build_id: registration.build_id,
        supported_workflow_types: registration.workflow_types,
        supported_activity_types: registration.activity_types,
        workflow_definition_fingerprints: registration.fingerprints,
        document,
        status: "active".into(),
        registered_at: now,
        last_heartbeat_at: now,
    };
    let record = services.store().register_worker(record).await?;
    if let Some(known) = services.known_registrations() {
        known.note(&record);
    }
    Ok(Registered {
        record,
        registration_token,
    })
}

/// 32 lowercase hex characters, derived from a fresh id (the ids come from the services'
/// sources, so a simulated server mints them deterministically).
fn registration_token(fresh_id: &str, worker_id: &str) -> String {
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(format!("{fresh_id}\0{worker_id}").as_bytes());
    hex::encode(&digest[..16])
}

/// How often a worker heartbeats and when it counts as stale: its own declared cadence
/// (`heartbeat_interval_seconds`, kept in its document), else the server's; stale after two
/// missed beats, never sooner than [`STALE_AFTER_SECONDS`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cadence {
    pub interval_seconds: i64,
    pub stale_after_seconds: i64,
}

impl Cadence {
    pub fn of(document: &Map<String, Value>) -> Self {
        match document
            .get("heartbeat_interval_seconds")
            .and_then(Value::as_i64)
            .filter(|s| *s > 0)
        {
            Some(declared) => Cadence {
                interval_seconds: declared,
                stale_after_seconds: STALE_AFTER_SECONDS.max(declared.saturating_mul(2)),
            },
            None => Cadence {
                interval_seconds: HEARTBEAT_INTERVAL_SECONDS,
                stale_after_seconds: STALE_AFTER_SECONDS,
            },
        }
    }

    /// Whether a worker last heard from at `last_heartbeat_at` is stale at `now`.
    pub fn stale(&self, last_heartbeat_at: Millis, now: Millis) -> bool {
        now - last_heartbeat_at > self.stale_after_seconds * 1000
    }
}

/// A worker's heartbeat with what it reported (free slots, process metrics, cadence); `None`
/// when it is not registered (it should register again).
pub async fn heartbeat<S: Services>(
    services: &S,
    namespace: &str,
    worker_id: &str,
    reported: Map<String, Value>,
) -> AppResult<Option<WorkerRecord>> {
    Ok(services
        .store()
        .heartbeat_worker(namespace, worker_id, services.now(), reported)
        .await?)
}

/// Removes a registration; `None` when there was none, else the runs whose workflow tasks the
/// worker held and that were given back.
pub async fn deregister<S: Services>(services: &S, namespace: &str, worker_id: &str) -> AppResult<Option<Vec<RunState>>> {
    forget(services, namespace, worker_id);
    if !services.store().deregister_worker(namespace, worker_id).await? {
        return Ok(None);
    }
    Ok(Some(release_leased_workflow_tasks(services, namespace, worker_id).await?))
}

/// The node no longer serves polls from the registration it last saw.
fn forget<S: Services>(services: &S, namespace: &str, worker_id: &str) {
    if let Some(known) = services.known_registrations() {
        known.forget(namespace, worker_id);
    }
}

/// A fenced deregistration (see `FleetStore::deregister_fenced`): the receipt, and the runs
/// whose workflow tasks were given back (`None`: the receipt was replayed, nothing was done).
pub async fn deregister_fenced<S: Services>(
    services: &S,
    namespace: &str,
    worker_id: &str,
    token: &str,
) -> AppResult<(Value, Option<Vec<RunState>>)> {
    let (receipt, replayed) = services
        .store()
        .deregister_fenced(namespace, worker_id, token, services.now())
        .await?;
    forget(services, namespace, worker_id);
    if replayed {
        return Ok((receipt, None));
    }
    Ok((receipt, Some(release_leased_workflow_tasks(services, namespace, worker_id).await?)))
}

/// Gives a departed worker's leased workflow tasks back so live workers get them now, not
/// after the lease. (Activity attempts are left to finish or expire: the worker may still
/// report them.)
async fn release_leased_workflow_tasks<S: Services>(services: &S, namespace: &str, worker_id: &str) -> AppResult<Vec<RunState>> {
    let store = services.store();
    let mut released = Vec::new();
    for task_id in store.leased_tasks(namespace, worker_id, TaskKind::Workflow).await? {
        let (id, owner) = (task_id.clone(), worker_id.to_string());
        let changed = store
            .mutate_run(namespace, RunLocator::Task(task_id), services.now(), move |run, cx| {
                release_workflow_task(run, cx, &id, &owner)
            })
            .await;
        match changed {
            Ok(((), run)) => released.push(run),
            Err(StoreError::Refused(_)) => {} // completed or re-leased meanwhile
            Err(error) => return Err(error.into()),
        }
    }
    Ok(released)
}

/// Marks a build id of a queue draining (or no longer draining).
pub async fn set_build_id_drain<S: Services>(
    services: &S,
    namespace: &str,
    queue: &str,
    build_id: Option<String>,
    draining: bool,
) -> AppResult<BuildIdRollout> {
    let now: Millis = services.now();
    Ok(services
        .store()
        .set_build_id_drain(namespace, queue, build_id, draining, now)
        .await?)
}

/// Promotes a cohort: new starts on the queue that name no build are pinned to it.
pub async fn promote_build_id<S: Services>(
    services: &S,
    namespace: &str,
    queue: &str,
    build_id: Option<String>,
) -> AppResult<BuildIdRollout> {
    Ok(services
        .store()
        .promote_build_id(namespace, queue, build_id, services.now())
        .await?)
}

/// Whether `build_id`'s cohort is draining among a queue's rollouts.
pub fn draining_in(rollouts: &[BuildIdRollout], build_id: Option<&str>) -> bool {
    rollouts
        .iter()
        .any(|r| r.build_id.as_deref() == build_id && r.drain_intent == "draining")
}

/// Whether the worker's build-id cohort on its queue is draining (it gets no new work).
pub async fn is_draining<S: Services>(services: &S, worker: &WorkerRecord) -> AppResult<bool> {
    let rollouts = services.rollouts(&worker.namespace, &worker.task_queue).await?;
    Ok(draining_in(&rollouts, worker.build_id.as_deref()))
}
