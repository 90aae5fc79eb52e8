//! Standalone activities in the workload: a client starts an activity on a host run of its own
//! (a plain or a declared action, one attempt or a few), workers run it like any activity task,
//! and its end closes the run. Clients also start an id again: refused while its activity is
//! open, a new run once it closed.

use super::*;
use capstan_app::standalone::{self, StartActivityRequest};

impl Sim {
    pub(crate) async fn start_standalone_activity(&mut self) -> Result<(), Failure> {
        // A client sometimes starts a known id again (most often one whose activity ended).
        let again = match !self.standalone.is_empty() && self.rng.random_bool(0.3) {
            true => pick(&mut self.rng, self.standalone.iter()),
            false => None,
        };
        let activity_id = match again {
            Some(known) => known,
            None => {
                let index = self.programs.len();
                let id = format!("sim-{}-{index}-activity", self.config.seed);
                // No workflow code: its program is empty, and it counts as a started workflow.
                self.programs.insert(id.clone(), Vec::new());
                self.standalone.insert(id.clone());
                id
            }
        };
        let activity_type = if self.rng.random_bool(0.3) { DECLARED } else { PLAIN };
        let retry_policy = match self.rng.random_range(0..3) {
            0 => None,
            n => Some(RetryPolicy {
                max_attempts: Some(n + 1),
                backoff_seconds: vec![1],
                non_retryable_error_types: Vec::new(),
            }),
        };
        self.trace(|| format!("start standalone activity {activity_id} ({activity_type}, {retry_policy:?})"));
        let request = StartActivityRequest {
            namespace: NAMESPACE.into(),
            activity_id: Some(activity_id.clone()),
            activity_type: activity_type.into(),
            activity_class: None,
            task_queue: QUEUE.into(),
            input: Payload::avro(PAYLOAD),
            business_key: None,
            retry_policy,
            timeouts: ActivityTimeouts::default(),
            principal: Some(capstan_engine::Principal::token(SIMULATED_CLIENT)),
        };
        let previous = self.current_run_of(&activity_id).await?;
        let result = standalone::start_activity(&self.app, request).await;
        let Some(run) = self.declined(result)? else {
            // Refused only while the id's activity is still open.
            return match previous {
                Some(open) if !open.is_closed() => Ok(()),
                _ => Err(self.fail(format!(
                    "a start of standalone activity {activity_id} was refused though no run of it is open"
                ))),
            };
        };
        if let Some(open) = previous.filter(|p| !p.is_closed()) {
            return Err(self.fail(format!(
                "{activity_id} started run {} while run {} was open",
                run.run_id, open.run_id
            )));
        }
        if run.workflow_task.is_some() || run.tasks.values().any(|t| t.kind == TaskKind::Workflow) {
            return Err(self.fail(format!("standalone activity {activity_id} got a workflow task")));
        }
        self.report.standalone_started += 1;
        self.acknowledge(&run);
        Ok(())
    }

    pub(crate) async fn current_run_of(&mut self, workflow_id: &str) -> Result<Option<RunState>, Failure> {
        self.store()
            .load_run(NAMESPACE, RunLocator::Current(WorkflowId(workflow_id.to_string())))
            .await
            .map_err(|e| self.fail(format!("load: {e}")))
    }
}
