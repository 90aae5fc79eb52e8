//! Reconciliation probes in the workload: the declared action names a probe, so every unknown
//! outcome starts one; workers answer it found, absent or inconclusive (or with nonsense, or fail
//! it), and the checks see each probe ask about its entry only, never run the action, and
//! resolve the entry at most once, as the probe.

use super::*;
use capstan_engine::ledger_probe::probe_workflow_id;

/// The probe's activity type.
pub(crate) const PROBE: &str = "sim.lookup";

/// The declared action's definition: a bounded probe.
pub(crate) fn action_document() -> Map<String, Value> {
    let document = json!({"probe": {"activity_type": PROBE, "max_attempts": 2, "schedule_to_close_seconds": 120}});
    document.as_object().expect("an object").clone()
}

/// Payload blobs as JSON text where they are JSON (probe questions and answers), the fixed
/// workload payload as a string: the simulator checks logic, not the SDKs' Avro.
pub(crate) struct SimCodec;

impl MemoCodec for SimCodec {
    fn merge(&self, _: MemoBase<'_>, _: &Payload) -> Result<MergedMemo, String> {
        Err("the simulated workload keeps no memo".into())
    }

    fn to_json(&self, payload: &Payload) -> Result<Value, String> {
        Ok(serde_json::from_str(&payload.blob).unwrap_or_else(|_| Value::String(payload.blob.clone())))
    }

    fn json_to_payload(&self, value: &Value) -> Result<Payload, String> {
        Ok(Payload::avro(value.to_string()))
    }
}

pub(crate) static SIM_CODEC: SimCodec = SimCodec;

impl Sim {
    /// What a worker answers a probe with: mostly conclusive, sometimes not, sometimes nonsense.
    pub(crate) fn probe_answer(&mut self) -> Payload {
        let answer = match self.rng.random_range(0..10) {
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
    pub(crate) async fn check_probes(&mut self) -> Result<(), Failure> {
        let entries = self
            .store()
            .ledger_entries(NAMESPACE, LedgerFilter::default(), 100_000)
            .await
            .map_err(|e| self.fail(format!("ledger: {e}")))?;
        for entry in entries {
            if entry.state == LedgerState::OutcomeUnknown {
                return Err(self.fail(format!("ledger entry {} is still unknown", entry.ledger_key)));
            }
            let Some(probe) = &entry.probe else { continue };
            let probe_id = probe_workflow_id(&entry.ledger_key);
            if probe["workflow_id"] != json!(probe_id) {
                return Err(self.fail(format!("entry {}: probe {probe} is not its own", entry.ledger_key)));
            }
            let host = self
                .store()
                .load_run(NAMESPACE, RunLocator::Current(probe_id.clone()))
                .await
                .map_err(|e| self.fail(format!("load: {e}")))?
                .ok_or_else(|| self.fail(format!("probe {probe_id} was never started")))?;
            let asked = host.standalone.as_ref().map(|s| s.activity_type.as_str());
            if asked != Some(PROBE) || host.probe_of.as_ref().map(|t| t.ledger_key.as_str()) != Some(entry.ledger_key.as_str()) {
                return Err(self.fail(format!("probe {probe_id} ran {asked:?} for {:?}", host.probe_of)));
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
                    return Err(self.fail(format!(
                        "entry {} answered {probe} but is {:?} by {principal:?}",
                        entry.ledger_key, entry.state
                    )))
                }
                None if by_probe => {
                    return Err(self.fail(format!(
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
            self.report.probes[slot] += 1;
        }
        Ok(())
    }
}
