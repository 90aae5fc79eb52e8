//! Reconciliation probes in the workload: the declared action names a probe, so every unknown
//! outcome starts one; workers answer it found, absent or inconclusive (or with nonsense, or fail
//! it), and the checks see each probe ask about its entry only, never run the action, and
//! resolve the entry at most once, as the probe. (The payload codec that reads their JSON
//! answers is the world's `SimCodec`.)

use crate::report::Failure;
use crate::workload::NAMESPACE;
use crate::world::World;
use capstan_engine::ledger_probe::probe_workflow_id;
use capstan_engine::{LedgerState, Payload};
use capstan_store::{LedgerFilter, LedgerStore, RunLocator, RunStore};
use rand::rngs::StdRng;
use rand::Rng;
use serde_json::{json, Map, Value};

/// The probe's activity type.
pub(crate) const PROBE: &str = "sim.lookup";

/// The declared action's definition: a bounded probe.
pub(crate) fn action_document() -> Map<String, Value> {
    let document = json!({"probe": {"activity_type": PROBE, "max_attempts": 2, "schedule_to_close_seconds": 120}});
    document.as_object().expect("an object").clone()
}

/// What a worker answers a probe with: mostly conclusive, sometimes not, sometimes nonsense.
pub(crate) fn probe_answer(rng: &mut StdRng) -> Payload {
    let answer = match rng.random_range(0..10) {
        0..=3 => json!({"outcome": "found", "evidence": {"provider_ref": "sim"}, "result": "receipt"}),
        4..=7 => json!({"outcome": "absent", "evidence": {"searched": "by key"}}),
        8 => json!({"outcome": "inconclusive", "evidence": {"note": "provider unsure"}}),
        _ => json!({"outcome": "found"}),
    };
    Payload::avro(answer.to_string())
}

/// At the end: every probe asked about its own entry by its idempotency key and ran the probe
/// type only; an entry a probe answered `found` or `absent` was resolved as that, by the
/// probe; nothing is left unknown. Counts the answers.
pub(crate) async fn check_probes(world: &mut World) -> Result<(), Failure> {
    let entries = world
        .store()
        .ledger_entries(NAMESPACE, LedgerFilter::default(), 100_000)
        .await
        .map_err(|e| world.fail(format!("ledger: {e}")))?;
    for entry in entries {
        if entry.state == LedgerState::OutcomeUnknown {
            return Err(world.fail(format!("ledger entry {} is still unknown", entry.ledger_key)));
        }
        let Some(probe) = &entry.probe else { continue };
        let probe_id = probe_workflow_id(&entry.ledger_key);
        if probe["workflow_id"] != json!(probe_id) {
            return Err(world.fail(format!("entry {}: probe {probe} is not its own", entry.ledger_key)));
        }
        let host = world
            .store()
            .load_run(NAMESPACE, RunLocator::Current(probe_id.clone()))
            .await
            .map_err(|e| world.fail(format!("load: {e}")))?
            .ok_or_else(|| world.fail(format!("probe {probe_id} was never started")))?;
        let asked = host.standalone.as_ref().map(|s| s.activity_type.as_str());
        if asked != Some(PROBE) || host.probe_of.as_ref().map(|t| t.ledger_key.as_str()) != Some(entry.ledger_key.as_str()) {
            return Err(world.fail(format!("probe {probe_id} ran {asked:?} for {:?}", host.probe_of)));
        }
        let principal = entry.resolution.as_ref().map(|r| r["principal"].clone());
        let by_probe = principal == Some(json!(format!("probe:{PROBE}")));
        let expected = match probe["state"].as_str() {
            Some("found") => Some(LedgerState::EffectConfirmed),
            Some("absent") => Some(LedgerState::EffectAbsent),
            _ => None,
        };
        match expected {
            Some(state) if state != entry.state || !by_probe => {
                return Err(world.fail(format!(
                    "entry {} answered {probe} but is {:?} by {principal:?}",
                    entry.ledger_key, entry.state
                )))
            }
            None if by_probe => {
                return Err(world.fail(format!(
                    "entry {} resolved by a probe that did not decide ({probe})",
                    entry.ledger_key
                )))
            }
            _ => {}
        }
        let slot = match probe["state"].as_str() {
            Some("found") => 0,
            Some("absent") => 1,
            Some("inconclusive") => 2,
            _ => 3,
        };
        world.counters.probes[slot] += 1;
    }
    Ok(())
}
