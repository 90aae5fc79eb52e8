//! The recovery ledger's one human decision: an operator resolves an `outcome_unknown` entry
//! (the effect happened, with its result; or it did not, and the step runs again).

use crate::{AppError, AppResult, Services};
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
            cx.serve(RequestContext::acting_for(Some(principal)));
            if run.run_id == entry.run_id {
                resolve_ledger_entry(run, cx, &ledger_key, decision, evidence, &resolved_by)
            } else {
                resolve_earlier_run_entry(run, cx, entry, decision, evidence, &resolved_by)
            }
        })
        .await?;
    Ok(done)
}

/// An activity type declared a consequential action, its request shape already checked.
pub struct ActionDeclaration {
    pub namespace: String,
    pub activity_type: String,
    pub recovery_mode: RecoveryMode,
    /// The definition's fields (`recovery_mode`, `verification`, `pending`, `probe`, …).
    pub document: serde_json::Map<String, Value>,
    /// Whether this process has an atomic handler for the type (an atomic action runs here).
    pub atomic_handler: bool,
}

/// Declares (or re-declares, as its next version) an action. Refused: an atomic action this
/// process has no handler for, whose tasks would wait forever; a probe that is a declared
/// action, or an action over a type some definition probes with (a probe only asks).
pub async fn declare_action<V: Services>(services: &V, declaration: ActionDeclaration) -> AppResult<ActionDefinition> {
    let ActionDeclaration {
        namespace,
        activity_type,
        recovery_mode,
        document,
        atomic_handler,
    } = declaration;
    let store = services.store();
    check_probe(&store.action_definitions(&namespace).await?, &activity_type, &document)?;
    if recovery_mode == RecoveryMode::Atomic && !atomic_handler {
        return Err(Refusal::new(
            Reason::AtomicHandlerMissing,
            format!(
                "This server has no atomic handler registered for {activity_type:?}: atomic actions are Rust handlers \
                 registered by an application that embeds Capstan (see docs/recovery-ledger.md). Define it through a node \
                 that registers one."
            ),
        )
        .with("field", "recovery_mode")
        .into());
    }
    let definition = store
        .put_action_definition(&namespace, &activity_type, recovery_mode, document, services.now())
        .await?;
    Ok(definition)
}

fn check_probe(definitions: &[ActionDefinition], activity_type: &str, document: &serde_json::Map<String, Value>) -> AppResult<()> {
    use capstan_engine::ledger_probe::ProbeSpec;
    let probe = match document.get("probe") {
        None | Some(Value::Null) => None,
        Some(block) => Some(ProbeSpec::parse(block, activity_type).map_err(|(field, message)| AppError::invalid(field, message))?),
    };
    if let Some(probe) = probe.filter(|p| definitions.iter().any(|d| d.activity_type == p.activity_type)) {
        return Err(AppError::invalid(
            "probe.activity_type",
            format!(
                "{:?} is a declared action; a probe only asks, so it may not be one.",
                probe.activity_type
            ),
        ));
    }
    let probed_by = definitions
        .iter()
        .find(|d| ProbeSpec::of(&d.document).is_some_and(|p| p.activity_type == activity_type));
    if let Some(other) = probed_by {
        return Err(AppError::invalid(
            "activity_type",
            format!(
                "{activity_type:?} is the probe of {:?}; a probe may not be a declared action.",
                other.activity_type
            ),
        ));
    }
    Ok(())
}
