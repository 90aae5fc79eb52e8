//! Polls: a registered worker asks for a workflow or activity task of its queue. One look at a
//! time; the long-poll wait around it (and waking on new work) is the caller's.
//!
//! A poll may carry a `poll_request_id`: a retry of it (its response was lost) gets the lease
//! the first one took back, while that lease is live, instead of a second task.

use crate::{AppResult, Services};
use capstan_engine::*;
use capstan_store::prelude::*;
use capstan_store::{HandedOff, LookAsk, Parked, PollKey, Poller, RunLocator, StoreError, WorkerRecord};

/// The registration a poll comes from, checked: it exists, is for this queue, and (when the poll
/// names one) for this build. The one this node last saw serves when it passes: the poll's
/// looks read the registration as it stands anyway (`claim`).
pub async fn poller<V: Services>(
    services: &V,
    namespace: &str,
    worker_id: &str,
    queue: &str,
    build_id: Option<&str>,
) -> AppResult<WorkerRecord> {
    let known = services.known_registrations();
    if let Some(worker) = known.and_then(|known| known.get(namespace, worker_id)) {
        if fits(&worker, queue, build_id).is_ok() {
            return Ok(worker);
        }
    }
    let worker = services
        .store()
        .get_worker(namespace, worker_id)
        .await?
        .ok_or_else(|| not_registered(worker_id))?;
    if let Some(known) = known {
        known.note(&worker);
    }
    fits(&worker, queue, build_id)?;
    Ok(worker)
}

fn not_registered(worker_id: &str) -> Refusal {
    Refusal::new(Reason::WorkerNotRegistered, "Register the worker before polling.").with("worker_id", worker_id)
}

/// Whether a poll for `queue` (and `build_id`, when it names one) may come from `worker`.
fn fits(worker: &WorkerRecord, queue: &str, build_id: Option<&str>) -> Result<(), Refusal> {
    if worker.task_queue != queue {
        return Err(
            Refusal::new(Reason::TaskQueueMismatch, "The worker is registered for another task queue.")
                .with("registered_task_queue", worker.task_queue.clone())
                .with("requested_task_queue", queue),
        );
    }
    if let (Some(asked), Some(registered)) = (build_id, &worker.build_id) {
        if asked != registered {
            return Err(
                Refusal::new(Reason::BuildIdMismatch, "The poll's build id differs from the registration's.")
                    .with("registered_build_id", registered.clone())
                    .with("requested_build_id", asked),
            );
        }
    }
    Ok(())
}

/// The worker registrations a node last saw, so that a poll does not read its worker's before
/// its first look. Bounded: past [`KnownRegistrations::MAX`] it starts over.
#[derive(Debug, Default)]
pub struct KnownRegistrations {
    seen: std::sync::Mutex<std::collections::HashMap<(String, String), WorkerRecord>>,
}

impl KnownRegistrations {
    const MAX: usize = 4_096;

    pub fn get(&self, namespace: &str, worker_id: &str) -> Option<WorkerRecord> {
        let seen = self.seen.lock().expect("known registrations");
        seen.get(&(namespace.to_string(), worker_id.to_string())).cloned()
    }

    pub fn note(&self, worker: &WorkerRecord) {
        let mut seen = self.seen.lock().expect("known registrations");
        if seen.len() >= Self::MAX {
            seen.clear();
        }
        seen.insert((worker.namespace.clone(), worker.worker_id.clone()), worker.clone());
    }

    pub fn forget(&self, namespace: &str, worker_id: &str) {
        let mut seen = self.seen.lock().expect("known registrations");
        seen.remove(&(namespace.to_string(), worker_id.to_string()));
    }
}

/// One poll for a task of `kind`.
#[derive(Clone, Debug)]
pub struct Poll {
    pub namespace: String,
    pub worker: WorkerRecord,
    pub kind: TaskKind,
    pub poll_request_id: Option<String>,
    /// How long a lease this poll takes lasts.
    pub lease_ms: i64,
}

impl Poll {
    /// The scope of the poll's idempotency, when it has a request id.
    pub fn key(&self) -> Option<PollKey> {
        self.poll_request_id.as_ref().map(|id| PollKey {
            namespace: self.namespace.clone(),
            task_queue: self.worker.task_queue.clone(),
            worker_id: self.worker.worker_id.clone(),
            kind: self.kind,
            poll_request_id: id.clone(),
        })
    }

    fn types(&self) -> &[String] {
        match self.kind {
            TaskKind::Workflow => &self.worker.supported_workflow_types,
            _ => &self.worker.supported_activity_types,
        }
    }
}

/// The lease an earlier poll with the same request id took (`task_id` at `fence`), if it is
/// still this worker's.
async fn recalled<V: Services>(services: &V, poll: &Poll, task_id: TaskId, fence: u64) -> AppResult<Option<(Task, RunState)>> {
    let Some(run) = services
        .store()
        .load_run(&poll.namespace, RunLocator::Task(task_id.clone()))
        .await?
    else {
        return Ok(None);
    };
    let now = services.now();
    let owner = poll.worker.worker_id.as_str();
    let live = run.tasks.get(&task_id).filter(|t| {
        t.lease()
            .is_some_and(|l| l.owner == owner && l.fence == fence && l.expires_at > now)
    });
    Ok(live.cloned().map(|task| (task, run)))
}

/// What one look of a poll came to. A long poll is woken by one announcement per ready task,
/// and whoever is woken but does not take the work passes the wake-up on: `Missed` says there
/// is work on the queue this poll did not take, `Idle` that there is none.
pub enum Claim {
    Leased(Box<(Task, RunState)>),
    /// Something is ready that this poll could not take (another type, build, sticky or session
    /// worker) or lost to another poller.
    Missed,
    /// Nothing is ready on the queue.
    Idle,
    /// The queue's flow-control limits hold claims back: which limit, and in how many
    /// milliseconds to look again.
    Throttled {
        held_by: String,
        retry_after_ms: i64,
    },
    /// The worker registered again, differently, since the poll read its registration: the poll
    /// ends without work, and the worker's next poll runs on the new registration.
    Reregistered,
}

