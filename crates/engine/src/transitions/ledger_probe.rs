//! Reconciliation probes as the transitions drive them: started when a dispatch's outcome
//! becomes unknown, answered when the probe's host run closes (the model is
//! [`crate::ledger_probe`]).

use super::ledger_steps::{checkpoint, resolve_entry_as, Resolver};
use crate::ledger_probe::{probe_workflow_id, ProbeAnswer, ProbeSpec, ProbeTarget, Verdict, PROBE_RETRIES_PER_EXECUTION};
use crate::transitions::{integrity_refusal, iso8601};
use crate::{
    resolve_earlier_run_entry, start_standalone_activity, ActivityExecution, ActivityTimeouts, Cx, LedgerDecision, LedgerEntry,
    LedgerState, RetryPolicy, RunState, RunStatus, StartRun, StartStandaloneActivity,
};
use serde_json::{json, Map, Value};

/// A dispatch's outcome became unknown: the entry records why in its next checkpoint, and when
/// the action names a probe, the probe is started in the same transaction.
pub(super) fn mark_outcome_unknown(run: &mut RunState, cx: &mut Cx, mut entry: LedgerEntry, execution: &ActivityExecution, reason: Value) {
    entry.state = LedgerState::OutcomeUnknown;
    entry.unknown_reason = Some(reason.clone());
    let mut details = obj!("reason" => reason);
    if let Some(spec) = execution.action.as_ref().and_then(|pin| pin.probe.as_ref()) {
        let probe = start_probe(run, cx, &entry, execution, spec);
        details.insert("probe".into(), probe.clone());
        entry.probe = Some(probe);
    }
    checkpoint(run, cx, entry, details);
}

/// Starts the probe of `entry` as a standalone activity whose one argument is the question:
/// the provider's idempotency key and the dispatch it is asked about. Returns the probe's state
/// as the entry keeps it.
fn start_probe(run: &RunState, cx: &mut Cx, entry: &LedgerEntry, execution: &ActivityExecution, spec: &ProbeSpec) -> Value {
    let probe_id = probe_workflow_id(&entry.ledger_key);
    let mut state = json!({"workflow_id": probe_id, "activity_type": spec.activity_type});
    let question = json!([{
        "idempotency_key": execution.provider_key(),
        "ledger_key": entry.ledger_key,
        "namespace": entry.namespace,
        "workflow_id": entry.workflow_id,
        "run_id": entry.run_id,
        "activity_type": entry.activity_type,
        "activity_execution_id": entry.activity_execution_id,
        "activity_attempt_id": entry.activity_attempt_id,
        "attempt_number": entry.attempt_number,
    }]);
    let input = match cx.memo.map(|codec| codec.json_to_payload(&question)) {
        Some(Ok(input)) => input,
        Some(Err(error)) => return not_dispatched(state, format!("the question could not be encoded: {error}")),
        None => return not_dispatched(state, "no payload codec to encode the question with".into()),
    };
    let mut next = Cx::new(cx.now, &mut *cx.ids, cx.limits);
    let host = StartRun {
        scheduling: run.scheduling.clone(),
        namespace: run.namespace.clone(),
        workflow_id: probe_id,
        run_id: next.id(),
        workflow_type: crate::standalone::STANDALONE_ACTIVITY_TYPE.to_string(),
        task_queue: spec.task_queue.clone().unwrap_or_else(|| execution.queue.clone()),
        input,
        execution_timeout_seconds: None,
        run_timeout_seconds: None,
        business_key: None,
        memo: Map::new(),
        search_attributes: Map::new(),
        command_id: next.id(),
        contract: None,
        compatibility: None,
        origin_trace: run.origin_trace.clone(),
        principal: cx.principal.clone(),
    };
    let start = StartStandaloneActivity {
        run: host,
        activity_type: spec.activity_type.clone(),
        activity_class: spec.activity_type.clone(),
        retry_policy: Some(RetryPolicy {
            max_attempts: Some(spec.max_attempts),
            backoff_seconds: Vec::new(),
            non_retryable_error_types: Vec::new(),
        }),
        timeouts: ActivityTimeouts {
            start_to_close_seconds: Some(spec.start_to_close_seconds),
            schedule_to_start_seconds: None,
            schedule_to_close_seconds: Some(spec.schedule_to_close_seconds),
            heartbeat_seconds: None,
        },
    };
    let mut probe = start_standalone_activity(&mut next, start, 1);
    probe.probe_of = Some(ProbeTarget {
        namespace: run.namespace.clone(),
        workflow_id: run.workflow_id.clone(),
        ledger_key: entry.ledger_key.clone(),
        probe_type: spec.activity_type.clone(),
    });
    let effects = next.effects;
    cx.effects.probes_started.push((probe, effects));
    state["state"] = json!("dispatched");
    state
}

fn not_dispatched(mut state: Value, problem: String) -> Value {
    state["state"] = json!("not_dispatched");
    state["problem"] = json!(problem);
    state
}

