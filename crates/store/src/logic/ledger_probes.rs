//! A reconciliation probe's answer, applied in the transaction that closes the probe's host
//! run: through the action instance's current run (the only one that extends the instance's
//! checkpoint chain), as an operator's resolution is.

use super::persist::persist;
use super::runs::lock_run;
use crate::tx::{args, Tx};
use crate::*;
use capstan_engine::ledger_probe::ProbeAnswer;

const CURRENT_RUN: &str = "SELECT current_run_id FROM workflow_instances WHERE workflow_id = $1 AND namespace = $2";

/// Records `answer` on its entry. The run is locked before the entry is read, so an operator's
/// resolution committed meanwhile is seen and the answer changes nothing (it stays on the
/// probe's own run).
pub(crate) async fn settle<T: Tx>(tx: &mut T, answer: &ProbeAnswer, env: &Env) -> StoreResult<()> {
    let target = &answer.target;
    let current = tx
        .query_opt(CURRENT_RUN, &args![target.workflow_id.as_str(), &target.namespace])
        .await?;
    let Some(run_id) = current.map(|row| row.text(0)).transpose()? else {
        return Ok(());
    };
    let Some(mut run) = lock_run(tx, &run_id, false).await? else {
        return Ok(());
    };
    let Some(stored) = super::ledger_reads::ledger_entry(tx, &target.namespace, &target.ledger_key).await? else {
        return Ok(());
    };
    let mut ids = env.ids();
    let mut cx = env.cx(answer.answered_at, &mut ids);
    match capstan_engine::answer_probe(&mut run, &mut cx, stored, answer) {
        Some(entry) => {
            tracing::info!(namespace = %target.namespace, ledger_key = %target.ledger_key, state = entry.state.as_str(),
                verdict = answer.verdict.name(), "reconciliation probe answered");
            let effects = cx.effects;
            persist(tx, &run, &effects, false, env).await
        }
        None => Ok(()),
    }
}
