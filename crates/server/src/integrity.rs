//! Offline integrity checks: every run's history chain and every instance's ledger chain,
//! recomputed from the stored rows alone (`capstan verify`).

use capstan_engine::{ledger, verify_chain_from};
use capstan_store::{RunLocator, Store, StoreResult};
use serde::Serialize;

/// What a verification pass found.
#[derive(Debug, Default, Serialize)]
pub struct IntegrityReport {
    pub runs_checked: u64,
    pub events_checked: u64,
    pub ledger_instances_checked: u64,
    pub checkpoints_checked: u64,
    /// One line per broken chain: where, and what.
    pub problems: Vec<String>,
}

impl IntegrityReport {
    pub fn ok(&self) -> bool {
        self.problems.is_empty()
    }
}

const RUNS_PAGE: usize = 500;

/// Walks every run and every ledger chain in the store, and compares the kept run counts with
/// a full count.
pub async fn verify<S: Store>(store: &S) -> StoreResult<IntegrityReport> {
    let mut report = IntegrityReport::default();
    let mut after = None;
    loop {
        let page = store.runs_page(after.clone(), RUNS_PAGE).await?;
        let Some(last) = page.last() else { break };
        after = Some(last.2.clone());
        for (namespace, workflow_id, run_id) in page {
            report.runs_checked += 1;
            let Some(run) = store
                .load_run(&namespace, RunLocator::Run(workflow_id.clone(), run_id.clone()))
                .await?
            else {
                report
                    .problems
                    .push(format!("run {run_id} of {workflow_id} ({namespace}): listed but unreadable"));
                continue;
            };
            let events = store.history(&run.run_id, 0, run.last_sequence, usize::MAX / 2).await?;
            report.events_checked += events.len() as u64;
            let place = format!("run {run_id} of {workflow_id} ({namespace})");
            if let Err(sequence) = verify_chain_from(&run.chain_origin, &events) {
                report.problems.push(format!("{place}: history chain broken at event {sequence}"));
            } else if events.len() as u64 != run.last_sequence {
                report.problems.push(format!(
                    "{place}: {} events stored, the run records {}",
                    events.len(),
                    run.last_sequence
                ));
            } else if events.last().is_some_and(|e| e.hash != run.last_hash) {
                report
                    .problems
                    .push(format!("{place}: the last event's hash differs from the run's head"));
            }
        }
    }
    for drift in store.run_count_drift(None).await? {
        let key = &drift.key;
        report.problems.push(format!(
            "run counts of {} ({} on {}, {}{}): kept {}, a full count gives {}; POST /api/system/run-counts/rebuild repairs them",
            key.namespace,
            key.workflow_type,
            key.task_queue,
            key.class,
            if key.current { ", current" } else { "" },
            drift.kept,
            drift.counted
        ));
    }
    for (namespace, workflow_id) in store.ledger_instances().await? {
        report.ledger_instances_checked += 1;
        let checkpoints = store.ledger_checkpoints(&namespace, &workflow_id).await?;
        report.checkpoints_checked += checkpoints.len() as u64;
        if let Err(index) = ledger::verify_checkpoints(&checkpoints) {
            let key = &checkpoints[index].ledger_key;
            report.problems.push(format!(
                "ledger of {workflow_id} ({namespace}): checkpoint {index} (entry {key}) does not hash or link correctly"
            ));
        }
    }
    Ok(report)
}
