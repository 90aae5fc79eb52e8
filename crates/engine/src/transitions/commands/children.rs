//! `start_child_workflow`: a child instance started in the same transition as the parent's step.

use crate::transitions::commands::At;
use crate::transitions::{begin_run, blank_run, events};
use crate::{ChildLink, Cx, EventType, ParentLink, RunState, StartChild, StartRun, WorkflowId};
use serde_json::Map;

/// Builds the child's first run with its own effects, records `ChildWorkflowScheduled` and
/// `ChildRunStarted` on the parent, and links the child to the parent's step.
pub(super) fn start_child_workflow(run: &mut RunState, cx: &mut Cx, at: At, child: StartChild) {
    let At { step, task: wt } = at;
    let child_id = child
        .workflow_id
        .clone()
        .unwrap_or_else(|| format!("{}:{}:{step}", run.workflow_id, run.run_id));
    let parent = ParentLink {
        workflow_id: run.workflow_id.clone(),
        run_id: run.run_id.clone(),
        sequence: step,
        retry_policy: child.retry_policy.clone(),
        attempt: 1,
    };
    let (child_run, child_effects) = {
        let mut next = Cx::new(cx.now, &mut *cx.ids, cx.limits);
        let start = StartRun {
            scheduling: run.scheduling.clone(),
            namespace: run.namespace.clone(),
            workflow_id: WorkflowId(child_id.clone()),
            run_id: next.id(),
            workflow_type: child.workflow_type.clone(),
            task_queue: child
                .queue
                .clone()
                .filter(|q| !q.is_empty())
                .unwrap_or_else(|| run.task_queue.clone()),
            input: child.arguments.clone(),
            execution_timeout_seconds: child.execution_timeout_seconds,
            run_timeout_seconds: child.run_timeout_seconds,
            business_key: None,
            memo: Map::new(),
            search_attributes: Map::new(),
            command_id: next.id(),
            contract: None,
            compatibility: None,
            origin_trace: child.observability_context.clone(),
            principal: cx.principal.clone(),
        };
        let execution_deadline_at = start.execution_timeout_seconds.map(|s| next.now + s * 1000);
        crate::transitions::start::acting_for(&mut next, &start);
        let mut child_run = blank_run(&next, start, 1, execution_deadline_at);
        child_run.parent = Some(parent);
        let child_run = begin_run(child_run, &mut next);
        (child_run, next.effects)
    };
    let scheduled = events::child_workflow_scheduled(step, &child_run, &child);
    run.append(cx, EventType::ChildWorkflowScheduled, scheduled, wt, None);
    let started = events::child_run_started(events::ChildStarted::First {
        step,
        child: &child_run,
        start: &child,
    });
    run.append(cx, EventType::ChildRunStarted, started, wt, None);
    run.children.insert(
        step,
        ChildLink {
            workflow_id: child_run.workflow_id.clone(),
            run_id: child_run.run_id.clone(),
            workflow_type: child_run.workflow_type.clone(),
            parent_close_policy: child.parent_close_policy,
            cancellation_policy: child.cancellation_policy,
            call_id: child_run.start_command_id.to_string(),
            tags: child.tags,
        },
    );
    cx.effects.children_started.push((child_run, child_effects));
}