impl Claim {
    pub fn into_lease(self) -> Option<(Task, RunState)> {
        match self {
            Claim::Leased(leased) => Some(*leased),
            Claim::Missed | Claim::Idle | Claim::Throttled { .. } | Claim::Reregistered => None,
        }
    }
}

/// A retried poll's earlier lease while it is live (see the module's note), else the oldest ready
/// task the worker can run, if there is one now.
pub async fn claim<V: Services>(services: &V, poll: &Poll) -> AppResult<Claim> {
    let store = services.store();
    let now = services.now();
    let queue = poll.worker.task_queue.as_str();
    let ready = store
        .look(LookAsk {
            namespace: poll.namespace.clone(),
            kind: poll.kind,
            queue: queue.to_string(),
            types: poll.types().to_vec(),
            now,
            recall: poll.key(),
            worker_id: Some(poll.worker.worker_id.clone()),
        })
        .await?;
    if let Some(current) = &ready.registration {
        if !current.as_ref().is_some_and(|current| current.same_registration(&poll.worker)) {
            return reregistered(services, poll, current.as_ref());
        }
    }
    if let Some((task_id, fence)) = ready.recalled {
        if let Some(lease) = recalled(services, poll, task_id, fence).await? {
            return Ok(Claim::Leased(Box::new(lease)));
        }
    }
    if !ready.matching {
        return Ok(if ready.any { Claim::Missed } else { Claim::Idle });
    }
    let owner = poll.worker.worker_id.as_str();
    let claimed = store
        .claim_task(
            &poll.namespace,
            poll.kind,
            queue,
            poll.types(),
            owner,
            poll.lease_ms,
            now,
            poll.key(),
        )
        .await;
    let claimed = match claimed {
        Err(StoreError::Refused(refusal)) if refusal.reason == Reason::TaskQueueThrottled => {
            let detail = |key: &str| refusal.details.get(key).cloned().unwrap_or_default();
            return Ok(Claim::Throttled {
                held_by: detail("held_by").as_str().unwrap_or_default().to_string(),
                retry_after_ms: detail("retry_after_ms").as_i64().unwrap_or(1_000),
            });
        }
        other => other?,
    };
    let Some((task, run)) = claimed else { return Ok(Claim::Missed) };
    tracing::info!(namespace = %poll.namespace, workflow_id = %run.workflow_id, run_id = %run.run_id, task_id = %task.id,
        kind = poll.kind.as_str(), fence = task.fence, owner, "task leased");
    Ok(Claim::Leased(Box::new((task, run))))
}

/// A poll whose worker's registration is not the one it started with: gone, refused; changed,
/// ended without work (a poll does not change its types or build mid-way).
fn reregistered<V: Services>(services: &V, poll: &Poll, current: Option<&WorkerRecord>) -> AppResult<Claim> {
    let known = services.known_registrations();
    let Some(current) = current else {
        if let Some(known) = known {
            known.forget(&poll.namespace, &poll.worker.worker_id);
        }
        return Err(not_registered(&poll.worker.worker_id).into());
    };
    if let Some(known) = known {
        known.note(current);
    }
    Ok(Claim::Reregistered)
}

/// Parks the poll on this node between looks: a transaction that makes a task it may take ready
/// leases it to the poll there and then (see `capstan_store::parked_polls`).
pub fn park<V: Services>(services: &V, poll: &Poll) -> Parked {
    services.store().park_poll(Poller {
        namespace: poll.namespace.clone(),
        kind: poll.kind,
        queue: poll.worker.task_queue.clone(),
        worker_id: poll.worker.worker_id.clone(),
        build_id: poll.worker.build_id.clone(),
        types: poll.types().to_vec(),
        lease_ms: poll.lease_ms,
        poll: poll.key(),
    })
}

/// A lease handed to a parked poll that went away before its answer: a workflow task is given
/// back at once (no history changes; its next lease is fenced higher). An activity attempt is
/// left to its lease, as a claim's lost answer is: its start is history already. The run given
/// back, if it was.
pub async fn give_back<V: Services>(services: &V, handed: HandedOff) -> AppResult<Option<RunState>> {
    let HandedOff { task, run } = handed;
    let Some(lease) = task.lease().cloned() else { return Ok(None) };
    if task.kind != TaskKind::Workflow {
        tracing::info!(namespace = %run.namespace, run_id = %run.run_id, task_id = %task.id,
            "an activity attempt handed to a poll that went away waits for its lease to run out");
        return Ok(None);
    }
    let task_id = task.id.clone();
    let given = services
        .store()
        .mutate_run(&run.namespace, RunLocator::Task(task_id.clone()), services.now(), move |run, cx| {
            // Only the lease that was handed: a report or a newer lease since then stands.
            let held = run
                .tasks
                .get(&task_id)
                .and_then(|t| t.lease())
                .is_some_and(|l| l.fence == lease.fence);
            if !held {
                return Err(Refusal::new(Reason::TaskNotLeased, "The handed lease has ended."));
            }
            release_workflow_task(run, cx, &task_id, &lease.owner)
        })
        .await;
    match given {
        Ok(((), run)) => {
            tracing::info!(namespace = %run.namespace, run_id = %run.run_id, task_id = %task.id,
                "a workflow task handed to a poll that went away was given back");
            Ok(Some(run))
        }
        Err(StoreError::Refused(_)) => Ok(None),
        Err(error) => Err(error.into()),
    }
}