/// A probe's host run is closing: what it answered (a completed probe's decoded result; any
/// other end is inconclusive), for the store to apply to the action's instance.
pub(super) fn probe_answer(run: &RunState, cx: &Cx, target: ProbeTarget) -> ProbeAnswer {
    let inconclusive = |evidence: Value| Verdict::Inconclusive { evidence };
    let verdict = match (&run.output, run.status, cx.memo) {
        (Some(output), RunStatus::Completed, Some(codec)) => match codec.to_json(output) {
            Ok(answer) => Verdict::read(&answer, |value| codec.json_to_payload(value)),
            Err(error) => inconclusive(json!({"problem": format!("the probe's answer could not be decoded: {error}")})),
        },
        (Some(_), RunStatus::Completed, None) => inconclusive(json!({"problem": "the probe's answer could not be decoded here"})),
        _ => inconclusive(json!({
            "problem": "the probe ended without an answer",
            "status": run.status.as_str(),
            "failure": run.failure.as_ref().map(|f| f.message.clone()),
        })),
    };
    ProbeAnswer {
        target,
        probe_workflow_id: run.workflow_id.clone(),
        verdict,
        answered_at: cx.now,
    }
}

/// Records a probe's answer about `stored` (the entry as the store holds it) through the
/// instance's current run. `found` and `absent` resolve the entry as an operator's decision
/// would, with the probe as the principal; an inconclusive answer — or one the step cannot take
/// (a found result that fails the definition's checks, a second `absent` for one execution) —
/// is recorded on the entry and leaves the decision to the operator. `None`: nothing recorded
/// (the entry was settled meanwhile, or the instance's chain is blocked by an incident).
pub fn answer_probe(run: &mut RunState, cx: &mut Cx, stored: LedgerEntry, answer: &ProbeAnswer) -> Option<LedgerEntry> {
    if stored.state != LedgerState::OutcomeUnknown || integrity_refusal(run).is_err() {
        return None;
    }
    let same_run = stored.run_id == run.run_id;
    let mut entry = if same_run {
        run.ledger.get(&stored.ledger_key)?.clone()
    } else {
        stored
    };
    let blocked = run
        .activities
        .values()
        .find(|a| same_run && a.blocked_by.as_deref() == Some(entry.ledger_key.as_str()))
        .cloned();
    let verdict = takeable(answer.verdict.clone(), blocked.as_ref());
    let principal = answer.target.principal();
    let mut probe = entry
        .probe
        .clone()
        .unwrap_or_else(|| json!({"workflow_id": answer.probe_workflow_id, "activity_type": answer.target.probe_type}));
    probe["state"] = json!(verdict.name());
    probe["answered_at"] = json!(iso8601(cx.now));
    entry.probe = Some(probe);
    let evidence = json!({"probe_workflow_id": answer.probe_workflow_id, "answer": verdict.evidence()});
    let decision = match verdict {
        Verdict::Found { result, .. } => LedgerDecision::EffectConfirmed { result },
        Verdict::Absent { .. } => LedgerDecision::EffectAbsent,
        Verdict::Inconclusive { .. } => {
            let evidence_hash = crate::ledger::digest(&crate::canonical::to_string(&evidence));
            let details = obj!("probe" => "inconclusive", "principal" => principal, "evidence_hash" => evidence_hash);
            return Some(checkpoint(run, cx, entry, details));
        }
    };
    if !same_run {
        return resolve_earlier_run_entry(run, cx, entry, decision, evidence, &principal).ok();
    }
    let (key, absent) = (entry.ledger_key.clone(), decision == LedgerDecision::EffectAbsent);
    run.ledger.insert(key.clone(), entry);
    let resolved = resolve_entry_as(run, cx, &key, decision, evidence, &principal, Resolver::Probe).ok()?;
    if let (true, Some(execution)) = (absent, blocked) {
        if let Some(stored) = run.activities.get_mut(&execution.id) {
            stored.probe_retries += 1;
        }
    }
    Some(resolved)
}

/// The verdict the blocked step can take: a found result must pass the definition's checks,
/// and an execution is retried on a probe's word at most `PROBE_RETRIES_PER_EXECUTION` times.
fn takeable(verdict: Verdict, blocked: Option<&ActivityExecution>) -> Verdict {
    let Some(execution) = blocked else {
        return verdict;
    };
    let checks = execution.action.as_ref().and_then(|pin| pin.verification.as_ref());
    let failed_checks = match (&verdict, checks) {
        (Verdict::Found { result_json, .. }, Some(checks)) => crate::ledger::check_result(checks, result_json).err(),
        _ => None,
    };
    if let Some(problems) = failed_checks {
        return Verdict::Inconclusive {
            evidence: json!({"problem": "the probe's result fails the definition's checks", "problems": problems,
                "probe_evidence": verdict.evidence()}),
        };
    }
    if matches!(verdict, Verdict::Absent { .. }) && execution.probe_retries >= PROBE_RETRIES_PER_EXECUTION {
        return Verdict::Inconclusive {
            evidence: json!({"problem": "absent again after a retry a probe already caused: left to the operator",
                "probe_evidence": verdict.evidence()}),
        };
    }
    verdict
}
