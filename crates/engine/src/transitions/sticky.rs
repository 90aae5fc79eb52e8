//! Sticky execution on a run: the replay mode a lease gets, who a ready workflow task is held
//! for, and a completion's claim checked and kept as the run's affinity.

use crate::refusal::{Reason, Refusal};
use crate::run::RunState;
use crate::sticky::{ReplayMode, StickyAffinity, StickyClaim, STICKY_HOLD_MS, STICKY_TTL_SECONDS_MAX};
use crate::task::{Task, TaskDetail, TaskKind};
use crate::Millis;

impl RunState {
    /// The replay mode of a lease `owner` takes at `now`.
    pub fn replay_mode_for(&self, owner: &str, now: Millis) -> ReplayMode {
        match &self.sticky {
            None => ReplayMode::ColdReplay,
            Some(affinity) if affinity.expires_at <= now => ReplayMode::ForcedColdReplay,
            Some(affinity) if affinity.worker_id == owner => ReplayMode::StickyHitExpected,
            Some(_) => ReplayMode::ForcedColdReplay,
        }
    }

    /// Who a ready workflow task is held for, and until when: the run's sticky owner, until
    /// its claim runs out or `STICKY_HOLD_MS` after the task became available, whichever is
    /// first. `None`: any compatible worker may lease it.
    pub fn sticky_hold(&self, task: &Task) -> Option<(&str, Millis)> {
        let affinity = self.sticky.as_ref()?;
        let held = task.kind == TaskKind::Workflow && task.is_ready() && matches!(task.detail, TaskDetail::Workflow { .. });
        let until = affinity.expires_at.min(task.available_at.max(task.created_at) + STICKY_HOLD_MS);
        held.then_some((affinity.worker_id.as_str(), until))
    }
}

/// Checks that a claim names the lease's holder and this run.
pub fn check_sticky_claim(run: &RunState, owner: &str, claim: &StickyClaim) -> Result<(), Refusal> {
    let mismatch = |field: &str| {
        Refusal::new(
            Reason::StickyCacheIdentityMismatch,
            format!("The sticky_cache claim's {field} does not match the workflow task's."),
        )
        .with("field", format!("sticky_cache.{field}"))
    };
    if claim.worker_id != owner {
        return Err(mismatch("worker_id"));
    }
    if claim.run_id != run.run_id.as_str() {
        return Err(mismatch("run_id"));
    }
    if claim.workflow_id != run.workflow_id.as_str() {
        return Err(mismatch("workflow_id"));
    }
    Ok(())
}

/// After a completion: the completing worker's claim becomes the run's affinity; a completion
/// without one (or one that closed the run) leaves the run unclaimed.
pub fn record_sticky_claim(run: &mut RunState, now: Millis, claim: Option<StickyClaim>) {
    run.sticky = match claim {
        Some(claim) if !run.is_closed() => Some(StickyAffinity {
            worker_id: claim.worker_id,
            build_id: claim.build_id,
            claimed_at: now,
            expires_at: now + claim.ttl_seconds.clamp(1, STICKY_TTL_SECONDS_MAX) * 1000,
            metrics: claim.metrics,
        }),
        _ => None,
    };
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transitions::lease_workflow_task;
    use crate::{Cx, Limits, SequentialIds};
    use serde_json::Map;

    // When `new_run` starts its run.
    const NOW: Millis = 1_000;

    fn started() -> RunState {
        crate::run::tests::new_run()
    }

    fn claim(worker: &str, ttl_seconds: i64) -> StickyClaim {
        StickyClaim {
            worker_id: worker.into(),
            workflow_id: "wf".into(),
            run_id: "run".into(),
            build_id: "b1".into(),
            ttl_seconds,
            metrics: Map::new(),
        }
    }

    #[test]
    fn the_replay_mode_follows_the_claim() {
        let mut run = started();
        assert_eq!(run.replay_mode_for("a", NOW), ReplayMode::ColdReplay);
        record_sticky_claim(&mut run, NOW, Some(claim("a", 60)));
        assert_eq!(run.replay_mode_for("a", NOW + 59_999), ReplayMode::StickyHitExpected);
        assert_eq!(run.replay_mode_for("b", NOW + 1), ReplayMode::ForcedColdReplay);
        assert_eq!(
            run.replay_mode_for("a", NOW + 60_000),
            ReplayMode::ForcedColdReplay,
            "the claim ran out"
        );
        record_sticky_claim(&mut run, NOW, None);
        assert_eq!(
            run.replay_mode_for("a", NOW),
            ReplayMode::ColdReplay,
            "a completion without a claim clears it"
        );
        record_sticky_claim(&mut run, NOW, Some(claim("a", 1_000_000)));
        assert_eq!(
            run.sticky.as_ref().unwrap().expires_at,
            NOW + STICKY_TTL_SECONDS_MAX * 1000,
            "the TTL is bounded"
        );
    }

    #[test]
    fn a_lease_records_its_replay_mode_on_the_task() {
        let limits = Limits::default();
        let mut ids = SequentialIds::new("lease");
        let mut run = started();
        record_sticky_claim(&mut run, NOW, Some(claim("a", 60)));
        let task_id = run.workflow_task.clone().unwrap();
        let mut cx = Cx::new(NOW + 10, &mut ids, &limits);
        let task = lease_workflow_task(&mut run, &mut cx, &task_id, "b", 30_000).unwrap();
        assert!(matches!(
            task.detail,
            TaskDetail::Workflow {
                replay_mode: Some(ReplayMode::ForcedColdReplay),
                ..
            }
        ));
    }

    #[test]
    fn a_ready_workflow_task_is_held_briefly_for_the_owner() {
        let mut run = started();
        let task = run.tasks[run.workflow_task.as_ref().unwrap()].clone();
        assert_eq!(run.sticky_hold(&task), None, "unclaimed: anyone");
        record_sticky_claim(&mut run, NOW, Some(claim("a", 3600)));
        assert_eq!(
            run.sticky_hold(&task),
            Some(("a", task.available_at.max(task.created_at) + STICKY_HOLD_MS))
        );
        record_sticky_claim(&mut run, NOW, Some(claim("a", 1)));
        assert_eq!(run.sticky_hold(&task), Some(("a", NOW + 1000)), "never past the claim");
    }

    #[test]
    fn a_claim_names_the_lease_holder_and_the_run() {
        let run = started();
        assert!(check_sticky_claim(&run, "a", &claim("a", 60)).is_ok());
        let refused = check_sticky_claim(&run, "b", &claim("a", 60)).unwrap_err();
        assert_eq!(refused.reason, Reason::StickyCacheIdentityMismatch);
        let other_run = StickyClaim {
            run_id: "run-2".into(),
            ..claim("a", 60)
        };
        assert!(check_sticky_claim(&run, "a", &other_run).is_err());
    }
}
