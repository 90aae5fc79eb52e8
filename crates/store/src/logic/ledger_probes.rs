//! A reconciliation probe's answer, applied in the transaction that closes the probe's host
//! run: through the action instance's current run (the only one that extends the instance's
//! checkpoint chain), as an operator's resolution is.

use super::persist::persist;
use super::runs::locate_and_lock;
use crate::tx::Tx;
use crate::*;
use capstan_engine::ledger_probe::ProbeAnswer;

/// Records `answer` on its entry. The run is locked before the entry is read, so an operator's
/// resolution committed meanwhile is seen and the answer changes nothing (it stays on the
/// probe's own run).
pub(crate) async fn settle<T: Tx>(tx: &mut T, answer: &ProbeAnswer, env: &Env) -> StoreResult<()> {
    let target = &answer.target;
    let current = RunLocator::Current(target.workflow_id.clone());
    let Some(mut run) = locate_and_lock(tx, &target.namespace, &current).await? else {
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
