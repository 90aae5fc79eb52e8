//! Importing a run from a history bundle in one transaction (`capstan_engine::import`): the
//! instance is created or locked, the run checked against what the store already holds, then
//! written with its copied history through `persist` like any new run.

use super::locate::lock_run;
use super::persist::persist;
use super::run_rows::{insert_instance, set_current_run, LOCK_INSTANCE};
use crate::tx::{args, Tx};
use crate::*;
use capstan_engine::import::{ImportedRun, InFlight};

const RUN_NUMBER_TAKEN: &str = "SELECT run_id FROM runs WHERE workflow_id = $1 AND run_number = $2";

fn conflict(rule: &str, message: &str) -> Refusal {
    Refusal::new(Reason::ImportRunConflict, message)
        .with("rule", rule)
        .with("errors", serde_json::json!([{"rule": rule, "message": message}]))
}

pub(crate) async fn import_run<T: Tx>(
    tx: &mut T,
    imported: ImportedRun,
    in_flight: InFlight,
    now: Millis,
    dry_run: bool,
    env: &Env,
) -> StoreResult<ImportOutcome> {
    // Lock order as a start's: the instance, then its runs.
    let instance = tx
        .query_opt(LOCK_INSTANCE.sql(tx.dialect()), &args![imported.workflow_id.as_str()])
        .await?;
    if let Some(existing) = lock_run(tx, imported.run_id.as_str(), false).await? {
        let repeat = existing
            .import
            .as_ref()
            .is_some_and(|stamp| stamp.dedupe_key == imported.stamp.dedupe_key)
            && existing.namespace == imported.namespace
            && existing.workflow_id == imported.workflow_id;
        if repeat {
            return Ok(ImportOutcome::AlreadyImported(existing));
        }
        return Err(conflict(
            "target.run_id_conflict",
            "A workflow run with this run_id already exists and was not imported from the same bundle.",
        )
        .with("run_id", imported.run_id.as_str())
        .into());
    }
    let mut becomes_current = true;
    if let Some(row) = &instance {
        let (namespace, current_run_id) = (row.text(0)?, row.text(1)?);
        if namespace != imported.namespace {
            return Err(Refusal::new(
                Reason::WorkflowIdReservedInNamespace,
                "This workflow id is reserved in another namespace.",
            )
            .with("workflow_id", imported.workflow_id.as_str())
            .into());
        }
        let taken = tx
            .query_opt(RUN_NUMBER_TAKEN, &args![imported.workflow_id.as_str(), imported.run_number as i64])
            .await?;
        if let Some(row) = taken {
            return Err(
                conflict("target.run_number_conflict", "The instance already has a run of this run_number.")
                    .with("existing_run_id", row.text(0)?)
                    .into(),
            );
        }
        let current = lock_run(tx, &current_run_id, false)
            .await?
            .ok_or_else(|| StoreError::Storage(format!("instance points at missing run {current_run_id}")))?;
        becomes_current = imported.run_number > current.run_number;
        // An open run goes on here only as its instance's current run.
        if !becomes_current && !imported.status.is_terminal() {
            return Err(conflict(
                "target.newer_run_present",
                "The instance here already has a later run; an open earlier run cannot go on beside it.",
            )
            .with("current_run_id", current_run_id)
            .into());
        }
        // A later run may not replace a run still open here; an earlier one is only history.
        if becomes_current && !current.is_closed() {
            return Err(conflict(
                "target.instance_open",
                "The instance's current run here is still open; an imported later run cannot replace it.",
            )
            .with("current_run_id", current_run_id)
            .into());
        }
    }
    let mut ids = env.ids();
    let mut cx = env.cx(now, &mut ids);
    let run = capstan_engine::import_run(&mut cx, imported, &in_flight)?;
    if dry_run {
        return Ok(ImportOutcome::WouldImport(run));
    }
    let effects = cx.effects;
    if instance.is_none() {
        match insert_instance(tx, &run, now).await {
            // Another node imported or started this id a moment ago.
            Err(StoreError::Conflict { .. }) => {
                return Err(conflict(
                    "target.instance_created",
                    "Another request created this workflow instance meanwhile; retry.",
                )
                .into())
            }
            other => other?,
        }
    }
    persist(tx, &run, &effects, true, env).await?;
    if instance.is_some() && becomes_current {
        set_current_run(tx, &run).await?;
    }
    Ok(ImportOutcome::Imported(run))
}
