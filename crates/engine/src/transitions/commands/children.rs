//! `start_child_workflow`: a child instance started in the same transition as the parent's step.

use super::*;

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
        };
        let execution_deadline_at = start.execution_timeout_seconds.map(|s| next.now + s * 1000);
        let mut child_run = blank_run(&next, start, 1, execution_deadline_at);
        child_run.parent = Some(parent);
        let child_run = begin_run(child_run, &mut next);
        (child_run, next.effects)
    };
    let mut payload = obj!(
        "sequence" => step,
        "child_workflow_instance_id" => child_run.workflow_id,
        "child_workflow_run_id" => child_run.run_id,
        "child_workflow_type" => child_run.workflow_type,
        "child_call_id" => child_run.start_command_id,
        "workflow_link_id" => child_run.start_command_id,
        "parent_close_policy" => child.parent_close_policy,
        "cancellation_policy" => child.cancellation_policy,
        "task_queue" => child_run.task_queue,
    );
    if let Some(policy) = &child.retry_policy {
        payload.insert("retry_policy".into(), child_retry_snapshot(policy));
    }
    extend(&mut payload, &child.tags);
    run.append(cx, EventType::ChildWorkflowScheduled, payload.clone(), wt, None);
    payload.insert("child_status".into(), json!(child_run.status.as_str()));
    payload.insert("child_run_number".into(), json!(child_run.run_number));
    payload.insert("execution_timeout_seconds".into(), json!(child_run.execution_timeout_seconds));
    payload.insert("run_timeout_seconds".into(), json!(child_run.run_timeout_seconds));
    run.append(cx, EventType::ChildRunStarted, payload, wt, None);
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
