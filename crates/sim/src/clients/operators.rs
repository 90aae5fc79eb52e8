//! Operators in the workload: an operator settles `outcome_unknown` ledger entries, either
//! way (the effect was absent, or it happened with a result).

use crate::report::Failure;
use crate::workload::{NAMESPACE, PAYLOAD, SIMULATED_OPERATOR};
use crate::world::{Acted, World};
use capstan_app::ledger;
use capstan_engine::{LedgerDecision, LedgerState, Payload, Principal};
use capstan_store::{LedgerFilter, LedgerStore};
use rand::Rng;
use serde_json::json;

/// An operator settles an unknown outcome, if there is one to settle.
pub(crate) async fn resolve_unknown(world: &mut World) -> Result<Acted, Failure> {
    match resolve_one_unknown(world).await? {
        true => Ok(Acted::Done),
        false => Ok(Acted::Idle),
    }
}

/// An operator settles one `outcome_unknown` entry (either way); returns whether one was
/// settled.
pub(crate) async fn resolve_one_unknown(world: &mut World) -> Result<bool, Failure> {
    let filter = LedgerFilter {
        state: Some(LedgerState::OutcomeUnknown),
        ..LedgerFilter::default()
    };
    let entries = world
        .store()
        .ledger_entries(NAMESPACE, filter, 100)
        .await
        .map_err(|e| world.fail(format!("ledger: {e}")))?;
    let Some(entry) = entries.into_iter().next() else {
        return Ok(false);
    };
    let decision = if world.rng.random_bool(0.5) {
        LedgerDecision::EffectAbsent
    } else {
        LedgerDecision::EffectConfirmed {
            result: Payload::avro(PAYLOAD),
        }
    };
    world.trace(|| format!("operator resolves {} ({:?})", entry.ledger_key, decision));
    let resolution = ledger::Resolution {
        namespace: NAMESPACE.into(),
        ledger_key: entry.ledger_key,
        decision,
        evidence: json!({"note": "simulated operator"}),
        principal: Principal::token(SIMULATED_OPERATOR),
    };
    let result = ledger::resolve(&world.app, resolution).await;
    let Some((_, run)) = world.declined(result)? else {
        return Ok(false);
    };
    world.counters.outcome_unknown_resolved += 1;
    world.seen.acknowledge(&run);
    Ok(true)
}
