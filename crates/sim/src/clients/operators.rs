//! Operators in the workload: an operator settles `outcome_unknown` ledger entries, either
//! way (the effect was absent, or it happened with a result), limits the queue's activity
//! tasks live, and pauses and resumes workflows.

use crate::report::Failure;
use crate::workload::{NAMESPACE, PAYLOAD, QUEUE, SIMULATED_OPERATOR};
use crate::world::{Acted, World};
use capstan_app::control::Target;
use capstan_app::pause::{self, PauseRequest};
use capstan_app::{ledger, queue_limits};
use capstan_engine::flow::{KeyLimits, QueueLimits};
use capstan_engine::{LedgerDecision, LedgerState, Payload, Principal, TaskKind};
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

/// An operator limits the queue's activity tasks live (a leased-task cap, a dispatch rate, both,
/// or a cap per fairness key with a key weighted up), or lifts the limits.
pub(crate) async fn limit_activities(world: &mut World) -> Result<Acted, Failure> {
    let limits = match world.rng.random_range(0..5) {
        0 => QueueLimits::default(),
        1 => QueueLimits {
            max_leased_tasks: Some(world.rng.random_range(1..=3)),
            ..QueueLimits::default()
        },
        2 => QueueLimits {
            dispatch_rate_per_second: Some(f64::from(world.rng.random_range(1..=8)) / 2.0),
            dispatch_burst: Some(world.rng.random_range(1..=3)),
            ..QueueLimits::default()
        },
        3 => QueueLimits {
            dispatch_rate_per_second: Some(2.0),
            max_leased_tasks: Some(world.rng.random_range(1..=3)),
            ..QueueLimits::default()
        },
        // Per fairness key: a cap for every key, one key weighted up.
        _ => QueueLimits {
            fairness_key_limits: Some(KeyLimits {
                max_leased_tasks: Some(world.rng.random_range(1..=2)),
                ..KeyLimits::default()
            }),
            fairness_weights: [("tenant-a".to_string(), world.rng.random_range(1..=5))].into(),
            ..QueueLimits::default()
        },
    };
    set_activity_limits(world, limits).await?;
    Ok(Acted::Done)
}

/// An operator sets the queue's activity limits to `limits` (none: lifts them).
pub(crate) async fn set_activity_limits(world: &mut World, limits: QueueLimits) -> Result<(), Failure> {
    world.trace(|| format!("operator limits activity tasks: {limits:?}"));
    let set = queue_limits::set(&world.app, NAMESPACE, QUEUE, TaskKind::Activity, limits).await;
    world.declined(set).map(drop)
}

/// An operator pauses (or resumes) a workflow; a closed one refuses, which is fine. While it is
/// paused nothing of it may be leased (`checks::check_not_paused`).
pub(crate) async fn hold(world: &mut World, workflow_id: &str, pause_it: bool) -> Result<Acted, Failure> {
    let request = PauseRequest {
        target: Target {
            namespace: NAMESPACE.into(),
            workflow_id: workflow_id.to_string(),
            run_id: None,
        },
        reason: Some("simulated operator".into()),
        request_id: None,
        principal: Some(Principal::token(SIMULATED_OPERATOR)),
    };
    let render = |changed: &bool, _: &capstan_engine::RunState| json!(changed);
    let result = match pause_it {
        true => pause::pause(&world.app, request, render).await,
        false => pause::resume(&world.app, request, render).await,
    };
    let Some(receipt) = world.declined(result)? else {
        return Ok(Acted::Done);
    };
    world.trace(|| {
        format!(
            "operator {} {workflow_id}: {}",
            if pause_it { "pauses" } else { "resumes" },
            receipt.body
        )
    });
    if let Some(run) = &receipt.run {
        world.seen.acknowledge(run);
        if receipt.body == json!(true) && pause_it {
            world.counters.paused += 1;
        }
    }
    Ok(Acted::Done)
}
