//! The command contract a workflow type has on a task queue: read from worker registrations.

use capstan_engine::{CommandContract, RunState};
use capstan_store::{RunLocator, Store, StoreResult, WorkerRecord};

/// The contract of `workflow_type` in the newest registration on the queue that declares one.
/// A rolling deploy therefore admits what the newest code declares.
pub fn newest(workers: &[WorkerRecord], workflow_type: &str) -> Option<CommandContract> {
    workers
        .iter()
        .filter_map(|worker| {
            let entry = worker.document.get("workflow_command_contracts")?.get(workflow_type)?;
            Some((worker.registered_at, CommandContract::from_registration(entry)?))
        })
        .max_by_key(|(registered_at, _)| *registered_at)
        .map(|(_, contract)| contract)
}

/// The contract registered now for a workflow type on a queue.
pub async fn registered<S: Store>(store: &S, namespace: &str, queue: &str, workflow_type: &str) -> StoreResult<Option<CommandContract>> {
    Ok(newest(&store.queue_workers(namespace, queue).await?, workflow_type))
}

/// The registered contract a command on the run at `locator` falls back to, only needed when the
/// run recorded none at its start (see `capstan_engine::admission_contract`).
pub async fn fallback_for<S: Store>(store: &S, namespace: &str, locator: &RunLocator) -> StoreResult<Fallback> {
    let run = store.load_run(namespace, locator.clone()).await?;
    fallback_of(store, namespace, run.as_ref()).await
}

/// [`fallback_for`] the run the caller already loaded.
pub async fn fallback_of<S: Store>(store: &S, namespace: &str, run: Option<&RunState>) -> StoreResult<Fallback> {
    match run {
        Some(run) if run.contract.is_none() => {
            let contract = registered(store, namespace, &run.task_queue, &run.workflow_type).await?;
            Ok(Fallback(contract.map(|c| (run.workflow_type.clone(), c))))
        }
        _ => Ok(Fallback(None)),
    }
}

/// A registered contract and the workflow type it was read for.
pub struct Fallback(Option<(String, CommandContract)>);

impl Fallback {
    /// The contract, if the run the transition sees is still of the type it was read for (the
    /// run may have continued as another type since).
    pub fn for_run(&self, run: &RunState) -> Option<&CommandContract> {
        self.0.as_ref().filter(|(ty, _)| *ty == run.workflow_type).map(|(_, c)| c)
    }
}
