//! Pausing a run: the hold, what it tells the store's counts, repeats, and how a close and a
//! continue-as-new treat it.

mod support;

use capstan_engine::*;
use support::*;

/// Applies `f` to the sim's run with its own `Cx`, keeping the effects for the test to read.
fn with_effects<T>(sim: &mut Sim, f: impl FnOnce(&mut RunState, &mut Cx) -> Result<T, Refusal>) -> (Result<T, Refusal>, Effects) {
    let mut cx = Cx::new(sim.now, &mut sim.ids, &sim.limits);
    let result = f(&mut sim.run, &mut cx);
    if result.is_ok() {
        sim.history.extend(cx.effects.events.clone());
    }
    (result, cx.effects)
}

#[test]
fn a_pause_holds_the_run_and_a_resume_lets_it_go() {
    let mut sim = Sim::start();
    let workflow_task = sim.ready_task(TaskKind::Workflow);
    let (paused, effects) = with_effects(&mut sim, |run, cx| pause(run, cx, Some("outage".into())));
    assert_eq!(paused, Ok(true));
    assert_eq!(effects.reclassed_from, Some(RunClass::Open));
    assert!(effects.touched_tasks.contains(&workflow_task), "every task's row is written again");
    assert!(effects.events.is_empty(), "no history event: DW's event types are a closed set");
    let hold = sim.run.paused.clone().expect("held");
    assert_eq!((hold.paused_at, hold.reason.as_deref()), (sim.now, Some("outage")));
    assert_eq!(RunClass::of(&sim.run), RunClass::Paused);

    let (again, effects) = with_effects(&mut sim, |run, cx| pause(run, cx, None));
    assert_eq!(again, Ok(false), "a paused run needs nothing");
    assert_eq!(effects.reclassed_from, None);
    assert_eq!(sim.run.paused, Some(hold), "the first hold stays");

    let (resumed, effects) = with_effects(&mut sim, resume);
    assert_eq!(resumed, Ok(true));
    assert_eq!(effects.reclassed_from, Some(RunClass::Paused));
    assert!(effects.touched_tasks.contains(&workflow_task));
    assert_eq!(RunClass::of(&sim.run), RunClass::Open);
    assert_eq!(with_effects(&mut sim, resume).0, Ok(false), "a running run needs nothing");
}

#[test]
fn a_paused_run_closes_out_of_its_class_and_a_closed_run_cannot_be_held() {
    let mut sim = Sim::start();
    sim.apply(|run, cx| pause(run, cx, None)).unwrap();
    let (closed, effects) = with_effects(&mut sim, |run, cx| {
        close_by_command(run, cx, CloseCommand::Terminate, None, CommandId("t".into()))
    });
    assert!(closed.is_ok());
    assert_eq!(effects.reclassed_from, Some(RunClass::Paused));
    assert_eq!(sim.run.paused, None, "the hold goes with the run");
    assert_eq!(RunClass::of(&sim.run), RunClass::Closed(RunStatus::Terminated));
    for refused in [sim.apply(|run, cx| pause(run, cx, None)), sim.apply(resume)] {
        assert_eq!(refused.unwrap_err().reason, Reason::RunNotActive);
    }
}

#[test]
fn a_continue_as_new_of_a_paused_run_starts_paused() {
    let mut sim = Sim::start();
    sim.lease_workflow("w");
    sim.apply(|run, cx| pause(run, cx, Some("hold".into()))).unwrap();
    let continued = WorkflowCommand::ContinueAsNew {
        arguments: Payload::avro("AA=="),
        workflow_type: None,
        queue: None,
        tags: Default::default(),
        observability_context: None,
    };
    let task = sim.run.workflow_task.clone().unwrap();
    let fence = sim.run.tasks[&task].fence;
    let (completed, effects) = with_effects(&mut sim, |run, cx| {
        complete_workflow_task(run, cx, &task, "w", fence, vec![continued])
    });
    assert!(completed.is_ok(), "{completed:?}");
    assert_eq!(effects.reclassed_from, Some(RunClass::Paused));
    let (next, _) = effects.successor.as_deref().expect("a successor");
    assert_eq!(next.paused.as_ref().and_then(|p| p.reason.as_deref()), Some("hold"));
    assert_eq!(RunClass::of(next), RunClass::Paused);
}
