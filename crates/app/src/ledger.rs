//! The recovery ledger's one human decision: an operator resolves an `outcome_unknown` entry
//! (the effect happened, with its result; or it did not, and the step runs again).

use crate::{AppResult, Services};
use capstan_engine::*;
use capstan_store::prelude::*;
use capstan_store::RunLocator;
use serde_json::Value;

pub struct Resolution {
    pub namespace: String,
    pub ledger_key: String,
    pub decision: LedgerDecision,
    /// What the operator saw (the provider's reference, a note): required, recorded verbatim.
    pub evidence: Value,
    /// Who resolved it: its id is the entry's `resolved_by`, and the events the resolution
    /// causes record it.
    pub principal: Principal,
}

/// Resolves an entry whose outcome is unknown; any other entry is refused.
pub async fn resolve<V: Services>(services: &V, resolution: Resolution) -> AppResult<(LedgerEntry, RunState)> {
    let Resolution {
        namespace,
        ledger_key,
        decision,
        evidence,
        principal,
    } = resolution;
    let resolved_by = principal.id.clone();
    let store = services.store();
    let entry = store
        .ledger_entry(&namespace, &ledger_key)
        .await?
        .ok_or_else(|| Refusal::new(Reason::LedgerEntryNotFound, "No such ledger entry.").with("ledger_key", ledger_key.clone()))?;
    if entry.state != LedgerState::OutcomeUnknown {
        return Err(Refusal::new(
            Reason::LedgerEntryNotUnknown,
            "Only an entry whose outcome is unknown can be resolved.",
        )
        .with("ledger_key", ledger_key)
        .with("state", entry.state.as_str())
        .into());
    }
    // Through the instance's current run: only it extends the instance's checkpoint chain, so
    // an entry of an earlier (continued or retried) run is settled there, not on its own run.
    let locator = RunLocator::Current(entry.workflow_id.clone());
    let done = store
        .mutate_run(&namespace, locator, services.now(), move |run, cx| {
            cx.principal = Some(principal);
            if run.run_id == entry.run_id {
                resolve_ledger_entry(run, cx, &ledger_key, decision, evidence, &resolved_by)
            } else {
                resolve_earlier_run_entry(run, cx, entry, decision, evidence, &resolved_by)
            }
        })
        .await?;
    Ok(done)
}
